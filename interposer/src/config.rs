//! Environment configuration, read once (at load time, from the library
//! constructor) and never on a hot path.
//!
//! | variable | meaning |
//! |---|---|
//! | `DILU_REAL_LIBCUDA` | path (or soname) of the real driver to `dlopen`; default `libcuda.so.1` |
//! | `DILU_CALL_REPORT` | file to which one JSON line of call counters is appended at exit |
//! | `DILU_LOG` | `tracing` `EnvFilter` directive (e.g. `debug`); logging is off when unset |
//!
//! A variable that is set but unusable stops the process with one line naming
//! it and the accepted forms (fail closed).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::OnceLock;

pub struct Config {
    pub real_libcuda: Option<CString>,
    pub call_report: Option<PathBuf>,
    pub log: Option<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process configuration (read on first use).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(read)
}

fn read() -> Config {
    Config {
        real_libcuda: nonempty("DILU_REAL_LIBCUDA", "a path or soname of the real libcuda")
            .map(|v| CString::new(v.into_vec()).expect("env values contain no NUL")),
        call_report: nonempty("DILU_CALL_REPORT", "a file path").map(PathBuf::from),
        log: nonempty(
            "DILU_LOG",
            "a tracing filter such as `debug` or `dilu_interposer=trace`",
        )
        .map(|v| match v.into_string() {
            Ok(s) => s,
            Err(v) => fail("DILU_LOG", &v, "a UTF-8 tracing filter such as `debug`"),
        }),
    }
}

fn nonempty(var: &str, accepted: &str) -> Option<OsString> {
    let v = std::env::var_os(var)?;
    if v.is_empty() {
        fail(var, &v, accepted);
    }
    Some(v)
}

/// Prints one line naming the variable and the accepted forms, then exits.
pub fn fail(var: &str, value: &OsString, accepted: &str) -> ! {
    eprintln!("dilu-interposer: invalid {var}={value:?}; expected {accepted}");
    std::process::exit(2)
}
