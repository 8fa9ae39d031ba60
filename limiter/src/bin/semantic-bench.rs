#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! `semantic-bench [DIMS]`: what the semantic tier's index costs in the
//! limiter's process (`portcullis_limiter::semantic`): a `Nearest` over
//! 100, 1,000 and 10,000 stored prompts of one space (DIMS dimensions,
//! default 1,536, OpenAI's text-embedding-3-small), and the index's bytes.
//! Prints one line per size (`make bench-fleet-cache` runs it).

use portcullis_limiter::semantic::Semantic;
use std::time::Instant;

fn vector(seed: u64, dims: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..dims)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let dims: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1536);
    for n in [100usize, 1_000, 10_000] {
        let s = Semantic::new(n, usize::MAX);
        for i in 0..n as u64 {
            assert!(s.put(b"space", &vector(i, dims), &[b'a'; 600], 0, u64::MAX));
        }
        let queries: Vec<Vec<f32>> = (0..50u64).map(|i| vector(1_000_000 + i, dims)).collect();
        // Warm, then time: every query scans the whole space (none is near).
        for q in &queries {
            let _ = s.nearest(b"space", q, 0.95, 1);
        }
        let rounds = (200_000 / n).max(3);
        let t = Instant::now();
        for _ in 0..rounds {
            for q in &queries {
                assert!(s.nearest(b"space", q, 0.95, 1).is_none());
            }
        }
        let per = t.elapsed().as_secs_f64() / (rounds * queries.len()) as f64;
        let (entries, bytes) = s.size();
        println!(
            "semantic index, {entries} prompts of {dims} dimensions in one space: Nearest {:.1} µs ({:.0} ns per prompt); {:.1} MiB held",
            per * 1e6,
            per * 1e9 / n as f64,
            bytes as f64 / (1 << 20) as f64
        );
    }
}
