//! [`SandboxLimits`]: the host-side limits of every run's sandbox (memory, fuel, the caps
//! on guest values, the journal budget), with their defaults and the check that a host can
//! honour them. Plain configuration: the sandbox applies them to each store, the
//! capabilities to each guest call. [`SandboxLimitKind`] names the limit a run passed (a
//! `sandbox_limit` failure's `kind`).

/// Host-side sandbox limits, the same for every run of a host. Every field has a default,
/// so a serialized form from an older build (missing newer fields) still parses.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct SandboxLimits {
    /// Linear memory per run, in bytes.
    pub memory_bytes: usize,
    /// Table elements per table.
    pub table_elements: usize,
    /// Component and core instances per run.
    pub instances: usize,
    /// Tables per run.
    pub tables: usize,
    /// Memories per run.
    pub memories: usize,
    /// CPU fuel per attempt (roughly one unit per wasm instruction).
    pub fuel: u64,
    /// Fuel between forced yields, so a spinning guest never starves other runs.
    pub fuel_yield_interval: u64,
    /// Bytes of a prompt.
    pub max_prompt_bytes: usize,
    /// Bytes of one step value.
    pub max_step_bytes: usize,
    /// Bytes of the run's result.
    pub max_result_bytes: usize,
    /// Bytes of captured stdout + stderr per run.
    pub max_output_bytes: usize,
    /// Log lines per run; further lines are dropped and counted.
    pub max_log_lines: usize,
    /// Bytes of one log line (longer lines are truncated).
    pub max_log_line_bytes: usize,
    /// Bytes of log text per run; further lines are dropped and counted.
    pub max_log_bytes: usize,
    /// Agent calls one run may have pending at once (queued or running): each holds its
    /// prompt in the host, so a guest bypassing its SDK's item cap cannot pile up memory.
    /// A memo hit, answered at once from the journal, is never pending.
    pub max_pending_agent_calls: usize,
    /// Bytes one run's pending agent calls may hold in the host at once (prompts, labels,
    /// models, schemas and their parsed trees); a call past it aborts the run. Admitted
    /// after the per-call caps: a call with a schema or over 64 KiB before it is keyed, any
    /// other before it waits.
    pub max_pending_agent_bytes: u64,
    /// The same over every run of the host.
    pub max_host_pending_agent_bytes: u64,
    /// Nesting depth of any JSON value crossing the boundary (results, step values); at
    /// most [`crate::model::json::MAX_DEPTH`], which is also the default.
    pub max_json_depth: usize,
    /// Bytes of a phase title (`ctx.phase`).
    pub max_phase_bytes: usize,
    /// Bytes of an agent call's label.
    pub max_label_bytes: usize,
    /// Bytes of an agent call's model name.
    pub max_model_bytes: usize,
    /// Bytes of a step key.
    pub max_step_key_bytes: usize,
    /// Bytes of an agent call's schema text.
    pub max_schema_bytes: usize,
    /// Store bytes a run may journal over its whole life, all attempts together: step keys
    /// and values, agent keys and results, progress entries, each charged what it occupies
    /// in the store (the store's footprint).
    pub max_journal_bytes: u64,
    /// Distinct step keys a run may journal, all attempts together.
    pub max_steps: usize,
    /// Bytes of journaled step values and agent results a run keeps in host memory; the
    /// rest is read from the store when the guest asks for it. Not a guest-visible limit.
    pub journal_cache_bytes: usize,
    /// How long the factory's `meta` may take, in milliseconds (it must be cheap: the host
    /// calls it to load, describe and register a component).
    pub meta_timeout_ms: u64,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 256 << 20,
            table_elements: 100_000,
            instances: 64,
            tables: 64,
            memories: 16,
            fuel: 50_000_000_000,
            fuel_yield_interval: 1_000_000,
            max_prompt_bytes: 1 << 20,
            max_step_bytes: 16 << 20,
            max_result_bytes: 16 << 20,
            max_output_bytes: 1 << 20,
            max_log_lines: 100_000,
            max_log_line_bytes: 8 << 10,
            max_log_bytes: 16 << 20,
            max_json_depth: crate::model::json::MAX_DEPTH,
            max_pending_agent_calls: 65_536,
            max_pending_agent_bytes: default_pending_agent_bytes(),
            max_host_pending_agent_bytes: default_host_pending_agent_bytes(),
            max_phase_bytes: 1 << 10,
            max_label_bytes: 1 << 10,
            max_model_bytes: 1 << 10,
            max_step_key_bytes: 4 << 10,
            max_schema_bytes: 256 << 10,
            max_journal_bytes: 256 << 20,
            max_steps: 100_000,
            journal_cache_bytes: 32 << 20,
            meta_timeout_ms: 10_000,
        }
    }
}

