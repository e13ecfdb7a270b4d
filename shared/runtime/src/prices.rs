//! What a model's tokens cost: a price table per model id (shipped here,
//! overridden by the JSON file `$STEPPE_PRICES` names), and the cost of an
//! agent step's usage. A provider that reports its own cost is believed.

use std::collections::HashMap;

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input tokens read from the provider's prompt cache (default: `input`).
    #[serde(default)]
    pub cached_input: Option<f64>,
}

/// List prices (USD per million tokens) of common models, by the model id
/// without its provider route (`anthropic/claude-sonnet-4` and
/// `claude-sonnet-4` both find `claude-sonnet-4`).
const SHIPPED: &[(&str, f64, f64, f64)] = &[
    // The claude CLI's model aliases (`@claude/sonnet`): its rate card for a crashed run's estimate.
    ("sonnet", 3.0, 15.0, 0.3),
    ("opus", 15.0, 75.0, 1.5),
    ("haiku", 1.0, 5.0, 0.1),
    ("claude-opus-4", 15.0, 75.0, 1.5),
    ("claude-opus-4.1", 15.0, 75.0, 1.5),
    ("claude-sonnet-4", 3.0, 15.0, 0.3),
    ("claude-sonnet-4.5", 3.0, 15.0, 0.3),
    ("claude-3.7-sonnet", 3.0, 15.0, 0.3),
    ("claude-3.5-sonnet", 3.0, 15.0, 0.3),
    ("claude-haiku-4.5", 1.0, 5.0, 0.1),
    ("claude-3.5-haiku", 0.8, 4.0, 0.08),
    ("gpt-4o", 2.5, 10.0, 1.25),
    ("gpt-4o-mini", 0.15, 0.6, 0.075),
    ("gpt-4.1", 2.0, 8.0, 0.5),
    ("gpt-4.1-mini", 0.4, 1.6, 0.1),
    ("gpt-4.1-nano", 0.1, 0.4, 0.025),
    ("gpt-5", 1.25, 10.0, 0.125),
    ("gpt-5-mini", 0.25, 2.0, 0.025),
    ("gpt-5-nano", 0.05, 0.4, 0.005),
    ("o3", 2.0, 8.0, 0.5),
    ("o4-mini", 1.1, 4.4, 0.275),
    ("gemini-2.5-pro", 1.25, 10.0, 0.31),
    ("gemini-2.5-flash", 0.3, 2.5, 0.075),
    ("deepseek-chat", 0.27, 1.1, 0.07),
];

/// The price table: shipped prices, then the overrides of a file.
#[derive(Debug, Clone, Default)]
pub struct Prices {
    by_model: HashMap<String, Price>,
}

#[derive(Debug, thiserror::Error)]
pub enum PricesError {
    #[error("price file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("price file {path}: {message} (expected {{\"MODEL\": {{\"input\": USD_PER_MTOK, \"output\": USD_PER_MTOK, \"cached_input\": USD_PER_MTOK}}}})")]
    Parse { path: String, message: String },
}

impl Prices {
    pub fn shipped() -> Self {
        let by_model = SHIPPED.iter().map(|&(m, input, output, cached)| (m.to_string(), Price { input, output, cached_input: Some(cached) })).collect();
        Prices { by_model }
    }

    /// The shipped table with `$STEPPE_PRICES`'s overrides, if it names a file.
    pub fn from_env() -> Result<Self, PricesError> {
        let mut p = Self::shipped();
        if let Some(path) = std::env::var_os("STEPPE_PRICES").filter(|v| !v.is_empty()) {
            p.load(std::path::Path::new(&path))?;
        }
        Ok(p)
    }

    /// Adds (or replaces) the prices of a JSON file `{"MODEL": {"input": …, "output": …}}`.
    pub fn load(&mut self, path: &std::path::Path) -> Result<(), PricesError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PricesError::Read { path: shown.clone(), source })?;
        let table: HashMap<String, Price> = serde_json::from_str(&text).map_err(|e| PricesError::Parse { path: shown.clone(), message: e.to_string() })?;
        for (model, price) in table {
            if !(price.input >= 0.0 && price.output >= 0.0 && price.cached_input.is_none_or(|c| c >= 0.0)) {
                return Err(PricesError::Parse { path: shown, message: format!("{model}: prices are USD per million tokens, not negative") });
            }
            self.by_model.insert(model, price);
        }
        Ok(())
    }

    /// The price of `model` (as an agent names it, provider prefix and all):
    /// the whole id, else the id after its last `/`, else the longest known
    /// id it extends with a `-` suffix (`gpt-4o-2024-08-06` → `gpt-4o`).
    pub fn of(&self, model: &str) -> Option<Price> {
        if let Some(p) = self.by_model.get(model) {
            return Some(*p);
        }
        let mut ids = vec![model];
        let mut rest = model;
        while let Some((_, tail)) = rest.split_once('/') {
            ids.push(tail);
            rest = tail;
        }
        for id in &ids {
            if let Some(p) = self.by_model.get(*id) {
                return Some(*p);
            }
        }
        let last = ids.last().copied().unwrap_or(model);
        self.by_model.iter().filter(|(k, _)| last.strip_prefix(k.as_str()).is_some_and(|s| s.starts_with('-'))).max_by_key(|(k, _)| k.len()).map(|(_, p)| *p)
    }

    /// What `usage` cost on `model`: None when the model has no price.
    pub fn cost(&self, model: &str, usage: &crate::agent_work::Usage) -> Option<f64> {
        let p = self.of(model)?;
        let cached = usage.cached.min(usage.prompt) as f64;
        let fresh = usage.prompt.saturating_sub(usage.cached) as f64;
        Some((fresh * p.input + cached * p.cached_input.unwrap_or(p.input) + usage.completion as f64 * p.output) / 1_000_000.0)
    }
}

