//! The binary's logs: `tracing` initialised once, before any front door runs. `RUST_LOG`
//! filters (default [`DEFAULT_FILTER`]: warnings from dependencies, `info` from factory's
//! own code); `--log-format human` (the default, coloured on a terminal) or `json` (one
//! object per line) on stderr. The service (`factory serve`, by hand or started by a front
//! door) also writes its log to `<state-dir>/serve.log` ([`ServiceLog`]): owner-only
//! (0600), never through a symlink, and rotated to `serve.log.1` when it would pass
//! [`SERVICE_LOG_MAX_BYTES`], so the two files never hold more than twice that. That file
//! is always JSON lines, whatever `--log-format` says, so one record is one line: a guest's
//! label or a server's message holding a line break cannot forge a record there. A service
//! started by a front door has that file for its stderr too, so what it says ([`say`]: its
//! banners) is written there as JSON records as well. A panic anywhere is logged as one
//! `error` event before Rust's own report (left out when stderr is the service log).
//!
//! Traces: off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! is set (and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`); then the
//! spans the host opens ([`factory_host::trace`]) and factory's warnings inside them are
//! exported over OTLP HTTP/protobuf by the OpenTelemetry SDK's batch processor: a bounded
//! queue (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048) on a thread of its own, so export never
//! blocks or fails a run; spans that do not fit are dropped and counted by the SDK, which
//! says so when it shuts down. `OTEL_SERVICE_NAME` names the service (default `factory`).
//!
//! Metrics: exported over OTLP HTTP/protobuf too when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set (and neither `OTEL_SDK_DISABLED=true` nor
//! `OTEL_METRICS_EXPORTER=none`): the metrics `/metrics` serves, under the same names
//! ([`factory_host::metrics::export_to`]), cumulative, read every
//! `OTEL_METRIC_EXPORT_INTERVAL` milliseconds (default 60000) by the SDK's periodic reader on
//! a thread of its own, and once more when the process stops.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The service's log file in the state directory.
pub const LOG_FILE: &str = "serve.log";

/// What `RUST_LOG` is when unset (or unparseable): dependencies' warnings, factory's info.
pub const DEFAULT_FILTER: &str = "warn,factory_host=info,factory=info";

/// The service log's size bound: past it, the file is rotated to `serve.log.1`.
pub const SERVICE_LOG_MAX_BYTES: u64 = 8 << 20;

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// For people: one line per event, coloured on a terminal.
    #[default]
    Human,
    /// For machines: one JSON object per line (`timestamp`, `level`, `target`, `fields`, spans).
    Json,
}

/// The filter of one layer: `RUST_LOG`, else [`DEFAULT_FILTER`].
fn filter() -> (EnvFilter, Option<String>) {
    match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => match EnvFilter::try_new(&text) {
            Ok(filter) => (filter, None),
            Err(e) => (
                EnvFilter::new(DEFAULT_FILTER),
                Some(format!("RUST_LOG={text:?} is not a filter ({e}); using {DEFAULT_FILTER}")),
            ),
        },
        _ => (EnvFilter::new(DEFAULT_FILTER), None),
    }
}

/// One fmt layer in `format` over `writer`.
fn fmt_layer<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter, _) = filter();
    match format {
        LogFormat::Human => {
            tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi).with_filter(filter).boxed()
        }
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(false)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    }
}

/// Start logging: stderr always (unless `stderr` is false: a service whose stderr is its
/// log file already), and the service log when `service_log` names a state directory.
/// Errors opening the service log are returned (the service must not run without its log).
pub fn init(format: LogFormat, service_log: Option<&Path>, stderr: bool) -> std::io::Result<()> {
    let (_, bad_filter) = filter();
    let mut layers: Vec<Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>> = Vec::new();
    if stderr {
        let ansi = format == LogFormat::Human && std::io::IsTerminal::is_terminal(&std::io::stderr());
        layers.push(fmt_layer(format, std::io::stderr, ansi));
    }
    if let Some(state_dir) = service_log {
        let log = ServiceLog::open(state_dir.join(LOG_FILE), SERVICE_LOG_MAX_BYTES)?;
        if !stderr {
            // stderr is this file (a service started by a front door): say it there.
            let _ = SAY_TO.set(log.clone());
        }
        layers.push(fmt_layer(LogFormat::Json, log, false));
    }
    let traces =
        if wanted("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") { Some(otel_layer()) } else { None };
    let metrics_failed = match wanted("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") {
        true => otel_metrics().err(),
        false => None,
    };
    let traces_failed = match traces {
        Some(Ok(layer)) => {
            layers.push(layer);
            None
        }
        Some(Err(e)) => Some(e),
        None => None,
    };
    // A second initialisation (none today) keeps the first.
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some(message) = bad_filter {
        tracing::warn!("{message}");
    }
    if let Some(e) = traces_failed {
        tracing::warn!(error = %e, "cannot export traces over OTLP; running without them");
    }
    if let Some(e) = metrics_failed {
        tracing::warn!(error = %e, "cannot export metrics over OTLP; running without them");
    }
    install_panic_hook();
    Ok(())
}

