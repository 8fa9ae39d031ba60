//! `ShouldRateLimit` over the counters in Redis.

use crate::counters::{self, SCRIPT};
use crate::proto::rate_limit_service_server::RateLimitService;
use crate::proto::{CurrentLimit, DescriptorStatus, Duration, RateLimitRequest, RateLimitResponse};
use crate::redis_conn::Redis;
use std::time::Duration as StdDuration;
use tonic::{Request, Response, Status};

const OK: u32 = 1;
const OVER_LIMIT: u32 = 2;

/// The counters' Redis ([`Redis`]: reached lazily, so the service starts
/// whether or not Redis is up) and the script that decides a request.
pub struct Limiter {
    redis: Redis,
    script: redis::Script,
    prefix: String,
    /// With a token (`--token-file`), a call must carry `authorization:
    /// Bearer <token>`: nobody else can spend a client's limit.
    token: Option<String>,
    /// Calls refused for a missing or wrong token.
    pub unauthenticated: std::sync::atomic::AtomicU64,
}

impl Limiter {
    pub fn new(redis_url: &str, prefix: &str, timeout: StdDuration) -> redis::RedisResult<Self> {
        Ok(Self {
            redis: Redis::new(redis_url, timeout)?,
            script: redis::Script::new(SCRIPT),
            prefix: prefix.to_string(),
            token: None,
            unauthenticated: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Only calls carrying this token are served.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    fn authorized<T>(&self, request: &Request<T>) -> bool {
        portcullis_service::call_authorized(self.token.as_deref(), request)
    }

    /// Decide one request: every descriptor with a limit is checked and
    /// counted together; descriptors without a limit are not counted here.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let request_hits = req.hits_addend.max(1);
        let mut invocation = self.script.prepare_invoke();
        let mut counted = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            let Some(limit) = d.limit.as_ref() else {
                continue;
            };
            let Some(period) = counters::period_ms(limit.unit) else {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i}: unknown rate limit unit {}",
                    limit.unit
                )));
            };
            if limit.requests_per_unit == 0 {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i}: a limit of 0 per unit"
                )));
            }
            // A descriptor's own hits override the request's (0: a check
            // that counts nothing).
            let hits = d
                .hits_addend
                .as_ref()
                .map_or(u64::from(request_hits), |h| h.value);
            invocation
                .key(counters::key(&self.prefix, &req.domain, d, limit.unit))
                .arg(limit.requests_per_unit)
                .arg(period)
                .arg(hits);
            counted.push((i, limit.requests_per_unit, limit.unit));
        }
        let mut statuses: Vec<DescriptorStatus> = req
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: OK,
                ..DescriptorStatus::default()
            })
            .collect();
        if counted.is_empty() {
            return Ok(RateLimitResponse {
                overall_code: OK,
                statuses,
                response_headers_to_add: Vec::new(),
            });
        }
        let mut conn = self.redis.connection().await?;
        let out: Vec<i64> = self.redis.run(invocation.invoke_async(&mut conn)).await?;
        let (admitted, per) = out
            .split_first()
            .ok_or_else(|| Status::internal("redis: empty script answer"))?;
        if per.len() != counted.len().saturating_mul(3) {
            return Err(Status::internal("redis: script answer of the wrong length"));
        }
        for ((i, per_unit, unit), v) in counted.iter().zip(per.chunks_exact(3)) {
            let [code, remaining, reset_ms] = v else {
                continue;
            };
            if let Some(s) = statuses.get_mut(*i) {
                let reset_ms = u64::try_from(*reset_ms).unwrap_or(0);
                *s = DescriptorStatus {
                    code: u32::try_from(*code).unwrap_or(OVER_LIMIT),
                    current_limit: Some(CurrentLimit {
                        requests_per_unit: *per_unit,
                        unit: *unit,
                        name: String::new(),
                    }),
                    limit_remaining: u32::try_from(*remaining).unwrap_or(u32::MAX),
                    duration_until_reset: Some(Duration {
                        seconds: i64::try_from(reset_ms / 1000).unwrap_or(i64::MAX),
                        nanos: i32::try_from((reset_ms % 1000) * 1_000_000).unwrap_or(0),
                    }),
                };
            }
        }
        Ok(RateLimitResponse {
            overall_code: if *admitted == 1 { OK } else { OVER_LIMIT },
            statuses,
            response_headers_to_add: Vec::new(),
        })
    }
}

#[tonic::async_trait]
impl RateLimitService for Limiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        if !self.authorized(&request) {
            self.unauthenticated
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(Status::unauthenticated(
                "this rate limit service serves only callers with its token",
            ));
        }
        self.decide(request.get_ref()).await.map(Response::new)
    }
}
