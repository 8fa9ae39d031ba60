//! The GenAI conventions' metrics, aggregated from every record (sampled
//! or not) into cumulative histograms, one per attribute set, with the
//! conventions' bucket boundaries.

use super::spans::{error_type, operation, provider_name, request_model, text};
use crate::otlp_proto::{metric, Histogram, HistogramDataPoint, KeyValue, Metric};
use crate::proto::RequestRecord;
use std::collections::HashMap;

const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
const DURATION_BOUNDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];
const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
const PER_TOKEN_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// The instruments: name, unit, description, bounds.
const INSTRUMENTS: [(&str, &str, &str, &[f64]); 4] = [
    (
        "gen_ai.client.token.usage",
        "{token}",
        "Number of input and output tokens used.",
        TOKEN_BOUNDS,
    ),
    (
        "gen_ai.client.operation.duration",
        "s",
        "GenAI operation duration.",
        DURATION_BOUNDS,
    ),
    (
        "gen_ai.server.time_to_first_token",
        "s",
        "Time to generate first token for successful responses.",
        TTFT_BOUNDS,
    ),
    (
        "gen_ai.server.time_per_output_token",
        "s",
        "Time per output token generated after the first token for successful responses.",
        PER_TOKEN_BOUNDS,
    ),
];

const TOKENS: usize = 0;
const DURATION: usize = 1;
const TTFT: usize = 2;
const PER_TOKEN: usize = 3;

#[derive(Clone)]
struct Series {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Series {
    fn new(bounds: &[f64]) -> Series {
        Series {
            counts: vec![0; bounds.len() + 1],
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn add(&mut self, bounds: &[f64], v: f64) {
        // A bucket holds values up to and including its upper bound.
        let at = bounds.partition_point(|b| *b < v);
        if let Some(c) = self.counts.get_mut(at) {
            *c += 1;
        }
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

/// Attribute values, in a fixed order per instrument (the key of a series).
type Key = Vec<(&'static str, String)>;

#[derive(Default)]
pub struct Aggregator {
    series: [HashMap<Key, Series>; 4],
}

impl Aggregator {
    fn add(&mut self, which: usize, key: Key, v: f64) {
        let Some((_, _, _, bounds)) = INSTRUMENTS.get(which) else {
            return;
        };
        let Some(map) = self.series.get_mut(which) else {
            return;
        };
        map.entry(key)
            .or_insert_with(|| Series::new(bounds))
            .add(bounds, v);
    }

    /// One record's measurements.
    pub fn record(&mut self, r: &RequestRecord) {
        let mut base: Key = vec![
            ("gen_ai.operation.name", operation(&r.api).to_string()),
            (
                "gen_ai.provider.name",
                provider_name(&r.provider_format).to_string(),
            ),
            ("gen_ai.request.model", request_model(r).to_string()),
        ];
        if !r.response_model.is_empty() {
            base.push(("gen_ai.response.model", r.response_model.clone()));
        }
        if !r.server_address.is_empty() {
            base.push(("server.address", r.server_address.clone()));
        }
        let mut duration = base.clone();
        if let Some(e) = error_type(r) {
            duration.push(("error.type", e));
        }
        self.add(DURATION, duration, r.latency_ms as f64 / 1e3);
        if r.prompt_tokens > 0 || r.completion_tokens > 0 {
            for (kind, n) in [("input", r.prompt_tokens), ("output", r.completion_tokens)] {
                let mut k = base.clone();
                k.push(("gen_ai.token.type", kind.to_string()));
                self.add(TOKENS, k, n as f64);
            }
        }
        if r.ttft_ms > 0 && r.status == 200 {
            self.add(TTFT, base.clone(), r.ttft_ms as f64 / 1e3);
            if r.completion_tokens > 1 && r.latency_ms >= r.ttft_ms {
                let per =
                    (r.latency_ms - r.ttft_ms) as f64 / 1e3 / (r.completion_tokens - 1) as f64;
                self.add(PER_TOKEN, base, per);
            }
        }
    }

    /// Every series so far, cumulative since `start_ns`.
    pub fn metrics(&self, start_ns: u64, now_ns: u64) -> Vec<Metric> {
        let mut out = Vec::new();
        for ((name, unit, description, bounds), map) in INSTRUMENTS.iter().zip(&self.series) {
            if map.is_empty() {
                continue;
            }
            let mut points: Vec<HistogramDataPoint> = map
                .iter()
                .map(|(key, s)| HistogramDataPoint {
                    start_time_unix_nano: start_ns,
                    time_unix_nano: now_ns,
                    count: s.count,
                    sum: Some(s.sum),
                    bucket_counts: s.counts.clone(),
                    explicit_bounds: bounds.to_vec(),
                    attributes: key
                        .iter()
                        .map(|(k, v)| text(k, v))
                        .collect::<Vec<KeyValue>>(),
                    min: Some(s.min),
                    max: Some(s.max),
                })
                .collect();
            points
                .sort_by(|a, b| format!("{:?}", a.attributes).cmp(&format!("{:?}", b.attributes)));
            out.push(Metric {
                name: name.to_string(),
                description: description.to_string(),
                unit: unit.to_string(),
                data: Some(metric::Data::Histogram(Histogram {
                    data_points: points,
                    // Cumulative.
                    aggregation_temporality: 2,
                })),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_and_series_split_by_attributes() {
        let mut s = Series::new(DURATION_BOUNDS);
        s.add(DURATION_BOUNDS, 0.01);
        s.add(DURATION_BOUNDS, 0.011);
        s.add(DURATION_BOUNDS, 100.0);
        assert_eq!(s.counts[0], 1);
        assert_eq!(s.counts[1], 1);
        assert_eq!(s.counts[DURATION_BOUNDS.len()], 1);
        let mut agg = Aggregator::default();
        let r = RequestRecord {
            api: "chat_completions".into(),
            model: "m".into(),
            provider_format: "openai".into(),
            status: 200,
            latency_ms: 900,
            ttft_ms: 300,
            completion_tokens: 7,
            prompt_tokens: 3,
            ..RequestRecord::default()
        };
        agg.record(&r);
        agg.record(&RequestRecord {
            status: 503,
            error: "upstream_failed".into(),
            ..r.clone()
        });
        let m = agg.metrics(1, 2);
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gen_ai.client.token.usage",
                "gen_ai.client.operation.duration",
                "gen_ai.server.time_to_first_token",
                "gen_ai.server.time_per_output_token"
            ]
        );
        let Some(metric::Data::Histogram(d)) = &m[1].data else {
            panic!("a histogram")
        };
        assert_eq!(d.data_points.len(), 2, "the error is its own series");
        let Some(metric::Data::Histogram(per)) = &m[3].data else {
            panic!("a histogram")
        };
        // (900 - 300) ms over the 6 tokens after the first.
        let per_token = per.data_points[0].sum.unwrap();
        assert!((per_token - 0.1).abs() < 1e-9, "{per_token}");
    }
}