/// Where [`say`] writes when stderr is the service log.
static SAY_TO: OnceLock<ServiceLog> = OnceLock::new();

/// Whether [`say`] writes to the service log (this process's stderr is that file).
pub fn says_to_log() -> bool {
    SAY_TO.get().is_some()
}

/// Say `text` to the person running the command: a line on stderr, or, in a service whose
/// stderr is its log file, an `INFO` record of that log (JSON, whatever `RUST_LOG` says:
/// the banners a front door and the tests read).
pub fn say(text: &str) {
    match SAY_TO.get() {
        Some(log) => {
            let record = serde_json::json!({
                "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
                "level": "INFO",
                "fields": { "message": text },
                "target": "factory::serve",
            });
            let mut log = log.clone();
            let _ = log.write_all(format!("{record}\n").as_bytes());
        }
        // It may quote a factory's name or a session's (recovered runs): escaped.
        None => eprintln!("{}", crate::doors::cli::escape::esc(text)),
    }
}

/// The trace pipeline, once set up: flushed by [`shutdown`].
static TRACES: OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = OnceLock::new();

/// The metric pipeline, once set up: flushed by [`shutdown`].
static METRICS: OnceLock<opentelemetry_sdk::metrics::SdkMeterProvider> = OnceLock::new();

/// Whether the standard variables ask for one signal's export: an endpoint (the common one
/// or the signal's own `endpoint_var`), the SDK not disabled, its `exporter_var` not `none`.
fn wanted(exporter_var: &str, endpoint_var: &str) -> bool {
    let var = |k: &str| std::env::var(k).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let none = var(exporter_var).is_some_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && !none && (var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() || var(endpoint_var).is_some())
}

/// The resource both signals carry: `service.name` from `OTEL_SERVICE_NAME`, else `factory`.
fn resource() -> opentelemetry_sdk::Resource {
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").map_or(true, |v| v.trim().is_empty()) {
        resource = resource.with_service_name("factory");
    }
    resource.build()
}

/// The metric pipeline: the host's metrics recorded on a meter whose periodic reader exports
/// over OTLP (endpoint, headers, timeout and interval from the standard variables).
fn otel_metrics() -> Result<(), opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).build();
    let provider =
        opentelemetry_sdk::metrics::SdkMeterProvider::builder().with_reader(reader).with_resource(resource()).build();
    if factory_host::metrics::export_to(provider.meter("factory")) {
        let _ = METRICS.set(provider);
    }
    Ok(())
}

/// The layer that hands the host's spans to the OTLP exporter (endpoint, headers and
/// timeout from the standard `OTEL_EXPORTER_OTLP_*` variables).
fn otel_layer(
) -> Result<Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>, opentelemetry_otlp::ExporterBuildError> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource())
        .build();
    let tracer = provider.tracer("factory");
    let _ = TRACES.set(provider);
    // The host's spans, and factory's own warnings as events inside them; never a
    // dependency's (the exporter's own logs would loop).
    let targets = tracing_subscriber::filter::Targets::new()
        .with_target(factory_host::trace::TARGET, tracing::Level::INFO)
        .with_target("factory", tracing::Level::WARN);
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_filter(targets)
        .boxed())
}

/// Export what spans are still queued and the metrics once more (each waiting a bounded
/// time), and stop both pipelines.
pub fn shutdown() {
    if let Some(provider) = TRACES.get() {
        if let Err(e) = provider.shutdown_with_timeout(std::time::Duration::from_secs(5)) {
            tracing::warn!(error = %e, "traces: the last spans could not be exported");
        }
    }
    if let Some(provider) = METRICS.get() {
        if let Err(e) = provider.shutdown_with_timeout(std::time::Duration::from_secs(5)) {
            tracing::warn!(error = %e, "metrics: the last values could not be exported");
        }
    }
}

