//! Asynchronous execution: streams with FIFO operation queues, one lazily
//! started worker thread per stream, events, graphs, and handing each kernel
//! to the device's sharing model (`SIMGPU_SHARING`): the serial timeline
//! ([`serial_timeline`]) or the time-sliced engine ([`crate::engine`]).

use crate::config::Sharing;
use crate::driver::{Ctx, Registry, current, drv, next_id};
use crate::engine::Submit;
use crate::serial_timeline;
use crate::trace::KernelRecord;
use crate::{Res, now_ns, sleep_until};
use dilu_abi::cuda::*;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Kernels this process ran under the serial model: each one's trace
/// number (the time-sliced engine numbers its own).
static SERIAL_KERNELS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Kernels a stream hands to the engine before the first of them has
/// completed. A real driver's queue holds thousands of commands; a bound
/// keeps the engine's scans short, and 32 is far more than a stream's next
/// kernel needs to be there when the one before it ends.
const KERNELS_AHEAD: usize = 32;

pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);
pub(crate) type StreamCallback = unsafe extern "C" fn(sys::CUstream, u32, *mut c_void);

#[derive(Clone)]
pub(crate) struct KernelOp {
    pub name: Arc<str>,
    pub blocks: u64,
    pub dur_ns: u64,
    pub graph: bool,
}

#[derive(Clone)]
pub(crate) enum Op {
    Kernel(KernelOp),
    Copy {
        dst: usize,
        src: usize,
        n: usize,
    },
    CopyOwned {
        dst: usize,
        data: Arc<Vec<u8>>,
    },
    Memset {
        dst: usize,
        val: u32,
        elem: usize,
        count: usize,
    },
    Record {
        ev: Arc<Event>,
        generation: u64,
    },
    Host {
        f: HostFn,
        data: usize,
    },
    Callback {
        f: StreamCallback,
        handle: usize,
        data: usize,
    },
    Free {
        ptr: u64,
    },
    Wait {
        stream: Arc<Stream>,
        seq: u64,
        ev: Arc<Event>,
    },
    /// A graph's allocation node (applied at launch, never enqueued).
    GraphAlloc {
        ptr: u64,
    },
    /// A graph's free node (applied at launch, never enqueued).
    GraphFree {
        ptr: u64,
    },
}

struct St {
    q: VecDeque<(u64, u64, Op)>,
    submitted: u64,
    completed: u64,
    last_end: u64,
    worker: bool,
    capture: Option<Vec<Op>>,
    capture_id: u64,
    closed: bool,
}

pub(crate) struct Stream {
    pub id: u64,
    pub ctx: usize,
    pub dev: usize,
    pub flags: u32,
    pub priority: i32,
    pub legacy: bool,
    st: Mutex<St>,
    cv: Condvar,
}

pub(crate) static STREAMS: Registry<Stream> = Registry::new();

thread_local! {
    static PER_THREAD: RefCell<HashMap<usize, Arc<Stream>>> = RefCell::new(HashMap::new());
}

/// The calling thread's per-thread default stream of `ctx`.
pub(crate) fn per_thread(ctx: &Arc<Ctx>) -> Arc<Stream> {
    PER_THREAD.with(|m| {
        m.borrow_mut()
            .entry(ctx.handle())
            .or_insert_with(|| Stream::new(ctx, 0, 0, false))
            .clone()
    })
}

/// Resolves a stream handle. NULL is the legacy stream, or the per-thread
/// default stream in `_ptsz`/`_ptds` entry points; 0x1 and 0x2 are
/// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
pub(crate) fn resolve(h: sys::CUstream, pt: bool) -> Res<Arc<Stream>> {
    match h as usize {
        0 => {
            let c = current()?;
            Ok(if pt { per_thread(&c) } else { c.legacy() })
        }
        CU_STREAM_LEGACY => Ok(current()?.legacy()),
        CU_STREAM_PER_THREAD => Ok(per_thread(&current()?)),
        v => {
            drv()?;
            STREAMS.get(v).ok_or(CUDA_ERROR_INVALID_HANDLE)
        }
    }
}

