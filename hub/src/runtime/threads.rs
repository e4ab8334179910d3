//! The plugin threads: where a call that outlives its first epoch tick runs
//! on, so that long or host-heavy calls never hold the request threads.
//!
//! Why not every call: an ordinary call takes microseconds, and handing it to
//! another thread and back would cost more than the call. A call moves when
//! the epoch ticker first interrupts it (at most one tick in), with its
//! store: wasmtime's call future may be polled from any thread.
//!
//! Why fewer threads than cores, at a lower scheduling priority: whatever
//! every plugin of the hub does at once, a core is left for the requests,
//! and when the cores are contended the kernel runs the request threads
//! first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

thread_local! {
    /// Whether this thread is one of the plugin threads.
    static ON_PLUGIN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How much nicer than the hub the plugin threads are (19 is the lowest
/// priority).
const NICENESS: i32 = 10;

pub struct PluginThreads {
    runtime: Option<tokio::runtime::Runtime>,
}

impl PluginThreads {
    /// Every core but one (at least one thread).
    pub fn start() -> std::io::Result<PluginThreads> {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        PluginThreads::with_threads(cores.saturating_sub(1).max(1))
    }

    pub fn with_threads(count: usize) -> std::io::Result<PluginThreads> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(count)
            .thread_name("hub-plugin")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        Ok(PluginThreads {
            runtime: Some(runtime),
        })
    }

    /// Runs `call` on the plugin threads; `None` if they are shut down (the
    /// hub is stopping) or the call panicked.
    pub async fn run<F>(&self, call: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = self.runtime.as_ref()?;
        runtime.spawn(call).await.ok()
    }

    /// Runs `work` on a blocking thread of the plugin threads (at their
    /// priority); once they are shut down, here.
    pub fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static) {
        match &self.runtime {
            Some(runtime) => drop(runtime.spawn_blocking(work)),
            None => work(),
        }
    }
}

impl Drop for PluginThreads {
    fn drop(&mut self) {
        // Dropped from async code (a reload replaces the runtime): waiting
        // for the threads there would block a request thread, and tokio
        // refuses it. A call still running ends at its own deadline.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A future whose polls are timed, whichever thread polls it: what a call
/// costs the machine, without the time it waited for a thread, for the
/// database or for a timer. On the plugin threads a poll is timed in the
/// thread's CPU time (they run at a low priority, so their wall time grows
/// with everyone else's work); elsewhere in wall time, which on a request
/// thread is its CPU time but for a rare preemption, and costs 20 ns to read
/// instead of a system call's 400. It boxes the future it times, so that
/// it can be polled in place and then handed to another thread as it is.
pub struct Metered<F> {
    inner: Pin<Box<F>>,
    spent: Arc<AtomicU64>,
}

impl<F: Future> Metered<F> {
    /// `spent` gathers the nanoseconds, also while the future is unfinished.
    pub fn new(inner: F, spent: Arc<AtomicU64>) -> Metered<F> {
        Metered {
            inner: Box::pin(inner),
            spent,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let (poll, took) = if ON_PLUGIN_THREAD.get() {
            let started = thread_cpu_time();
            let poll = self.inner.as_mut().poll(cx);
            (poll, thread_cpu_time().saturating_sub(started))
        } else {
            let started = std::time::Instant::now();
            let poll = self.inner.as_mut().poll(cx);
            (poll, started.elapsed())
        };
        self.spent.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        poll
    }
}

/// CPU time the calling thread has used.
#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "clock_gettime writes only the timespec passed to it"
)]
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, exclusively borrowed timespec.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

/// Elsewhere, the time since the process started (wall time inside polls).
#[cfg(not(target_os = "linux"))]
fn thread_cpu_time() -> Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "setpriority on the calling thread: no memory is passed or kept"
)]
fn lower_priority() {
    ON_PLUGIN_THREAD.set(true);
    // On Linux a thread's niceness is its own: `who = 0` with PRIO_PROCESS
    // names the calling thread only. Failing leaves the thread at the hub's
    // priority, which is still correct, only less protective.
    // SAFETY: both calls take integers only and touch no memory of ours.
    unsafe {
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, (now + NICENESS).min(19));
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {
    ON_PLUGIN_THREAD.set(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_runs_on_a_plugin_thread_at_a_lower_priority() {
        let threads = PluginThreads::with_threads(1).expect("threads");
        let (name, nice) = threads
            .run(async {
                let name = std::thread::current().name().map(str::to_owned);
                #[cfg(target_os = "linux")]
                #[allow(unsafe_code, reason = "getpriority of the calling thread")]
                // SAFETY: no pointers; errno is not read (the value is checked).
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                #[cfg(not(target_os = "linux"))]
                let nice = NICENESS;
                (name, nice)
            })
            .await
            .expect("ran");
        assert_eq!(name.as_deref(), Some("hub-plugin"));
        assert!(nice >= NICENESS, "niceness {nice}");
    }

    #[tokio::test]
    async fn a_metered_future_counts_its_work_and_not_its_waits() {
        let threads = PluginThreads::with_threads(1).expect("threads");
        for on_plugin_thread in [false, true] {
            let spent = if on_plugin_thread {
                threads.run(metered_work()).await.expect("ran")
            } else {
                metered_work().await
            };
            // Far from the sleep's 200 ms: on a busy machine the 20 ms of
            // work may take longer on the wall clock, which the request
            // threads count.
            assert!(
                spent >= Duration::from_millis(15) && spent < Duration::from_millis(150),
                "{spent:?} (on a plugin thread: {on_plugin_thread})"
            );
        }
    }

    /// 200 ms asleep, then 20 ms of work (of this thread's CPU time, so that
    /// other processes on the machine cannot make it less): what a metered
    /// future counts of it.
    async fn metered_work() -> Duration {
        let spent = Arc::new(AtomicU64::new(0));
        let work = Metered::new(
            async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let started = thread_cpu_time();
                let mut x = 0u64;
                while thread_cpu_time().saturating_sub(started) < Duration::from_millis(20) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                x
            },
            spent.clone(),
        );
        work.await;
        Duration::from_nanos(spent.load(Ordering::Relaxed))
    }
}
