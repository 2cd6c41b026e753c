//! The four factory limits: declared in `meta`, overridden per invocation (an override may
//! also lift a declared limit: no limit of that kind for the run), validated before a run
//! starts; and the per-agent soft limits ([`AgentLimits`]: a call's own, falling back to the
//! factory's defaults in `meta`) with the [`SoftLimit`] that ended a call.

use serde::{Deserialize, Deserializer, Serialize};

/// The largest `timeoutSeconds` accepted (the spec's cap, i32::MAX milliseconds).
pub const MAX_TIMEOUT_SECONDS: f64 = 2_147_483.647;

/// Factory limits. `None` means "no limit of this kind". As the overrides of an invocation
/// a limit may also be lifted ([`Lifted`]): no limit of that kind, whatever the factory
/// declares. JSON: camelCase fields, absent when not given; a lifted limit is `null`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(from = "LimitsForm", into = "LimitsForm")]
pub struct Limits {
    /// Subagents running at once; more wait in a queue.
    pub max_concurrent_subagents: Option<u32>,
    /// Subagent spawns over the whole run (all attempts).
    pub max_total_subagents: Option<u32>,
    /// Accumulated active seconds over all attempts.
    pub timeout_seconds: Option<f64>,
    /// AI-credit budget for the run (post-paid, fail-closed).
    pub max_ai_credits: Option<f64>,
    /// The limits these overrides lift (each then has no value). Effective limits
    /// ([`Limits::overridden_by`]) and declared ones lift nothing.
    pub lifted: Lifted,
}

/// Which limits an override lifts: no limit of that kind for the invocation, whatever the
/// factory declares (`--max-ai-credits none`; `"maxAiCredits": null` in JSON).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifted {
    /// `maxConcurrentSubagents` is lifted.
    pub max_concurrent_subagents: bool,
    /// `maxTotalSubagents` is lifted.
    pub max_total_subagents: bool,
    /// `timeoutSeconds` is lifted.
    pub timeout_seconds: bool,
    /// `maxAiCredits` is lifted.
    pub max_ai_credits: bool,
}

impl Lifted {
    /// The names (as the spec spells them) of the lifted limits, in declaration order.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.max_concurrent_subagents, "maxConcurrentSubagents"),
            (self.max_total_subagents, "maxTotalSubagents"),
            (self.timeout_seconds, "timeoutSeconds"),
            (self.max_ai_credits, "maxAiCredits"),
        ]
        .into_iter()
        .filter_map(|(lifted, name)| lifted.then_some(name))
        .collect()
    }
}

/// The JSON form of [`Limits`]: per field absent (not given), `null` (lifted) or a value.
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
struct LimitsForm {
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    max_concurrent_subagents: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    max_total_subagents: Option<Option<u32>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    timeout_seconds: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    max_ai_credits: Option<Option<f64>>,
}

/// A field that is present: `Some(None)` for `null`, `Some(Some(v))` for a value.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A field's value and whether it is lifted, from its JSON form.
fn unform<T>(field: Option<Option<T>>) -> (Option<T>, bool) {
    match field {
        None => (None, false),
        Some(None) => (None, true),
        Some(Some(value)) => (Some(value), false),
    }
}

/// A field's JSON form from its value and whether it is lifted (a value wins).
fn form<T>(value: Option<T>, lifted: bool) -> Option<Option<T>> {
    match value {
        Some(value) => Some(Some(value)),
        None => lifted.then_some(None),
    }
}

impl From<LimitsForm> for Limits {
    fn from(f: LimitsForm) -> Limits {
        let (max_concurrent_subagents, mcs) = unform(f.max_concurrent_subagents);
        let (max_total_subagents, mts) = unform(f.max_total_subagents);
        let (timeout_seconds, ts) = unform(f.timeout_seconds);
        let (max_ai_credits, mac) = unform(f.max_ai_credits);
        Limits {
            max_concurrent_subagents,
            max_total_subagents,
            timeout_seconds,
            max_ai_credits,
            lifted: Lifted {
                max_concurrent_subagents: mcs,
                max_total_subagents: mts,
                timeout_seconds: ts,
                max_ai_credits: mac,
            },
        }
    }
}

