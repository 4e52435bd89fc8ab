//! Process-wide driver state: configuration, shared device, arenas,
//! contexts and the handle registries.

use crate::Res;
use crate::config::Config;
use crate::exec::Stream;
use crate::memory::{Arena, charged};
use crate::shm::Shm;
use crate::trace::Trace;
use dilu_abi::cuda::*;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Live handles of one kind: the handle value is the address of the Arc'd
/// object, and look-ups validate it.
pub(crate) struct Registry<T> {
    map: Mutex<BTreeMap<usize, Arc<T>>>,
}

impl<T> Registry<T> {
    pub(crate) const fn new() -> Self {
        Registry {
            map: Mutex::new(BTreeMap::new()),
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, Arc<T>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn insert(&self, v: Arc<T>) -> usize {
        let h = Arc::as_ptr(&v) as *const u8 as usize;
        self.lock().insert(h, v);
        h
    }
    pub(crate) fn get(&self, h: usize) -> Option<Arc<T>> {
        self.lock().get(&h).cloned()
    }
    pub(crate) fn remove(&self, h: usize) -> Option<Arc<T>> {
        self.lock().remove(&h)
    }
    pub(crate) fn handles(&self) -> Vec<usize> {
        self.lock().keys().copied().collect()
    }
}

/// Destructor cudart registers with a context-local value:
/// `(context, key, value)`.
pub(crate) type LocalDtor = extern "C" fn(*mut std::ffi::c_void, usize, usize);

/// A context-local value (export table C693336E).
pub(crate) struct LocalValue {
    pub key: usize,
    pub value: usize,
    pub dtor: Option<LocalDtor>,
}

pub(crate) struct Ctx {
    /// Unique per process, never reused, from 1 (`cuCtxGetId`; tools read it
    /// as the context number).
    pub id: u64,
    pub dev: usize,
    pub flags: AtomicU32,
    pub primary: bool,
    pub retains: AtomicU32,
    pub streams: Mutex<Vec<Weak<Stream>>>,
    pub legacy: OnceLock<Arc<Stream>>,
    pub limits: Mutex<[u64; 16]>,
    /// Context-local storage of private clients (cudart).
    pub local: Mutex<Vec<LocalValue>>,
}

impl Ctx {
    pub(crate) fn new(dev: usize, flags: u32, primary: bool) -> Ctx {
        let mut limits = [0u64; 16];
        limits[0] = 1024; // stack size
        limits[1] = 1 << 20; // printf fifo
        limits[2] = 8 << 20; // malloc heap
        limits[3] = 2; // dev runtime sync depth
        limits[4] = 2048; // pending launch count
        limits[5] = 32; // max L2 fetch granularity
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ctx {
            id: NEXT_ID.fetch_add(1, Relaxed),
            dev,
            flags: AtomicU32::new(flags),
            primary,
            retains: AtomicU32::new(0),
            streams: Mutex::new(Vec::new()),
            legacy: OnceLock::new(),
            limits: Mutex::new(limits),
            local: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn handle(self: &Arc<Self>) -> usize {
        Arc::as_ptr(self) as *const u8 as usize
    }

    /// The context's legacy default stream.
    pub(crate) fn legacy(self: &Arc<Self>) -> Arc<Stream> {
        self.legacy
            .get_or_init(|| Stream::new(self, 0, 0, true))
            .clone()
    }

    pub(crate) fn all_streams(&self) -> Vec<Arc<Stream>> {
        let mut v = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }

    /// Empties the context-local storage and runs its destructors (at
    /// context destroy and primary-context reset, as the driver does).
    pub(crate) fn drop_local_storage(self: &Arc<Self>) {
        let values = std::mem::take(&mut *self.local.lock().unwrap_or_else(|e| e.into_inner()));
        for v in values {
            if let Some(dtor) = v.dtor {
                dtor(self.handle() as *mut std::ffi::c_void, v.key, v.value);
            }
        }
    }

    /// Waits for all work of every stream of this context.
    pub(crate) fn synchronize(self: &Arc<Self>) -> Res {
        for s in self.all_streams() {
            s.synchronize()?;
        }
        if let Ok(d) = drv() {
            d.flush_trace();
        }
        Ok(())
    }
}

pub(crate) static CTXS: Registry<Ctx> = Registry::new();

thread_local! {
    static CTX_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn ctx_stack<R>(f: impl FnOnce(&mut Vec<usize>) -> R) -> R {
    CTX_STACK.with(|s| f(&mut s.borrow_mut()))
}

/// The calling thread's current context.
pub(crate) fn current() -> Res<Arc<Ctx>> {
    drv()?;
    let h = ctx_stack(|s| s.last().copied()).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    CTXS.get(h).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// Address space each process reserves per device beyond twice its capacity.
const ARENA_SLACK: usize = 64 << 30;

pub(crate) struct Driver {
    pub cfg: Config,
    pub shm: Option<Shm>,
    pub arenas: Vec<Arena>,
    pub capacity: Vec<u64>,
    pub primary: Vec<Arc<Ctx>>,
    pub trace: Option<Trace>,
    /// Per visible device: the engine running this process's kernels.
    pub engines: Vec<Arc<crate::engine::Engine>>,
    null_next: AtomicU64,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

pub(crate) fn drv() -> Res<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        _ => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

pub(crate) fn init() -> CUresult {
    match DRIVER.get_or_init(|| {
        Driver::new().map_err(|msg| {
            eprintln!("{msg}");
            CUDA_ERROR_INVALID_VALUE
        })
    }) {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => *e,
    }
}

/// Set in a child forked after the driver was initialised. NVIDIA's driver
/// cannot be used in such a child (every call returns
/// `CUDA_ERROR_NOT_INITIALIZED`, `cuInit` included); simgpu does the same,
/// so a child never touches the locks, streams, memory or trace buffer it
/// inherited from its parent.
static FORKED: AtomicBool = AtomicBool::new(false);

pub(crate) fn forked() -> bool {
    FORKED.load(Relaxed)
}

extern "C" fn in_forked_child() {
    FORKED.store(true, Relaxed);
}

extern "C" fn at_exit() {
    if forked() {
        return; // the parent's slot and trace buffer are not ours
    }
    if let Ok(d) = drv() {
        if let Some(t) = &d.trace {
            t.flush_and_wait();
        }
        if let Some(shm) = &d.shm {
            shm.release();
        }
    }
}

impl Driver {
    fn new() -> Result<Driver, String> {
        let cfg = Config::from_env()?;
        let trace = match &cfg.trace {
            Some(p) if !cfg.null => Some(Trace::open(p)?),
            _ => None,
        };
        let mut shm = None;
        let mut capacity = vec![cfg.memory; cfg.visible.len()];
        let mut arenas = Vec::new();
        let mut cfg = cfg;
        if !cfg.null {
            let s = Shm::attach(&cfg.instance, cfg.devices, cfg.memory, cfg.sharing.code())?;
            // The creator of the instance decides its shape.
            let ndev = s.ndev();
            cfg.visible.retain(|&p| p < ndev);
            capacity = cfg
                .visible
                .iter()
                .map(|&p| s.dev(p).capacity.load(Relaxed))
                .collect();
            for &c in &capacity {
                // Address space, not memory: a real GPU's virtual space is far
                // larger than its memory, so fragmentation never refuses an
                // allocation that the shared capacity admits.
                let span = (c as usize).saturating_mul(2).saturating_add(ARENA_SLACK);
                arenas.push(Arena::new(span)?);
            }
            shm = Some(s);
        }
        let seed = if cfg.seed != 0 {
            cfg.seed
        } else {
            crate::now_ns() ^ (std::process::id() as u64) << 32
        };
        let engines = cfg
            .visible
            .iter()
            .enumerate()
            .map(|(i, &p)| Arc::new(crate::engine::Engine::new(p, seed.wrapping_add(i as u64))))
            .collect();
        let primary = (0..cfg.visible.len())
            .map(|d| {
                let c = Arc::new(Ctx::new(d, 0, true));
                CTXS.insert(c.clone());
                c
            })
            .collect();
        // SAFETY: registering plain extern "C" fns that never unwind.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(in_forked_child));
        }
        Ok(Driver {
            cfg,
            shm,
            arenas,
            capacity,
            primary,
            trace,
            engines,
            null_next: AtomicU64::new(1 << 44),
        })
    }

    pub(crate) fn null(&self) -> bool {
        self.cfg.null
    }

    pub(crate) fn ndev(&self) -> usize {
        self.cfg.visible.len()
    }

    pub(crate) fn check_dev(&self, dev: i32) -> Res<usize> {
        if dev < 0 || dev as usize >= self.ndev() {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        Ok(dev as usize)
    }

    pub(crate) fn phys(&self, dev: usize) -> usize {
        self.cfg.visible[dev]
    }

    pub(crate) fn flush_trace(&self) {
        if let Some(t) = &self.trace {
            t.flush();
        }
    }

    /// Records that this process holds a context on visible device `dev`
    /// (the simulated NVML lists it as a running process there).
    pub(crate) fn mark_active(&self, dev: usize) {
        if let Some(s) = &self.shm {
            s.mark_active(self.phys(dev));
        }
    }

    /// Charges `bytes` (already rounded) against the shared device.
    pub(crate) fn charge(&self, dev: usize, bytes: u64) -> Res {
        self.mark_active(dev);
        match &self.shm {
            None => Ok(()),
            Some(s) if s.charge(self.phys(dev), bytes) => Ok(()),
            Some(_) => Err(CUDA_ERROR_OUT_OF_MEMORY),
        }
    }

    pub(crate) fn uncharge(&self, dev: usize, bytes: u64) {
        if let Some(s) = &self.shm {
            s.uncharge(self.phys(dev), bytes);
        }
    }

    pub(crate) fn mem_info(&self, dev: usize) -> (u64, u64) {
        match &self.shm {
            None => (self.capacity[dev], self.capacity[dev]),
            Some(s) => s.mem_info(self.phys(dev)),
        }
    }

    /// Device allocation: shared accounting first, then the local arena.
    pub(crate) fn alloc(&self, dev: usize, bytes: u64) -> Res<u64> {
        if self.null() {
            let n = bytes.max(1).div_ceil(256) * 256;
            return Ok(self.null_next.fetch_add(n, Relaxed));
        }
        crate::api::ipc::reclaim_let_go(self);
        let c = charged(bytes);
        self.charge(dev, c)?;
        match self.arenas[dev].alloc(c as usize) {
            Some(p) => Ok(p as u64),
            None => {
                self.uncharge(dev, c);
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    pub(crate) fn free(&self, ptr: u64) -> Res {
        if self.null() {
            return Ok(());
        }
        if ptr == 0 {
            return Ok(());
        }
        for (d, a) in self.arenas.iter().enumerate() {
            if a.contains(ptr as usize, 1) {
                if a.range_of(ptr as usize)
                    .is_some_and(|(base, _)| base == ptr as usize)
                    && crate::api::ipc::freed_while_mapped(d, ptr)
                {
                    return Ok(());
                }
                let len = a.free(ptr as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
                self.uncharge(d, len as u64);
                return Ok(());
            }
        }
        Err(CUDA_ERROR_INVALID_VALUE)
    }

    /// Device of a device pointer range (arena or VMM reservation).
    pub(crate) fn dev_of(&self, ptr: u64, len: usize) -> Option<usize> {
        for (d, a) in self.arenas.iter().enumerate() {
            if a.contains(ptr as usize, len) {
                return Some(d);
            }
        }
        crate::api::vmm::vmm_dev(ptr as usize, len)
            .or_else(|| crate::api::ipc::imported_dev(ptr, len))
    }

    /// Validates that `[ptr, ptr+len)` is device memory.
    pub(crate) fn check_dptr(&self, ptr: u64, len: usize) -> Res {
        if self.null() || len == 0 {
            return Ok(());
        }
        if ptr == 0 || self.dev_of(ptr, len).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }
}

/// Unique ids for streams.
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Relaxed)
}
