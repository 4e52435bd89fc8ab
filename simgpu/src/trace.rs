//! SIMGPU_TRACE: one JSON line per executed kernel segment, appended with O_APPEND in
//! whole-line write() calls so concurrent processes never interleave.
//!
//! The lines are written by a thread of their own, not by the device
//! engine or the synchronising thread that fills them: a write() to a disk
//! file may block for milliseconds (journal commits, writeback), and the
//! trace is a measuring instrument, which must not add that to the latency
//! of the program it measures. At exit every line handed over is written
//! before the process ends.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::time::Duration;

const FLUSH_AT: usize = 64 << 10;
/// How long the exit waits for the writer to write what it was handed.
const EXIT_WAIT: Duration = Duration::from_secs(10);

pub(crate) struct Trace {
    fd: i32,
    buf: Mutex<String>,
    writer: Mutex<Writer>,
}

/// The writer thread, started with the first lines handed over.
enum Writer {
    NotStarted,
    Running(Sender<Chunk>),
    /// It could not be started: the thread that hands lines over writes them.
    Unavailable,
}

enum Chunk {
    Lines(String),
    /// Answered once everything handed over before it is written.
    Written(SyncSender<()>),
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
            writer: Mutex::new(Writer::NotStarted),
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
            let lines = std::mem::take(&mut *b);
            drop(b);
            self.hand_over(lines);
        }
    }

    /// Hands the lines gathered so far to the writer (a synchronisation:
    /// the trace then holds every kernel that completed before it, as soon
    /// as the writer has written them).
    pub(crate) fn flush(&self) {
        let lines = std::mem::take(&mut *self.buf.lock().unwrap_or_else(|e| e.into_inner()));
        if !lines.is_empty() {
            self.hand_over(lines);
        }
    }

    /// At exit: hands over the last lines and waits until the writer has
    /// written everything.
    pub(crate) fn flush_and_wait(&self) {
        self.flush();
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Writer::Running(tx) = &*writer {
            let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
            if tx.send(Chunk::Written(done_tx)).is_ok() {
                let _ = done_rx.recv_timeout(EXIT_WAIT);
            }
        }
    }

    fn hand_over(&self, lines: String) {
        let mut writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if let Writer::NotStarted = *writer {
            let (tx, rx) = std::sync::mpsc::channel();
            let fd = self.fd;
            let spawned = std::thread::Builder::new()
                .name("simgpu-trace".into())
                .spawn(move || write_lines(fd, rx));
            *writer = match spawned {
                Ok(_) => Writer::Running(tx),
                Err(_) => Writer::Unavailable,
            };
        }
        match &*writer {
            Writer::Running(tx) => {
                if let Err(std::sync::mpsc::SendError(Chunk::Lines(lines))) =
                    tx.send(Chunk::Lines(lines))
                {
                    write_all(self.fd, lines.as_bytes());
                }
            }
            _ => write_all(self.fd, lines.as_bytes()),
        }
    }
}

/// The writer thread: writes each chunk in the order handed over.
fn write_lines(fd: i32, rx: Receiver<Chunk>) {
    for chunk in rx {
        match chunk {
            Chunk::Lines(lines) => write_all(fd, lines.as_bytes()),
            Chunk::Written(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: fd is open for the life of the process; bytes is a valid
        // readable slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        bytes = &bytes[n as usize..];
    }
}
