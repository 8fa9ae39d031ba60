//! Budget periods: calendar days, ISO weeks (from Monday) and months, and
//! `total` (never resets), in UTC or at a configured offset from it. A
//! period is named by an index (days since the epoch, weeks since the
//! Monday before it, months since year 0), so counters of one period are
//! one key and a new period starts from nothing. Time is a parameter.
// Clocks and config meet here: every sum saturates, never wraps.
#![deny(clippy::arithmetic_side_effects)]

const DAY_MS: u64 = 86_400_000;

/// How long a budget counts before it starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    Day,
    /// Monday 00:00 to the next Monday.
    Week,
    /// The calendar month.
    Month,
    /// Never resets.
    Total,
}

impl Period {
    pub fn parse(s: &str) -> Option<Period> {
        match s {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            "total" => Some(Period::Total),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
            Period::Total => "total",
        }
    }

    /// In messages: "Daily budget", "Weekly budget", ...
    pub fn adjective(self) -> &'static str {
        match self {
            Period::Day => "Daily",
            Period::Week => "Weekly",
            Period::Month => "Monthly",
            Period::Total => "Total",
        }
    }

    /// The period containing `now_ms`, on the clock `offset_ms` from UTC.
    pub fn index(self, now_ms: u64, offset_ms: i64) -> u64 {
        let day = local_day(now_ms, offset_ms);
        match self {
            Period::Day => day,
            // 1970-01-01 was a Thursday, so Mondays are days 4 + 7k.
            Period::Week => day.saturating_add(3) / 7,
            Period::Month => {
                let (y, m, _) = civil(day);
                y.saturating_mul(12).saturating_add(m.saturating_sub(1))
            }
            Period::Total => 0,
        }
    }

    /// The first local day of period `index`.
    fn first_day(self, index: u64) -> u64 {
        match self {
            Period::Day => index,
            Period::Week => index.saturating_mul(7).saturating_sub(3),
            Period::Month => days_from_civil(index / 12, (index % 12).saturating_add(1)),
            Period::Total => 0,
        }
    }

    /// Milliseconds from `now_ms` until the period containing it ends
    /// (`None`: `total` never ends).
    pub fn ms_to_end(self, now_ms: u64, offset_ms: i64) -> Option<u64> {
        if self == Period::Total {
            return None;
        }
        let next = self.first_day(self.index(now_ms, offset_ms).saturating_add(1));
        let local_now = local_ms(now_ms, offset_ms);
        Some(next.saturating_mul(DAY_MS).saturating_sub(local_now).max(1))
    }

    /// The period's name in a rate limit descriptor: its first day
    /// (`2026-12-07`), its month (`2026-12`), or `total`.
    pub fn label(self, index: u64) -> String {
        match self {
            Period::Day | Period::Week => {
                let (y, m, d) = civil(self.first_day(index));
                format!("{y:04}-{m:02}-{d:02}")
            }
            Period::Month => format!("{:04}-{:02}", index / 12, (index % 12).saturating_add(1)),
            Period::Total => "total".into(),
        }
    }
}

/// `now_ms` on the clock `offset_ms` from UTC (before the epoch reads as 0).
fn local_ms(now_ms: u64, offset_ms: i64) -> u64 {
    let n = i64::try_from(now_ms).unwrap_or(i64::MAX);
    u64::try_from(n.saturating_add(offset_ms)).unwrap_or(0)
}

/// The local day number (days since 1970-01-01 on that clock).
pub fn local_day(now_ms: u64, offset_ms: i64) -> u64 {
    local_ms(now_ms, offset_ms) / DAY_MS
}

/// `+HH:MM`, `-HH:MM` or `UTC` as milliseconds east of UTC (within ±14h).
pub fn parse_offset(s: &str) -> Option<i64> {
    if s == "UTC" || s == "Z" || s == "+00:00" {
        return Some(0);
    }
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1i64, s.get(1..)?),
        b'-' => (-1i64, s.get(1..)?),
        _ => return None,
    };
    let (h, m) = rest.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m) = (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?);
    if h > 14 || m > 59 || (h == 14 && m > 0) {
        return None;
    }
    Some(
        sign.saturating_mul(
            h.saturating_mul(60)
                .saturating_add(m)
                .saturating_mul(60_000),
        ),
    )
}

/// Year, month (1-12), day (1-31) of a day number (days since 1970-01-01),
/// proleptic Gregorian, over eras of 400 years; a day number this large is
/// centuries past any clock, so it saturates.
pub fn civil(day: u64) -> (u64, u64, u64) {
    let z = day.min(100_000_000).saturating_add(719_468);
    let era = z / 146_097;
    let doe = z.saturating_sub(era.saturating_mul(146_097));
    let yoe = doe
        .saturating_sub(doe / 1460)
        .saturating_add(doe / 36_524)
        .saturating_sub(doe / 146_096)
        / 365;
    let doy = doe.saturating_sub(
        yoe.saturating_mul(365)
            .saturating_add(yoe / 4)
            .saturating_sub(yoe / 100),
    );
    let mp = doy.saturating_mul(5).saturating_add(2) / 153;
    let d = doy
        .saturating_sub(mp.saturating_mul(153).saturating_add(2) / 5)
        .saturating_add(1);
    let m = if mp < 10 {
        mp.saturating_add(3)
    } else {
        mp.saturating_sub(9)
    };
    let y = yoe
        .saturating_add(era.saturating_mul(400))
        .saturating_add(u64::from(m <= 2));
    (y, m, d)
}

