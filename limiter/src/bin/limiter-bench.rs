#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]
//! `portcullis-limiter-bench ADDR [SECONDS] [IN_FLIGHT]`: decisions per
//! second of a running limiter. IN_FLIGHT concurrent `ShouldRateLimit`
//! calls (over 4 HTTP/2 connections), each a request-rate descriptor of one
//! of 1,000 clients under a limit it never reaches, so every call is a full
//! decision (script run, counters written). Prints one line of figures.

use portcullis_limiter::proto::rate_limit_service_client::RateLimitServiceClient;
use portcullis_limiter::proto::{Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn request(i: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "portcullis".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: "client".into(),
                    value: format!("bench-{}", i % 1000),
                },
                Entry {
                    key: "limit".into(),
                    value: "requests_per_minute".into(),
                },
            ],
            limit: Some(RateLimitOverride {
                requests_per_unit: u32::MAX,
                unit: 2,
            }),
            hits_addend: None,
        }],
        hits_addend: 1,
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let addr = args
        .get(1)
        .ok_or("usage: portcullis-limiter-bench ADDR [SECONDS] [IN_FLIGHT]")?;
    let seconds: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let in_flight: u64 = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(RateLimitServiceClient::connect(format!("http://{addr}")).await?);
    }
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let over = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let lat = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..in_flight {
        let idx = usize::try_from(t % 4)?;
        let mut c = clients.get(idx).ok_or("no client")?.clone();
        let (done, errors, over, stop, lat) = (
            done.clone(),
            errors.clone(),
            over.clone(),
            stop.clone(),
            lat.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match c.should_rate_limit(request(i)).await {
                    Ok(r) if r.get_ref().overall_code == 1 => {}
                    Ok(_) => {
                        over.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                mine.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                done.fetch_add(1, Ordering::Relaxed);
                i += in_flight;
            }
            if let Ok(mut l) = lat.lock() {
                l.extend(mine);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let took = start.elapsed().as_secs_f64();
    for t in tasks {
        t.await?;
    }
    let n = done.load(Ordering::Relaxed);
    let mut l = lat.lock().map_err(|_| "poisoned")?.clone();
    l.sort_unstable();
    let q = |p: f64| {
        l.get(((l.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "decisions {n} in {took:.1}s: {:.0}/s, {in_flight} in flight, p50 {} us, p99 {} us, over-limit {}, errors {}",
        n as f64 / took,
        q(0.5),
        q(0.99),
        over.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}
