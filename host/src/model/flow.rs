//! How a backend's flow stands ([`FlowStats`]) and why its calls wait ([`WaitReason`]):
//! what progress lines, run detail, the dashboard and metrics show of the flow controller
//! ([`crate::backend::flow`]), which owns the flows themselves. Plain data.

/// Why calls wait in a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The server said when to come back (429 `retry-after`, or nothing left until a reset).
    Server,
    /// The request rate (configured or learned).
    RequestRate,
    /// The token rate (configured or learned).
    TokenRate,
    /// The concurrency limit.
    Concurrency,
    /// The budget shared by the workers of a cluster.
    Cluster,
}

impl WaitReason {
    /// Its spelling in metrics and run detail.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Server => "server",
            WaitReason::RequestRate => "request_rate",
            WaitReason::TokenRate => "token_rate",
            WaitReason::Concurrency => "concurrency",
            WaitReason::Cluster => "cluster",
        }
    }
}

/// A flow as it stands (for progress lines, run detail and metrics).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlowStats {
    /// The backend's name.
    pub backend: String,
    /// Calls waiting to be admitted.
    pub queued: u64,
    /// Calls admitted and not yet answered.
    pub in_flight: u64,
    /// The concurrency limit now.
    pub limit: u64,
    /// The request rate paced at (per second), when one is known.
    pub requests_per_second: Option<f64>,
    /// The token rate paced at (per second), when one is known.
    pub tokens_per_second: Option<f64>,
    /// Why the head of the queue waits, when it does.
    pub waiting_for: Option<WaitReason>,
    /// Calls admitted so far.
    pub admitted: u64,
    /// Replies that pushed back (429, 529, 503) so far.
    pub throttled: u64,
    /// Seconds calls spent waiting in this flow, in total.
    pub wait_seconds: f64,
}

impl FlowStats {
    /// One line for a progress display: `318 queued: `openai` at 40 req/s`.
    pub fn line(&self) -> String {
        let why = match self.waiting_for {
            Some(WaitReason::Server) => "told to wait by the server".to_string(),
            Some(WaitReason::Concurrency) => format!("{} at once", self.limit),
            Some(WaitReason::TokenRate) => match self.tokens_per_second {
                Some(t) => format!("at {} tokens/min", (t * 60.0).round()),
                None => "token budget".into(),
            },
            Some(WaitReason::Cluster) => "cluster budget".into(),
            Some(WaitReason::RequestRate) | None => match self.requests_per_second {
                Some(r) => format!("at {} req/s", round_rate(r)),
                None => format!("{} at once", self.limit),
            },
        };
        format!("{} queued: `{}` {why}", self.queued, self.backend)
    }
}

fn round_rate(r: f64) -> String {
    if r >= 10.0 {
        format!("{}", r.round())
    } else {
        format!("{:.1}", r)
    }
}

/// The flows that have calls waiting, as one progress line each, joined by `; ` (empty
/// when none has).
pub fn queued_lines(flows: &[FlowStats]) -> String {
    flows.iter().filter(|f| f.queued > 0).map(FlowStats::line).collect::<Vec<_>>().join("; ")
}

/// Decides when a run's flows are worth telling its live followers again: while some call
/// waits in one, whenever what a progress line shows changed; and once more when the last
/// waiting call was admitted (so a display clears its line). Nothing while none waits.
#[derive(Debug, Default)]
pub struct FlowWatch {
    /// What was last told, as shown.
    told: Vec<Shown>,
    /// Whether a call was waiting when it was told.
    waiting: bool,
}

/// What a display shows of one flow.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    backend: String,
    queued: u64,
    in_flight: u64,
    limit: u64,
    requests_per_second: Option<f64>,
    tokens_per_second: Option<f64>,
    waiting_for: Option<WaitReason>,
    throttled: u64,
}

impl FlowWatch {
    /// `flows` as they stand now: `Some` when they are to be told.
    pub fn next(&mut self, flows: Vec<FlowStats>) -> Option<Vec<FlowStats>> {
        let waiting = flows.iter().any(|f| f.queued > 0);
        if !waiting && !self.waiting {
            return None;
        }
        let shown: Vec<Shown> = flows
            .iter()
            .map(|f| Shown {
                backend: f.backend.clone(),
                queued: f.queued,
                in_flight: f.in_flight,
                limit: f.limit,
                requests_per_second: f.requests_per_second,
                tokens_per_second: f.tokens_per_second,
                waiting_for: f.waiting_for,
                throttled: f.throttled,
            })
            .collect();
        if shown == self.told && waiting == self.waiting {
            return None;
        }
        self.told = shown;
        self.waiting = waiting;
        Some(flows)
    }
}

/// The rates a shared flow budget refills at, and its bucket sizes (a backend's request and
/// token buckets, as its flow paces them): what a flow hands the budget its workers share.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FlowRates {
    /// Requests per second (`None`: requests are not metered).
    pub requests: Option<f64>,
    /// The request bucket's size.
    pub request_burst: f64,
    /// Tokens per second (`None`: tokens are not metered).
    pub tokens: Option<f64>,
    /// The token bucket's size.
    pub token_burst: f64,
    /// What the caller's own request bucket holds: a new budget starts from it (at most full).
    pub requests_left: f64,
    /// What the caller's own token bucket holds (likewise).
    pub tokens_left: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(queued: u64, waiting_for: Option<WaitReason>) -> FlowStats {
        FlowStats {
            backend: "openai".into(),
            queued,
            in_flight: 4,
            limit: 4,
            requests_per_second: Some(40.0),
            tokens_per_second: None,
            waiting_for,
            admitted: 10,
            throttled: 0,
            wait_seconds: 1.5,
        }
    }

    #[test]
    fn a_line_says_how_many_wait_for_which_backend_and_why() {
        assert_eq!(stats(318, Some(WaitReason::RequestRate)).line(), "318 queued: `openai` at 40 req/s");
        assert_eq!(stats(3, Some(WaitReason::Concurrency)).line(), "3 queued: `openai` 4 at once");
        assert_eq!(stats(3, Some(WaitReason::Server)).line(), "3 queued: `openai` told to wait by the server");
        assert_eq!(
            queued_lines(&[stats(0, None), stats(2, Some(WaitReason::RequestRate))]),
            "2 queued: `openai` at 40 req/s"
        );
    }

    #[test]
    fn a_watch_tells_changes_while_calls_wait_and_once_when_none_does() {
        let mut watch = FlowWatch::default();
        assert!(watch.next(vec![stats(0, None)]).is_none(), "nothing waits: nothing to tell");
        assert!(watch.next(vec![stats(5, Some(WaitReason::RequestRate))]).is_some());
        let mut same = stats(5, Some(WaitReason::RequestRate));
        same.admitted += 3;
        same.wait_seconds += 2.0;
        assert!(watch.next(vec![same]).is_none(), "what a line shows did not change");
        assert!(watch.next(vec![stats(4, Some(WaitReason::RequestRate))]).is_some());
        assert!(watch.next(vec![stats(0, None)]).is_some(), "the queue emptied: told once");
        assert!(watch.next(vec![stats(0, None)]).is_none());
    }
}
