//! `portcullis-limiter`: Envoy's rate limit service over Redis, and the
//! prompt cache's fleet tier (`portcullis.cache.v1.Cache`).
//!
//! ```text
//! portcullis-limiter [--listen 127.0.0.1:8081] [--redis redis://127.0.0.1:6379]
//!                    [--prefix portcullis:rl:] [--redis-timeout-ms 500] [--threads 0]
//!                    [--cache-redis URL] [--cache-prefix portcullis:cache:]
//!                    [--cache-max-entry-bytes 1048576]
//!                    [--semantic-max-entries 10000] [--semantic-max-bytes 268435456]
//!                    [--token-file PATH]
//!                    [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH]]
//! ```
//! The cache's entries go to `--cache-redis` (default: `--redis`); give it a
//! Redis of its own with `maxmemory` and `allkeys-lru`, so entries, not
//! counters, are what Redis evicts when full.
//! With a token file, only calls carrying `authorization: Bearer <token>`
//! are served (the filter sends `PORTCULLIS_LIMITER_TOKEN` from Envoy's
//! environment); others are refused `UNAUTHENTICATED`. The TLS flags serve
//! gRPC over TLS, with client certificates signed by `--tls-client-ca`
//! required when it is given (`portcullis_service`).

use portcullis_limiter::cache::SharedCache;
use portcullis_limiter::cache_proto::cache_server::CacheServer;
use portcullis_limiter::proto::rate_limit_service_server::RateLimitServiceServer;
use portcullis_limiter::service::Limiter;
use std::net::SocketAddr;
use std::time::Duration;

/// The largest entry the cache may be told to keep (a Put is one gRPC
/// message; the server reads messages up to twice this).
const MAX_ENTRY_CEILING: usize = 8 << 20;

struct Args {
    listen: SocketAddr,
    redis: String,
    prefix: String,
    timeout_ms: u64,
    threads: usize,
    cache_redis: Option<String>,
    cache_prefix: String,
    cache_max_entry_bytes: usize,
    semantic_max_entries: usize,
    semantic_max_bytes: usize,
    token: Option<String>,
    tls: Option<tonic::transport::ServerTlsConfig>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
        redis: "redis://127.0.0.1:6379".into(),
        prefix: "portcullis:rl:".into(),
        timeout_ms: 500,
        threads: 0,
        cache_redis: None,
        cache_prefix: "portcullis:cache:".into(),
        cache_max_entry_bytes: 1 << 20,
        semantic_max_entries: 10_000,
        semantic_max_bytes: 256 << 20,
        token: None,
        tls: None,
    };
    let mut tls = portcullis_service::TlsFlags::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                a.listen = v.parse().map_err(|e| format!("--listen {v}: {e}"))?;
            }
            "--redis" => a.redis = value()?,
            "--prefix" => a.prefix = value()?,
            "--redis-timeout-ms" => {
                let v = value()?;
                a.timeout_ms = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("--redis-timeout-ms {v}: a number of milliseconds above 0")
                })?;
            }
            "--threads" => {
                let v = value()?;
                a.threads = v
                    .parse()
                    .map_err(|_| format!("--threads {v}: a number (0: one per core)"))?;
            }
            "--cache-redis" => a.cache_redis = Some(value()?),
            "--cache-prefix" => a.cache_prefix = value()?,
            "--cache-max-entry-bytes" => {
                let v = value()?;
                a.cache_max_entry_bytes = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0 && *n <= MAX_ENTRY_CEILING)
                    .ok_or_else(|| {
                        format!("--cache-max-entry-bytes {v}: a number of bytes from 1 to {MAX_ENTRY_CEILING}")
                    })?;
            }
            "--semantic-max-entries" | "--semantic-max-bytes" => {
                let v = value()?;
                let n = v
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{flag} {v}: a number above 0"))?;
                if flag == "--semantic-max-entries" {
                    a.semantic_max_entries = n;
                } else {
                    a.semantic_max_bytes = n;
                }
            }
            "--token-file" => {
                a.token = portcullis_service::token_from_file("--token-file", Some(value()?))?;
            }
            "--tls-cert" | "--tls-key" | "--tls-client-ca" => {
                tls.take(&flag, Some(value()?))?;
            }
            "-h" | "--help" => {
                println!("usage: portcullis-limiter [--listen ADDR] [--redis URL] [--prefix P] [--redis-timeout-ms N] [--threads N] [--cache-redis URL] [--cache-prefix P] [--cache-max-entry-bytes N] [--semantic-max-entries N] [--semantic-max-bytes N] [--token-file PATH] [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH]]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    a.tls = tls.server_config()?;
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("portcullis-limiter: {e}");
            std::process::exit(2);
        }
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if args.threads > 0 {
        rt.worker_threads(args.threads);
    }
    match rt.enable_all().build() {
        Ok(rt) => rt.block_on(serve(args)),
        Err(e) => {
            eprintln!("portcullis-limiter: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    }
}

async fn serve(args: Args) {
    let limiter = match Limiter::new(
        &args.redis,
        &args.prefix,
        Duration::from_millis(args.timeout_ms),
    ) {
        Ok(l) => l.with_token(args.token.clone()),
        Err(e) => {
            eprintln!("portcullis-limiter: --redis {}: {e}", args.redis);
            std::process::exit(2);
        }
    };
    let cache_redis = args
        .cache_redis
        .clone()
        .unwrap_or_else(|| args.redis.clone());
    let cache = match SharedCache::new(
        &cache_redis,
        &args.cache_prefix,
        Duration::from_millis(args.timeout_ms),
        args.cache_max_entry_bytes,
    ) {
        Ok(c) => c
            .with_token(args.token.clone())
            .with_semantic(args.semantic_max_entries, args.semantic_max_bytes),
        Err(e) => {
            eprintln!("portcullis-limiter: --cache-redis {cache_redis}: {e}");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("portcullis-limiter: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    let bound = listener.local_addr().map_or(args.listen, |a| a);
    println!(
        "portcullis-limiter listening on {bound} (gRPC envoy.service.ratelimit.v3, portcullis.cache.v1), counters in {}, cache in {cache_redis}",
        args.redis
    );
    // No Nagle delay: answers are small and latency is the point.
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = args.tls.clone() {
        builder = match builder.tls_config(tls) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("portcullis-limiter: TLS: {e}");
                std::process::exit(2);
            }
        };
    }
    let served = builder
        .add_service(RateLimitServiceServer::new(limiter))
        .add_service(
            CacheServer::new(cache)
                .max_decoding_message_size(MAX_ENTRY_CEILING.saturating_mul(2))
                .max_encoding_message_size(MAX_ENTRY_CEILING.saturating_mul(2)),
        )
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    if let Err(e) = served {
        eprintln!("portcullis-limiter: {e}");
        std::process::exit(1);
    }
}
