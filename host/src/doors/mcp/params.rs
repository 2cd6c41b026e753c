//! The inputs of the MCP server's two tools and how they fail before a run exists:
//! `run_factory`'s [`RunFactoryParams`] and `factories_manage`'s [`ManageParams`] with its
//! [`Operation`]s, each with the JSON schema the client is shown (written out, since the
//! model reads its descriptions), and the [`ToolError`] a call answers with instead of a
//! run envelope.

use factory_host::{ErrorCode, Limits};
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::schemars;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;

/// A failure before a run exists: a tool error with the spec's code.
pub(super) struct ToolError {
    pub(super) code: ErrorCode,
    pub(super) message: String,
}

impl ToolError {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError { code, message: message.into() }
    }

    pub(super) fn result(self) -> CallToolResult {
        let mut result = CallToolResult::structured_error(json!({ "code": self.code, "message": self.message }));
        result.content = vec![ContentBlock::text(format!("{}: {}", self.code, self.message))];
        result
    }
}

/// `run_factory`'s input: exactly one of two branches (checked again at the call).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RunFactoryParams {
    pub(super) name: Option<String>,
    pub(super) args: Option<Value>,
    pub(super) resume_from_run_id: Option<String>,
    pub(super) limits: Option<Limits>,
    pub(super) input: Option<Value>,
    /// When the call answers before the run ends: tell this session when it does (default on).
    pub(super) notify_on_complete: Option<bool>,
    /// Log each phase the run enters into this session (default off).
    pub(super) log_phase_names: Option<bool>,
}

const LIMITS_SCHEMA: &str = r#"{
  "type": "object",
  "description": "Limit overrides for this invocation (each must be positive; null lifts the limit: no limit of that kind, whatever the factory declares). Omit to use the factory's declared limits; on resume, raise the limit that stopped the run.",
  "properties": {
    "maxConcurrentSubagents": {"type": ["integer", "null"], "minimum": 1, "description": "Subagents running at once; further ones queue."},
    "maxTotalSubagents": {"type": ["integer", "null"], "minimum": 1, "description": "Subagent spawns over the whole run, all attempts included."},
    "timeoutSeconds": {"type": ["number", "null"], "exclusiveMinimum": 0, "description": "Active seconds over all attempts."},
    "maxAiCredits": {"type": ["number", "null"], "exclusiveMinimum": 0, "description": "AI-credit budget for the whole run (post-paid, fail-closed)."}
  },
  "additionalProperties": false
}"#;

fn limits_schema() -> Value {
    serde_json::from_str(LIMITS_SCHEMA).unwrap_or_else(|_| json!({"type": "object"}))
}

impl schemars::JsonSchema for RunFactoryParams {
    fn schema_name() -> Cow<'static, str> {
        "RunFactoryParams".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let value = json!({
            "type": "object",
            "description": "Either start a factory by name ({ name, args?, limits? }) or resume a run that stopped ({ resumeFromRunId, limits?, input? }).",
            "properties": {
                "name": {"type": "string", "description": "The factory to run (see factories_manage operation `list`). Its description says which args it expects."},
                "args": {"description": "Arguments for the factory, any JSON value, passed verbatim (default {})."},
                "resumeFromRunId": {"type": "string", "description": "Resume this run (same id and args): journaled work replays for free, so resuming is cheaper than starting again. Find ids with factories_manage operation `runs`."},
                "limits": limits_schema(),
                "notifyOnComplete": {"type": "boolean", "description": "When this call answers before the run ends (still running at the wait bound), tell this session when it ends: a log notification (notifications/message, logger `factory`, data.event `factory_completed`) with its status, a result preview and how to read it. Default true."},
                "logPhaseNames": {"type": "boolean", "description": "Log each phase the run enters into this session (notifications/message, logger `factory`, data.event `phase`). Default false."},
                "input": {"description": "Resume only: the answer to the checkpoint the run waits at (its envelope's `checkpoint`), any JSON value; the factory's ctx.pause(key) returns it. Omit to resume without an answer (ctx.pause returns null)."}
            },
            "oneOf": [
                {"required": ["name"], "not": {"anyOf": [{"required": ["resumeFromRunId"]}, {"required": ["input"]}]}},
                {"required": ["resumeFromRunId"], "not": {"anyOf": [{"required": ["name"]}, {"required": ["args"]}]}}
            ],
            "additionalProperties": false
        });
        schemars::Schema::try_from(value).unwrap_or_default()
    }
}

