//! A widget's callback calls (`[[channels]] calls = {…}`): whether visitors
//! may ask to be called back, and when (weekdays and hours in a time zone,
//! by IANA name with daylight saving time, or at a fixed UTC offset).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallsConfig {
    #[serde(default)]
    pub enabled: bool,
    /// The schedule's time zone, `Europe/Berlin` (daylight saving time
    /// included); takes precedence over `utc_offset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The schedule's fixed offset from UTC, `+01:00` or `-05:30`, when no
    /// `time_zone` is given.
    #[serde(default = "utc")]
    pub utc_offset: String,
    /// When calls are taken; none: at any time.
    #[serde(default)]
    pub hours: Vec<CallHours>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallHours {
    /// `mon` … `sun`.
    pub days: Vec<String>,
    /// `HH:MM`, inclusive.
    pub from: String,
    /// `HH:MM`, exclusive.
    pub to: String,
}

fn utc() -> String {
    "+00:00".to_owned()
}

const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// The spec's reason when calls are off.
pub const CALLBACK_DISABLED: &str = "Callback disabled";
/// Calls are on, but not at this hour or on this day.
pub const OUTSIDE_HOURS: &str = "Calls are not available at this time";

/// Minutes east of UTC of `+HH:MM` / `-HH:MM`.
fn offset_minutes(s: &str) -> Option<i64> {
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let minutes = clock_minutes(rest)?;
    (minutes <= 14 * 60).then_some(sign * minutes)
}

/// Minutes since midnight of `HH:MM` (`24:00` is the end of the day).
fn clock_minutes(s: &str) -> Option<i64> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    ((0..=23).contains(&h) && (0..=59).contains(&m) || (h == 24 && m == 0)).then_some(h * 60 + m)
}

