//! Credits: the pricing table that turns token usage into integer nano-credits, and the
//! exact decimal parser that turns a configured price ("0.0025" credits per 1k tokens) into
//! nano-credits without floating-point drift. Accounting itself lives in the run engine.

use super::Usage;
use std::collections::BTreeMap;

/// Nano-credits in one credit.
pub const NANO_PER_CREDIT: u64 = 1_000_000_000;

/// The price of one model: nano-credits per 1000 input and per 1000 output tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    /// Nano-credits per 1000 prompt tokens.
    pub input_nano_per_1k: u64,
    /// Nano-credits per 1000 completion tokens.
    pub output_nano_per_1k: u64,
}

impl Price {
    /// The cost of a call, rounded up to the next nano-credit (saturating).
    pub fn credits_nano(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        let total = u128::from(input_tokens) * u128::from(self.input_nano_per_1k)
            + u128::from(output_tokens) * u128::from(self.output_nano_per_1k);
        u64::try_from(total.div_ceil(1000)).unwrap_or(u64::MAX)
    }
}

/// A backend's prices: a default and per-model overrides (exact model names). A model with
/// no price (no entry of its own and no default) costs an unknown amount, not zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pricing {
    /// The price of a model with no entry of its own (`None`: such models are unpriced).
    pub default: Option<Price>,
    /// Per-model prices.
    pub models: BTreeMap<String, Price>,
}

impl Pricing {
    /// The price that applies to `model`, if one is configured.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.models.get(model).copied().or(self.default)
    }

    /// Usage with its credits for `model` (`credits_nano: None` when the model is unpriced).
    pub fn usage(&self, model: &str, input_tokens: u64, output_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            credits_nano: self.price(model).map(|p| p.credits_nano(input_tokens, output_tokens)),
        }
    }

    /// The message for a budgeted call on an unpriced `model` of backend `backend`, naming
    /// the `factory.toml` lines that would price it; `None` when it is priced.
    pub fn unpriced(&self, backend: &str, model: &str) -> Option<String> {
        if self.price(model).is_some() {
            return None;
        }
        let shown = if model.is_empty() { "(the backend's default)" } else { model };
        Some(format!(
            "model `{shown}` of backend `{backend}` has no price, so maxAiCredits cannot be enforced; \
             price it in factory.toml (credits per 1000 tokens):\n  [backends.{backend}.pricing]\n  \
             models = {{ \"{model}\" = {{ input = 0.003, output = 0.015 }} }}\n\
             (or `input`/`output` for every model; a built-in backend needs a [backends.NAME] entry \
             with `kind = ...` to carry prices), or run without --max-ai-credits"
        ))
    }
}

/// A credit amount that is not a non-negative decimal number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a non-negative decimal amount of credits (at most 9 decimal places)")]
pub struct BadCredits(pub String);

/// Parse a decimal amount of credits ("1", "0.0025", "12.5") exactly into nano-credits.
pub fn parse_credits_nano(text: &str) -> Result<u64, BadCredits> {
    let bad = || BadCredits(text.to_string());
    let t = text.trim();
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    if (whole.is_empty() && frac.is_empty())
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > 9 {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad())? };
    let frac_nano: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<9}").parse().map_err(|_| bad())? };
    whole.checked_mul(NANO_PER_CREDIT).and_then(|w| w.checked_add(frac_nano)).ok_or_else(bad)
}

/// Nano-credits from a floating-point amount (TOML floats, a cost a CLI reports): the
/// shortest decimal that round-trips the float, parsed exactly.
pub fn float_credits_nano(amount: f64) -> Result<u64, BadCredits> {
    if !amount.is_finite() || amount < 0.0 {
        return Err(BadCredits(amount.to_string()));
    }
    // `Display` for f64 never uses an exponent and prints the shortest round-trip form;
    // amounts finer than a nano-credit are rounded up.
    let text = amount.to_string();
    match parse_credits_nano(&text) {
        Ok(n) => Ok(n),
        Err(_) => {
            let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
            let cut = format!("{whole}.{}", &frac[..frac.len().min(9)]);
            parse_credits_nano(&cut).map(|n| n.saturating_add(1)).map_err(|_| BadCredits(text.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_credits_parse_exactly() {
        assert_eq!(parse_credits_nano("1"), Ok(1_000_000_000));
        assert_eq!(parse_credits_nano("0.0025"), Ok(2_500_000));
        assert_eq!(parse_credits_nano(".5"), Ok(500_000_000));
        assert_eq!(parse_credits_nano("3."), Ok(3_000_000_000));
        assert_eq!(parse_credits_nano("0.000000001"), Ok(1));
        assert_eq!(parse_credits_nano("0.1000000000"), Ok(100_000_000));
        assert!(parse_credits_nano("0.0000000001").is_err());
        assert!(parse_credits_nano("-1").is_err());
        assert!(parse_credits_nano("1e3").is_err());
        assert!(parse_credits_nano(".").is_err());
        assert!(parse_credits_nano("99999999999999999999").is_err());
        assert_eq!(float_credits_nano(0.003), Ok(3_000_000));
        assert_eq!(float_credits_nano(0.1 + 0.2), Ok(300_000_001));
        assert_eq!(float_credits_nano(1e-7), Ok(100));
        assert!(float_credits_nano(-0.5).is_err());
        assert!(float_credits_nano(f64::NAN).is_err());
    }

    #[test]
    fn usage_is_priced_per_model_and_rounded_up() {
        let price = Price { input_nano_per_1k: 2_500_000, output_nano_per_1k: 10_000_000 };
        // 1234 * 2.5e6 / 1000 + 567 * 1e7 / 1000 = 3_085_000 + 5_670_000
        assert_eq!(price.credits_nano(1234, 567), 8_755_000);
        // 1 token at 1 nano per 1k is a thousandth of a nano: rounds up to 1.
        assert_eq!(Price { input_nano_per_1k: 1, output_nano_per_1k: 0 }.credits_nano(1, 0), 1);
        assert_eq!(
            Price { input_nano_per_1k: u64::MAX, output_nano_per_1k: u64::MAX }.credits_nano(u64::MAX, 1),
            u64::MAX
        );
        let mut pricing = Pricing::default();
        pricing.models.insert("big".into(), price);
        // No default price: another model's cost is unknown, not zero.
        assert_eq!(pricing.usage("small", 1000, 1000).credits_nano, None);
        assert!(pricing.unpriced("local", "small").is_some_and(|m| m.contains("[backends.local.pricing]")));
        assert_eq!(pricing.unpriced("local", "big"), None);
        assert_eq!(pricing.usage("big", 1000, 1000).credits_nano, Some(12_500_000));
        pricing.default = Some(Price::default());
        assert_eq!(pricing.usage("small", 1000, 1000).credits_nano, Some(0));
    }
}
