//! Pending approvals: a start the service's trust check refuses, from a caller that can wait
//! for the owner's answer ([`super::Consent::Ask`], the HTTP door), is held here with its
//! consent [`Question`] until the owner approves it once or always, or declines it (from
//! the dashboard, `factory approvals` or the API). An approved start runs with exactly the
//! sha256 the question named ([`super::Consent::Sha256`]), so a component that changed in
//! between is refused, not run. At most [`MAX_PENDING`] are pending at once; one left
//! unanswered for [`APPROVAL_TTL`] expires (nothing starts). Answered ones are kept a while
//! (at most [`MAX_ANSWERED`], for [`APPROVAL_TTL`]) so the caller waiting on one learns its
//! answer. They live in the serving process's memory only: a restart forgets them, and
//! nothing unattended (recovery, a cluster worker) ever asks or answers one.

use super::consent::Question;
use super::wire::Request;
use crate::error::{ApprovalError, Error, ErrorCode};
use crate::model::scope::Scope;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most approvals pending at once: one more start is refused until some are answered.
pub const MAX_PENDING: usize = 32;

/// How long a question waits for the owner (the same as an MCP elicitation), and how long
/// an answered one is remembered.
pub const APPROVAL_TTL: Duration = Duration::from_secs(600);

/// The most answered approvals remembered for their waiters.
pub const MAX_ANSWERED: usize = 256;

/// The longest one wait for an answer holds a request.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// One approval, as the owner and the waiting caller see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// Its id (what `approve` and `decline` name).
    pub id: String,
    /// The session that asked (none: the owner, for a resume in the owner's view).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// What is asked.
    pub question: Question,
    /// Where it stands.
    pub state: ApprovalState,
    /// When it was asked (ms since the epoch).
    pub created_at_ms: u64,
    /// When it expires if unanswered (ms since the epoch).
    pub expires_at_ms: u64,
}

/// What a start came to: a run, or (consent `ask`) an approval waiting for the owner.
#[derive(Debug, Clone)]
pub enum Started {
    /// The run (or attempt) started: its id.
    Run(String),
    /// The start waits for the owner's answer.
    Pending(Box<Approval>),
}

/// Where an approval stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", rename_all_fields = "camelCase")]
pub enum ApprovalState {
    /// Waiting for the owner.
    Pending,
    /// Approved, and the run started.
    Approved {
        /// The run it started.
        run_id: String,
        /// Whether the sha256 is trusted from now on.
        always: bool,
    },
    /// Declined: nothing started.
    Declined,
    /// Nobody answered within [`APPROVAL_TTL`]: nothing started.
    Expired,
    /// Approved, but the start was refused (the component changed since the question, say).
    Failed {
        /// The refusal's code.
        code: ErrorCode,
        /// What it said.
        message: String,
    },
}

/// The owner's answer to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    /// Run it this once.
    Once,
    /// Run it, and trust its sha256 from now on.
    Always,
    /// Start nothing.
    Decline,
}

struct Entry {
    approval: Approval,
    /// The start to make once approved (its consent the question's sha256); taken when it is.
    request: Option<Request>,
    /// When it expires (pending) or is forgotten (answered).
    until: Instant,
}