/// Default [`SandboxLimits::max_pending_agent_bytes`]: 128 MiB, half the default memory
/// limit, so a run's guest memory and its pending calls stay under twice that limit.
fn default_pending_agent_bytes() -> u64 {
    128 << 20
}

/// Default [`SandboxLimits::max_host_pending_agent_bytes`]: 1 GiB.
fn default_host_pending_agent_bytes() -> u64 {
    1 << 30
}

/// Sandbox limits a host cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum SandboxLimitsError {
    /// `max_json_depth` over [`crate::model::json::MAX_DEPTH`]: values that deep could not be
    /// read back inside the records and wire frames that wrap them.
    #[error("maxJsonDepth {0} is over the ceiling of {ceiling}", ceiling = crate::model::json::MAX_DEPTH)]
    JsonDepth(usize),
}

impl SandboxLimits {
    /// Check the limits a host can honour.
    pub fn validate(&self) -> Result<(), SandboxLimitsError> {
        if self.max_json_depth > crate::model::json::MAX_DEPTH {
            return Err(SandboxLimitsError::JsonDepth(self.max_json_depth));
        }
        Ok(())
    }

    /// One line naming the caps on guest values and the journal budget (for `describe` and
    /// `show`), e.g. `phase/label/model <= 1 KiB, step key <= 4 KiB, ...`.
    pub fn bounds_line(&self) -> String {
        format!(
            "phase <= {}, label <= {}, model <= {}, step key <= {}, schema <= {}, journal <= {}, steps <= {}",
            human_bytes(self.max_phase_bytes as u64),
            human_bytes(self.max_label_bytes as u64),
            human_bytes(self.max_model_bytes as u64),
            human_bytes(self.max_step_key_bytes as u64),
            human_bytes(self.max_schema_bytes as u64),
            human_bytes(self.max_journal_bytes),
            self.max_steps
        )
    }
}

/// `1 KiB`, `256 MiB`, `1000 bytes`: exact binary units when they divide evenly.
fn human_bytes(n: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

/// Which sandbox limit a run passed: the `kind` of a `sandbox_limit` failure, serialized as
/// its name (`maxStepBytes`, `fuel`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SandboxLimitKind {
    /// the run's result, in bytes.
    MaxResultBytes,
    /// the nesting of the run's result.
    MaxJsonDepth,
    /// the guest's CPU fuel.
    Fuel,
    /// the guest's stack.
    Stack,
    /// the guest's linear memory.
    Memory,
    /// the guest's tables.
    Table,
    /// the bytes a run journals.
    MaxJournalBytes,
    /// an agent prompt (or wrap-up prompt), in bytes.
    MaxPromptBytes,
    /// agent calls pending at once.
    MaxPendingAgentCalls,
    /// bytes of the run's pending agent calls.
    MaxPendingAgentBytes,
    /// bytes of every run's pending agent calls on the host.
    MaxHostPendingAgentBytes,
    /// a step's value, in bytes.
    MaxStepBytes,
    /// steps journaled by a run.
    MaxSteps,
    /// checkpoints of a run.
    MaxCheckpoints,
    /// a phase title, in bytes.
    MaxPhaseBytes,
    /// an agent label, in bytes.
    MaxLabelBytes,
    /// an agent's model name, in bytes.
    MaxModelBytes,
    /// an agent's schema, in bytes.
    MaxSchemaBytes,
    /// a step or checkpoint key, in bytes.
    MaxStepKeyBytes,
}

impl SandboxLimitKind {
    /// Every kind.
    pub const ALL: [SandboxLimitKind; 19] = [
        SandboxLimitKind::MaxResultBytes,
        SandboxLimitKind::MaxJsonDepth,
        SandboxLimitKind::Fuel,
        SandboxLimitKind::Stack,
        SandboxLimitKind::Memory,
        SandboxLimitKind::Table,
        SandboxLimitKind::MaxJournalBytes,
        SandboxLimitKind::MaxPromptBytes,
        SandboxLimitKind::MaxPendingAgentCalls,
        SandboxLimitKind::MaxPendingAgentBytes,
        SandboxLimitKind::MaxHostPendingAgentBytes,
        SandboxLimitKind::MaxStepBytes,
        SandboxLimitKind::MaxSteps,
        SandboxLimitKind::MaxCheckpoints,
        SandboxLimitKind::MaxPhaseBytes,
        SandboxLimitKind::MaxLabelBytes,
        SandboxLimitKind::MaxModelBytes,
        SandboxLimitKind::MaxSchemaBytes,
        SandboxLimitKind::MaxStepKeyBytes,
    ];