impl From<Limits> for LimitsForm {
    fn from(l: Limits) -> LimitsForm {
        LimitsForm {
            max_concurrent_subagents: form(l.max_concurrent_subagents, l.lifted.max_concurrent_subagents),
            max_total_subagents: form(l.max_total_subagents, l.lifted.max_total_subagents),
            timeout_seconds: form(l.timeout_seconds, l.lifted.timeout_seconds),
            max_ai_credits: form(l.max_ai_credits, l.lifted.max_ai_credits),
        }
    }
}

/// One limit of an override after an earlier one: the later one's when it gives or lifts it.
fn later<T: Copy>(earlier: (Option<T>, bool), later: (Option<T>, bool)) -> (Option<T>, bool) {
    if later.0.is_some() || later.1 {
        later
    } else {
        earlier
    }
}

/// A limit value that is not allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid limit `{field}`: {reason}")]
pub struct LimitError {
    /// The limit's name as the spec spells it (`timeoutSeconds`, ...).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// 2^53 - 1: the largest integer a double (a JSON number in most readers) holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

impl Limits {
    /// Check every present limit: positive, integral where integral, timeout finite and at
    /// most [`MAX_TIMEOUT_SECONDS`], `maxAiCredits` a positive safe integer of nano-credits.
    ///
    /// ```
    /// use factory_host::Limits;
    ///
    /// let fine = Limits { timeout_seconds: Some(90.5), max_total_subagents: Some(10), ..Limits::default() };
    /// assert!(fine.validate().is_ok());
    /// let zero = Limits { timeout_seconds: Some(0.0), ..Limits::default() };
    /// assert_eq!(zero.validate().unwrap_err().field, "timeoutSeconds");
    /// let dust = Limits { max_ai_credits: Some(1e-10), ..Limits::default() };
    /// assert!(dust.validate().unwrap_err().reason.contains("rounds to zero"));
    /// let huge = Limits { max_ai_credits: Some(1e7), ..Limits::default() };
    /// assert!(huge.validate().unwrap_err().reason.contains("safe integer"));
    /// assert!(Limits { max_ai_credits: Some(9e6), ..Limits::default() }.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), LimitError> {
        let bad = |field, reason: String| Err(LimitError { field, reason });
        if self.max_concurrent_subagents == Some(0) {
            return bad("maxConcurrentSubagents", "must be a positive integer, got 0".into());
        }
        if self.max_total_subagents == Some(0) {
            return bad("maxTotalSubagents", "must be a positive integer, got 0".into());
        }
        if let Some(t) = self.timeout_seconds {
            if !t.is_finite() || t <= 0.0 {
                return bad("timeoutSeconds", format!("must be a positive finite number, got {t}"));
            }
            if t > MAX_TIMEOUT_SECONDS {
                return bad("timeoutSeconds", format!("must be at most {MAX_TIMEOUT_SECONDS}, got {t}"));
            }
        }
        if let Some(c) = self.max_ai_credits {
            if !c.is_finite() || c <= 0.0 {
                return bad("maxAiCredits", format!("must be a positive finite number, got {c}"));
            }
            // Budgets are kept in nano-credits: as upstream, the amount must round to a
            // positive integer of them that is exact in a double (and in JSON readers).
            let nano = (c * 1e9).round();
            if nano < 1.0 {
                return bad("maxAiCredits", format!("rounds to zero nano-credits, got {c}"));
            }
            if nano > MAX_SAFE_INTEGER {
                return bad(
                    "maxAiCredits",
                    format!("is past the largest safe integer of nano-credits (9007199.254740991 credits), got {c}"),
                );
            }
        }
        let given = [
            self.max_concurrent_subagents.is_some(),
            self.max_total_subagents.is_some(),
            self.timeout_seconds.is_some(),
            self.max_ai_credits.is_some(),
        ];
        let lifted = [
            self.lifted.max_concurrent_subagents,
            self.lifted.max_total_subagents,
            self.lifted.timeout_seconds,
            self.lifted.max_ai_credits,
        ];
        let names = ["maxConcurrentSubagents", "maxTotalSubagents", "timeoutSeconds", "maxAiCredits"];
        if let Some(i) = (0..4).find(|&i| given[i] && lifted[i]) {
            return bad(names[i], "is both given and lifted".into());
        }
        Ok(())
    }

