//! Credits: the pricing that turns token usage into integer nano-credits, the built-in
//! dated price table of common OpenAI and Anthropic models, and the exact decimal parser
//! that turns a configured price ("0.0025" credits per 1k tokens) into nano-credits without
//! floating-point drift. One AI credit is one US cent (US$0.01); a nano-credit is 10^-9 of
//! a credit (US$10^-11), and every amount is an integer number of nano-credits. Accounting
//! itself lives in the run engine.

use super::Usage;
use std::collections::BTreeMap;

/// Nano-credits in one credit.
pub const NANO_PER_CREDIT: u64 = 1_000_000_000;

/// Credits in one US dollar: one AI credit is one US cent.
pub const CREDITS_PER_USD: u64 = 100;

/// The date the built-in prices ([`builtin_prices`]) were taken from the providers' public
/// price lists.
pub const BUILTIN_PRICES_TAKEN: &str = "2025-11-24";

/// The price of one model in nano-credits per 1000 tokens of each kind. A cache price of
/// `None` is unknown: cache tokens of that kind are then counted at zero and the cost is
/// flagged as a lower bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Price {
    /// Nano-credits per 1000 uncached prompt tokens.
    pub input_nano_per_1k: u64,
    /// Nano-credits per 1000 completion tokens.
    pub output_nano_per_1k: u64,
    /// Nano-credits per 1000 prompt tokens read from the cache, if known.
    pub cache_read_nano_per_1k: Option<u64>,
    /// Nano-credits per 1000 prompt tokens written to the cache, if known.
    pub cache_write_nano_per_1k: Option<u64>,
}

impl Price {
    /// Zero for every kind of token, cache reads and writes included: the price of a model
    /// a server on this machine runs when nothing prices it ([`CallPricing`]).
    pub const FREE: Price = Price {
        input_nano_per_1k: 0,
        output_nano_per_1k: 0,
        cache_read_nano_per_1k: Some(0),
        cache_write_nano_per_1k: Some(0),
    };

    /// A price for input and output tokens only (cache prices unknown).
    pub fn new(input_nano_per_1k: u64, output_nano_per_1k: u64) -> Price {
        Price { input_nano_per_1k, output_nano_per_1k, ..Price::default() }
    }

    /// The cost of a call of `input_tokens` and `output_tokens` (no cache), rounded up to
    /// the next nano-credit (saturating).
    pub fn credits_nano(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        self.cost(&Usage::tokens(input_tokens, output_tokens, None)).0
    }

    /// The cost of `usage`'s tokens in nano-credits, rounded up once to the next
    /// nano-credit (saturating at `u64::MAX`), and whether it is a lower bound (cache
    /// tokens of a kind this price does not know).
    pub fn cost(&self, usage: &Usage) -> (u64, bool) {
        let part = |tokens: u64, per_1k: u64| u128::from(tokens) * u128::from(per_1k);
        let mut total = part(usage.input_tokens, self.input_nano_per_1k)
            .saturating_add(part(usage.output_tokens, self.output_nano_per_1k));
        let mut at_least = false;
        for (tokens, per_1k) in [
            (usage.cache_read_tokens, self.cache_read_nano_per_1k),
            (usage.cache_write_tokens, self.cache_write_nano_per_1k),
        ] {
            match per_1k {
                Some(per_1k) => total = total.saturating_add(part(tokens, per_1k)),
                None => at_least |= tokens > 0,
            }
        }
        (u64::try_from(total.div_ceil(1000)).unwrap_or(u64::MAX), at_least)
    }
}