/// A `factories_manage` operation, named on the wire by [`Operation::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Operation {
    /// `list`.
    List,
    /// `inspect`.
    Inspect,
    /// `author`.
    Author,
    /// `runs`.
    Runs,
    /// `show`.
    Show,
    /// `progress`.
    Progress,
    /// `wait`.
    Wait,
    /// `cancel`.
    Cancel,
    /// `pause`.
    Pause,
    /// `resume`.
    Resume,
    /// `remove`.
    Remove,
    /// `gc`.
    Gc,
}

impl Operation {
    /// Every operation, in the order the tool's description gives them.
    pub(super) const ALL: [Operation; 12] = [
        Operation::List,
        Operation::Inspect,
        Operation::Author,
        Operation::Runs,
        Operation::Show,
        Operation::Progress,
        Operation::Wait,
        Operation::Cancel,
        Operation::Pause,
        Operation::Resume,
        Operation::Remove,
        Operation::Gc,
    ];

    /// Its name in `operation`.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Inspect => "inspect",
            Operation::Author => "author",
            Operation::Runs => "runs",
            Operation::Show => "show",
            Operation::Progress => "progress",
            Operation::Wait => "wait",
            Operation::Cancel => "cancel",
            Operation::Pause => "pause",
            Operation::Resume => "resume",
            Operation::Remove => "remove",
            Operation::Gc => "gc",
        }
    }

    /// The operation named `name`, or `invalid_params` saying which there are.
    pub(super) fn named(name: &str) -> Result<Operation, ToolError> {
        Operation::ALL.into_iter().find(|op| op.as_str() == name).ok_or_else(|| {
            let known: Vec<&str> = Operation::ALL.iter().map(|op| op.as_str()).collect();
            ToolError::new(
                ErrorCode::InvalidParams,
                format!("unknown operation `{name}` (expected {})", known.join(", ")),
            )
        })
    }
}

/// `factories_manage`'s input.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct ManageParams {
    pub(super) operation: String,
    pub(super) name: Option<String>,
    pub(super) meta: Option<Value>,
    pub(super) run: Option<String>,
    pub(super) run_id: Option<String>,
    pub(super) after: Option<String>,
    pub(super) after_seq: Option<u64>,
    pub(super) before_seq: Option<u64>,
    pub(super) phase: Option<String>,
    pub(super) limit: Option<usize>,
    pub(super) input: Option<Value>,
    pub(super) keep_days: Option<u32>,
    pub(super) keep_last: Option<u32>,
    pub(super) dry_run: Option<bool>,
}

