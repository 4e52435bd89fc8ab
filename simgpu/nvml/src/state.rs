//! Library state: the init reference count, the opened shared device state
//! and the device handles.

use crate::config::{Config, MAX_DEVICES};
use crate::sampler::Sampler;
use crate::shm::Shm;
use crate::{
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_UNINITIALIZED, Res,
};
use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering::*};

pub(crate) struct State {
    pub instance: String,
    pub shm: Shm,
    pub sampler: Sampler,
}

impl State {
    pub(crate) fn ndev(&self) -> usize {
        self.shm.ndev()
    }
}

static STATE: OnceLock<Result<State, String>> = OnceLock::new();
/// nvmlInit calls not yet matched by nvmlShutdown.
static INITS: AtomicU32 = AtomicU32::new(0);

/// nvmlInit: opens the shared state once per process (it stays mapped after
/// the last nvmlShutdown, so a later nvmlInit is cheap).
pub(crate) fn init() -> Res {
    let state = STATE.get_or_init(|| {
        let cfg = Config::from_env()?;
        let shm = Shm::observe(&cfg.instance, cfg.devices, cfg.memory)?;
        let sampler = Sampler::new(&shm);
        OPENED_BY.store(std::process::id(), Relaxed);
        // SAFETY: registers a plain extern "C" fn that never unwinds.
        unsafe { libc::atexit(leave_at_exit) };
        Ok(State {
            instance: cfg.instance,
            shm,
            sampler,
        })
    });
    match state {
        Ok(_) => {
            INITS.fetch_add(1, AcqRel);
            Ok(())
        }
        Err(msg) => {
            eprintln!("{msg}");
            Err(NVML_ERROR_DRIVER_NOT_LOADED)
        }
    }
}

/// The process that opened the shared state: a child forked from it shares
/// the parent's open file (and its lock) and must not let go of it.
static OPENED_BY: AtomicU32 = AtomicU32::new(0);

/// At exit: the shared device state is removed if this was its last use
/// (the driver's instance files piled up in /dev/shm while every process
/// that also opened NVML kept its own lock on them to the end).
extern "C" fn leave_at_exit() {
    if OPENED_BY.load(Relaxed) != std::process::id() {
        return;
    }
    if let Some(Ok(state)) = STATE.get() {
        state.shm.leave();
    }
}

pub(crate) fn shutdown() -> Res {
    INITS
        .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1))
        .map(|_| ())
        .map_err(|_| NVML_ERROR_UNINITIALIZED)
}

/// The state, if NVML is initialised.
pub(crate) fn state() -> Res<&'static State> {
    if INITS.load(Acquire) == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    match STATE.get() {
        Some(Ok(s)) => Ok(s),
        _ => Err(NVML_ERROR_UNINITIALIZED),
    }
}

/// One cell per possible device: `nvmlDevice_t` is the address of a cell.
#[repr(C)]
pub(crate) struct HandleCell(u64);

static HANDLES: [HandleCell; MAX_DEVICES] = {
    let mut cells = [const { HandleCell(0) }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        cells[i] = HandleCell(i as u64);
        i += 1;
    }
    cells
};

pub(crate) fn handle(index: usize) -> *mut c_void {
    (&HANDLES[index] as *const HandleCell).cast_mut().cast()
}

/// The device index of a handle, validated against the device count.
pub(crate) fn index(state: &State, device: *mut c_void) -> Res<usize> {
    let base = HANDLES.as_ptr() as usize;
    let addr = device as usize;
    let size = std::mem::size_of::<HandleCell>();
    if addr < base || !(addr - base).is_multiple_of(size) {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = (addr - base) / size;
    if i >= state.ndev() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}