    /// The effective limits: these (declared) limits with every limit `overrides` gives
    /// replacing its counterpart and every limit it lifts removed. Lifts nothing itself.
    pub fn overridden_by(&self, overrides: &Limits) -> Limits {
        fn pick<T>(declared: Option<T>, given: Option<T>, lifted: bool) -> Option<T> {
            if lifted {
                None
            } else {
                given.or(declared)
            }
        }
        let lifted = &overrides.lifted;
        Limits {
            max_concurrent_subagents: pick(
                self.max_concurrent_subagents,
                overrides.max_concurrent_subagents,
                lifted.max_concurrent_subagents,
            ),
            max_total_subagents: pick(
                self.max_total_subagents,
                overrides.max_total_subagents,
                lifted.max_total_subagents,
            ),
            timeout_seconds: pick(self.timeout_seconds, overrides.timeout_seconds, lifted.timeout_seconds),
            max_ai_credits: pick(self.max_ai_credits, overrides.max_ai_credits, lifted.max_ai_credits),
            lifted: Lifted::default(),
        }
    }

    /// These overrides followed by `next` (a resume's): each limit `next` gives or lifts
    /// replaces this one's, the others stay (lifts included).
    pub fn followed_by(&self, next: &Limits) -> Limits {
        let (a, b) = (&self.lifted, &next.lifted);
        let (max_concurrent_subagents, mcs) = later(
            (self.max_concurrent_subagents, a.max_concurrent_subagents),
            (next.max_concurrent_subagents, b.max_concurrent_subagents),
        );
        let (max_total_subagents, mts) =
            later((self.max_total_subagents, a.max_total_subagents), (next.max_total_subagents, b.max_total_subagents));
        let (timeout_seconds, ts) =
            later((self.timeout_seconds, a.timeout_seconds), (next.timeout_seconds, b.timeout_seconds));
        let (max_ai_credits, mac) =
            later((self.max_ai_credits, a.max_ai_credits), (next.max_ai_credits, b.max_ai_credits));
        Limits {
            max_concurrent_subagents,
            max_total_subagents,
            timeout_seconds,
            max_ai_credits,
            lifted: Lifted {
                max_concurrent_subagents: mcs,
                max_total_subagents: mts,
                timeout_seconds: ts,
                max_ai_credits: mac,
            },
        }
    }

    /// How many subagents may run at once: the concurrency cap, else the total cap.
    pub fn concurrency(&self) -> Option<u32> {
        self.max_concurrent_subagents.or(self.max_total_subagents)
    }
}

/// The wrap-up prompt sent when a call's `maxDurationSeconds` is up and it set none.
pub const DEFAULT_WRAP_UP: &str =
    "Your time for this task is up. Stop working now and give your final answer, in the format you were asked for.";

/// Soft limits of one agent call (the factory's defaults, or a call's own). `None`: no limit
/// of this kind. Part of the call's memo key when any is present.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentLimits {
    /// Model turns the subagent may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Wall-clock seconds the call may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_seconds: Option<f64>,
    /// The prompt sent when `max_duration_seconds` is up ([`DEFAULT_WRAP_UP`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap_up: Option<String>,
}

/// A soft limit value that is not allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentLimitError {
    /// `maxTurns` is 0.
    #[error("invalid agent limit `maxTurns`: must be a positive integer, got 0")]
    MaxTurns,
    /// `maxDurationSeconds` is not a positive finite number within the cap.
    #[error("invalid agent limit `maxDurationSeconds`: must be a positive finite number of at most {MAX_TIMEOUT_SECONDS}, got {0}")]
    MaxDurationSeconds(f64),
    /// `wrapUp` is empty (whitespace only).
    #[error("invalid agent limit `wrapUp`: must not be empty")]
    EmptyWrapUp,
}

impl AgentLimitError {
    /// The limit's name as the SDKs spell it.
    pub fn field(&self) -> &'static str {
        match self {
            AgentLimitError::MaxTurns => "maxTurns",
            AgentLimitError::MaxDurationSeconds(_) => "maxDurationSeconds",
            AgentLimitError::EmptyWrapUp => "wrapUp",
        }
    }
}

impl AgentLimits {
    /// Whether no soft limit is set.
    pub fn is_empty(&self) -> bool {
        self.max_turns.is_none() && self.max_duration_seconds.is_none() && self.wrap_up.is_none()
    }