impl CallsConfig {
    /// Every problem, each naming its key under `calls`.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(zone) = &self.time_zone
            && jiff::tz::TimeZone::get(zone).is_err()
        {
            out.push(format!(
                "calls.time_zone: `{zone}` is not a time zone like Europe/Berlin"
            ));
        }
        if offset_minutes(&self.utc_offset).is_none() {
            out.push(format!(
                "calls.utc_offset: `{}` is not an offset like +01:00",
                self.utc_offset
            ));
        }
        for (i, h) in self.hours.iter().enumerate() {
            for day in &h.days {
                if !DAYS.contains(&day.as_str()) {
                    out.push(format!(
                        "calls.hours[{i}].days: `{day}` is not one of mon, tue, wed, thu, fri, sat, sun"
                    ));
                }
            }
            match (clock_minutes(&h.from), clock_minutes(&h.to)) {
                (Some(f), Some(t)) if f < t => {}
                (Some(_), Some(_)) => out.push(format!(
                    "calls.hours[{i}]: `from` ({}) must be before `to` ({})",
                    h.from, h.to
                )),
                _ => out.push(format!(
                    "calls.hours[{i}]: `from` and `to` are times like 09:00"
                )),
            }
        }
        out
    }

    /// Whether a call may be asked for at `now_ms` (Unix ms); else the
    /// reason the page is given.
    pub fn available_at(&self, now_ms: i64) -> Result<(), &'static str> {
        if !self.enabled {
            return Err(CALLBACK_DISABLED);
        }
        if self.hours.is_empty() {
            return Ok(());
        }
        let (weekday, minute) = self.local_time(now_ms);
        let open = self.hours.iter().any(|h| {
            h.days.iter().any(|d| d == weekday)
                && matches!(
                    (clock_minutes(&h.from), clock_minutes(&h.to)),
                    (Some(f), Some(t)) if f <= minute && minute < t
                )
        });
        if open { Ok(()) } else { Err(OUTSIDE_HOURS) }
    }

    /// The weekday and the minute of the day at `now_ms` where the calls are taken.
    fn local_time(&self, now_ms: i64) -> (&'static str, i64) {
        let zoned = self.time_zone.as_deref().and_then(|zone| {
            let tz = jiff::tz::TimeZone::get(zone).ok()?;
            let at = tz.to_datetime(jiff::Timestamp::from_millisecond(now_ms).ok()?);
            let weekday = DAYS[usize::from(at.weekday().to_sunday_zero_offset().unsigned_abs())];
            Some((weekday, i64::from(at.hour()) * 60 + i64::from(at.minute())))
        });
        zoned.unwrap_or_else(|| {
            let local = now_ms.div_euclid(60_000) + offset_minutes(&self.utc_offset).unwrap_or(0);
            // 1970-01-01 was a Thursday.
            let day = local.div_euclid(24 * 60);
            (
                DAYS[(day + 4).rem_euclid(7) as usize],
                local.rem_euclid(24 * 60),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weekdays_9_to_18(offset: &str) -> CallsConfig {
        CallsConfig {
            enabled: true,
            time_zone: None,
            utc_offset: offset.to_owned(),
            hours: vec![CallHours {
                days: ["mon", "tue", "wed", "thu", "fri"]
                    .map(String::from)
                    .to_vec(),
                from: "09:00".into(),
                to: "18:00".into(),
            }],
        }
    }

    /// 2026-11-25 (a Wednesday) at `hh:mm` UTC, in Unix ms.
    fn wednesday(hh: i64, mm: i64) -> i64 {
        (1_795_564_800 + hh * 3600 + mm * 60) * 1000
    }

    #[test]
    fn the_schedule_is_read_at_its_offset() {
        let c = weekdays_9_to_18("+00:00");
        assert_eq!(c.available_at(wednesday(9, 0)), Ok(()));
        assert_eq!(c.available_at(wednesday(17, 59)), Ok(()));
        assert_eq!(c.available_at(wednesday(18, 0)), Err(OUTSIDE_HOURS));
        assert_eq!(c.available_at(wednesday(8, 59)), Err(OUTSIDE_HOURS));
        // 08:30 UTC is 09:30 at +01:00, and 17:30 UTC is 18:30 there.
        let berlin = weekdays_9_to_18("+01:00");
        assert_eq!(berlin.available_at(wednesday(8, 30)), Ok(()));
        assert_eq!(berlin.available_at(wednesday(17, 30)), Err(OUTSIDE_HOURS));
        // Saturday: 3 days after a Wednesday.
        let saturday = wednesday(12, 0) + 3 * 86_400_000;
        assert_eq!(c.available_at(saturday), Err(OUTSIDE_HOURS));
    }

    #[test]
    fn a_time_zone_follows_daylight_saving_time() {
        let mut berlin = weekdays_9_to_18("+00:00");
        berlin.time_zone = Some("Europe/Berlin".into());
        // November: Berlin is UTC+1, so 08:30 UTC is 09:30 there.
        assert_eq!(berlin.available_at(wednesday(8, 30)), Ok(()));
        assert_eq!(berlin.available_at(wednesday(7, 30)), Err(OUTSIDE_HOURS));
        // 2026-07-01, a Wednesday: Berlin is UTC+2, so 07:30 UTC is 09:30.
        let july = (1_782_864_000 + 7 * 3600 + 30 * 60) * 1000;
        assert_eq!(berlin.available_at(july), Ok(()));
        berlin.time_zone = Some("Mars/Olympus".into());
        assert!(berlin.problems()[0].starts_with("calls.time_zone"));
    }

    #[test]
    fn disabled_calls_give_the_specs_reason_and_no_hours_mean_always() {
        let mut c = weekdays_9_to_18("+00:00");
        c.enabled = false;
        assert_eq!(c.available_at(wednesday(12, 0)), Err(CALLBACK_DISABLED));
        c.enabled = true;
        c.hours.clear();
        assert_eq!(c.available_at(wednesday(3, 0)), Ok(()));
    }

    #[test]
    fn problems_name_their_keys() {
        let bad = CallsConfig {
            enabled: true,
            time_zone: None,
            utc_offset: "CET".into(),
            hours: vec![CallHours {
                days: vec!["monday".into()],
                from: "18:00".into(),
                to: "09:00".into(),
            }],
        };
        let p = bad.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("calls.utc_offset"), "{p:?}");
        assert!(p[1].starts_with("calls.hours[0].days"), "{p:?}");
        assert!(p[2].contains("must be before"), "{p:?}");
        assert!(weekdays_9_to_18("-05:30").problems().is_empty());
    }
}
