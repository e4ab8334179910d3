//! Time as the hub reads it: a [`Clock`] each hub is given at start, so
//! tests can hold time still and move it on instead of sleeping.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::Either;
use tokio::sync::watch;

/// The system's wall clock in Unix milliseconds. Only for what decides
/// nothing by time and belongs to no running hub (a CLI command, a
/// `created_at` the store stamps); a hub's own decisions read its [`Clock`].
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Where one hub's time comes from: the system's clock, or a [`ManualClock`]
/// that stands still until a test moves it. Cheap to clone; clones share
/// the time. The system clock is a branch and a system call, as before.
#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

/// A clock that moves only when told, by whole milliseconds.
struct Manual {
    wall_ms: i64,
    origin: Instant,
    /// Milliseconds moved since `wall_ms`/`origin`; sleepers watch it.
    elapsed: watch::Sender<u64>,
}

/// A timer ran out before the work it bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

impl Clock {
    /// The system's clock (what `hub serve` runs on).
    pub fn system() -> Clock {
        Clock::default()
    }

    /// Wall time in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        match &self.manual {
            None => now_ms(),
            Some(m) => m
                .wall_ms
                .saturating_add(i64::try_from(*m.elapsed.borrow()).unwrap_or(i64::MAX)),
        }
    }

    /// Monotonic time, for waits and lifetimes that no row records.
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => m.origin + Duration::from_millis(*m.elapsed.borrow()),
        }
    }

    /// Returns once `d` has passed on this clock, counted from this call
    /// (not from the first poll), as `tokio::time::sleep` does.
    pub fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send + 'static {
        match &self.manual {
            None => Either::Left(tokio::time::sleep(d)),
            Some(m) => {
                let m = m.clone();
                let end = (*m.elapsed.borrow()).saturating_add(millis(d));
                Either::Right(async move { m.until(end).await })
            }
        }
    }

    /// Returns once this clock reads `at` (at once when it is past).
    pub async fn sleep_until(&self, at: Instant) {
        match &self.manual {
            None => tokio::time::sleep_until(at.into()).await,
            Some(m) => {
                m.until(millis(at.saturating_duration_since(m.origin)))
                    .await
            }
        }
    }

    /// Returns once this clock's wall time reads `at_ms` (at once when it
    /// is past). A wait worked out from a time read earlier cannot miss a
    /// move of the clock made meanwhile, as a relative sleep would.
    pub async fn sleep_until_ms(&self, at_ms: i64) {
        match &self.manual {
            None => {
                let left = u64::try_from(at_ms.saturating_sub(now_ms())).unwrap_or(0);
                if left > 0 {
                    tokio::time::sleep(Duration::from_millis(left)).await;
                }
            }
            Some(m) => {
                let since = at_ms.saturating_sub(m.wall_ms);
                m.until(u64::try_from(since).unwrap_or(0)).await;
            }
        }
    }

    /// `work`, unless `d` passes on this clock first (counted from this call).
    pub fn timeout<F: Future>(
        &self,
        d: Duration,
        work: F,
    ) -> impl Future<Output = Result<F::Output, Elapsed>> {
        match &self.manual {
            None => {
                let bounded = tokio::time::timeout(d, work);
                Either::Left(async move { bounded.await.map_err(|_| Elapsed) })
            }
            Some(_) => {
                let end = self.sleep(d);
                Either::Right(async move {
                    tokio::select! {
                        out = work => Ok(out),
                        () = end => Err(Elapsed),
                    }
                })
            }
        }
    }
}

impl Manual {
    async fn until(&self, elapsed: u64) {
        let mut rx = self.elapsed.subscribe();
        // The sender lives as long as `self`: this cannot fail while awaited.
        let _ = rx.wait_for(|e| *e >= elapsed).await;
    }
}

/// A clock for tests: it starts at the system's time, rounded down to a
/// whole second (the unit of reminders and signatures), and stands still
/// until [`ManualClock::advance`] moves it, waking what slept until then.
#[derive(Clone)]
pub struct ManualClock(Arc<Manual>);

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    pub fn new() -> ManualClock {
        let wall_ms = now_ms() / 1000 * 1000;
        ManualClock(Arc::new(Manual {
            wall_ms,
            origin: Instant::now(),
            elapsed: watch::Sender::new(0),
        }))
    }

    /// The clock to give a hub.
    pub fn clock(&self) -> Clock {
        Clock {
            manual: Some(self.0.clone()),
        }
    }

    pub fn now_ms(&self) -> i64 {
        self.clock().now_ms()
    }

    /// Moves the time on by `by` (whole milliseconds) and wakes every sleep
    /// and timeout that ends by then.
    pub fn advance(&self, by: Duration) {
        self.0
            .elapsed
            .send_modify(|e| *e = e.saturating_add(millis(by)));
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_sleepers_only_when_moved_past_their_end() {
        let manual = ManualClock::new();
        let clock = manual.clock();
        let start = clock.now_ms();
        let mut sleep = Box::pin(clock.sleep(Duration::from_secs(3)));
        let mut timeout =
            Box::pin(clock.timeout(Duration::from_secs(5), std::future::pending::<()>()));
        tokio::task::yield_now().await;
        assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        manual.advance(Duration::from_millis(2999));
        assert!(futures_util::poll!(sleep.as_mut()).is_pending());
        manual.advance(Duration::from_millis(1));
        assert!(futures_util::poll!(sleep.as_mut()).is_ready());
        assert_eq!(clock.now_ms(), start + 3000);
        assert!(futures_util::poll!(timeout.as_mut()).is_pending());
        manual.advance(Duration::from_secs(2));
        assert_eq!(
            futures_util::poll!(timeout.as_mut()),
            std::task::Poll::Ready(Err(Elapsed))
        );
        let at = clock.now() + Duration::from_secs(1);
        let at_ms = clock.now_ms() + 1000;
        manual.advance(Duration::from_secs(1));
        clock.sleep_until(at).await;
        clock.sleep_until_ms(at_ms).await;
    }
}