/// A backend's prices: a default and per-model prices (exact model names). A model with no
/// price (no entry of its own and no default) costs an unknown amount, not zero.
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
        self.priced(model, Usage::tokens(input_tokens, output_tokens, None))
    }

    /// `usage` with its credits for `model` filled in: `credits_nano: None` when the model
    /// is unpriced; `credits_at_least` set when some of its tokens have no price (and kept
    /// when `usage` already had it, e.g. counts the server sent unreadable).
    pub fn priced(&self, model: &str, usage: Usage) -> Usage {
        match self.price(model) {
            Some(price) => {
                let (credits, at_least) = price.cost(&usage);
                Usage { credits_nano: Some(credits), credits_at_least: at_least || usage.credits_at_least, ..usage }
            }
            None => Usage { credits_nano: None, ..usage },
        }
    }

    /// This pricing completed by a price table: when it has no default price, every model
    /// of `table` it does not price itself gets the table's price (its own entries and its
    /// default always win).
    pub fn with_table(mut self, table: &BTreeMap<String, Price>) -> Pricing {
        if self.default.is_none() {
            for (model, price) in table {
                self.models.entry(model.clone()).or_insert(*price);
            }
        }
        self
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
             price it in factory.toml (credits per 1000 tokens; one credit is US$0.01):\n  [backends.{backend}.pricing]\n  \
             models = {{ \"{model}\" = {{ input = 0.3, output = 1.5, cache_read = 0.03, cache_write = 0.375 }} }}\n\
             (or `input`/`output` for every model; the built-in `openai` and `anthropic` backends take the same \
             model entries under [prices.openai] / [prices.anthropic]; `factory backends --prices` lists the \
             built-in table), or lift the budget for one run with --max-ai-credits none"
        ))
    }

    /// This pricing with [`Price::FREE`] as its default when it has none: every model it
    /// does not price costs 0 credits (for a server on this machine, see [`CallPricing`]).
    pub fn free_unless_priced(mut self) -> Pricing {
        self.default.get_or_insert(Price::FREE);
        self
    }
}

/// Whether the server at `base_url` is this machine, by the parsed URL's host: an IPv4
/// loopback address (127.0.0.0/8, in any form the URL parser reads as one), IPv6 `::1` (or
/// an IPv4-mapped loopback address), or the name `localhost`. Other names are not resolved:
/// `127.0.0.1.example.com` and `localhost.example` are elsewhere, as is a URL that does
/// not parse.
pub fn on_this_machine(base_url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else { return false };
    let Some(host) = url.host_str() else { return false };
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|ip| ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()));
    }
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// How an HTTP backend (`openai`, `anthropic`) prices its calls: its configured pricing
/// and, for a server on this machine ([`on_this_machine`]), that pricing with every model it
/// leaves unpriced free ([`Pricing::free_unless_priced`]), so a budgeted run on a local
/// model is not refused; a remote server's unpriced models stay unpriced (fail-closed).
#[derive(Debug, Clone)]
pub(crate) struct CallPricing {
    /// What the configuration and the price table say.
    configured: Pricing,
    /// What calls are charged.
    charged: Pricing,
    /// The server's base URL (credentials redacted), when it is on this machine.
    here: Option<String>,
}

impl CallPricing {
    /// The pricing of a backend whose server is at `base_url`.
    pub(crate) fn new(configured: &Pricing, base_url: &str) -> CallPricing {
        let here = on_this_machine(base_url).then(|| super::redact::redact(base_url, &[]));
        let charged = if here.is_some() { configured.clone().free_unless_priced() } else { configured.clone() };
        CallPricing { configured: configured.clone(), charged, here }
    }

    /// `usage` with its credits for `model` ([`Pricing::priced`]).
    pub(crate) fn priced(&self, model: &str, usage: Usage) -> Usage {
        self.charged.priced(model, usage)
    }

    /// Why a budgeted call on `model` of backend `backend` cannot be accounted ([`Pricing::unpriced`]).
    pub(crate) fn unpriced(&self, backend: &str, model: &str) -> Option<String> {
        self.charged.unpriced(backend, model)
    }

    /// The line telling the user that `model`'s calls on backend `backend` cost 0 credits
    /// because its server is on this machine and nothing prices the model; `None` otherwise.
    pub(crate) fn free_notice(&self, backend: &str, model: &str) -> Option<String> {
        let here = self.here.as_ref()?;
        if self.configured.price(model).is_some() {
            return None;
        }
        let shown = if model.is_empty() { "(the backend's default)" } else { model };
        Some(format!(
            "backend `{backend}` at {here} is on this machine: calls of model `{shown}` cost 0 credits \
             (price it in factory.toml to count them)"
        ))
    }
}

