//! A retry policy: how many attempts, how far apart, how long each may take,
//! and how long a failing request holds back the ones queued after it.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub attempts: u32,
    /// From the start of the first attempt to the start of the second.
    pub interval: Duration,
    /// Each later wait is the previous one times this (1 keeps it fixed).
    pub backoff: f64,
    /// Longest wait between two attempts.
    pub max_interval: Duration,
    /// Longest wait for one response.
    pub timeout: Duration,
    /// How long after its first attempt a failing row keeps later rows of
    /// its order key waiting; `None` until it is given up (strict order).
    pub order_hold: Option<Duration>,
}

impl RetryPolicy {
    /// A policy with the same wait between every two attempts.
    pub fn fixed(attempts: u32, interval: Duration, timeout: Duration) -> RetryPolicy {
        RetryPolicy {
            attempts,
            interval,
            backoff: 1.0,
            max_interval: interval,
            timeout,
            order_hold: None,
        }
    }

    /// How long after the first attempt a failing row stops holding back its
    /// order key: the order hold, but never past the give-up time.
    pub fn hold_after(&self) -> Duration {
        let give_up = self.give_up_after();
        self.order_hold.map_or(give_up, |hold| hold.min(give_up))
    }

    /// From the start of attempt `attempt` (1-based) to the start of the next.
    pub fn wait_after(&self, attempt: i64) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let factor = self.backoff.max(1.0).powi(exponent);
        let wait = self.interval.as_secs_f64() * factor;
        if !wait.is_finite() || wait >= self.max_interval.as_secs_f64() {
            self.max_interval.max(self.interval)
        } else {
            Duration::from_secs_f64(wait)
        }
    }

    /// From the start of the first attempt to the end of the last wait: when a
    /// delivery that never succeeded is given up.
    pub fn give_up_after(&self) -> Duration {
        (1..=i64::from(self.attempts))
            .map(|n| self.wait_after(n))
            .sum()
    }
}
