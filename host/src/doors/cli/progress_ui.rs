//! Progress on stderr: an indicatif spinner line (phase, agents queued/running/done,
//! elapsed) on a terminal; plain timestamped lines otherwise, so logs stay readable, written
//! a batch at a time, with the calls a resume replays from the journal shown as one line per
//! burst (`agents FIRST … LAST: N replayed`, at least once a second) rather than one each.
//! While calls wait in the backend's flow (its request, token or concurrency budget), the
//! spinner line ends with how many wait for which backend and why (``318 queued: `openai` at
//! 40 req/s``); plain lines say it as a `flow:` line when it changed, at most every
//! [`FLOW_LINE_EVERY`].
//! Guest-chosen text (phases, log lines, labels) is shown escaped ([`crate::doors::cli::escape::esc`]).
//! Phases, agent outcomes and warnings are coloured when `--color`/`NO_COLOR` allow it
//! ([`crate::doors::cli::conventions::stderr_colored`]); the text is the same either way.

use crate::doors::cli::conventions::{paint, stderr_colored};
use crate::doors::cli::escape::esc;
use crate::doors::cli::events::EventSink;
use anstyle::{AnsiColor, Style};
use factory_host::{ProgressEntry, ProgressEvent};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Counts {
    queued: HashMap<String, u32>,
    running: u64,
    done: u64,
    failed: u64,
    replayed: u64,
    /// Replayed calls seen live in the attempt going on (a follower through the service
    /// sees none: they are told to live subscribers only, and counted by `AttemptEnded`).
    replayed_live: u64,
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
            ProgressEvent::AgentFinished { cached: true, .. } => {
                self.replayed += 1;
                self.replayed_live += 1;
            }
            ProgressEvent::AttemptEnded { replayed, .. } => {
                self.replayed += replayed.saturating_sub(self.replayed_live);
                self.replayed_live = 0;
            }
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

/// Bytes of lines gathered before they are written out, at most: the lines of a batch go to
/// stderr in one write (stderr is unbuffered, and a line written piece by piece is a syscall
/// a piece).
const WRITE_AT: usize = 64 << 10;

/// The pause after a batch (every entry at hand) before the next is taken: entries sent
/// meanwhile wait in the channel instead of waking this task (and a parked runtime thread)
/// one by one, which cost a resume replaying 50,000 calls a quarter of its CPU. Progress is
/// for people: 100 batches a second is live.
const PACE: Duration = Duration::from_millis(10);

/// How long consecutive replayed calls are gathered into one line: a resume replays
/// thousands of journaled calls in moments, and a line each would bury the rest.
const REPLAYS_SHOWN_EVERY: Duration = Duration::from_secs(1);

/// The least time between two plain `flow:` lines (the queue changes at every admission).
const FLOW_LINE_EVERY: Duration = Duration::from_secs(2);

/// What the progress display shows of the backend's flows.
#[derive(Default)]
struct FlowLine {
    /// The flows with calls queued, as one line (empty when none has).
    now: String,
    /// The last plain line shown, and when.
    shown: Option<(String, Instant)>,
}

impl FlowLine {
    fn update(&mut self, flows: &[factory_host::model::flow::FlowStats]) {
        self.now = esc(&factory_host::model::flow::queued_lines(flows)).into_owned();
    }

    /// The plain line to show now, if any: the queue changed (and the last line is at least
    /// [`FLOW_LINE_EVERY`] old), or it emptied after one was shown.
    fn plain(&mut self) -> Option<String> {
        let line = match &self.shown {
            Some((last, _)) if *last == self.now => return None,
            Some((_, at)) if !self.now.is_empty() && at.elapsed() < FLOW_LINE_EVERY => return None,
            None if self.now.is_empty() => return None,
            Some(_) if self.now.is_empty() => "flow: no calls queued".to_string(),
            _ => format!("flow: {}", self.now),
        };
        self.shown = Some((self.now.clone(), Instant::now()));
        Some(line)
    }
}

/// Consecutive replayed agent calls, not shown yet.
struct Replays {
    count: u64,
    first: String,
    last: String,
    /// When the first of them was replayed.
    since: Instant,
}

/// The plain form of progress (stderr is not a terminal): timestamped lines, gathered into
/// one write per batch of entries, with each burst of replayed calls shown as one line.
struct Plain {
    started: Instant,
    colored: bool,
    out: String,
    replays: Option<Replays>,
}

impl Plain {
    fn new(started: Instant, colored: bool) -> Self {
        Plain { started, colored, out: String::new(), replays: None }
    }

    /// Add `line`, after the replayed calls gathered before it.
    fn line(&mut self, line: &str) {
        self.show_replays();
        self.stamped(line);
    }

    fn stamped(&mut self, line: &str) {
        use std::fmt::Write as _;
        let _ = writeln!(self.out, "[{:>7.2}s] {line}", self.started.elapsed().as_secs_f64());
    }

    /// A call answered from the journal: gathered with the ones replayed just before it.
    fn replayed(&mut self, label: &str) {
        if self.replays.as_ref().is_some_and(|r| r.since.elapsed() >= REPLAYS_SHOWN_EVERY) {
            self.show_replays();
        }
        match &mut self.replays {
            Some(replays) => {
                replays.count += 1;
                replays.last.clear();
                replays.last.push_str(label);
            }
            None => {
                let since = Instant::now();
                self.replays = Some(Replays { count: 1, first: label.to_string(), last: label.to_string(), since });
            }
        }
    }

    /// Add the line of the replayed calls gathered so far, if any.
    fn show_replays(&mut self) {
        let Some(replays) = self.replays.take() else { return };
        let what = paint(self.colored, AnsiColor::Cyan.on_default(), "replayed");
        let line = match replays.count {
            1 => format!("agent {}: {what}", esc(&replays.first)),
            n => format!("agents {} … {}: {n} {what}", esc(&replays.first), esc(&replays.last)),
        };
        self.stamped(&line);
    }

    /// When the replayed calls gathered so far are due to be shown.
    fn replays_due(&self) -> Option<tokio::time::Instant> {
        self.replays.as_ref().map(|r| tokio::time::Instant::from_std(r.since + REPLAYS_SHOWN_EVERY))
    }

    /// Write the lines added so far to stderr, in one write.
    fn write_out(&mut self) {
        use std::io::Write as _;
        if !self.out.is_empty() {
            // Progress is best effort: a closed stderr must not stop the run.
            let _ = std::io::stderr().lock().write_all(self.out.as_bytes());
            self.out.clear();
        }
    }
}

/// The line an entry shows as (none for a replayed call: [`Plain::replayed`] gathers those),
/// and the phase it makes current.
fn line_of(event: &ProgressEvent, colored: bool, phase: &mut String) -> Option<String> {
    let (bold, green, red, yellow) = (
        Style::new().bold(),
        AnsiColor::Green.on_default(),
        AnsiColor::Red.on_default(),
        AnsiColor::Yellow.on_default(),
    );
    match event {
        ProgressEvent::Phase { title } => {
            *phase = esc(title).into_owned();
            Some(format!("phase: {}", paint(colored, bold, phase)))
        }
        ProgressEvent::Log { message, level } if level.is_info() => Some(format!("log: {}", esc(message))),
        ProgressEvent::Log { message, level } => {
            Some(format!("log {}: {}", paint(colored, yellow, level.as_str()), esc(message)))
        }
        ProgressEvent::AgentFinished { summary, cached: false } => {
            let what = if summary.ok() { paint(colored, green, "done") } else { paint(colored, red, "failed") };
            Some(format!("agent {}: {what}", esc(&summary.label)))
        }
        ProgressEvent::AttemptStarted { attempt } if *attempt > 1 => Some(format!("attempt {attempt}")),
        _ => None,
    }
}

/// The progress renderer of one run, rendering on a task of its own.
pub struct Renderer {
    task: tokio::task::JoinHandle<()>,
    ended: CancellationToken,
}

/// Render the entries `rx` receives (and write them to `events`) on a task of its own, until
/// the sender is dropped and [`Renderer::finish`] is called.
pub fn spawn(rx: UnboundedReceiver<ProgressEntry>, quiet: bool, events: Option<EventSink>) -> Renderer {
    spawn_paced(rx, quiet, events, PACE)
}

/// [`spawn`] with `pace` as the pause between batches.
fn spawn_paced(
    rx: UnboundedReceiver<ProgressEntry>,
    quiet: bool,
    events: Option<EventSink>,
    pace: Duration,
) -> Renderer {
    let ended = CancellationToken::new();
    let task = tokio::spawn(render(rx, quiet, events, ended.clone(), pace));
    Renderer { task, ended }
}

impl Renderer {
    /// Show what is left and the summary, and return once they are written. Call it once the
    /// sender is dropped (the run has ended): the renderer's pause between batches ends then,
    /// so a command does not wait out a pause before it exits.
    pub async fn finish(self) {
        self.ended.cancel();
        let _ = self.task.await;
    }
}

/// Render progress (and write it to `events`) until the run drops its sender, pausing
/// `pace` after each batch; `ended` (cancelled once the run has ended) cuts a pause short.
async fn render(
    mut rx: UnboundedReceiver<ProgressEntry>,
    quiet: bool,
    events: Option<EventSink>,
    ended: CancellationToken,
    pace: Duration,
) {
    let started = Instant::now();
    let mut counts = Counts::default();
    let mut phase = String::from("-");
    let colored = stderr_colored();
    let terminal = std::io::stderr().is_terminal();
    let bar = (!quiet && terminal).then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    });
    let mut plain = (!quiet && !terminal).then(|| Plain::new(started, colored));
    let mut flow = FlowLine::default();
    loop {
        let first = match plain.as_ref().and_then(Plain::replays_due) {
            Some(due) => match tokio::time::timeout_at(due, rx.recv()).await {
                Ok(entry) => entry,
                Err(_) => {
                    if let Some(plain) = &mut plain {
                        plain.show_replays();
                        plain.write_out();
                    }
                    continue;
                }
            },
            None => rx.recv().await,
        };
        let Some(first) = first else { break };
        let mut next = Some(first);
        while let Some(entry) = next {
            if let ProgressEvent::Flows { flows } = &entry.event {
                // Live state, not an event of the run: shown, not written to the events file.
                flow.update(flows);
                if let (Some(plain), Some(line)) = (&mut plain, flow.plain()) {
                    plain.line(&line);
                }
                next = rx.try_recv().ok();
                continue;
            }
            if let Some(sink) = &events {
                sink.progress(&entry);
            }
            counts.apply(&entry.event);
            match (&mut plain, &entry.event) {
                (Some(plain), ProgressEvent::AgentFinished { summary, cached: true }) => plain.replayed(&summary.label),
                (Some(plain), event) => {
                    if let Some(line) = line_of(event, colored, &mut phase) {
                        plain.line(&line);
                    }
                }
                // The bar counts agents; it shows every other line above itself.
                (None, ProgressEvent::AgentFinished { .. }) => {}
                (None, event) => {
                    if let (Some(line), Some(bar)) = (line_of(event, colored, &mut phase), &bar) {
                        bar.println(line);
                    }
                }
            }
            if let Some(plain) = plain.as_mut().filter(|p| p.out.len() >= WRITE_AT) {
                plain.write_out();
            }
            next = rx.try_recv().ok();
        }
        if let Some(bar) = &bar {
            match flow.now.is_empty() {
                true => bar.set_message(format!("{phase} | {}", counts.summary())),
                false => bar.set_message(format!("{phase} | {} | {}", counts.summary(), flow.now)),
            }
        }
        if let Some(plain) = &mut plain {
            plain.write_out();
        }
        // The pause; once the run has ended, what is left is taken at once.
        tokio::select! {
            () = tokio::time::sleep(pace) => {}
            () = ended.cancelled() => {}
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
        eprintln!("[{:>7.2}s] {}", started.elapsed().as_secs_f64(), counts.summary());
    }
    if let Some(plain) = &mut plain {
        plain.line(&counts.summary());
        plain.write_out();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(plain: &Plain) -> Vec<&str> {
        plain.out.lines().map(|l| l.split_once("] ").map_or(l, |(_, line)| line)).collect()
    }

    #[test]
    fn consecutive_replayed_calls_are_one_line_and_another_line_ends_their_burst() {
        let mut plain = Plain::new(Instant::now(), false);
        for i in 0..3 {
            plain.replayed(&format!("r:{i}"));
        }
        plain.line("agent new: done");
        plain.replayed("r:\u{1b}[2J");
        plain.show_replays();
        plain.show_replays();
        assert_eq!(lines(&plain), ["agents r:0 … r:2: 3 replayed", "agent new: done", "agent r:\\x1b[2J: replayed"]);
    }

    #[test]
    fn a_burst_of_replayed_calls_is_shown_once_a_second_has_passed() {
        let mut plain = Plain::new(Instant::now(), false);
        plain.replayed("a");
        plain.replayed("b");
        assert!(plain.out.is_empty(), "gathered, not shown yet");
        let due = plain.replays_due().expect("a burst is due to be shown");
        assert!(due > tokio::time::Instant::now(), "within the second");
        if let Some(replays) = &mut plain.replays {
            replays.since -= REPLAYS_SHOWN_EVERY;
        }
        plain.replayed("c");
        assert_eq!(lines(&plain), ["agents a … b: 2 replayed"]);
        plain.show_replays();
        assert_eq!(lines(&plain), ["agents a … b: 2 replayed", "agent c: replayed"]);
        assert!(plain.replays_due().is_none());
    }

    #[test]
    fn a_plain_flow_line_is_shown_when_the_queue_changed_at_most_every_two_seconds_and_once_emptied() {
        use factory_host::model::flow::{FlowStats, WaitReason};
        let stats = |queued| FlowStats {
            backend: "openai".into(),
            queued,
            in_flight: 2,
            limit: 2,
            requests_per_second: Some(40.0),
            tokens_per_second: None,
            waiting_for: (queued > 0).then_some(WaitReason::RequestRate),
            admitted: 0,
            throttled: 0,
            wait_seconds: 0.0,
        };
        let mut flow = FlowLine::default();
        flow.update(&[stats(0)]);
        assert_eq!(flow.plain(), None, "nothing queued, nothing shown");
        flow.update(&[stats(318)]);
        assert_eq!(flow.plain().as_deref(), Some("flow: 318 queued: `openai` at 40 req/s"));
        flow.update(&[stats(300)]);
        assert_eq!(flow.plain(), None, "within two seconds of the last line");
        if let Some((_, at)) = &mut flow.shown {
            *at -= FLOW_LINE_EVERY;
        }
        assert_eq!(flow.plain().as_deref(), Some("flow: 300 queued: `openai` at 40 req/s"));
        flow.update(&[stats(0)]);
        assert_eq!(flow.plain().as_deref(), Some("flow: no calls queued"), "the queue emptied: said at once");
        assert_eq!(flow.plain(), None);
    }

    /// With a pause of an hour, a renderer that waited its pause out after the run ended
    /// would not finish within the minute this test gives it.
    #[tokio::test]
    async fn a_renderer_whose_run_has_ended_does_not_wait_out_its_pause() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let ui = spawn_paced(rx, true, None, Duration::from_secs(3600));
        let entry =
            |seq| ProgressEntry { seq, at_ms: 0, phase: None, event: ProgressEvent::AttemptStarted { attempt: 1 } };
        tx.send(entry(1)).expect("the renderer is receiving");
        // The renderer takes the entry and begins its pause.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        tx.send(entry(2)).expect("the renderer is receiving");
        drop(tx);
        let finished = tokio::time::timeout(Duration::from_secs(60), ui.finish()).await;
        assert!(finished.is_ok(), "the renderer waited out its pause after the run ended");
    }
}
