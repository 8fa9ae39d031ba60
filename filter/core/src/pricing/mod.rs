//! Prices: which price a request pays (this file) and the default price
//! table (`price_table`, generated from `filter/core/data/prices.csv`).
//!
//! May use: `api`, `config`, `limits`, `units`.
//!
//! Which price a request pays, in layers: the answering provider's own
//! price for the model (`providers[].models[].price`), else the config's
//! `prices` for the model's public name, else the embedded default table
//! ([`crate::pricing::price_table`], generated from `data/prices.csv`) by the
//! provider's model id or the public name. A model no layer prices is
//! unpriced: its requests are counted as such, never silently free.

pub mod price_table;

use crate::config::Gateway;
use crate::limits::ratelimit::Price;
use crate::pricing::price_table::Entry;
pub use crate::units::{ImageKey, ImagePrices, Quality};

impl Entry {
    pub fn price(&self) -> Price {
        Price {
            input: self.input,
            output: self.output,
            cached_input: self.cached_input,
            cache_write: self.cache_write,
            reasoning: self.reasoning,
            input_audio: self.input,
            output_audio: self.output,
            ..Price::default()
        }
    }
}

/// Which layer priced a request (the record's `price_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Provider,
    Config,
    Default,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Provider => "provider",
            Source::Config => "config",
            Source::Default => "default",
        }
    }
}

/// The default table's price for a model id: the entry of that id, or of
/// the model a dated snapshot or `-latest` alias names
/// (`gpt-4o-mini-2024-07-18` is `gpt-4o-mini`; `gpt-4o-audio-preview`,
/// priced otherwise, is not `gpt-4o`).
pub fn default_price(model_id: &str) -> Option<Price> {
    if let Some(p) = unit_default(model_id) {
        return Some(p);
    }
    let table = crate::pricing::price_table::TABLE;
    if let Ok(i) = table.binary_search_by(|e| e.model.cmp(model_id)) {
        return table.get(i).map(Entry::price);
    }
    table
        .iter()
        .filter(|e| {
            model_id
                .strip_prefix(e.model)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|v| {
                    v == "latest"
                        || (v.bytes().all(|b| b.is_ascii_digit() || b == b'-')
                            && v.bytes().filter(u8::is_ascii_digit).count() >= 4)
                })
        })
        .max_by_key(|e| e.model.len())
        .map(Entry::price)
}

/// The price of `model` (an index of `gw.models`) as `provider` (an index
/// of `gw.providers`; `None`: the model's first) serves it, and its layer.
pub fn price_of(gw: &Gateway, model: usize, provider: Option<usize>) -> Option<(Price, Source)> {
    let m = gw.models.get(model)?;
    let serving = match provider {
        Some(p) => m.serving.iter().find(|s| s.provider == p),
        None => m.serving.first(),
    };
    if let Some(p) = serving.and_then(|s| s.price) {
        return Some((p, Source::Provider));
    }
    if let Some(p) = gw.prices.get(model).copied().flatten() {
        return Some((p, Source::Config));
    }
    let default = serving
        .and_then(|s| default_price(&s.provider_model_id))
        .or_else(|| default_price(&m.name))
        .map(|p| (p, Source::Default));
    // Last: another provider's own price for the model.
    default.or_else(|| {
        m.serving
            .iter()
            .find_map(|s| s.price)
            .map(|p| (p, Source::Provider))
    })
}

/// Whether any layer prices a model (a budget needs every model priced).
pub fn priced(model: &crate::config::Model, config: Option<Price>) -> bool {
    config.is_some()
        || default_price(&model.name).is_some()
        || model
            .serving
            .iter()
            .any(|s| s.price.is_some() || default_price(&s.provider_model_id).is_some())
}

