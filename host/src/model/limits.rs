//! The four factory limits: declared in `meta`, overridden per invocation, validated before a
//! run starts.

use serde::{Deserialize, Serialize};

/// The largest `timeoutSeconds` accepted (the spec's cap, i32::MAX milliseconds).
pub const MAX_TIMEOUT_SECONDS: f64 = 2_147_483.647;

/// Factory limits. `None` means "no limit of this kind".
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Subagents running at once; more wait in a queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_subagents: Option<u32>,
    /// Subagent spawns over the whole run (all attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_subagents: Option<u32>,
    /// Accumulated active seconds over all attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// AI-credit budget for the run (post-paid, fail-closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ai_credits: Option<f64>,
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

impl Limits {
    /// Check every present limit: positive, integral where integral, timeout finite and at
    /// most [`MAX_TIMEOUT_SECONDS`].
    ///
    /// ```
    /// use factory_host::Limits;
    ///
    /// let fine = Limits { timeout_seconds: Some(90.5), max_total_subagents: Some(10), ..Limits::default() };
    /// assert!(fine.validate().is_ok());
    /// let zero = Limits { timeout_seconds: Some(0.0), ..Limits::default() };
    /// assert_eq!(zero.validate().unwrap_err().field, "timeoutSeconds");
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
        }
        Ok(())
    }

    /// These limits with every limit present in `overrides` replacing its counterpart.
    pub fn overridden_by(&self, overrides: &Limits) -> Limits {
        Limits {
            max_concurrent_subagents: overrides.max_concurrent_subagents.or(self.max_concurrent_subagents),
            max_total_subagents: overrides.max_total_subagents.or(self.max_total_subagents),
            timeout_seconds: overrides.timeout_seconds.or(self.timeout_seconds),
            max_ai_credits: overrides.max_ai_credits.or(self.max_ai_credits),
        }
    }

    /// How many subagents may run at once: the concurrency cap, else the total cap.
    pub fn concurrency(&self) -> Option<u32> {
        self.max_concurrent_subagents.or(self.max_total_subagents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
