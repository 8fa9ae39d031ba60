//! The `since` query value: epoch milliseconds or a span back from now.
//! No dependencies, so the fuzz target includes this file as it is.

/// `since`: epoch milliseconds, or a span back from now (`90s`, `15m`, `24h`, `7d`).
/// Any other text, and spans too large to compute, are an error (a 400).
pub fn parse_since(s: Option<&str>, now: i64) -> Result<i64, String> {
    let Some(s) = s.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(now.saturating_sub(86_400_000));
    };
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let bad = || {
        format!("`since` must be epoch milliseconds or a span like 90s, 15m, 24h, 7d (got `{s}`)")
    };
    // The unit is the last character, whatever its width in bytes.
    let mut chars = s.chars();
    let unit = chars.next_back().ok_or_else(bad)?;
    let n: i64 = chars.as_str().parse().map_err(|_| bad())?;
    let unit_ms: i64 = match unit {
        's' => 1_000,
        'm' => 60_000,
        'h' => 3_600_000,
        'd' => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_ms)
        .filter(|span| *span >= 0)
        .and_then(|span| now.checked_sub(span))
        .ok_or_else(|| format!("`since` span is out of range (got `{s}`)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_accepts_epoch_ms_and_spans() {
        assert_eq!(parse_since(Some("1234"), 10_000_000), Ok(1234));
        assert_eq!(
            parse_since(Some("15m"), 10_000_000),
            Ok(10_000_000 - 900_000)
        );
        assert_eq!(parse_since(None, 100_000_000), Ok(100_000_000 - 86_400_000));
        assert!(parse_since(Some("3w"), 0).is_err());
        assert!(parse_since(Some("abc"), 0).is_err());
    }

    /// `é` is two bytes: splitting off the last byte once aborted the process.
    #[test]
    fn since_never_panics_on_multibyte_or_huge_values() {
        for bad in [
            "é",
            "1é",
            "\u{1F600}",
            "9223372036854775807d",
            "-5m",
            "m",
            "1.5h",
        ] {
            assert!(parse_since(Some(bad), 1_000).is_err(), "{bad}");
        }
        assert_eq!(parse_since(Some("2d"), 1_000), Ok(1_000 - 172_800_000));
    }
}