/// List prices of OpenAI's models priced by the unit rather than the
/// token: images by size and quality, speech per character, transcription
/// per second, moderation free. (`gpt-image-1` and `gpt-4o-transcribe`
/// report token usage: a config prices their tokens.)
fn unit_default(model_id: &str) -> Option<Price> {
    let per_image = |entries: &[(&str, f64)]| {
        let mut images = ImagePrices::default();
        for (key, usd) in entries {
            if let Some(k) = ImageKey::of_price_key(key) {
                images.push(k, usd * 1e6);
            }
        }
        Price {
            images,
            ..Price::default()
        }
    };
    let realtime = |input, cached_input, output, input_audio, output_audio| Price {
        input,
        cached_input,
        output,
        reasoning: output,
        cache_write: input,
        input_audio,
        output_audio,
        ..Price::default()
    };
    let unit = |micros: f64| Price {
        unit: micros,
        ..Price::default()
    };
    Some(match model_id {
        "dall-e-3" => per_image(&[
            ("1024x1024", 0.04),
            ("1024x1792", 0.08),
            ("1792x1024", 0.08),
            ("hd 1024x1024", 0.08),
            ("hd 1024x1792", 0.12),
            ("hd 1792x1024", 0.12),
            ("*", 0.04),
        ]),
        "dall-e-2" => per_image(&[
            ("256x256", 0.016),
            ("512x512", 0.018),
            ("1024x1024", 0.02),
            ("*", 0.02),
        ]),
        // $0.006 a minute.
        "whisper-1" => unit(100.0),
        // $15 and $30 per 1M characters.
        "tts-1" => unit(15.0),
        "tts-1-hd" => unit(30.0),
        "omni-moderation-latest" | "text-moderation-latest" | "omni-moderation-2024-09-26" => {
            Price::default()
        }
        // The Realtime API's models: text and audio tokens apart (USD per
        // 1M: input, cached input, output, audio input, audio output).
        "gpt-realtime" | "gpt-realtime-2025-08-28" => realtime(4.0, 0.4, 16.0, 32.0, 64.0),
        "gpt-realtime-mini" | "gpt-realtime-mini-2025-10-06" => {
            realtime(0.6, 0.06, 2.4, 10.0, 20.0)
        }
        "gpt-4o-realtime-preview" => realtime(5.0, 2.5, 20.0, 40.0, 80.0),
        "gpt-4o-mini-realtime-preview" => realtime(0.6, 0.3, 2.4, 10.0, 20.0),
        _ => return None,
    })
}

/// Batches cost half the model's price (OpenAI's and Anthropic's batch
/// discount).
pub const BATCH_FACTOR: f64 = 0.5;

/// The price of a model as a provider names it (a batch's `model`): the
/// gateway's model that provider serves under that id (or a dated
/// snapshot of it), else the default table's.
pub fn price_of_id(gw: &Gateway, provider: usize, model_id: &str) -> Option<(Price, Source)> {
    let served = gw.models.iter().position(|m| {
        m.serving.iter().any(|s| {
            s.provider == provider
                && (s.provider_model_id == model_id
                    || model_id
                        .strip_prefix(s.provider_model_id.as_str())
                        .is_some_and(|rest| rest.starts_with('-')))
        })
    });
    match served {
        Some(m) => price_of(gw, m, Some(provider)),
        None => default_price(model_id).map(|p| (p, Source::Default)),
    }
}

