//! The counters in Redis and the one script that decides a request.
//!
//! Per-second, per-minute and per-hour limits are token buckets (capacity
//! the limit, refilled continuously over the period), as the gateway's local
//! limits are, so a limit means the same whichever scope counts it. Daily
//! (and longer) limits are fixed windows that do not refill: a budget's
//! descriptor names its UTC day, so its window is that calendar day.
//!
//! Check and count happen in one script run, which Redis executes alone:
//! two gateways can never both take the last unit (a check in one round
//! trip and an increment in another can). Time is Redis' own clock (`TIME`),
//! so limiter instances on machines whose clocks differ still agree.

use crate::proto::RateLimitDescriptor;

/// `KEYS[i]`: descriptor i's counter. Per descriptor, `ARGV[3i-2..3i]`: its
/// limit, period in ms and hits. Returns `{admitted, code_1, remaining_1,
/// reset_ms_1, code_2, ...}`; codes 1 OK, 2 OVER_LIMIT.
pub const SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
local out = {1}
local after = {}
for i = 1, n do
  local limit = tonumber(ARGV[3 * i - 2])
  local period = tonumber(ARGV[3 * i - 1])
  local hits = tonumber(ARGV[3 * i])
  local code, left, reset
  if period >= 86400000 then
    local used = tonumber(redis.call('GET', KEYS[i]) or '0')
    local ttl = redis.call('PTTL', KEYS[i])
    if ttl < 0 then ttl = period end
    if used + hits <= limit then
      code, left = 1, limit - used - hits
    else
      code, left = 2, math.max(limit - used, 0)
    end
    reset = ttl
  else
    local v = redis.call('HMGET', KEYS[i], 'l', 't')
    local level, at = tonumber(v[1]), tonumber(v[2])
    if level == nil or at == nil then level, at = limit, now end
    level = math.min(limit, level + math.max(now - at, 0) * limit / period)
    if level >= hits then
      code, left = 1, level - hits
      reset = math.ceil((limit - left) * period / limit)
    else
      code, left = 2, level
      reset = math.ceil((hits - level) * period / limit)
    end
    after[i] = left
  end
  if code == 2 then out[1] = 0 end
  out[#out + 1] = code
  out[#out + 1] = math.floor(math.max(left, 0))
  out[#out + 1] = reset
end
if out[1] == 1 then
  for i = 1, n do
    local period = tonumber(ARGV[3 * i - 1])
    local hits = tonumber(ARGV[3 * i])
    if period >= 86400000 then
      if redis.call('INCRBY', KEYS[i], hits) == hits then
        redis.call('PEXPIRE', KEYS[i], period)
      end
    else
      redis.call('HSET', KEYS[i], 'l', tostring(after[i]), 't', now)
      redis.call('PEXPIRE', KEYS[i], period * 2)
    end
  end
end
return out
";

/// The period of a `RateLimitUnit` in milliseconds (`None`: unknown unit).
pub fn period_ms(unit: u32) -> Option<u64> {
    match unit {
        1 => Some(1_000),
        2 => Some(60_000),
        3 => Some(3_600_000),
        4 => Some(86_400_000),
        // MONTH (30 days), YEAR (365 days), WEEK.
        5 => Some(2_592_000_000),
        6 => Some(31_536_000_000),
        7 => Some(604_800_000),
        _ => None,
    }
}

/// A descriptor's counter: the domain, its entries (length-prefixed, so no
/// value can forge another's key) and the unit.
pub fn key(prefix: &str, domain: &str, d: &RateLimitDescriptor, unit: u32) -> String {
    let mut k = format!("{prefix}{}:{domain}|u{unit}", domain.len());
    for e in &d.entries {
        k.push_str(&format!(
            "|{}:{}{}:{}",
            e.key.len(),
            e.key,
            e.value.len(),
            e.value
        ));
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Entry;

    fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                })
                .collect(),
            limit: None,
            hits_addend: None,
        }
    }

    #[test]
    fn keys_cannot_be_forged_by_values() {
        let a = key("p:", "x", &d(&[("client", "a|1:b")]), 2);
        let b = key("p:", "x", &d(&[("client", "a"), ("b", "")]), 2);
        assert_ne!(a, b);
        assert_ne!(
            key("p:", "x", &d(&[("k", "v")]), 2),
            key("p:", "x", &d(&[("k", "v")]), 4)
        );
    }

    #[test]
    fn units_have_periods() {
        assert_eq!(period_ms(2), Some(60_000));
        assert_eq!(period_ms(4), Some(86_400_000));
        assert_eq!(period_ms(0), None);
        assert_eq!(period_ms(99), None);
    }
}