/// A provider whose list prices are built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    /// OpenAI (the `openai` backend kind).
    OpenAi,
    /// Anthropic (the `anthropic` backend kind).
    Anthropic,
}

impl Provider {
    /// Both providers.
    pub const ALL: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

    /// Its name: the backend kind, and the `[prices.NAME]` table of `factory.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// The price tables of the providers, applied to backends of their kind (see
/// [`Pricing::with_table`]): the built-in list prices, overridden and extended by
/// `factory.toml`'s `[prices.openai]` and `[prices.anthropic]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriceTables {
    /// OpenAI models.
    pub openai: BTreeMap<String, Price>,
    /// Anthropic models.
    pub anthropic: BTreeMap<String, Price>,
}

impl PriceTables {
    /// The built-in tables ([`builtin_prices`]).
    pub fn builtin() -> PriceTables {
        PriceTables { openai: builtin_prices(Provider::OpenAi), anthropic: builtin_prices(Provider::Anthropic) }
    }

    /// The table of `provider`.
    pub fn get(&self, provider: Provider) -> &BTreeMap<String, Price> {
        match provider {
            Provider::OpenAi => &self.openai,
            Provider::Anthropic => &self.anthropic,
        }
    }

    /// The table of `provider`, to change.
    pub fn get_mut(&mut self, provider: Provider) -> &mut BTreeMap<String, Price> {
        match provider {
            Provider::OpenAi => &mut self.openai,
            Provider::Anthropic => &mut self.anthropic,
        }
    }
}

/// An exact decimal text of `nano` nano-credits in credits ("0.25", "3", "0.000000001").
pub fn format_credits(nano: u64) -> String {
    let (whole, frac) = (nano / NANO_PER_CREDIT, nano % NANO_PER_CREDIT);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:09}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// One row of the built-in table: model, then US dollars per million tokens of input,
