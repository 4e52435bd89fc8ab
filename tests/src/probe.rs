//! A `mem-probe` tenant process (see `src/bin/mem_probe.rs`) driven one
//! command per line, for the node manager's end-to-end tests.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct Probe {
    pub child: Child,
    pub stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Probe {
    /// Starts `command` (`dilu run ... -- mem-probe`) with its standard
    /// input and output piped to this handle.
    pub fn spawn(mut command: Command) -> Probe {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start mem-probe");
        Probe {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// Sends one command and returns the probe's one-line answer.
    pub fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("the probe reads commands");
        self.stdin.flush().unwrap();
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).unwrap();
        assert!(n > 0, "the probe exited while answering {command:?}");
        line.trim_end().to_string()
    }

    pub fn alloc(&mut self, bytes: u64) -> String {
        self.ask(&format!("alloc {bytes}"))
    }

    /// Ends the probe's input and checks that it exits cleanly.
    pub fn finish(mut self) {
        drop(self.stdin);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the probe exits cleanly: {status}");
    }
}
