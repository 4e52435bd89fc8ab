//! SIMGPU_TRACE: one JSON line per executed kernel segment, appended with O_APPEND in
//! whole-line write() calls so concurrent processes never interleave.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::Mutex;

const FLUSH_AT: usize = 64 << 10;

pub(crate) struct Trace {
    fd: i32,
    buf: Mutex<String>,
}

pub(crate) struct KernelRecord<'a> {
    pub device: usize,
    pub stream: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: &'a str,
    pub blocks: u64,
    pub graph: bool,
    /// Per-process kernel number: the segments of one kernel share it.
    pub kernel: u64,
    /// Segment number within the kernel (0 = first).
    pub segment: u32,
    /// Whether this segment ends the kernel.
    pub last: bool,
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl Trace {
    pub(crate) fn open(path: &str) -> Result<Trace, String> {
        let c = CString::new(path).map_err(|_| {
            crate::config::bad("SIMGPU_TRACE", path, "a file path without NUL bytes")
        })?;
        // SAFETY: c is a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd < 0 {
            return Err(format!(
                "simgpu: SIMGPU_TRACE={path:?} cannot be opened for appending: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Trace {
            fd,
            buf: Mutex::new(String::new()),
        })
    }

    pub(crate) fn kernel(&self, r: &KernelRecord) {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let _ = write!(
            b,
            "{{\"pid\":{},\"device\":{},\"stream\":{},\"start_ns\":{},\"end_ns\":{},\"name\":",
            std::process::id(),
            r.device,
            r.stream,
            r.start_ns,
            r.end_ns
        );
        json_str(&mut b, r.name);
        let _ = writeln!(
            b,
            ",\"blocks\":{},\"graph\":{},\"kernel\":{},\"segment\":{},\"last\":{}}}",
            r.blocks, r.graph, r.kernel, r.segment, r.last
        );
        if b.len() >= FLUSH_AT {
            self.write_out(&mut b);
        }
    }

    pub(crate) fn flush(&self) {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        self.write_out(&mut b);
    }

    fn write_out(&self, b: &mut String) {
        let mut bytes = b.as_bytes();
        while !bytes.is_empty() {
            // SAFETY: fd is open; bytes is a valid readable slice.
            let n = unsafe { libc::write(self.fd, bytes.as_ptr().cast(), bytes.len()) };
            if n <= 0 {
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                break;
            }
            bytes = &bytes[n as usize..];
        }
        b.clear();
    }
}
