//! What the workload binaries share: their `main` (parse the options, exit
//! 2 with the usage on a bad one; run; print the summary, exit 1 on an
//! error), and the request-style shapes [`RequestShape`] that the SM-time
//! tests and the accuracy benchmark run through `cudarc-loop`.

use std::process::ExitCode;

pub fn main<O, E: std::fmt::Display>(
    name: &str,
    usage: &str,
    parse: impl FnOnce() -> Result<O, String>,
    run: impl FnOnce(&O) -> Result<String, E>,
) -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{name}: {message}\n{usage}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// How often a request-style workload synchronises: after every k launches
/// per stream, or never (the stream never drains).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncEvery {
    Launches(u32),
    Never,
}

impl SyncEvery {
    /// The shapes the SM-time matrix covers: one request of 1, 4 or 16
    /// kernels at a time (what an inference server does), and a pipeline
    /// that never drains (what training does).
    pub const ALL: [SyncEvery; 4] = [
        SyncEvery::Launches(1),
        SyncEvery::Launches(4),
        SyncEvery::Launches(16),
        SyncEvery::Never,
    ];

    fn arg(self) -> String {
        match self {
            SyncEvery::Launches(k) => k.to_string(),
            SyncEvery::Never => "never".into(),
        }
    }
}

/// Kernel lengths on simgpu's default cost model (132 SMs, 10 µs a wave).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSize {
    Us20,
    Us100,
    Ms1,
    /// Longer than a time slice (2.08 ms): preempted mid-kernel whenever
    /// another process has work (a 4096² fp32 matmul on an H100 is 2.7 ms).
    Ms3,
}

impl KernelSize {
    pub fn blocks(self) -> u32 {
        match self {
            KernelSize::Us20 => 264,
            KernelSize::Us100 => 1320,
            KernelSize::Ms1 => 13200,
            KernelSize::Ms3 => 39600,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            KernelSize::Us20 => "20 µs",
            KernelSize::Us100 => "100 µs",
            KernelSize::Ms1 => "1 ms",
            KernelSize::Ms3 => "3 ms",
        }
    }
}

/// A request-style workload for `cudarc-loop`: `sync` launches per stream
/// then a synchronisation, kernels of one size, on `streams` streams, or
/// CUDA graphs of `graph` kernels (one stream) launched the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestShape {
    pub sync: SyncEvery,
    pub kernel: KernelSize,
    pub streams: usize,
    pub graph: Option<u32>,
}

impl RequestShape {
    pub fn name(&self) -> String {
        let k = match self.sync {
            SyncEvery::Launches(k) => format!("k={k}"),
            SyncEvery::Never => "k=never".into(),
        };
        match self.graph {
            Some(kernels) => format!("{k}, graphs of {kernels} × {}", self.kernel.label()),
            None if self.streams == 1 => format!("{k}, {}, 1 stream", self.kernel.label()),
            None => format!("{k}, {}, {} streams", self.kernel.label(), self.streams),
        }
    }

    /// `cudarc-loop` arguments running this shape for `seconds`.
    pub fn loop_args(&self, seconds: f64) -> Vec<String> {
        let mut args = vec![
            "--seconds".to_string(),
            seconds.to_string(),
            "--depth".into(),
            self.sync.arg(),
            "--blocks".into(),
            self.kernel.blocks().to_string(),
            "--streams".into(),
            self.streams.to_string(),
        ];
        if let Some(kernels) = self.graph {
            args.extend(["--graph".into(), kernels.to_string()]);
        }
        args
    }
}
