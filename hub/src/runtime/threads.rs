//! The plugin threads: where a call that runs through an epoch tick goes on
//! running, so that long or host-heavy calls never hold the request threads;
//! and the [`Meter`] a call's cost is gathered in, whichever thread runs it.
//!
//! Why not every call: an ordinary call takes microseconds, and handing it to
//! another thread and back would cost more than the call. A call moves at
//! the first epoch tick it ran through (one to two ticks of running without
//! a break), with its store: wasmtime's call future may be polled from any
//! thread.
//!
//! Why fewer threads than cores, at a lower scheduling priority: whatever
//! every plugin of the hub does at once, a core is left for the requests,
//! and when the cores are contended the kernel runs the request threads
//! first.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

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

/// What one call cost the hub, gathered by [`Metered`] whichever thread
/// polls it: the time its polls ran, and the time it waited for what it
/// asked for (a host call's query, timer or request: it holds its slot and
/// memory meanwhile). Not counted: the time from a wake-up to the next poll
/// (waiting for a core, for a request thread or the niced plugin threads,
/// and the trip between them), nor the waits the hub imposes on the call
/// ([`Meter::pause`]). Those grow with everyone's load, and a channel
/// charged for them is capped when the hub is busiest, not when it floods.
pub struct Meter {
    /// Origin of the instants kept below as nanoseconds after it, plus one
    /// (zero: none).
    origin: Instant,
    ran: AtomicU64,
    waited: AtomicU64,
    /// The first wake-up since the current or last poll began.
    woken: AtomicU64,
    /// When the current poll began; zero between polls.
    polling: AtomicU64,
    /// The call is in a pause of the hub's.
    paused: AtomicBool,
}

impl Default for Meter {
    fn default() -> Meter {
        Meter {
            origin: Instant::now(),
            ran: AtomicU64::new(0),
            waited: AtomicU64::new(0),
            woken: AtomicU64::new(0),
            polling: AtomicU64::new(0),
            paused: AtomicBool::new(false),
        }
    }
}

impl Meter {
    /// The time the call's polls ran: on the plugin threads their CPU time,
    /// elsewhere their wall time.
    pub fn ran(&self) -> Duration {
        Duration::from_nanos(self.ran.load(Ordering::Relaxed))
    }

    /// The time the call waited for what it asked for.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited.load(Ordering::Relaxed))
    }

    /// How long the current poll has been running at `now`; zero between
    /// polls.
    pub fn polled_for(&self, now: Instant) -> Duration {
        match self.polling.load(Ordering::Relaxed) {
            0 => Duration::ZERO,
            began => now.saturating_duration_since(self.instant(began)),
        }
    }

    /// Runs `pause`, a wait the hub imposes on the call (a turn, the tick
    /// between slices), without counting it as the call's.
    pub async fn pause(self: Arc<Self>, pause: impl Future<Output = ()>) {
        struct Paused(Arc<Meter>);
        impl Drop for Paused {
            fn drop(&mut self) {
                self.0.paused.store(false, Ordering::Relaxed);
            }
        }
        self.paused.store(true, Ordering::Relaxed);
        let _paused = Paused(self);
        pause.await;
    }

    fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX - 1)
            + 1
    }

    fn instant(&self, stamp: u64) -> Instant {
        self.origin + Duration::from_nanos(stamp - 1)
    }

    fn woke(&self) {
        let now = self.stamp(Instant::now());
        // Only the first wake-up counts: the call could run from then on.
        let _ = self
            .woken
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Starts a poll at `now`; when the call was first woken since the last.
    fn begin_poll(&self, now: Instant) -> Option<Instant> {
        self.polling.store(self.stamp(now), Ordering::Relaxed);
        match self.woken.swap(0, Ordering::Relaxed) {
            0 => None,
            woken => Some(self.instant(woken)),
        }
    }

    fn end_poll(&self, ran: Duration) {
        self.polling.store(0, Ordering::Relaxed);
        add(&self.ran, ran);
    }
}

