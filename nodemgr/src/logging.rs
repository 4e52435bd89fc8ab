//! How the daemon logs. It never forks or detaches in either mode (systemd
//! runs it as `Type=notify` and supervises the process it started); what
//! `dilu nodemgr --foreground` changes is who reads the log:
//!
//! - **service mode** (default, what the systemd unit uses): one plain line
//!   per event on stderr, starting with its syslog priority as `<N>`
//!   (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug), which journald
//!   turns into the entry's priority; no timestamps (the journal adds its
//!   own) and no colour.
//! - **`--foreground`** (a person at a terminal): timestamped lines with the
//!   level spelled out, and a one-line banner saying where the daemon
//!   listens once it is ready.
//!
//! `DILU_LOG` filters either way (`info` by default; e.g. `debug`,
//! `dilu_nodemgr=debug`).

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{self, Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The variable that filters the daemon's log.
pub const FILTER_ENV: &str = "DILU_LOG";

/// The syslog priority of a level (sd-daemon(3) prefixes).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Service-mode lines: `<N>` then the message and its fields.
struct Journald(Format<Full, ()>);

impl<S, N> FormatEvent<S, N> for Journald
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Installs the logger for `dilu nodemgr` (see the module documentation).
pub fn init(foreground: bool) {
    let filter = std::env::var(FILTER_ENV).unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = if foreground {
        builder.try_init()
    } else {
        let plain = format::format()
            .with_ansi(false)
            .without_time()
            .with_level(false)
            .with_target(false);
        builder.event_format(Journald(plain)).try_init()
    };
}