impl schemars::JsonSchema for ManageParams {
    fn schema_name() -> Cow<'static, str> {
        "ManageParams".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let value = json!({
            "type": "object",
            "properties": {
                "operation": {
                    "type": "string",
                    "enum": Operation::ALL.map(Operation::as_str),
                    "description": "list: the factories you can run (name, description, phases, limits). author {meta, run}: write a new factory into this session (it is registered, not run; run it with run_factory). inspect {name}: one factory's description, phases, limits and args schema. runs {after?, limit?}: a page of this session's runs, oldest first (ids, factory, status, updated time); `next`, when present, is the `after` of the next page. show {runId}: a run's envelope, phases, agent summaries and latest progress. progress {runId, afterSeq?, beforeSeq?, phase?, limit?}: a page of its progress log. wait {runId}: block until the run ends and return its envelope. cancel {runId}: stop a running run and return its envelope (it stays resumable). pause {runId}: pause a running run (status paused, resumable, nothing paid twice) and return its envelope. resume {runId, input?}: resume a paused (or stopped) run and wait for it as run_factory does; `input` answers the checkpoint it waits at (its envelope's `checkpoint`). remove {runId}: delete an ended run and its journal for good (cancel a running one first). gc {keepDays?, keepLast?, dryRun?}: delete this session's ended runs (completed, error, cancelled) that the policy no longer keeps: those last updated more than keepDays days ago and not among the newest keepLast of their factory (give at least one); dryRun: only list them."
                },
                "name": {"type": "string", "description": "inspect: the factory's name."},
                "meta": {
                    "type": "object",
                    "description": "author: the factory's metadata: { name, description (say what args it expects), phases?: [{ title }], limits?: { maxConcurrentSubagents, maxTotalSubagents, timeoutSeconds, maxAiCredits }, argsSchema? }."
                },
                "run": {
                    "type": "string",
                    "description": "author: the factory's body, ONE self-contained JavaScript async function expression, e.g. `async ({ args, agent, parallel, step, phase, log }) => { ... }`. It closes over nothing: define every schema, constant and helper inside it; no import statements. ctx has args, runId, agent(prompt, { label, schema, model, agent, reasoningEffort, contextTier }) (text, parsed JSON with a schema, or null on failure), parallel(thunks), pipeline(items, ...stages), step(key, fn), phase(title), log(message), signal."
                },
                "runId": {"type": "string", "description": "show, progress, wait, cancel, pause, resume, remove: the run."},
                "input": {"description": "resume: the answer to the checkpoint the run waits at, any JSON value (ctx.pause returns it)."},
                "after": {"type": "string", "description": "runs: the runs created after this run id (the `next` of the previous page)."},
                "afterSeq": {"type": "integer", "minimum": 0, "description": "progress: entries after this sequence number (page forwards). runs: the runs created after this run `seq` (a page by sequence: { runs, oldestSeq, newestSeq, hasMoreNewer, omittedOlder }; `limit` counts ended runs, default 200, most 500)."},
                "beforeSeq": {"type": "integer", "minimum": 0, "description": "progress: entries before this sequence number (page backwards). runs: the newest runs created before this run `seq` (a page by sequence, as afterSeq; a number past every seq gives the newest page)."},
                "phase": {"type": "string", "description": "progress: only entries of this phase."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "progress: page size (default 50); runs: page size (default and most 1000)."},
                "keepDays": {"type": "integer", "minimum": 0, "description": "gc: keep runs updated in the last this many days."},
                "keepLast": {"type": "integer", "minimum": 0, "description": "gc: keep the newest this many runs of each factory."},
                "dryRun": {"type": "boolean", "description": "gc: only list the runs that would be deleted."}
            },
            "required": ["operation"],
            "additionalProperties": false
        });
        schemars::Schema::try_from(value).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_is_found_by_its_name_and_an_unknown_one_is_invalid_params() {
        for op in Operation::ALL {
            assert_eq!(Operation::named(op.as_str()).ok(), Some(op));
        }
        let unknown = Operation::named("explode").expect_err("refused");
        assert_eq!(unknown.code, ErrorCode::InvalidParams);
        assert!(unknown.message.contains("`explode`") && unknown.message.contains("remove"), "{}", unknown.message);
        // The tool's schema offers exactly these names.
        let schema = serde_json::to_value(<ManageParams as schemars::JsonSchema>::json_schema(
            &mut schemars::SchemaGenerator::default(),
        ))
        .expect("a schema");
        let names: Vec<&str> = Operation::ALL.iter().map(|op| op.as_str()).collect();
        assert_eq!(schema["properties"]["operation"]["enum"], json!(names));
    }
}