    /// Check every present value: `maxTurns` positive, `maxDurationSeconds` positive, finite
    /// and at most [`MAX_TIMEOUT_SECONDS`], `wrapUp` not blank.
    ///
    /// ```
    /// use factory_host::limits::{AgentLimits, AgentLimitError};
    ///
    /// assert!(AgentLimits { max_turns: Some(3), max_duration_seconds: Some(0.5), ..Default::default() }.validate().is_ok());
    /// let zero = AgentLimits { max_turns: Some(0), ..Default::default() };
    /// assert_eq!(zero.validate(), Err(AgentLimitError::MaxTurns));
    /// ```
    pub fn validate(&self) -> Result<(), AgentLimitError> {
        if self.max_turns == Some(0) {
            return Err(AgentLimitError::MaxTurns);
        }
        if let Some(d) = self.max_duration_seconds {
            if !d.is_finite() || d <= 0.0 || d > MAX_TIMEOUT_SECONDS {
                return Err(AgentLimitError::MaxDurationSeconds(d));
            }
        }
        if self.wrap_up.as_deref().is_some_and(|w| w.trim().is_empty()) {
            return Err(AgentLimitError::EmptyWrapUp);
        }
        Ok(())
    }

    /// These limits with each absent one taken from `defaults` (the factory's).
    pub fn or(self, defaults: &AgentLimits) -> AgentLimits {
        AgentLimits {
            max_turns: self.max_turns.or(defaults.max_turns),
            max_duration_seconds: self.max_duration_seconds.or(defaults.max_duration_seconds),
            wrap_up: self.wrap_up.or_else(|| defaults.wrap_up.clone()),
        }
    }

    /// `max_duration_seconds` as a duration.
    pub fn max_duration(&self) -> Option<std::time::Duration> {
        self.max_duration_seconds.and_then(|d| std::time::Duration::try_from_secs_f64(d).ok())
    }

    /// The wrap-up prompt to send: the call's, else [`DEFAULT_WRAP_UP`].
    pub fn wrap_up_prompt(&self) -> &str {
        self.wrap_up.as_deref().unwrap_or(DEFAULT_WRAP_UP)
    }
}

/// The soft limit that ended an agent call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SoftLimit {
    /// The subagent used its `maxTurns`.
    MaxTurns,
    /// The call's `maxDurationSeconds` ran out.
    MaxDurationSeconds,
}

impl SoftLimit {
    /// The spelling used in run detail, progress and traces.
    pub fn as_str(self) -> &'static str {
        match self {
            SoftLimit::MaxTurns => "maxTurns",
            SoftLimit::MaxDurationSeconds => "maxDurationSeconds",
        }
    }
}