/// The day number of the first of month `m` (1-12) of year `y` (before the
/// epoch reads as 0).
fn days_from_civil(y: u64, m: u64) -> u64 {
    let y = if m <= 2 { y.saturating_sub(1) } else { y };
    let era = y / 400;
    let yoe = y.saturating_sub(era.saturating_mul(400));
    let mp = if m > 2 {
        m.saturating_sub(3)
    } else {
        m.saturating_add(9)
    };
    let doy = mp.saturating_mul(153).saturating_add(2) / 5;
    let doe = yoe
        .saturating_mul(365)
        .saturating_add(yoe / 4)
        .saturating_sub(yoe / 100)
        .saturating_add(doy);
    era.saturating_mul(146_097)
        .saturating_add(doe)
        .saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// 2026-12-02T07:30:00Z, a Wednesday.
    const NOW: u64 = 1_796_196_600_000;

    #[test]
    fn civil_dates_round_trip() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(NOW / DAY_MS), (2026, 12, 2));
        for day in [0, 59, 60, 365, 10_956, 11_016, 20_424, 20_789, 60_000] {
            let (y, m, d) = civil(day);
            assert_eq!(days_from_civil(y, m) + d - 1, day, "day {day}");
        }
        // 2028 is a leap year: February has 29 days.
        assert_eq!(days_from_civil(2028, 3) - days_from_civil(2028, 2), 29);
        assert_eq!(civil(u64::MAX).0, civil(100_000_000).0);
    }

    #[test]
    fn periods_start_and_end_on_the_calendar() {
        let day = Period::Day.index(NOW, 0);
        assert_eq!(Period::Day.label(day), "2026-12-02");
        let week = Period::Week.index(NOW, 0);
        assert_eq!(Period::Week.label(week), "2026-11-30", "the Monday");
        let month = Period::Month.index(NOW, 0);
        assert_eq!(Period::Month.label(month), "2026-12");
        assert_eq!(month, 2026 * 12 + 11);
        assert_eq!(Period::Total.index(NOW, 0), 0);
        assert_eq!(Period::Total.ms_to_end(NOW, 0), None);
        // 07:30 on Wednesday the 2nd: 16h30m to midnight, 4 days + that to
        // Monday the 7th, 29 days + that to January the 1st.
        let to_midnight = 16 * 3_600_000 + 30 * 60_000;
        assert_eq!(Period::Day.ms_to_end(NOW, 0), Some(to_midnight));
        assert_eq!(
            Period::Week.ms_to_end(NOW, 0),
            Some(4 * DAY_MS + to_midnight)
        );
        assert_eq!(
            Period::Month.ms_to_end(NOW, 0),
            Some(29 * DAY_MS + to_midnight)
        );
        // One millisecond before the end is still the period; at the end,
        // the next one.
        let end = NOW + Period::Week.ms_to_end(NOW, 0).unwrap();
        assert_eq!(Period::Week.index(end - 1, 0), week);
        assert_eq!(Period::Week.index(end, 0), week + 1);
        assert_eq!(Period::Week.label(week + 1), "2026-12-07");
        let end = NOW + Period::Month.ms_to_end(NOW, 0).unwrap();
        assert_eq!(Period::Month.label(Period::Month.index(end, 0)), "2027-01");
    }

    #[test]
    fn an_offset_moves_where_periods_start() {
        let tokyo = parse_offset("+09:00").unwrap();
        // 07:30 UTC is 16:30 in Tokyo: 7h30m to its midnight.
        assert_eq!(
            Period::Day.ms_to_end(NOW, tokyo),
            Some(7 * 3_600_000 + 1_800_000)
        );
        let la = parse_offset("-08:00").unwrap();
        // 07:30 UTC on the 2nd is 23:30 on the 1st in Los Angeles.
        assert_eq!(Period::Day.label(Period::Day.index(NOW, la)), "2026-12-01");
        assert_eq!(Period::Day.ms_to_end(NOW, la), Some(1_800_000));
        assert_eq!(parse_offset("+05:30"), Some(330 * 60_000));
        assert_eq!(parse_offset("UTC"), Some(0));
        for bad in [
            "", "5", "+5:00", "+15:00", "+14:30", "+05:60", "05:00", "+0a:00",
        ] {
            assert_eq!(parse_offset(bad), None, "{bad}");
        }
        // A clock before the epoch reads as the epoch.
        assert_eq!(local_day(0, la), 0);
    }

    #[test]
    fn period_names_parse() {
        for p in [Period::Day, Period::Week, Period::Month, Period::Total] {
            assert_eq!(Period::parse(p.name()), Some(p));
        }
        assert_eq!(Period::parse("year"), None);
    }
}
