//! The consent question of the MCP door, asked of the person behind the MCP client through
//! MCP elicitation (`elicitation/create`, a form), over stdio and streamable HTTP alike. It
//! says what is asked about (the factory's name, the sha256 approved, the operation, the
//! backend, the grants, the effective limits and the phases) and takes one of three answers:
//! approve once, approve always (the sha256 is trusted from then on), or decline. A client
//! that did not declare elicitation cannot be asked ([`can_ask`]); the caller then keeps
//! the service's refusal.

use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::{ElicitationMode, Peer};
use rmcp::RoleServer;
use std::time::Duration;

/// The longest a question waits for its answer: a person reads it first.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(600);

pub use factory_host::service::{Operation, Question};

/// The person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Approved for this call.
    Once,
    /// Approved, and the sha256 is to be trusted from now on.
    Always,
    /// Declined (or dismissed): nothing is to start.
    Declined(Declined),
}

/// How a question ended without an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declined {
    /// The person declined.
    ByPerson,
    /// The person dismissed the question.
    Dismissed,
    /// No answer came within [`ANSWER_WITHIN`].
    Unanswered,
}

impl Declined {
    /// What to tell the caller.
    pub fn says(self) -> &'static str {
        match self {
            Declined::ByPerson => "the user declined",
            Declined::Dismissed => "the user dismissed the question",
            Declined::Unanswered => "no answer came in time",
        }
    }
}

/// Why a question could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The question's form could not be built.
    #[error("building the consent form: {0}")]
    Form(&'static str),
    /// The client failed to answer the request.
    #[error("asking the client: {0}")]
    Client(#[source] rmcp::service::ServiceError),
}

/// Whether the client declared it can show a form.
pub fn can_ask(peer: &Peer<RoleServer>) -> bool {
    peer.supported_elicitation_modes().contains(&ElicitationMode::Form)
}

/// The question's text, the facts first.
pub fn message(q: &Question) -> String {
    let op = q.operation.as_str();
    let limits = serde_json::to_string(&q.limits).unwrap_or_default();
    let phases = if q.phases.is_empty() { "none declared".to_string() } else { q.phases.join(", ") };
    let grants = if q.grants.is_empty() { "none (it reads no host files)".to_string() } else { q.grants.join(", ") };
    let what = match q.operation {
        Operation::Author => {
            "An agent wrote this factory and asks to register it in its session (its runs then need no \
                              further question)"
        }
        Operation::Run | Operation::Resume => "An agent asks to run this factory, which is not trusted on this machine",
    };
    format!(
        "{what}.\nfactory: {}\nsha256: {}\noperation: {op}\nbackend: {}\nlimits: {limits}\nphases: {phases}\ngrants: {grants}\n\
         Accept to approve it once; tick \"always\" to trust this sha256 from now on; decline to start nothing.",
        q.factory, q.sha256, q.backend
    )
}

/// Ask `q` of the client's user and wait (at most [`ANSWER_WITHIN`]) for the answer.
pub async fn ask(peer: &Peer<RoleServer>, q: &Question) -> Result<Answer, AskError> {
    let schema = ElicitationSchema::builder()
        .title("Approve a factory")
        .bool_property("always", |b| {
            b.title("Always").description("Trust this sha256 from now on (no question next time)").with_default(false)
        })
        .build()
        .map_err(AskError::Form)?;
    let params =
        ElicitRequestParams::FormElicitationParams { meta: None, message: message(q), requested_schema: schema };
    let result = match peer.create_elicitation_with_timeout(params, Some(ANSWER_WITHIN)).await {
        Ok(result) => result,
        Err(rmcp::service::ServiceError::Timeout { .. }) => return Ok(Answer::Declined(Declined::Unanswered)),
        Err(e) => return Err(AskError::Client(e)),
    };
    Ok(match result.action {
        ElicitationAction::Accept => {
            let always =
                result.content.as_ref().and_then(|c| c.get("always")).and_then(|v| v.as_bool()).unwrap_or(false);
            if always {
                Answer::Always
            } else {
                Answer::Once
            }
        }
        ElicitationAction::Decline => Answer::Declined(Declined::ByPerson),
        // Cancel, and whatever a later protocol adds: not an approval.
        _ => Answer::Declined(Declined::Dismissed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use factory_host::Limits;

    #[test]
    fn the_question_names_what_is_approved() {
        let q = Question {
            factory: "probe".into(),
            sha256: "ab".repeat(32),
            operation: Operation::Run,
            backend: "local".into(),
            limits: Limits::default(),
            phases: vec!["Scan".into(), "Verify".into()],
            grants: Vec::new(),
        };
        let text = message(&q);
        for fact in [
            "factory: probe",
            &format!("sha256: {}", "ab".repeat(32)),
            "operation: run",
            "backend: local",
            "phases: Scan, Verify",
            "grants: none",
        ] {
            assert!(text.contains(fact), "{fact} in {text}");
        }
    }
}