impl std::fmt::Display for SoftLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_limits_reject_bad_values_and_fall_back_field_by_field() {
        let bad = [
            (AgentLimits { max_turns: Some(0), ..Default::default() }, "maxTurns"),
            (AgentLimits { max_duration_seconds: Some(0.0), ..Default::default() }, "maxDurationSeconds"),
            (AgentLimits { max_duration_seconds: Some(f64::NAN), ..Default::default() }, "maxDurationSeconds"),
            (AgentLimits { max_duration_seconds: Some(-2.0), ..Default::default() }, "maxDurationSeconds"),
            (AgentLimits { max_duration_seconds: Some(2_147_483.648), ..Default::default() }, "maxDurationSeconds"),
            (AgentLimits { wrap_up: Some(" \n".into()), ..Default::default() }, "wrapUp"),
        ];
        for (limits, field) in bad {
            assert_eq!(limits.validate().unwrap_err().field(), field, "{limits:?}");
        }
        let defaults =
            AgentLimits { max_turns: Some(8), max_duration_seconds: Some(60.0), wrap_up: Some("now".into()) };
        let merged = AgentLimits { max_turns: Some(2), ..Default::default() }.or(&defaults);
        assert_eq!(
            merged,
            AgentLimits { max_turns: Some(2), max_duration_seconds: Some(60.0), wrap_up: Some("now".into()) }
        );
        assert_eq!(AgentLimits::default().wrap_up_prompt(), DEFAULT_WRAP_UP);
        assert!(AgentLimits::default().is_empty() && !merged.is_empty());
    }

    #[test]
    fn rejects_each_bad_value_by_name() {
        let cases = [
            (Limits { max_concurrent_subagents: Some(0), ..Default::default() }, "maxConcurrentSubagents"),
            (Limits { max_total_subagents: Some(0), ..Default::default() }, "maxTotalSubagents"),
            (Limits { timeout_seconds: Some(0.0), ..Default::default() }, "timeoutSeconds"),
            (Limits { timeout_seconds: Some(-1.5), ..Default::default() }, "timeoutSeconds"),
            (Limits { timeout_seconds: Some(f64::INFINITY), ..Default::default() }, "timeoutSeconds"),
            (Limits { timeout_seconds: Some(f64::NAN), ..Default::default() }, "timeoutSeconds"),
            (Limits { timeout_seconds: Some(2_147_483.648), ..Default::default() }, "timeoutSeconds"),
            (Limits { max_ai_credits: Some(0.0), ..Default::default() }, "maxAiCredits"),
            (Limits { max_ai_credits: Some(f64::NAN), ..Default::default() }, "maxAiCredits"),
        ];
        for (limits, field) in cases {
            assert_eq!(limits.validate().unwrap_err().field, field, "{limits:?}");
        }
    }

    #[test]
    fn accepts_fractions_and_the_cap() {
        let ok = Limits {
            max_concurrent_subagents: Some(3),
            max_total_subagents: Some(10),
            timeout_seconds: Some(MAX_TIMEOUT_SECONDS),
            max_ai_credits: Some(0.5),
            lifted: Lifted::default(),
        };
        assert_eq!(ok.validate(), Ok(()));
        assert!(Limits { timeout_seconds: Some(90.5), ..Default::default() }.validate().is_ok());
    }

    #[test]
    fn overrides_replace_only_present_fields_and_total_bounds_concurrency() {
        let declared = Limits { max_total_subagents: Some(10), max_ai_credits: Some(5.0), ..Default::default() };
        let merged = declared.overridden_by(&Limits { max_ai_credits: Some(6.0), ..Default::default() });
        assert_eq!(merged.max_total_subagents, Some(10));
        assert_eq!(merged.max_ai_credits, Some(6.0));
        assert_eq!(merged.concurrency(), Some(10));
        let capped = merged.overridden_by(&Limits { max_concurrent_subagents: Some(2), ..Default::default() });
        assert_eq!(capped.concurrency(), Some(2));
    }

    #[test]
    fn a_lifted_limit_is_null_in_json_and_removes_the_declared_one_through_resumes() {
        let lift = |lifted: Lifted| Limits { lifted, ..Default::default() };
        let no_budget = lift(Lifted { max_ai_credits: true, ..Default::default() });
        assert_eq!(serde_json::to_value(no_budget).unwrap(), serde_json::json!({"maxAiCredits": null}));
        let read: Limits = serde_json::from_str(r#"{"maxAiCredits": null, "timeoutSeconds": 5}"#).unwrap();
        assert_eq!(read, Limits { timeout_seconds: Some(5.0), ..no_budget });
        // Absent is not given; a value round-trips; nothing else changed in the JSON form.
        assert_eq!(serde_json::from_str::<Limits>("{}").unwrap(), Limits::default());
        assert_eq!(serde_json::to_string(&Limits::default()).unwrap(), "{}");
        let some = Limits { max_total_subagents: Some(4), max_ai_credits: Some(2.5), ..Default::default() };
        assert_eq!(serde_json::to_string(&some).unwrap(), r#"{"maxTotalSubagents":4,"maxAiCredits":2.5}"#);
        assert_eq!(serde_json::from_str::<Limits>(&serde_json::to_string(&some).unwrap()).unwrap(), some);

        let declared = Limits { max_total_subagents: Some(10), max_ai_credits: Some(5.0), ..Default::default() };
        let effective = declared.overridden_by(&no_budget);
        assert_eq!(
            effective,
            Limits { max_total_subagents: Some(10), ..Default::default() },
            "effective limits lift nothing"
        );
        assert_eq!(effective.validate(), Ok(()));
        assert_eq!(no_budget.lifted.names(), ["maxAiCredits"]);

        // A resume that says nothing keeps the lift; one that gives a budget replaces it.
        let kept = no_budget.followed_by(&Limits { max_concurrent_subagents: Some(2), ..Default::default() });
        assert_eq!(declared.overridden_by(&kept).max_ai_credits, None);
        assert_eq!(kept.max_concurrent_subagents, Some(2));
        let budget = kept.followed_by(&Limits { max_ai_credits: Some(7.0), ..Default::default() });
        assert_eq!(declared.overridden_by(&budget).max_ai_credits, Some(7.0));
        assert!(!budget.lifted.max_ai_credits);
        // And a later lift removes an earlier override's value.
        let lifted_again = budget.followed_by(&no_budget);
        assert_eq!(declared.overridden_by(&lifted_again).max_ai_credits, None);

        let both = Limits { max_ai_credits: Some(1.0), ..no_budget };
        assert_eq!(both.validate().unwrap_err().field, "maxAiCredits");
    }
}