/// An agent step's spend as its record keeps it (`usage` in its detail).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Spend {
    pub tokens: i64,
    pub prompt: u64,
    pub cached: u64,
    /// None: unpriced (no provider cost, no price for its model) — not $0.00.
    pub cost_usd: Option<f64>,
    pub finish: String,
}

impl Spend {
    /// The spend of an agent step's record; None for other steps.
    pub fn of(step: &crate::store::StepRecord) -> Option<Spend> {
        let tokens = step.tokens?;
        let detail: serde_json::Value = step.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
        let u = &detail["usage"];
        Some(Spend {
            tokens,
            prompt: u["prompt"].as_u64().unwrap_or(0),
            cached: u["cached"].as_u64().unwrap_or(0),
            cost_usd: u["cost_usd"].as_f64(),
            finish: u["finish"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// The spend of a run's agent steps together, and how many there were.
    pub fn total(steps: &[crate::store::StepRecord]) -> (Spend, usize, usize) {
        let (mut sum, mut agents, mut priced) = (Spend::default(), 0, 0);
        for s in steps.iter().filter_map(Spend::of) {
            agents += 1;
            sum.tokens += s.tokens;
            sum.prompt += s.prompt;
            sum.cached += s.cached;
            if let Some(c) = s.cost_usd {
                priced += 1;
                sum.cost_usd = Some(sum.cost_usd.unwrap_or(0.0) + c);
            }
        }
        (sum, agents, priced)
    }

    /// The share of prompt tokens read from the provider's cache, as `12%` (`-` with no prompt).
    pub fn cached_share(&self) -> String {
        if self.prompt == 0 {
            "-".into()
        } else {
            format!("{:.0}%", self.cached as f64 * 100.0 / self.prompt as f64)
        }
    }
}

/// A cost as the views show it: `$0.0123`; `unpriced` when nothing was
/// priced; `≥$0.0123` when some steps were and some were not.
pub fn show_cost(cost: Option<f64>, steps: usize, priced: usize) -> String {
    match cost {
        _ if steps == 0 => "-".into(),
        None => "unpriced".into(),
        Some(c) if priced < steps => format!("≥${c:.4}"),
        Some(c) => format!("${c:.4}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_work::Usage;

    #[test]
    fn models_are_found_by_route_and_by_dated_name() {
        let p = Prices::shipped();
        assert_eq!(p.of("openrouter/anthropic/claude-sonnet-4").map(|p| p.output), Some(15.0));
        assert_eq!(p.of("gpt-4o-mini").map(|p| p.input), Some(0.15), "the longer id wins over gpt-4o");
        assert_eq!(p.of("gpt-4o-2024-08-06").map(|p| p.input), Some(2.5));
        assert_eq!(p.of("openai/gpt-4omega"), None, "a prefix without a dash is another model");
        assert_eq!(p.of("x/y"), None);
    }

    #[test]
    fn cached_tokens_cost_the_cached_price() {
        let p = Prices::shipped();
        let u = Usage { prompt: 1_000_000, completion: 100_000, cached: 400_000, ..Default::default() };
        // 600k fresh at $3, 400k cached at $0.30, 100k out at $15.
        let c = p.cost("anthropic/claude-sonnet-4", &u).expect("priced");
        assert!((c - (1.8 + 0.12 + 1.5)).abs() < 1e-9, "{c}");
        assert_eq!(p.cost("unknown/model", &u), None);
    }

    #[test]
    fn a_price_file_overrides_and_adds() {
        let dir = std::env::temp_dir().join(format!("steppe-prices-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let f = dir.join("prices.json");
        std::fs::write(&f, r#"{"gpt-4o": {"input": 1, "output": 2}, "acme/house-model": {"input": 0.5, "output": 0.5, "cached_input": 0.1}}"#).expect("write");
        let mut p = Prices::shipped();
        p.load(&f).expect("load");
        assert_eq!(p.of("openai/gpt-4o"), Some(Price { input: 1.0, output: 2.0, cached_input: None }));
        assert_eq!(p.of("openrouter/acme/house-model").map(|p| p.cached_input), Some(Some(0.1)));
        std::fs::write(&f, r#"{"m": {"input": -1, "output": 2}}"#).expect("write");
        assert!(p.load(&f).unwrap_err().to_string().contains("not negative"));
        std::fs::write(&f, "nope").expect("write");
        let e = p.load(&f).unwrap_err().to_string();
        assert!(e.contains("prices.json") && e.contains("expected"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
