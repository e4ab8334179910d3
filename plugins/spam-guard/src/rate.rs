//! The fixed-window counter kept per client in KV as `{"start": ms, "count": n}`.

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub count: u64,
}

impl Window {
    /// The stored window; a missing or unreadable one starts afresh.
    pub fn parse(stored: Option<&str>) -> Option<Window> {
        let value: Value = serde_json::from_str(stored?).ok()?;
        Some(Window {
            start: value.get("start")?.as_i64()?,
            count: value.get("count")?.as_u64()?,
        })
    }

    pub fn to_json(self) -> String {
        json!({ "start": self.start, "count": self.count }).to_string()
    }
}

/// Adds one message at `at` to the stored window; a window that has run out
/// (or lies in the future, after a clock step back) is replaced by one starting now.
pub fn count(stored: Option<Window>, at: i64, window_ms: i64) -> Window {
    match stored {
        Some(w) if w.start <= at && at.saturating_sub(w.start) < window_ms => Window {
            start: w.start,
            count: w.count.saturating_add(1),
        },
        _ => Window {
            start: at,
            count: 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_count_and_roll_over() {
        let w = count(None, 1000, 60_000);
        assert_eq!(
            w,
            Window {
                start: 1000,
                count: 1
            }
        );
        let w = count(Some(w), 60_999, 60_000);
        assert_eq!(
            w,
            Window {
                start: 1000,
                count: 2
            }
        );
        let after = Window {
            start: 61_000,
            count: 1,
        };
        assert_eq!(count(Some(w), 61_000, 60_000), after);
        let before = Window {
            start: 500,
            count: 1,
        };
        assert_eq!(count(Some(w), 500, 60_000), before);
    }

    #[test]
    fn parses_what_it_writes_and_ignores_garbage() {
        let w = Window { start: 5, count: 3 };
        assert_eq!(Window::parse(Some(&w.to_json())), Some(w));
        assert_eq!(Window::parse(Some("nonsense")), None);
        assert_eq!(Window::parse(Some(r#"{"start":"x","count":1}"#)), None);
        assert_eq!(Window::parse(None), None);
    }
}