fn add(total: &AtomicU64, time: Duration) {
    total.fetch_add(
        u64::try_from(time.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// The waker a metered future hands what it polls: notes when the call was
/// woken, then wakes the task polling it (whichever that is now).
struct NoteWake {
    meter: Arc<Meter>,
    task: Mutex<Option<Waker>>,
}

impl Wake for NoteWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.meter.woke();
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

/// A future whose cost is gathered in a [`Meter`], whichever thread polls
/// it. On the plugin threads a poll is timed in the thread's CPU time (they
/// run at a low priority, so their wall time grows with everyone else's
/// work); elsewhere in wall time, which on a request thread is its CPU time
/// but for a rare preemption, and costs 20 ns to read instead of a system
/// call's 400. It boxes the future it times, so that it can be polled in
/// place and then handed to another thread as it is.
pub struct Metered<F> {
    inner: Pin<Box<F>>,
    meter: Arc<Meter>,
    note: Arc<NoteWake>,
    waker: Waker,
    /// When the last poll returned pending on something the call asked for.
    waiting_since: Option<Instant>,
}

impl<F: Future> Metered<F> {
    /// `meter` gathers the cost, also while the future is unfinished.
    pub fn new(inner: F, meter: Arc<Meter>) -> Metered<F> {
        let note = Arc::new(NoteWake {
            meter: meter.clone(),
            task: Mutex::new(None),
        });
        Metered {
            inner: Box::pin(inner),
            meter,
            waker: Waker::from(note.clone()),
            note,
            waiting_since: None,
        }
    }
}

impl<F: Future> Future for Metered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        let began = Instant::now();
        let woken = this.meter.begin_poll(began);
        if let Some(since) = this.waiting_since.take() {
            // Until the wake-up; what came after it was a wait for a core.
            let until = woken.unwrap_or(began).max(since);
            add(&this.meter.waited, until - since);
        }
        {
            let mut task = this.note.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut noted = Context::from_waker(&this.waker);
        let (poll, ran) = if ON_PLUGIN_THREAD.get() {
            let started = thread_cpu_time();
            let poll = this.inner.as_mut().poll(&mut noted);
            (poll, thread_cpu_time().saturating_sub(started))
        } else {
            let poll = this.inner.as_mut().poll(&mut noted);
            (poll, began.elapsed())
        };
        this.meter.end_poll(ran);
        if poll.is_pending() && !this.meter.paused.load(Ordering::Relaxed) {
            this.waiting_since = Some(Instant::now());
        }
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
    async fn a_metered_future_counts_its_work_and_its_own_waits() {
        let threads = PluginThreads::with_threads(1).expect("threads");
        for on_plugin_thread in [false, true] {
            let meter = if on_plugin_thread {
                threads.run(metered_work()).await.expect("ran")
            } else {
                metered_work().await
            };
            // Far from the sleep's 200 ms: on a busy machine the 20 ms of
            // work may take longer on the wall clock, which the request
            // threads count.
            let (ran, waited) = (meter.ran(), meter.waited());
            assert!(
                ran >= Duration::from_millis(15) && ran < Duration::from_millis(150),
                "ran {ran:?} (on a plugin thread: {on_plugin_thread})"
            );
            // The sleep is a wait the call asked for: it holds its slot.
            assert!(
                waited >= Duration::from_millis(200),
                "waited {waited:?} (on a plugin thread: {on_plugin_thread})"
            );
        }
    }

    /// 200 ms asleep, then 20 ms of work (of this thread's CPU time, so that
    /// other processes on the machine cannot make it less): what a metered
    /// future counts of it.
    async fn metered_work() -> Arc<Meter> {
        let meter = Arc::new(Meter::default());
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
            meter.clone(),
        );
        work.await;
        meter
    }

    /// Polls `future` by hand: once, then, after `before_next` has run, again
    /// until it is done.
    fn poll_by_hand<F: Future>(future: F, before_next: impl FnOnce()) {
        let mut future = std::pin::pin!(future);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(future.as_mut().poll(&mut cx).is_pending(), "pends once");
        before_next();
        while future.as_mut().poll(&mut cx).is_pending() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Pending once, waking its task at once: runnable, waiting for a core.
    fn ready_again() -> impl Future<Output = ()> {
        let mut polled = false;
        std::future::poll_fn(move |cx| {
            if polled {
                return Poll::Ready(());
            }
            polled = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
    }

    #[test]
    fn waiting_for_a_core_after_a_wake_up_is_not_counted() {
        // Woken at once, polled again 100 ms later (a loaded machine, the
        // niced plugin threads): none of it is the call's.
        let meter = Arc::new(Meter::default());
        poll_by_hand(Metered::new(ready_again(), meter.clone()), || {
            std::thread::sleep(Duration::from_millis(100));
        });
        assert_eq!(meter.waited(), Duration::ZERO);

        // Woken by another thread 50 ms in, polled 200 ms after that: the
        // 50 ms are the call's (a query, a timer), the 200 ms are not.
        let meter = Arc::new(Meter::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let started = Instant::now();
        poll_by_hand(Metered::new(rx, meter.clone()), || {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let _ = tx.send(());
            })
            .join()
            .expect("sender");
            std::thread::sleep(Duration::from_millis(200));
        });
        let waited = meter.waited();
        assert!(waited >= Duration::from_millis(50), "{waited:?}");
        assert!(
            waited + Duration::from_millis(200) <= started.elapsed(),
            "{waited:?} of {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_pause_of_the_hubs_is_not_counted() {
        let meter = Arc::new(Meter::default());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let paused = meter.clone().pause(async {
            let _ = rx.await;
        });
        poll_by_hand(Metered::new(paused, meter.clone()), || {
            std::thread::sleep(Duration::from_millis(50));
            let _ = tx.send(());
        });
        assert_eq!(meter.waited(), Duration::ZERO);
    }
}