impl Stream {
    pub(crate) fn new(ctx: &Arc<Ctx>, flags: u32, priority: i32, legacy: bool) -> Arc<Stream> {
        let s = Arc::new(Stream {
            id: next_id(),
            ctx: ctx.handle(),
            dev: ctx.dev,
            flags,
            priority,
            legacy,
            st: Mutex::new(St {
                q: VecDeque::new(),
                submitted: 0,
                completed: 0,
                last_end: 0,
                worker: false,
                capture: None,
                capture_id: 0,
                closed: false,
            }),
            cv: Condvar::new(),
        });
        ctx.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&s));
        s
    }

    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, St>) -> MutexGuard<'a, St> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Queues an operation; returns its sequence number (0 when it was
    /// captured into a graph or the driver is in null mode).
    pub(crate) fn enqueue(self: &Arc<Self>, op: Op) -> Res<u64> {
        let d = drv()?;
        if d.null() {
            return Ok(0);
        }
        let mut st = self.lock();
        if let Some(cap) = &mut st.capture {
            match op {
                Op::Record { .. } | Op::Wait { .. } => {}
                op => cap.push(op),
            }
            return Ok(0);
        }
        st.submitted += 1;
        let seq = st.submitted;
        if let (Op::Kernel(_), Some(shm)) = (&op, &d.shm) {
            shm.queued(shm.slot, d.phys(self.dev)).fetch_add(1, AcqRel);
        }
        st.q.push_back((seq, now_ns(), op));
        if !st.worker {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("simgpu-s{}", self.id))
                .spawn(move || me.worker());
            if let Err(error) = spawned {
                // The program sees only out-of-memory: say what it was.
                eprintln!("simgpu: cannot start a stream's worker thread: {error}");
                if let (Some((_, _, Op::Kernel(_))), Some(shm)) = (st.q.pop_back(), &d.shm) {
                    let _ =
                        shm.queued(shm.slot, d.phys(self.dev))
                            .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
                }
                st.submitted -= 1;
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            st.worker = true;
        } else {
            self.cv.notify_all();
        }
        Ok(seq)
    }

    /// Runs the stream's operations in order. Kernels go to the device's
    /// engine ahead of time, up to [`KERNELS_AHEAD`] of them, as a driver
    /// fills a hardware queue; any other operation first waits for them all
    /// (it needs the stream's completion time, and copies or host functions
    /// must see the kernels' effects).
    fn worker(self: Arc<Self>) {
        crate::exact_timers_for_this_thread();
        let mut ahead: VecDeque<(u64, u64)> = VecDeque::new();
        loop {
            let mut st = self.lock();
            let next_is_kernel = matches!(st.q.front(), Some((_, _, Op::Kernel(_))));
            if next_is_kernel && ahead.len() < KERNELS_AHEAD {
                let Some((seq, enq, Op::Kernel(k))) = st.q.pop_front() else {
                    continue;
                };
                let ready = enq.max(st.last_end);
                drop(st);
                // As for any operation: a panic must not kill the stream.
                let handed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.hand_over_kernel(ready, &k)
                }))
                .unwrap_or_else(|_| Err(now_ns()));
                match handed {
                    Ok(ticket) => ahead.push_back((seq, ticket)),
                    Err(end) => self.completed(seq, end),
                }
                continue;
            }
            if let Some((seq, ticket)) = ahead.pop_front() {
                drop(st);
                let end = drv().map_or_else(|_| now_ns(), |d| d.engines[self.dev].wait(ticket));
                self.completed(seq, end);
                continue;
            }
            while st.q.is_empty() {
                if st.closed {
                    st.worker = false;
                    return;
                }
                st = self.wait(st);
            }
            if matches!(st.q.front(), Some((_, _, Op::Kernel(_)))) {
                continue;
            }
            let Some((seq, enq, op)) = st.q.pop_front() else {
                continue;
            };
            let last_end = st.last_end;
            drop(st);
            let end = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.execute(enq.max(last_end), op)
            }))
            .unwrap_or_else(|_| now_ns());
            self.completed(seq, end);
        }
    }

    /// Marks operation `seq` done at device time `end`.
    fn completed(&self, seq: u64, end: u64) {
        let mut st = self.lock();
        st.completed = seq;
        st.last_end = st.last_end.max(end);
        self.cv.notify_all();
    }

    /// Hands a kernel that became ready at `ready` to the device:
    /// `Ok(ticket)` when the time-sliced engine took it without waiting,
    /// `Err(end)` when it already ran (serial model, or no engine).
    fn hand_over_kernel(&self, ready: u64, k: &KernelOp) -> Result<u64, u64> {
        let Ok(d) = drv() else { return Err(ready) };
        let Some(shm) = &d.shm else { return Err(ready) };
        if d.cfg.sharing == Sharing::Serial {
            return Err(self.run_kernel_serially(d, shm, ready, k));
        }
        let ready = ready + d.cfg.gap_ns;
        d.engines[self.dev].submit(&d.cfg, shm, d.trace.as_ref(), self.submit(ready, Some(k)))
    }

    /// Runs one operation that became ready at `ready`; returns its
    /// simulated completion time.
    fn execute(&self, ready: u64, op: Op) -> u64 {
        match op {
            Op::Kernel(k) => match self.hand_over_kernel(ready, &k) {
                Ok(ticket) => drv().map_or(ready, |d| d.engines[self.dev].wait(ticket)),
                Err(end) => end,
            },
            Op::Copy { dst, src, n } => {
                // SAFETY: both ranges were validated at enqueue time as device
                // memory or caller-provided host memory that the CUDA contract
                // keeps valid until the operation completes; `copy` allows
                // overlap.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
                ready
            }
            Op::CopyOwned { dst, data } => {
                // SAFETY: dst was validated as device memory of data.len() bytes.
                unsafe { std::ptr::copy(data.as_ptr(), dst as *mut u8, data.len()) };
                ready
            }
            Op::Memset {
                dst,
                val,
                elem,
                count,
            } => {
                // SAFETY: dst..dst+elem*count was validated as device memory;
                // elem is 1, 2 or 4 and the pointer alignment was checked.
                unsafe {
                    match elem {
                        1 => std::ptr::write_bytes(dst as *mut u8, val as u8, count),
                        2 => {
                            std::slice::from_raw_parts_mut(dst as *mut u16, count).fill(val as u16)
                        }
                        _ => std::slice::from_raw_parts_mut(dst as *mut u32, count).fill(val),
                    }
                }
                ready
            }
            Op::Record { ev, generation } => {
                let at = self.device_time_for_record(ready);
                ev.complete(generation, at);
                at
            }
            Op::Host { f, data } => {
                // SAFETY: the client handed us this callback and its argument.
                unsafe { f(data as *mut c_void) };
                ready.max(now_ns())
            }
            Op::Callback { f, handle, data } => {
                // SAFETY: as above; the signature is CUstreamCallback.
                unsafe { f(handle as sys::CUstream, CUDA_SUCCESS, data as *mut c_void) };
                ready.max(now_ns())
            }
            Op::Free { ptr } => {
                let _ = crate::api::mem::free_device(ptr);
                ready
            }
            Op::Wait { stream, seq, ev } => {
                let _ = stream.wait_seq(seq);
                ready.max(ev.time().unwrap_or(0))
            }
            Op::GraphAlloc { .. } | Op::GraphFree { .. } => ready,
        }
    }

    /// When an event recorded at `ready` is timestamped: at once if this
    /// process held the device then, else once it has the device again (a
    /// context that is not resident does not advance, as with real time
    /// slicing).
    fn device_time_for_record(&self, ready: u64) -> u64 {
        let Ok(d) = drv() else { return ready };
        let Some(shm) = &d.shm else { return ready };
        if d.cfg.sharing == Sharing::Serial {
            return serial_timeline::record_time(shm, d.phys(self.dev), ready, d.cfg.timeslice_ns);
        }
        let engine = &d.engines[self.dev];
        if let Some(t) = engine.record_time(shm, ready) {
            return t;
        }
        shm.queued(shm.slot, d.phys(self.dev)).fetch_add(1, AcqRel);
        engine.run(&d.cfg, shm, d.trace.as_ref(), self.submit(ready, None))
    }

    fn submit(&self, ready: u64, k: Option<&KernelOp>) -> Submit {
        Submit {
            stream: self.id,
            device: self.dev,
            name: k.map(|k| k.name.clone()).unwrap_or_else(|| Arc::from("")),
            blocks: k.map_or(0, |k| k.blocks),
            graph: k.is_some_and(|k| k.graph),
            dur_ns: k.map_or(0, |k| k.dur_ns),
            record: k.is_none(),
            ready,
        }
    }

    /// The serial model: reserves the kernel's stretch of the device
    /// timeline, waits until it has passed and writes it as one trace row.
    fn run_kernel_serially(
        &self,
        d: &crate::driver::Driver,
        shm: &crate::shm::Shm,
        ready: u64,
        k: &KernelOp,
    ) -> u64 {
        let phys = d.phys(self.dev);
        let (start, end) = serial_timeline::reserve(shm, phys, ready, k.dur_ns, d.cfg.timeslice_ns);
        shm.add_busy(phys, end - start);
        let queued = shm.queued(shm.slot, phys);
        let _ = queued.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        sleep_until(end);
        if let Some(t) = &d.trace {
            t.kernel(&KernelRecord {
                device: self.dev,
                stream: self.id,
                start_ns: start,
                end_ns: end,
                name: &k.name,
                blocks: k.blocks,
                graph: k.graph,
                kernel: SERIAL_KERNELS.fetch_add(1, Relaxed),
                segment: 0,
                last: true,
            });
        }
        end
    }

    pub(crate) fn wait_seq(&self, seq: u64) -> Res {
        let mut st = self.lock();
        while st.completed < seq {
            st = self.wait(st);
        }
        Ok(())
    }

    pub(crate) fn synchronize(&self) -> Res {
        let target = {
            let st = self.lock();
            if st.capture.is_some() {
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            st.submitted
        };
        self.wait_seq(target)
    }

    pub(crate) fn query(&self) -> Res {
        let st = self.lock();
        if st.completed >= st.submitted {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    /// Lets the worker exit once the queue is drained.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.cv.notify_all();
    }

    pub(crate) fn begin_capture(&self) -> Res {
        let mut st = self.lock();
        if st.capture.is_some() {
            return Err(CUDA_ERROR_ILLEGAL_STATE_OR_INVALID);
        }
        st.capture = Some(Vec::new());
        st.capture_id = next_id();
        Ok(())
    }

    pub(crate) fn end_capture(&self) -> Res<Vec<Op>> {
        self.lock()
            .capture
            .take()
            .ok_or(CUDA_ERROR_ILLEGAL_STATE_OR_INVALID)
    }

    /// Some(capture id) while capturing.
    pub(crate) fn capture_id(&self) -> Option<u64> {
        let st = self.lock();
        st.capture.as_ref().map(|_| st.capture_id)
    }
}

/// `CUDA_ERROR_ILLEGAL_STATE` (401).
pub(crate) const CUDA_ERROR_ILLEGAL_STATE_OR_INVALID: CUresult =
    sys::cudaError_enum::CUDA_ERROR_ILLEGAL_STATE as CUresult;

struct EvSt {
    generation: u64,
    stream: Option<Arc<Stream>>,
    seq: u64,
    time: Option<u64>,
}

pub(crate) struct Event {
    pub flags: u32,
    st: Mutex<EvSt>,
    /// An interprocess event's page (see [`crate::api::ipc_event`]).
    shared: Option<crate::api::ipc_event::SharedEvent>,
}

pub(crate) static EVENTS: Registry<Event> = Registry::new();

pub(crate) const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

impl Event {
    pub(crate) fn new(flags: u32) -> Event {
        Event {
            flags,
            st: Mutex::new(EvSt {
                generation: 0,
                stream: None,
                seq: 0,
                time: None,
            }),
            shared: None,
        }
    }

    /// An event whose records are counted on a page shared between
    /// processes.
    pub(crate) fn interprocess(flags: u32, shared: crate::api::ipc_event::SharedEvent) -> Event {
        Event {
            shared: Some(shared),
            ..Event::new(flags)
        }
    }

    pub(crate) fn shared(&self) -> Option<&crate::api::ipc_event::SharedEvent> {
        self.shared.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, EvSt> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(self: &Arc<Self>, stream: &Arc<Stream>) -> Res {
        if stream.capture_id().is_some() {
            return Ok(());
        }
        let null = drv()?.null();
        let mut st = self.lock();
        st.generation = match &self.shared {
            Some(shared) => shared.record(),
            None => st.generation + 1,
        };
        if null {
            st.time = Some(now_ns());
            st.stream = Some(stream.clone());
            st.seq = 0;
            if let Some(shared) = &self.shared {
                shared.complete(st.generation);
            }
            return Ok(());
        }
        st.time = None;
        let seq = stream.enqueue(Op::Record {
            ev: self.clone(),
            generation: st.generation,
        })?;
        st.stream = Some(stream.clone());
        st.seq = seq;
        Ok(())
    }

    fn complete(&self, generation: u64, t: u64) {
        let mut st = self.lock();
        if st.generation == generation {
            st.time = Some(t);
        }
        if let Some(shared) = &self.shared {
            shared.complete(generation);
        }
    }

    pub(crate) fn time(&self) -> Option<u64> {
        self.lock().time
    }

    /// (stream, seq) of the last record, if any.
    pub(crate) fn pending(&self) -> Option<(Arc<Stream>, u64)> {
        let st = self.lock();
        st.stream.clone().map(|s| (s, st.seq))
    }

    pub(crate) fn query(&self) -> Res {
        if let Some(shared) = &self.shared {
            return if shared.done() {
                Ok(())
            } else {
                Err(CUDA_ERROR_NOT_READY)
            };
        }
        let st = self.lock();
        if st.stream.is_none() || st.time.is_some() {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    }

    pub(crate) fn synchronize(&self) -> Res {
        if let Some((s, seq)) = self.pending() {
            s.wait_seq(seq)?;
        }
        if let Some(shared) = &self.shared {
            shared.wait_for_exporter();
        }
        drv()?.flush_trace();
        Ok(())
    }

    /// Opened from another process's handle.
    pub(crate) fn opened(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.opened())
    }

    pub(crate) fn elapsed_ms(a: &Event, b: &Event) -> Res<f32> {
        if a.flags & CU_EVENT_DISABLE_TIMING != 0 || b.flags & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        // One lock at a time: elapsed(a, b) and elapsed(b, a) may race.
        let state = |e: &Event| {
            let st = e.lock();
            (st.stream.is_some(), st.time)
        };
        let ((ra, ta), (rb, tb)) = (state(a), state(b));
        if !ra || !rb {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        match (ta, tb) {
            (Some(x), Some(y)) => Ok(((y as f64 - x as f64) / 1e6) as f32),
            _ => Err(CUDA_ERROR_NOT_READY),
        }
    }
}

pub(crate) struct Graph {
    pub ops: Mutex<Vec<Op>>,
}

pub(crate) struct GraphExec {
    pub ops: Vec<Op>,
}

pub(crate) static GRAPHS: Registry<Graph> = Registry::new();
pub(crate) static GRAPH_EXECS: Registry<GraphExec> = Registry::new();

impl GraphExec {
    pub(crate) fn launch(&self, stream: &Arc<Stream>) -> Res {
        crate::api::graph_mem::launch(&self.ops)?;
        for op in &self.ops {
            let op = match op {
                Op::Kernel(k) => Op::Kernel(KernelOp {
                    graph: true,
                    ..k.clone()
                }),
                Op::GraphAlloc { .. } | Op::GraphFree { .. } => continue,
                other => other.clone(),
            };
            stream.enqueue(op)?;
        }
        Ok(())
    }
}