/// The price a request pays: the model's (as [`price_of`]) with its unit
/// price for this request's units (an image's size and quality) and the
/// units it asks for reserved.
pub fn price_for(
    gw: &Gateway,
    model: usize,
    provider: Option<usize>,
    units: &crate::api::Units,
) -> Option<(Price, Source)> {
    let (mut p, source) = price_of(gw, model, provider)?;
    if let Some(per_image) = units.image.and_then(|k| p.images.of(k)) {
        p.unit = per_image;
    }
    p.units = units.count;
    Some((p, source))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pricing::price_table::TABLE;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The check that the generated table and its data file agree (also
    /// `python3 scripts/gen-prices.py --check` in `make lint`): every row
    /// of the file is an entry with its numbers, and nothing else is.
    #[test]
    fn the_generated_table_is_the_data_file() {
        let data = include_str!("../../data/prices.csv");
        let mut rows: Vec<Vec<&str>> = data
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .skip(1)
            .map(|l| l.split(',').map(str::trim).collect())
            .collect();
        rows.sort_by_key(|r| r[1]);
        assert_eq!(rows.len(), TABLE.len(), "rows and entries");
        for (r, e) in rows.iter().zip(TABLE) {
            let n = |i: usize, or: f64| r[i].parse::<f64>().unwrap_or(or);
            assert_eq!((r[1], r[0]), (e.model, e.format));
            let want = (n(2, -1.0), n(3, -1.0));
            assert_eq!((e.input, e.output), want, "{}", e.model);
            assert_eq!(e.cached_input, n(4, e.input), "{}", e.model);
            assert_eq!(e.cache_write, n(5, e.input), "{}", e.model);
            assert_eq!(e.reasoning, n(6, e.output), "{}", e.model);
        }
        assert!(
            TABLE.windows(2).all(|w| w[0].model < w[1].model),
            "sorted, no duplicates"
        );
    }

    #[test]
    fn a_dated_snapshot_takes_its_models_price() {
        let mini = default_price("gpt-4o-mini").unwrap();
        assert_eq!(
            (mini.input, mini.output, mini.cached_input),
            (0.15, 0.60, 0.075)
        );
        assert_eq!(default_price("gpt-4o-mini-2024-07-18"), Some(mini));
        assert_eq!(default_price("gpt-4o-2024-08-06").unwrap().input, 2.50);
        assert_eq!(default_price("o3-mini-2025-01-31").unwrap().input, 1.10);
        let sonnet = default_price("claude-sonnet-4-5-20250929").unwrap();
        assert_eq!((sonnet.cache_write, sonnet.cached_input), (3.75, 0.30));
        assert_eq!(
            default_price("gpt-4o-minimal"),
            None,
            "not a snapshot of gpt-4o-mini"
        );
        assert_eq!(
            default_price("gpt-4o-audio-preview"),
            None,
            "priced otherwise"
        );
        assert_eq!(
            default_price("claude-3-5-haiku-latest").unwrap().input,
            0.80
        );
        assert_eq!(default_price("llama-3"), None);
    }

    #[test]
    fn layers_go_provider_then_config_then_default() {
        let text = format!(
            "{}prices:\n  gpt-4o: {{input: 9, output: 9}}\n",
            crate::compile::tests::GOOD.replace(
                "      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini]}",
                "      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini], price: {input: 7, output: 7}}",
            )
        );
        let g = crate::compile::compile(text.as_bytes()).unwrap();
        let (mini, four, llama) = (
            g.names["gpt-4o-mini"],
            g.names["gpt-4o"],
            g.names["llama-3"],
        );
        let backup = g.providers.iter().position(|p| p.name == "backup");
        let primary = g.providers.iter().position(|p| p.name == "primary");
        let (p, s) = price_of(&g, mini, backup).unwrap();
        assert_eq!((p.input, s), (7.0, Source::Provider));
        let (p, s) = price_of(&g, mini, primary).unwrap();
        assert_eq!(
            (p.input, s),
            (0.15, Source::Default),
            "primary's id is in the table"
        );
        let (p, s) = price_of(&g, four, None).unwrap();
        assert_eq!((p.input, s), (9.0, Source::Config));
        assert_eq!(price_of(&g, llama, None), None, "unpriced");
    }

    #[test]
    fn an_image_is_priced_by_quality_and_size_then_size_then_quality_then_any() {
        let mut p = ImagePrices::default();
        for (k, usd) in [
            ("1024x1024", 1.0),
            ("hd 1024x1792", 2.0),
            ("hd", 3.0),
            ("*", 4.0),
        ] {
            assert!(p.push(ImageKey::of_price_key(k).unwrap(), usd));
        }
        assert_eq!(p.of(ImageKey::of("hd", "1024x1792")), Some(2.0));
        assert_eq!(p.of(ImageKey::of("standard", "1024x1024")), Some(1.0));
        assert_eq!(p.of(ImageKey::of("hd", "512x512")), Some(3.0));
        assert_eq!(p.of(ImageKey::of("", "")), Some(4.0));
        assert_eq!(ImageKey::of_price_key("ultra 1x1"), None);
        let dalle = default_price("dall-e-3").unwrap();
        assert_eq!(
            dalle.images.of(ImageKey::of("hd", "1792x1024")),
            Some(120_000.0)
        );
        assert_eq!(default_price("whisper-1").unwrap().unit, 100.0);
    }
}
