//! `dry-run`: the default, offline, deterministic backend. A text call replies with a short
//! text naming its label and the start of its prompt; a schema call replies with the
//! smallest instance of the schema, so every factory runs meaningfully with no API key.

use super::{estimate_tokens, AgentBackend, AgentReply, AgentRequest, BackendError, Usage};
use crate::model::schema::Schema;
use futures::future::BoxFuture;
use std::sync::Arc;

/// How much of the prompt a dry-run reply quotes.
const QUOTE_CHARS: usize = 60;

/// The offline default backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct DryRun;

impl DryRun {
    /// The reply text for `request` (pure; exposed for tests and docs).
    pub fn reply_text(request: &AgentRequest) -> Result<String, BackendError> {
        match &request.schema {
            Some(schema) => {
                let schema = Schema::from_value(schema.clone())
                    .map_err(|e| BackendError::ordinary(format!("dry-run: invalid schema: {e}")))?;
                // A search past its budget is an ordinary failure: the call answers null.
                let value = schema.solve().map_err(|e| BackendError::ordinary(format!("dry-run: {e}")))?;
                Ok(value.to_string())
            }
            None => {
                let quote: String = request.prompt.chars().take(QUOTE_CHARS).collect();
                let ellipsis = if request.prompt.chars().count() > QUOTE_CHARS { "..." } else { "" };
                let who = request.label.as_deref().unwrap_or("agent");
                Ok(format!("[dry-run {who}] reply to: {quote}{ellipsis}"))
            }
        }
    }
}

impl AgentBackend for DryRun {
    fn name(&self) -> String {
        "dry-run".to_string()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        Box::pin(async move {
            let text = DryRun::reply_text(&request)?;
            let usage = Usage::tokens(estimate_tokens(&request.prompt), estimate_tokens(&text), Some(0));
            Ok(AgentReply::new(text, Some(usage)))
        })
    }
}
