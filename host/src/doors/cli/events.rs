//! `--events FILE|fd:N`: versioned lifecycle events of a run as JSON lines, for tools that
//! follow a run: `run_started`, one `progress` event per progress entry (and `run_settled`,
//! what the attempt consumed, after its `attemptEnded`), `run_finished` with the terminal
//! envelope. Every line carries `"version": 1`.

use anyhow::{bail, Context, Result};
use factory_host::{ProgressEntry, RunEnvelope, RunSettled};
use serde_json::{json, Value};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// The format version written in every event.
pub const EVENTS_VERSION: u32 = 1;

/// Where events go (shared by the progress renderer and the run driver).
#[derive(Clone)]
pub struct EventSink {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    run_id: Arc<Mutex<Option<String>>>,
}

impl EventSink {
    /// Open `FILE` (created or truncated) or `fd:N` (an open descriptor the caller passed).
    pub fn open(spec: &str) -> Result<EventSink> {
        let out: Box<dyn Write + Send> = match spec.strip_prefix("fd:") {
            Some(n) => {
                let fd: i32 = n.parse().with_context(|| format!("--events {spec}: not a descriptor number"))?;
                if fd < 3 {
                    bail!("--events {spec}: use a descriptor above 2 (stdin, stdout and stderr are taken)");
                }
                if nix::fcntl::fcntl(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }, nix::fcntl::FcntlArg::F_GETFD)
                    .is_err()
                {
                    bail!("--events {spec}: descriptor {fd} is not open");
                }
                // SAFETY: the caller handed us this open descriptor for our exclusive use (as
                // in `3>events.jsonl`); it was checked open above and above stderr.
                Box::new(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
            }
            // Created owner-only: events carry factory output the user may not want shared.
            None => Box::new(
                factory_host::access::create_private_file(std::path::Path::new(spec))
                    .with_context(|| format!("--events {spec}"))?,
            ),
        };
        Ok(EventSink { out: Arc::new(Mutex::new(out)), run_id: Arc::new(Mutex::new(None)) })
    }

    fn write(&self, mut event: Value) {
        if let Some(obj) = event.as_object_mut() {
            obj.insert("version".into(), json!(EVENTS_VERSION));
        }
        // One write per line (the sink is unbuffered, so a reader never sees half a line
        // and a line costs one syscall, not one per piece).
        let mut line = event.to_string().into_bytes();
        line.push(b'\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // A reader that went away must not take the run down with it.
        let _ = out.write_all(&line).and_then(|_| out.flush());
    }

    /// The run exists.
    pub fn started(&self, run_id: &str) {
        *self.run_id.lock().unwrap_or_else(|p| p.into_inner()) = Some(run_id.to_string());
        self.write(json!({ "event": "run_started", "runId": run_id }));
    }

    /// A progress entry.
    pub fn progress(&self, entry: &ProgressEntry) {
        let run_id = self.run_id.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut event = json!({ "event": "progress", "runId": run_id });
        if let (Some(obj), Ok(Value::Object(entry))) = (event.as_object_mut(), serde_json::to_value(entry)) {
            obj.insert("entry".into(), Value::Object(entry));
        }
        self.write(event);
        // An attempt's end is also told as `run_settled`, with what the attempt consumed.
        if let Some(Ok(Value::Object(mut settled))) =
            RunSettled::of(run_id.as_deref().unwrap_or_default(), &entry.event).map(serde_json::to_value)
        {
            settled.insert("event".into(), json!("run_settled"));
            self.write(Value::Object(settled));
        }
    }

    /// The attempt ended with this envelope.
    pub fn finished(&self, envelope: &RunEnvelope) {
        self.write(json!({ "event": "run_finished", "runId": envelope.run_id, "envelope": envelope }));
    }
}
