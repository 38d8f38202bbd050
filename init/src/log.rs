//! Logging for every role of the node binary: one line per event, to the console (fd 2, which the
//! kernel opened on /dev/console before it ran us) and to the kernel log (/dev/kmsg), from the first
//! instruction of PID 1 on.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Installs the global subscriber for `role` (`init`, `agent`, ...). `filter` is an `EnvFilter`
/// directive such as `info` or `info,runtime=debug`; a bad directive falls back to `info`.
pub fn install(role: &'static str, filter: &str) {
    install_with_console(role, filter, None);
}

/// Like [`install`], but console lines go to `console` instead of fd 2. The runtime role uses a
/// close-on-exec duplicate of fd 2: libcontainer's children log through this subscriber after
/// they have put the container's stdio on fds 0-2 (docs/RUNTIME-NOTES.md P3).
pub fn install_with_console(role: &'static str, filter: &str, console: Option<File>) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let mut writer = LineWriter::new();
    writer.console = console.map(Arc::new);
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .event_format(LineFormat { role })
        .with_writer(writer)
        .finish();
    // A second install (tests) keeps the first subscriber; nothing else can fail here.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// `role: message k=v`, with `warn: ` / `error: ` after the role for those levels.
struct LineFormat {
    role: &'static str,
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        write!(writer, "{}: ", self.role)?;
        if level == Level::ERROR {
            write!(writer, "error: ")?;
        } else if level == Level::WARN {
            write!(writer, "warn: ")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Writes every formatted line to the console and to /dev/kmsg (when it can be opened).
#[derive(Clone)]
struct LineWriter {
    kmsg: Arc<Mutex<Option<File>>>,
    console: Option<Arc<File>>,
}

impl LineWriter {
    fn new() -> Self {
        let kmsg = OpenOptions::new().write(true).open("/dev/kmsg").ok();
        Self {
            kmsg: Arc::new(Mutex::new(kmsg)),
            console: None,
        }
    }
}

/// One event's output, flushed as one console write and one kmsg record on drop.
struct EventBuffer {
    buf: Vec<u8>,
    priority: u8,
    kmsg: Arc<Mutex<Option<File>>>,
    console: Option<Arc<File>>,
}

impl Write for EventBuffer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        // Errors writing a log line have nowhere to go; they are dropped on purpose.
        let _ = match &self.console {
            Some(f) => (&**f).write_all(&self.buf),
            None => io::stderr().write_all(&self.buf),
        };
        if let Ok(mut guard) = self.kmsg.lock()
            && let Some(kmsg) = guard.as_mut()
        {
            let mut rec = format!("<{}>", self.priority).into_bytes();
            rec.extend_from_slice(&self.buf);
            let _ = kmsg.write_all(&rec);
        }
    }
}

impl<'a> MakeWriter<'a> for LineWriter {
    type Writer = EventBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        EventBuffer {
            buf: Vec::new(),
            priority: 6,
            kmsg: self.kmsg.clone(),
            console: self.console.clone(),
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        let priority = match *meta.level() {
            Level::ERROR => 3,
            Level::WARN => 4,
            Level::INFO => 6,
            _ => 7,
        };
        EventBuffer {
            buf: Vec::new(),
            priority,
            kmsg: self.kmsg.clone(),
            console: self.console.clone(),
        }
    }
}