/// The approvals the service holds (one set per serving process, shared by its doors).
pub struct Approvals {
    entries: Mutex<Vec<Entry>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals { entries: Mutex::new(Vec::new()), changed: tokio::sync::watch::channel(0).0 }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Whether `scope` sees an approval asked by `session`: the owner sees every one, a session
/// its own.
fn sees(scope: &Scope, session: &Option<String>) -> bool {
    match scope {
        Scope::Owner => true,
        Scope::Session(name) => session.as_deref() == Some(name.as_str()),
    }
}

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Expire the pending ones past their time, forget the answered ones past theirs (and
    /// the oldest beyond [`MAX_ANSWERED`]); whether any changed.
    fn sweep(entries: &mut Vec<Entry>, now: Instant) -> bool {
        let mut changed = false;
        for entry in entries.iter_mut() {
            if entry.approval.state == ApprovalState::Pending && entry.request.is_some() && entry.until <= now {
                entry.approval.state = ApprovalState::Expired;
                entry.request = None;
                entry.until = now + APPROVAL_TTL;
                changed = true;
            }
        }
        let before = entries.len();
        entries.retain(|e| e.approval.state == ApprovalState::Pending || e.until > now);
        let answered = entries.iter().filter(|e| e.approval.state != ApprovalState::Pending).count();
        let mut excess = answered.saturating_sub(MAX_ANSWERED);
        entries.retain(|e| {
            if excess > 0 && e.approval.state != ApprovalState::Pending {
                excess -= 1;
                return false;
            }
            true
        });
        changed || entries.len() != before
    }

    fn announce(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Hold `request` (a start whose consent is the question's sha256) until the owner
    /// answers `question`; refused when [`MAX_PENDING`] are pending already.
    pub fn hold(&self, session: Option<String>, question: Question, request: Request) -> Result<Approval, Error> {
        let now = Instant::now();
        let approval = {
            let mut entries = self.lock();
            Self::sweep(&mut entries, now);
            let pending = entries.iter().filter(|e| e.approval.state == ApprovalState::Pending).count();
            if pending >= MAX_PENDING {
                return Err(ApprovalError::Full(MAX_PENDING).into());
            }
            let created = now_ms();
            let approval = Approval {
                id: uuid::Uuid::new_v4().simple().to_string(),
                session,
                question,
                state: ApprovalState::Pending,
                created_at_ms: created,
                expires_at_ms: created + APPROVAL_TTL.as_millis() as u64,
            };
            entries.push(Entry { approval: approval.clone(), request: Some(request), until: now + APPROVAL_TTL });
            approval
        };
        tracing::info!(event = "approval_pending", id = %approval.id, factory = %approval.question.factory, sha256 = %approval.question.sha256, "a start waits for the owner's approval");
        self.announce();
        Ok(approval)
    }

    /// The pending approvals `scope` sees, oldest first.
    pub fn pending(&self, scope: &Scope) -> Vec<Approval> {
        let mut entries = self.lock();
        if Self::sweep(&mut entries, Instant::now()) {
            self.announce();
        }
        entries
            .iter()
            .filter(|e| e.approval.state == ApprovalState::Pending && sees(scope, &e.approval.session))
            .map(|e| e.approval.clone())
            .collect()
    }

    /// Approval `id` as `scope` sees it, in whatever state.
    pub fn get(&self, scope: &Scope, id: &str) -> Result<Approval, Error> {
        let mut entries = self.lock();
        if Self::sweep(&mut entries, Instant::now()) {
            self.announce();
        }
        entries
            .iter()
            .find(|e| e.approval.id == id && sees(scope, &e.approval.session))
            .map(|e| e.approval.clone())
            .ok_or_else(|| ApprovalError::Unknown(id.to_string()).into())
    }

    /// Approval `id` once it is answered, or as it stands after `within` (at most
    /// [`MAX_WAIT`], and never past its expiry).
    pub async fn wait(&self, scope: &Scope, id: &str, within: Duration) -> Result<Approval, Error> {
        let deadline = tokio::time::Instant::now() + within.min(MAX_WAIT);
        let mut changes = self.changed.subscribe();
        loop {
            changes.borrow_and_update();
            let approval = self.get(scope, id)?;
            if approval.state != ApprovalState::Pending {
                return Ok(approval);
            }
            // Wake at its expiry too, to see it expire.
            let expires = Duration::from_millis(approval.expires_at_ms.saturating_sub(now_ms()));
            let wake = deadline.min(tokio::time::Instant::now() + expires + Duration::from_millis(10));
            match tokio::time::timeout_at(wake, changes.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Ok(approval),
                Err(_) if tokio::time::Instant::now() >= deadline => return self.get(scope, id),
                Err(_) => continue,
            }
        }
    }

    /// Take approval `id`'s start to answer it (no one else can answer it meanwhile): the
    /// approval and the start request.
    pub fn take(&self, scope: &Scope, id: &str) -> Result<(Approval, Request), Error> {
        let mut entries = self.lock();
        if Self::sweep(&mut entries, Instant::now()) {
            self.announce();
        }
        let entry = entries
            .iter_mut()
            .find(|e| e.approval.id == id && sees(scope, &e.approval.session))
            .ok_or_else(|| ApprovalError::Unknown(id.to_string()))?;
        let state = match &entry.approval.state {
            ApprovalState::Pending => None,
            ApprovalState::Approved { .. } => Some("approved"),
            ApprovalState::Declined => Some("declined"),
            ApprovalState::Expired => Some("expired"),
            ApprovalState::Failed { .. } => Some("approved, and its start failed"),
        };
        match (state, entry.request.take()) {
            (None, Some(request)) => Ok((entry.approval.clone(), request)),
            (None, None) => Err(ApprovalError::Answered(id.to_string(), "being answered").into()),
            (Some(state), _) => Err(ApprovalError::Answered(id.to_string(), state).into()),
        }
    }

    /// Record the answer to approval `id` (taken before); the approval as it now stands.
    pub fn settle(&self, id: &str, state: ApprovalState) -> Option<Approval> {
        let settled = {
            let mut entries = self.lock();
            let entry = entries.iter_mut().find(|e| e.approval.id == id)?;
            entry.approval.state = state;
            entry.request = None;
            entry.until = Instant::now() + APPROVAL_TTL;
            entry.approval.clone()
        };
        tracing::info!(event = "approval_answered", id = %id, state = ?settled.state, "a pending approval was answered");
        self.announce();
        Some(settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::consent::Operation;

    fn question() -> Question {
        Question {
            factory: "f".into(),
            sha256: "ab".repeat(32),
            operation: Operation::Run,
            backend: "local".into(),
            limits: crate::Limits::default(),
            phases: Vec::new(),
            grants: Vec::new(),
        }
    }

    fn start() -> Request {
        Request::Metrics
    }

    #[test]
    fn pending_approvals_are_bounded_and_seen_by_their_session_and_the_owner() {
        let approvals = Approvals::default();
        let first = approvals.hold(Some("a".into()), question(), start()).unwrap();
        assert_eq!(approvals.pending(&Scope::Owner).len(), 1);
        assert_eq!(approvals.pending(&Scope::Session("a".into())).len(), 1);
        assert!(approvals.pending(&Scope::Session("b".into())).is_empty());
        assert!(approvals.take(&Scope::Session("b".into()), &first.id).is_err());
        for _ in 1..MAX_PENDING {
            approvals.hold(None, question(), start()).unwrap();
        }
        let full = approvals.hold(None, question(), start()).unwrap_err();
        assert_eq!(full.code(), ErrorCode::NoApprovalProvider, "{full}");
        // Answered, it is no longer pending, cannot be answered twice, and frees a place.
        let (_, _) = approvals.take(&Scope::Owner, &first.id).unwrap();
        let again = approvals.take(&Scope::Owner, &first.id).unwrap_err();
        assert!(again.to_string().contains("being answered"), "{again}");
        approvals.settle(&first.id, ApprovalState::Declined);
        assert!(approvals.take(&Scope::Owner, &first.id).unwrap_err().to_string().contains("declined"));
        assert_eq!(approvals.get(&Scope::Owner, &first.id).unwrap().state, ApprovalState::Declined);
        assert!(approvals.hold(None, question(), start()).is_ok());
        assert_eq!(approvals.get(&Scope::Owner, "nope").unwrap_err().code(), ErrorCode::NotFound);
    }

    #[test]
    fn an_unanswered_approval_expires_and_starts_nothing() {
        let approvals = Approvals::default();
        let held = approvals.hold(None, question(), start()).unwrap();
        {
            let mut entries = approvals.lock();
            entries[0].until = Instant::now() - Duration::from_millis(1);
        }
        assert!(approvals.pending(&Scope::Owner).is_empty());
        assert_eq!(approvals.get(&Scope::Owner, &held.id).unwrap().state, ApprovalState::Expired);
        assert!(approvals.take(&Scope::Owner, &held.id).unwrap_err().to_string().contains("expired"));
    }

    #[tokio::test]
    async fn a_waiter_learns_the_answer() {
        let approvals = std::sync::Arc::new(Approvals::default());
        let held = approvals.hold(None, question(), start()).unwrap();
        let waiter = {
            let (approvals, id) = (approvals.clone(), held.id.clone());
            tokio::spawn(async move { approvals.wait(&Scope::Owner, &id, MAX_WAIT).await })
        };
        approvals.take(&Scope::Owner, &held.id).unwrap();
        approvals.settle(&held.id, ApprovalState::Approved { run_id: "r".into(), always: false });
        let answered = waiter.await.unwrap().unwrap();
        assert_eq!(answered.state, ApprovalState::Approved { run_id: "r".into(), always: false });
    }
}
