//! A process stopped (SIGSTOP) for as long as a guard lives: a daemon that
//! stalls, as an overloaded or frozen node's does. Its socket still takes
//! connections (the kernel queues them), but nothing reads or answers them.

use std::process::Command;

/// Resumes the process (SIGCONT) when dropped, whatever failed meanwhile.
pub struct Stalled(u32);

/// Stops process `pid` until the guard is dropped.
pub fn stall(pid: u32) -> Stalled {
    assert!(signal("-STOP", pid), "kill -STOP {pid} failed");
    Stalled(pid)
}

impl Drop for Stalled {
    fn drop(&mut self) {
        // Maybe while a test panics: never panic here.
        signal("-CONT", self.0);
    }
}

/// Sends signal `name` (as `kill` spells it) to `pid`; whether it went.
fn signal(name: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([name, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}
