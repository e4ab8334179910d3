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
}

impl PluginThreads {
    /// Runs `work` on a blocking thread of the plugin threads (at their
    /// priority); `false` if they are shut down.
    pub fn spawn_blocking(&self, work: impl FnOnce() + Send + 'static) -> bool {
        match &self.runtime {
            Some(runtime) => {
                runtime.spawn_blocking(work);
                true
            }
            None => false,
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

#[cfg(target_os = "linux")]
#[allow(
    unsafe_code,
    reason = "setpriority on the calling thread: no memory is passed or kept"
)]
fn lower_priority() {
    // On Linux a thread's niceness is its own: `who = 0` with PRIO_PROCESS
    // names the calling thread only. Failing leaves the thread at the hub's
    // priority, which is still correct, only less protective.
    unsafe {
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, (now + NICENESS).min(19));
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

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
}
