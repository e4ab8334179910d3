//! A plugin call's deadline, which measures the plugin: the time a host
//! call spends waiting for the hub's own database (a key-value read, the
//! usage a quota checks) moves it later, so a busy database or a cold pool
//! does not time out a plugin that ran for microseconds. What the guest
//! runs, and what it waits for of its own (a `send` to a destination),
//! stays charged.
//!
//! The database time left out is bounded ([`MAX_EXCUSED`]): a database that
//! never answers still ends the call.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// Most database time one call may leave out of its deadline. Past it the
/// call ends as a timeout like any other: the event is then answered by its
/// route's `on_error` rather than waiting on a database that is gone.
pub const MAX_EXCUSED: Duration = Duration::from_secs(10);

/// When one call must end: its start, its `timeout_ms`, and the database
/// waits left out so far. While a host call waits for the database the
/// call's clock stands still.
#[derive(Debug)]
pub struct Deadline {
    start: Instant,
    budget: Duration,
    clock: Mutex<Clock>,
    /// Told when a database wait begins or ends.
    moved: Notify,
}

#[derive(Debug, Default)]
struct Clock {
    /// Database waits that ended, at most [`MAX_EXCUSED`].
    excused: Duration,
    /// When the database wait under way began.
    waiting_since: Option<Instant>,
}

impl Deadline {
    /// A deadline `budget` from now.
    pub fn new(budget: Duration) -> Deadline {
        Deadline {
            start: Instant::now(),
            budget,
            clock: Mutex::new(Clock::default()),
            moved: Notify::new(),
        }
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instant the call must end by, as it stands now; during a
    /// database wait, the latest it can be (every excuse used up).
    pub fn at(&self) -> Instant {
        let clock = self.clock();
        let excused = if clock.waiting_since.is_some() {
            MAX_EXCUSED
        } else {
            clock.excused
        };
        self.start + self.budget + excused
    }

    /// Time left until [`Deadline::at`].
    pub fn left(&self) -> Duration {
        self.at().saturating_duration_since(Instant::now())
    }

    /// Database time left out so far (of the waits that ended).
    pub fn excused(&self) -> Duration {
        self.clock().excused
    }

    /// Runs `wait`, a host call's wait for the hub's database, with the
    /// call's clock stopped: the time it takes is left out of the deadline
    /// (up to [`MAX_EXCUSED`] in all).
    pub async fn excusing<T>(&self, wait: impl Future<Output = T>) -> T {
        let _stopped = Stopped::new(self);
        wait.await
    }

    fn excuse(&self, waited: Duration) {
        {
            let mut clock = self.clock();
            clock.excused = (clock.excused + waited).min(MAX_EXCUSED);
        }
        self.moved.notify_waiters();
    }

    /// Completes once the deadline has passed, following it as it moves.
    pub async fn passed(&self) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let at = self.at();
            if Instant::now() >= at {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = moved => {}
            }
        }
    }

    /// `run`, or `None` if the deadline passes first.
    pub async fn bound<T>(&self, run: impl Future<Output = T>) -> Option<T> {
        tokio::select! {
            biased;
            out = run => Some(out),
            () = self.passed() => None,
        }
    }
}

/// A database wait under way; its time is excused when it ends, however
/// it ends (a wait given up when the call is dropped counts as ended).
struct Stopped<'a> {
    deadline: &'a Deadline,
    since: Instant,
}

impl<'a> Stopped<'a> {
    fn new(deadline: &'a Deadline) -> Stopped<'a> {
        let since = Instant::now();
        deadline.clock().waiting_since = Some(since);
        deadline.moved.notify_waiters();
        Stopped { deadline, since }
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.deadline.clock().waiting_since = None;
        self.deadline.excuse(self.since.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_database_wait_moves_the_deadline_by_what_it_took() {
        let deadline = Deadline::new(Duration::from_secs(60));
        let first = deadline.at();
        let waited = Instant::now();
        deadline
            .excusing(tokio::time::sleep(Duration::from_millis(20)))
            .await;
        let took = waited.elapsed();
        assert!(deadline.excused() >= Duration::from_millis(20));
        assert!(
            deadline.excused() <= took,
            "{:?} > {took:?}",
            deadline.excused()
        );
        assert_eq!(deadline.at(), first + deadline.excused());
    }

    /// The defect this fixes: a plugin whose key-value read waited on a
    /// busy database past its `timeout_ms` was stopped as too slow.
    #[tokio::test]
    async fn a_call_is_not_stopped_while_it_waits_for_the_database() {
        let deadline = Deadline::new(Duration::from_millis(10));
        let read = deadline.excusing(tokio::time::sleep(Duration::from_millis(50)));
        assert_eq!(deadline.bound(read).await, Some(()));
        assert!(deadline.excused() >= Duration::from_millis(50));
    }

    #[test]
    fn database_waits_are_left_out_only_up_to_their_bound() {
        let deadline = Deadline::new(Duration::from_millis(100));
        let first = deadline.at();
        deadline.excuse(MAX_EXCUSED / 2);
        deadline.excuse(MAX_EXCUSED);
        assert_eq!(deadline.at(), first + MAX_EXCUSED);
    }

    /// A guest that only runs is stopped at its deadline; one moved while
    /// the call waits on it is followed, not the one it started with.
    #[tokio::test]
    async fn the_bound_follows_the_deadline_as_it_moves() {
        let deadline = Arc::new(Deadline::new(Duration::from_millis(30)));
        let first = deadline.at();
        let running = deadline.clone();
        let call = tokio::spawn(async move {
            let out = running.bound(std::future::pending::<()>()).await;
            (out, Instant::now())
        });
        // One thread: the call now waits for its first deadline.
        tokio::task::yield_now().await;
        deadline.excuse(Duration::from_millis(50));
        let (out, ended) = call.await.expect("the call");
        assert_eq!(out, None);
        assert_eq!(deadline.at(), first + Duration::from_millis(50));
        assert!(ended >= deadline.at(), "stopped before the moved deadline");
    }
}