/// output, cache read and cache write (the providers' list prices).
type Row = (&'static str, &'static str, &'static str, &'static str, &'static str);

/// OpenAI list prices (standard tier). Writing the prompt cache costs nothing on OpenAI.
const OPENAI_PRICES: &[Row] = &[
    ("gpt-5.1", "1.25", "10", "0.125", "0"),
    ("gpt-5", "1.25", "10", "0.125", "0"),
    ("gpt-5-mini", "0.25", "2", "0.025", "0"),
    ("gpt-5-nano", "0.05", "0.40", "0.005", "0"),
    ("gpt-4.1", "2", "8", "0.50", "0"),
    ("gpt-4.1-mini", "0.40", "1.60", "0.10", "0"),
    ("gpt-4.1-nano", "0.10", "0.40", "0.025", "0"),
    ("gpt-4o", "2.50", "10", "1.25", "0"),
    ("gpt-4o-2024-08-06", "2.50", "10", "1.25", "0"),
    ("gpt-4o-2024-11-20", "2.50", "10", "1.25", "0"),
    ("gpt-4o-mini", "0.15", "0.60", "0.075", "0"),
    ("gpt-4o-mini-2024-07-18", "0.15", "0.60", "0.075", "0"),
    ("o3", "2", "8", "0.50", "0"),
    ("o4-mini", "1.10", "4.40", "0.275", "0"),
    ("o3-mini", "1.10", "4.40", "0.55", "0"),
];

/// Anthropic list prices; cache write is the 5-minute cache write (1.25x input), cache
/// read 0.1x input.
const ANTHROPIC_PRICES: &[Row] = &[
    ("claude-opus-4-5", "5", "25", "0.50", "6.25"),
    ("claude-opus-4-5-20251101", "5", "25", "0.50", "6.25"),
    ("claude-opus-4-1", "15", "75", "1.50", "18.75"),
    ("claude-opus-4-1-20250805", "15", "75", "1.50", "18.75"),
    ("claude-opus-4-0", "15", "75", "1.50", "18.75"),
    ("claude-opus-4-20250514", "15", "75", "1.50", "18.75"),
    ("claude-sonnet-4-5", "3", "15", "0.30", "3.75"),
    ("claude-sonnet-4-5-20250929", "3", "15", "0.30", "3.75"),
    ("claude-sonnet-4-0", "3", "15", "0.30", "3.75"),
    ("claude-sonnet-4-20250514", "3", "15", "0.30", "3.75"),
    ("claude-haiku-4-5", "1", "5", "0.10", "1.25"),
    ("claude-haiku-4-5-20251001", "1", "5", "0.10", "1.25"),
    ("claude-3-7-sonnet-latest", "3", "15", "0.30", "3.75"),
    ("claude-3-7-sonnet-20250219", "3", "15", "0.30", "3.75"),
    ("claude-3-5-sonnet-latest", "3", "15", "0.30", "3.75"),
    ("claude-3-5-sonnet-20241022", "3", "15", "0.30", "3.75"),
    ("claude-3-5-sonnet-20240620", "3", "15", "0.30", "3.75"),
    ("claude-3-5-haiku-latest", "0.80", "4", "0.08", "1"),
    ("claude-3-5-haiku-20241022", "0.80", "4", "0.08", "1"),
];

/// Nano-credits per 1000 tokens for a price of `usd` US dollars per million tokens:
/// `usd` x 100 credits/USD x 10^9 nano / 1000 (thousands in a million) = `usd` x 10^8.
fn usd_per_million(usd: &str) -> u64 {
    // A table entry that does not parse is a bug in this file (the unit test reads them all).
    parse_credits_nano(usd).map(|nano_usd| nano_usd / 10).unwrap_or(u64::MAX)
}

/// The built-in list prices of `provider`'s models, taken on [`BUILTIN_PRICES_TAKEN`].
pub fn builtin_prices(provider: Provider) -> BTreeMap<String, Price> {
    let rows = match provider {
        Provider::OpenAi => OPENAI_PRICES,
        Provider::Anthropic => ANTHROPIC_PRICES,
    };
    rows.iter()
        .map(|(model, input, output, read, write)| {
            let price = Price {
                input_nano_per_1k: usd_per_million(input),
                output_nano_per_1k: usd_per_million(output),
                cache_read_nano_per_1k: Some(usd_per_million(read)),
                cache_write_nano_per_1k: Some(usd_per_million(write)),
            };
            (model.to_string(), price)
        })
        .collect()
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
    fn only_a_loopback_host_is_this_machine() {
        for here in [
            "http://127.0.0.1:8080/v1",
            "http://127.8.9.10/v1",
            "https://localhost:11434/v1",
            "http://LOCALHOST/v1",
            "http://[::1]:8080/v1",
            "http://[::ffff:127.0.0.1]/v1",
            "http://user:secret@127.0.0.1/v1",
            // Forms the URL parser reads as 127.0.0.1.
            "http://2130706433/v1",
            "http://0x7f.1/v1",
        ] {
            assert!(on_this_machine(here), "{here}");
        }
        for elsewhere in [
            "https://api.openai.com/v1",
            "http://127.0.0.1.evil.com/v1",
            "http://localhost.evil/v1",
            "http://evil.com/127.0.0.1/v1",
            "http://evil.com?host=localhost",
            "http://127.0.0.1@evil.com/v1",
            "http://localhost@evil.com/v1",
            "http://128.0.0.1/v1",
            "http://10.0.0.1/v1",
            "http://0.0.0.0/v1",
            "http://[::2]/v1",
            "http://[::ffff:10.0.0.1]/v1",
            "http://sub.localhost/v1",
            "127.0.0.1:8080/v1",
            "not a url",
            "",
        ] {
            assert!(!on_this_machine(elsewhere), "{elsewhere}");
        }
    }

    #[test]
    fn a_server_on_this_machine_charges_nothing_for_what_nothing_prices() {
        let mut configured = Pricing::default();
        configured.models.insert("big".into(), Price::new(1_000, 2_000));
        let usage = Usage { cache_read_tokens: 50, ..Usage::tokens(100, 10, None) };

        let local = CallPricing::new(&configured, "http://user:pw@127.0.0.1:8080/v1");
        assert_eq!(local.unpriced("local", "small"), None);
        let free = local.priced("small", usage.clone());
        assert_eq!((free.credits_nano, free.credits_at_least), (Some(0), false), "cache tokens are free too");
        let notice = local.free_notice("local", "small").expect("a notice for an unpriced model");
        assert!(notice.contains("`local`") && notice.contains("`small`") && notice.contains("0 credits"), "{notice}");
        assert!(!notice.contains("pw"), "credentials are redacted: {notice}");
        // A model that is priced keeps its price, and no notice is due.
        assert_eq!(local.priced("big", usage.clone()).credits_nano, Some(100 + 20));
        assert_eq!(local.free_notice("local", "big"), None);

        // A remote server's unpriced models stay unpriced: a budget refuses them.
        let remote = CallPricing::new(&configured, "https://127.0.0.1.example.com/v1");
        assert!(remote.unpriced("remote", "small").is_some_and(|m| m.contains("--max-ai-credits none")));
        assert_eq!(remote.priced("small", usage).credits_nano, None);
        assert_eq!(remote.free_notice("remote", "small"), None);

        // A default price is a price: nothing is made free.
        let priced = Pricing { default: Some(Price::new(5, 5)), ..Pricing::default() };
        assert_eq!(CallPricing::new(&priced, "http://localhost/v1").free_notice("local", "any"), None);
    }

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
        let price = Price::new(2_500_000, 10_000_000);
        // 1234 * 2.5e6 / 1000 + 567 * 1e7 / 1000 = 3_085_000 + 5_670_000
        assert_eq!(price.credits_nano(1234, 567), 8_755_000);
        // 1 token at 1 nano per 1k is a thousandth of a nano: rounds up to 1.
        assert_eq!(Price::new(1, 0).credits_nano(1, 0), 1);
        assert_eq!(Price::new(u64::MAX, u64::MAX).credits_nano(u64::MAX, 1), u64::MAX);
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

    #[test]
    fn the_builtin_table_converts_exactly_and_prices_cache_tokens() {
        for provider in Provider::ALL {
            let rows = if provider == Provider::OpenAi { OPENAI_PRICES } else { ANTHROPIC_PRICES };
            let table = builtin_prices(provider);
            assert_eq!(table.len(), rows.len(), "{provider:?}: no model listed twice");
            for (model, input, output, read, write) in rows {
                for usd in [input, output, read, write] {
                    // At most 8 decimals of a dollar per million tokens: exact in nano-credits per 1k.
                    let nano_usd = parse_credits_nano(usd).unwrap_or_else(|e| panic!("{model}: {e}"));
                    assert_eq!(nano_usd % 10, 0, "{model}: {usd} is not exact");
                }
            }
        }
        let openai = builtin_prices(Provider::OpenAi);
        // gpt-4o: $2.50 / $10 / $1.25 cached per million tokens; one credit is $0.01, so
        // $2.50 per million = 0.25 credits per 1000 tokens = 250_000_000 nano-credits.
        let gpt4o = openai["gpt-4o"];
        assert_eq!(gpt4o.input_nano_per_1k, 250_000_000);
        assert_eq!(gpt4o.output_nano_per_1k, 1_000_000_000);
        assert_eq!(gpt4o.cache_read_nano_per_1k, Some(125_000_000));
        assert_eq!(gpt4o.cache_write_nano_per_1k, Some(0));
        // 1000 uncached input ($0.0025) + 500 output ($0.005) + 2000 cache-read ($0.0025)
        // = $0.01 = exactly one credit.
        let usage = Usage { input_tokens: 1000, output_tokens: 500, cache_read_tokens: 2000, ..Usage::default() };
        assert_eq!(gpt4o.cost(&usage), (1_000_000_000, false));
        // gpt-5-nano cache read: $0.005 per million = 500_000 nano-credits per 1000 tokens,
        // so one token is 500 nano-credits ($5e-9 = 5e-7 credits).
        let nano = openai["gpt-5-nano"];
        assert_eq!(nano.cost(&Usage { cache_read_tokens: 1, ..Usage::default() }), (500, false));

        let anthropic = builtin_prices(Provider::Anthropic);
        // claude-sonnet-4-5: $3 in, $15 out, $0.30 cache read, $3.75 cache write per million.
        // 100 in ($0.0003) + 50 out ($0.00075) + 10_000 read ($0.003) + 2000 write ($0.0075)
        // = $0.01155 = 1.155 credits.
        let sonnet = anthropic["claude-sonnet-4-5"];
        assert_eq!(
            (
                sonnet.input_nano_per_1k,
                sonnet.output_nano_per_1k,
                sonnet.cache_read_nano_per_1k,
                sonnet.cache_write_nano_per_1k
            ),
            (300_000_000, 1_500_000_000, Some(30_000_000), Some(375_000_000))
        );
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 50,
            cache_read_tokens: 10_000,
            cache_write_tokens: 2000,
            ..Usage::default()
        };
        assert_eq!(sonnet.cost(&usage), (1_155_000_000, false));
        // claude-3-5-haiku: $0.80 in per million = 80_000_000 nano-credits per 1000 tokens.
        assert_eq!(anthropic["claude-3-5-haiku-20241022"].credits_nano(1000, 0), 80_000_000);
    }

    #[test]
    fn credits_format_exactly() {
        assert_eq!(format_credits(0), "0");
        assert_eq!(format_credits(250_000_000), "0.25");
        assert_eq!(format_credits(3_000_000_000), "3");
        assert_eq!(format_credits(1), "0.000000001");
        assert_eq!(format_credits(u64::MAX), "18446744073.709551615");
        assert_eq!(parse_credits_nano(&format_credits(u64::MAX)), Ok(u64::MAX));
    }

    #[test]
    fn unpriced_cache_tokens_make_the_cost_a_lower_bound() {
        // 0.001 credits per 1000 input tokens (1_000_000 nano), no cache prices.
        let price = Price::new(1_000_000, 2_000_000);
        let usage = Usage { input_tokens: 10, output_tokens: 5, cache_read_tokens: 7, ..Usage::default() };
        // 10 x 1_000 + 5 x 2_000 = 20_000 nano-credits, the 7 cache tokens uncounted.
        assert_eq!(price.cost(&usage), (20_000, true));
        assert_eq!(price.cost(&Usage { cache_read_tokens: 0, ..usage.clone() }), (20_000, false));
        let pricing = Pricing { default: Some(price), ..Pricing::default() };
        let priced = pricing.priced("m", usage);
        assert_eq!((priced.credits_nano, priced.credits_at_least), (Some(20_000), true));
        // Hostile counts saturate instead of wrapping or panicking.
        let max = Price {
            input_nano_per_1k: u64::MAX,
            output_nano_per_1k: u64::MAX,
            cache_read_nano_per_1k: Some(u64::MAX),
            cache_write_nano_per_1k: Some(u64::MAX),
        };
        let huge = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            cache_read_tokens: u64::MAX,
            cache_write_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(max.cost(&huge), (u64::MAX, false));
        // A table completes a pricing without a default, never overrides it.
        let table = builtin_prices(Provider::OpenAi);
        let own = Pricing { models: [("gpt-4o".to_string(), price)].into(), ..Pricing::default() };
        let merged = own.with_table(&table);
        assert_eq!(merged.price("gpt-4o"), Some(price), "its own entry wins");
        assert_eq!(merged.price("gpt-4.1"), Some(table["gpt-4.1"]));
        assert_eq!(merged.price("llama"), None, "a model of neither stays unpriced");
        let flat = Pricing { default: Some(price), ..Pricing::default() }.with_table(&table);
        assert_eq!(flat.price("gpt-4.1"), Some(price), "its default wins over the table");
    }
}
