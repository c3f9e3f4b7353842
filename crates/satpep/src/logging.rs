//! The proxy's log output: plain text for a terminal, syslog priority prefixes when stderr
//! is the systemd journal (so `journalctl -p warning` finds warnings), or JSON lines for
//! log shippers.
//!
//! tracing-journald (the journal's native protocol, one journal field per event field) was
//! declined: it writes to the journal's socket, which only a host running systemd has, while
//! the priority prefix works through the stream systemd already gives the unit (stderr) and
//! needs no dependency; structured fields are there with `--log-format json`.

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// journal when stderr is the systemd journal, else text.
    Auto,
    /// Time, level, target and fields, one line per event.
    Text,
    /// Syslog priority prefix (`<4>` warning, `<6>` info, …) and no time: the journal
    /// stamps and ranks each line itself.
    Journal,
    /// One JSON object per line (time, level, target, fields).
    Json,
}

/// The syslog priority of a tracing level, as sd-daemon(3)'s prefixes number them.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Prefixes each line of the inner format with its priority (`<N>`).
struct Journal<F>(F);

impl<S, N, F> FormatEvent<S, N> for Journal<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
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

/// Whether `fd` is the stream systemd connected to the journal: `JOURNAL_STREAM` holds its
/// device and inode ("dev:ino"), as systemd.exec(5) describes.
pub fn is_journal_stream(journal_stream: Option<&str>, fd: i32) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat writes one stat struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    st.st_dev == dev && st.st_ino == ino
}

/// The format `auto` stands for here.
pub fn resolve(f: LogFormat) -> LogFormat {
    match f {
        LogFormat::Auto
            if is_journal_stream(std::env::var("JOURNAL_STREAM").ok().as_deref(), 2) =>
        {
            LogFormat::Journal
        }
        LogFormat::Auto => LogFormat::Text,
        f => f,
    }
}

/// The journal's line format: priority prefix, level, target and fields, no time, no colour.
fn journal_format() -> Journal<Format<tracing_subscriber::fmt::format::Full, ()>> {
    Journal(
        tracing_subscriber::fmt::format()
            .without_time()
            .with_ansi(false),
    )
}

/// Installs the global subscriber: `format` on stderr, filtered by RUST_LOG (default info).
pub fn init(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match resolve(format) {
        LogFormat::Journal => builder.event_format(journal_format()).init(),
        LogFormat::Json => builder.json().init(),
        _ => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::sync::{Arc, Mutex};

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn journal_lines_carry_their_priority_and_no_time() {
        let buf = Buf::default();
        let w = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_max_level(Level::DEBUG)
            .with_writer(move || w.clone())
            .event_format(journal_format())
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(limit = 3, "limit reached");
            tracing::info!("summary");
            tracing::debug!(target: "satpep::connection", src = "198.18.1.2:1", "split");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(
            lines[0].starts_with("<4>") && lines[0].contains("limit reached limit=3"),
            "{out}"
        );
        assert!(lines[1].starts_with("<6>"), "{out}");
        assert!(
            lines[2].starts_with("<7>") && lines[2].contains("satpep::connection"),
            "{out}"
        );
        // No timestamp before the level: the journal adds its own.
        assert!(lines[1][3..].trim_start().starts_with("INFO"), "{out}");
    }

    #[test]
    fn the_journal_stream_is_recognised_by_device_and_inode() {
        let f = std::fs::File::create(
            std::env::temp_dir().join(format!("satpep-journal-{}", std::process::id())),
        )
        .unwrap();
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(f.as_raw_fd(), &mut st) }, 0);
        let me = format!("{}:{}", st.st_dev, st.st_ino);
        assert!(is_journal_stream(Some(&me), f.as_raw_fd()));
        let other = format!("{}:{}", st.st_dev, st.st_ino + 1);
        assert!(!is_journal_stream(Some(&other), f.as_raw_fd()));
        assert!(!is_journal_stream(None, f.as_raw_fd()));
        assert!(!is_journal_stream(Some("garbage"), f.as_raw_fd()));
    }
}