    /// Its name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxLimitKind::MaxResultBytes => "maxResultBytes",
            SandboxLimitKind::MaxJsonDepth => "maxJsonDepth",
            SandboxLimitKind::Fuel => "fuel",
            SandboxLimitKind::Stack => "stack",
            SandboxLimitKind::Memory => "memory",
            SandboxLimitKind::Table => "table",
            SandboxLimitKind::MaxJournalBytes => "maxJournalBytes",
            SandboxLimitKind::MaxPromptBytes => "maxPromptBytes",
            SandboxLimitKind::MaxPendingAgentCalls => "maxPendingAgentCalls",
            SandboxLimitKind::MaxPendingAgentBytes => "maxPendingAgentBytes",
            SandboxLimitKind::MaxHostPendingAgentBytes => "maxHostPendingAgentBytes",
            SandboxLimitKind::MaxStepBytes => "maxStepBytes",
            SandboxLimitKind::MaxSteps => "maxSteps",
            SandboxLimitKind::MaxCheckpoints => "maxCheckpoints",
            SandboxLimitKind::MaxPhaseBytes => "maxPhaseBytes",
            SandboxLimitKind::MaxLabelBytes => "maxLabelBytes",
            SandboxLimitKind::MaxModelBytes => "maxModelBytes",
            SandboxLimitKind::MaxSchemaBytes => "maxSchemaBytes",
            SandboxLimitKind::MaxStepKeyBytes => "maxStepKeyBytes",
        }
    }
}

impl std::fmt::Display for SandboxLimitKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sandbox_limit_kind_serializes_as_its_name() {
        use super::SandboxLimitKind;
        for kind in SandboxLimitKind::ALL {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(kind.as_str()));
            assert_eq!(serde_json::from_value::<SandboxLimitKind>(serde_json::json!(kind.as_str())).unwrap(), kind);
        }
        assert_eq!(SandboxLimitKind::MaxHostPendingAgentBytes.to_string(), "maxHostPendingAgentBytes");
        assert_eq!(SandboxLimitKind::Fuel.as_str(), "fuel");
    }

    use super::SandboxLimits;

    #[test]
    fn an_older_serialized_form_reads_with_the_new_limits_defaulted() {
        // What a host before the guest-value caps and the journal budget sent.
        let old = serde_json::json!({
            "memoryBytes": 1 << 20, "tableElements": 10, "instances": 1, "tables": 1, "memories": 1,
            "fuel": 5, "fuelYieldInterval": 1, "maxPromptBytes": 7, "maxStepBytes": 8, "maxResultBytes": 9,
            "maxOutputBytes": 10, "maxLogLines": 11, "maxLogLineBytes": 12, "maxLogBytes": 13,
            "maxPendingAgentCalls": 14, "maxJsonDepth": 15
        });
        let limits: SandboxLimits = serde_json::from_value(old).expect("an older form parses");
        let defaults = SandboxLimits::default();
        assert_eq!(limits.memory_bytes, 1 << 20);
        assert_eq!(limits.max_prompt_bytes, 7);
        assert_eq!(limits.max_phase_bytes, defaults.max_phase_bytes);
        assert_eq!(limits.max_journal_bytes, defaults.max_journal_bytes);
        assert_eq!(limits.max_steps, defaults.max_steps);
        // And the current form round-trips.
        let again: SandboxLimits = serde_json::from_value(serde_json::to_value(&defaults).unwrap()).unwrap();
        assert_eq!(again, defaults);
    }

    #[test]
    fn the_bounds_line_names_every_new_limit_with_its_default() {
        assert_eq!(
            SandboxLimits::default().bounds_line(),
            "phase <= 1 KiB, label <= 1 KiB, model <= 1 KiB, step key <= 4 KiB, schema <= 256 KiB, \
             journal <= 256 MiB, steps <= 100000"
        );
    }
}
