//! Progress on stderr: an indicatif spinner line (phase, agents queued/running/done,
//! elapsed) on a terminal; plain timestamped lines otherwise, so logs stay readable.
//! Guest-chosen text (phases, log lines, labels) is shown escaped ([`crate::doors::cli::escape::esc`]).
//! Phases, agent outcomes and warnings are coloured when `--color`/`NO_COLOR` allow it
//! ([`crate::doors::cli::conventions::stderr_colored`]); the text is the same either way.

use crate::doors::cli::conventions::{paint, stderr_colored};
use crate::doors::cli::escape::esc;
use anstyle::{AnsiColor, Style};
use crate::doors::cli::events::EventSink;
use factory_host::{ProgressEntry, ProgressEvent};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Default)]
struct Counts {
    queued: HashMap<String, u32>,
    running: u64,
    done: u64,
    failed: u64,
    replayed: u64,
}

impl Counts {
    fn queued(&self) -> u64 {
        self.queued.values().map(|n| u64::from(*n)).sum()
    }

    fn apply(&mut self, event: &ProgressEvent) {
        match event {
            ProgressEvent::AgentQueued { label } => *self.queued.entry(label.clone()).or_default() += 1,
            ProgressEvent::AgentStarted { label, attempt } => {
                if let Some(n) = self.queued.get_mut(label) {
                    *n = n.saturating_sub(1);
                }
                if *attempt == 0 {
                    self.running += 1;
                }
            }
            ProgressEvent::AgentFinished { summary, cached: false } => {
                self.running = self.running.saturating_sub(1);
                self.done += 1;
                if !summary.ok() {
                    self.failed += 1;
                }
            }
            ProgressEvent::AgentFinished { cached: true, .. } => self.replayed += 1,
            _ => {}
        }
    }

    fn summary(&self) -> String {
        format!(
            "agents: {} queued, {} running, {} done ({} failed), {} replayed",
            self.queued(),
            self.running,
            self.done,
            self.failed,
            self.replayed
        )
    }
}

/// Render progress (and write it to `events`) until the run drops its sender.
pub async fn render(mut rx: UnboundedReceiver<ProgressEntry>, quiet: bool, events: Option<EventSink>) {
    let started = Instant::now();
    let mut counts = Counts::default();
    let mut phase = String::from("-");
    let colored = stderr_colored();
    let bold = Style::new().bold();
    let (green, red, yellow, cyan) = (
        AnsiColor::Green.on_default(),
        AnsiColor::Red.on_default(),
        AnsiColor::Yellow.on_default(),
        AnsiColor::Cyan.on_default(),
    );
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
    while let Some(entry) = rx.recv().await {
        if let Some(sink) = &events {
            sink.progress(&entry);
        }
        counts.apply(&entry.event);
        let line = match &entry.event {
            ProgressEvent::Phase { title } => {
                phase = esc(title).into_owned();
                Some(format!("phase: {}", paint(colored, bold, &phase)))
            }
            ProgressEvent::Log { message, level } if level.is_info() => Some(format!("log: {}", esc(message))),
            ProgressEvent::Log { message, level } => {
                Some(format!("log {}: {}", paint(colored, yellow, level.as_str()), esc(message)))
            }
            ProgressEvent::AgentFinished { summary, cached } => {
                let label = esc(&summary.label);
                let what = match (cached, summary.ok()) {
                    (true, _) => paint(colored, cyan, "replayed"),
                    (false, true) => paint(colored, green, "done"),
                    (false, false) => paint(colored, red, "failed"),
                };
                Some(format!("agent {label}: {what}"))
            }
            ProgressEvent::AttemptStarted { attempt } if *attempt > 1 => Some(format!("attempt {attempt}")),
            _ => None,
        };
        match &bar {
            Some(bar) => {
                if let (Some(line), false) = (&line, matches!(entry.event, ProgressEvent::AgentFinished { .. })) {
                    bar.println(line);
                }
                bar.set_message(format!("{phase} | {}", counts.summary()));
            }
            None if !quiet => {
                if let Some(line) = line {
                    eprintln!("[{:>7.2}s] {line}", started.elapsed().as_secs_f64());
                }
            }
            None => {}
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if !quiet {
        eprintln!("[{:>7.2}s] {}", started.elapsed().as_secs_f64(), counts.summary());
    }
}