/// Log every panic as one `error` event (with where it happened), then report it as Rust does.
fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        tracing::error!(panic = %what, location = %location, "panicked");
        // Rust's report is free text: not into a log of JSON lines.
        if SAY_TO.get().is_none() {
            previous(info);
        }
    }));
}

/// The service's log file, bounded: a write that would take it past `max` bytes first
/// renames it to `<name>.1` (replacing the previous one) and starts a new file. Opened as
/// the state directory's other files are ([`factory_host::access::private_file_options`]:
/// 0600, no symlink followed, ours alone). Written here rather than with a log-rotation
/// crate because those open files their own way (following symlinks, umask modes).
#[derive(Clone)]
pub struct ServiceLog {
    inner: Arc<Mutex<Open>>,
}

struct Open {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
    max: u64,
}

impl ServiceLog {
    /// Open (or create) the log at `path`, rotated now if it is already over `max`.
    pub fn open(path: PathBuf, max: u64) -> std::io::Result<ServiceLog> {
        let file = open_private_append(&path)?;
        let mut open = Open { len: file.metadata()?.len(), path, file, max };
        if open.len >= max {
            open.rotate()?;
        }
        Ok(ServiceLog { inner: Arc::new(Mutex::new(open)) })
    }
}

fn open_private_append(path: &Path) -> std::io::Result<std::fs::File> {
    let file = factory_host::access::private_file_options().append(true).open(path)?;
    factory_host::access::tighten_open(&file)?;
    Ok(file)
}

impl Open {
    fn rotate(&mut self) -> std::io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = open_private_append(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

impl Write for ServiceLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut open = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if open.len > 0 && open.len.saturating_add(buf.len() as u64) > open.max {
            // A log that cannot rotate keeps writing where it is rather than lose lines.
            let _ = open.rotate();
        }
        // One line longer than the bound is cut (and ended), so the file stays bounded and
        // the next record starts a line of its own.
        let room = usize::try_from(open.max).unwrap_or(usize::MAX).max(1);
        if buf.len() > room {
            let mut cut = buf[..room - 1].to_vec();
            cut.push(b'\n');
            open.file.write_all(&cut)?;
            open.len = open.len.saturating_add(cut.len() as u64);
            return Ok(buf.len());
        }
        let n = open.file.write(buf)?;
        open.len = open.len.saturating_add(n as u64);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).file.flush()
    }
}

impl<'a> MakeWriter<'a> for ServiceLog {
    type Writer = ServiceLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::ServiceLog;
    use std::io::Write;

    #[test]
    fn the_service_log_rotates_once_past_its_bound_and_keeps_one_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.log");
        let mut log = ServiceLog::open(path.clone(), 100).unwrap();
        for _ in 0..30 {
            log.write_all(b"0123456789\n").unwrap();
        }
        let now = std::fs::metadata(&path).unwrap().len();
        let old = std::fs::metadata(dir.path().join("serve.log.1")).unwrap().len();
        assert!(now <= 100 && old <= 100, "each file within the bound: {now}, {old}");
        assert_eq!((now + old) % 11, 0, "whole lines only");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_record_whose_fields_hold_line_breaks_is_one_line_of_the_service_log() {
        use tracing_subscriber::layer::SubscriberExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.log");
        let log = ServiceLog::open(path.clone(), 1 << 20).unwrap();
        let subscriber = tracing_subscriber::registry().with(super::fmt_layer(super::LogFormat::Json, log, false));
        let label = "h:\nfactory serve: pid 1, forged\u{1b}[31m";
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: "factory_host", "agent", label);
            let _in = span.enter();
            tracing::warn!(target: "factory", error = "broken\n{\"forged\":true}\u{7}", "an agent failed");
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "one record, one line: {text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\u{7}'), "{text}");
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(record["spans"][0]["label"], label, "{text}");
        assert_eq!(record["fields"]["error"], "broken\n{\"forged\":true}\u{7}", "{text}");
    }

    #[test]
    fn a_line_past_the_bound_is_cut_and_ended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serve.log");
        let mut log = ServiceLog::open(path.clone(), 10).unwrap();
        log.write_all(b"0123456789abcdef\n").unwrap();
        log.write_all(b"next\n").unwrap();
        let now = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.path().join("serve.log.1")).unwrap();
        assert_eq!((old.as_str(), now.as_str()), ("012345678\n", "next\n"));
    }
}
