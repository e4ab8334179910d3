//! One loaded plugin: its pre-instantiated component, grants and limits, and
//! a call: fresh store, deadline, memory cap, then the outcome checked
//! against what the plugin may do.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;
use wasmtime::UpdateDeadline;

use super::bindings::{self, HandlerPre, Needs};
use super::deadline::Deadline;
use super::host::HostState;
use super::sanitize::{MAX_MESSAGE_BYTES, one_line};
use super::scope::{KvQuota, Limits, LogWindow, PluginScope, Services};
use super::share::TimeShare;
use super::threads::{Meter, Metered};
use super::{ErrorKind, LoadError, Origin, PluginCounters, PluginError, Runtime, engine};
use crate::config::PluginConfig;
use crate::event::{Direction, Event};
use crate::runtime::destinations::Destination;

pub struct Plugin {
    /// What its calls' host imports reach (name, config, limits, grants,
    /// key-value quota, log allowance).
    scope: Arc<PluginScope>,
    /// Content hash of the `.wasm`: a reload keeps plugins whose hash is unchanged.
    digest: String,
    /// Calls of this plugin that may run past their first epoch tick at
    /// once (`max_concurrency`); ordinary calls, done within a tick, never
    /// wait for one.
    running: Arc<Semaphore>,
    /// Call time per channel (`time_share`).
    share: TimeShare,
    runtime: Runtime,
    pre: HandlerPre<HostState>,
    counters: Arc<PluginCounters>,
}

/// Charges a call's cost to its channel's share when the call ends, however
/// it ends: the time it spent on the request thread before and after it ran,
/// and what its [`Meter`] gathered while it ran (its polls, and its waits
/// for what it asked for). Waiting for a core, the trips to and from the
/// plugin threads and the hub's own pauses are not the channel's doing.
struct Charge<'a> {
    share: &'a TimeShare,
    channel: Option<i64>,
    meter: Arc<Meter>,
    /// Time on the request thread so far, outside the metered run.
    outside: Duration,
    /// Since when the call is on the request thread again (`None` while
    /// the metered run is under way).
    since: Option<Instant>,
}

impl Charge<'_> {
    /// The metered run starts: what came before it is counted.
    fn run(&mut self) {
        if let Some(since) = self.since.take() {
            self.outside += since.elapsed();
        }
    }

    /// The metered run's result is back on the request thread.
    fn back(&mut self) {
        self.since = Some(Instant::now());
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        let ran = self.meter.ran();
        let outside = self.outside + self.since.map_or(Duration::ZERO, |s| s.elapsed());
        self.share
            .call_ended(self.channel, outside + ran + self.meter.waited(), ran);
    }
}

/// The event as a plugin sees it, with the hub's context.
pub struct PluginEvent<'a> {
    pub event: &'a Event,
    pub channel: Option<&'a str>,
    pub context: &'a Value,
}

/// What a plugin decided, parsed and checked.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub action: Action,
    pub forwards: Vec<Forward>,
    /// The call's key-value writes (`None` deletes), for the caller to apply
    /// in the transaction of the event they belong to.
    pub kv_writes: KvWrites,
}

/// Key-value writes of one call: key → new value, or `None` to delete.
pub type KvWrites = std::collections::BTreeMap<String, Option<String>>;

#[derive(Debug, Clone)]
pub enum Action {
    Continue(Option<Value>),
    Drop(String),
    Reply(Value),
}

#[derive(Debug, Clone)]
pub struct Forward {
    pub destination: Arc<Destination>,
    pub payload: Value,
}

impl Plugin {
    /// Reads, compiles (or takes from the cache) and type-checks a plugin.
    pub fn load(
        runtime: &Runtime,
        config: &PluginConfig,
        path: &Path,
        services: Services,
    ) -> Result<(Plugin, Origin), LoadError> {
        let wasm = std::fs::read(path).map_err(|source| match super::unbuilt_project(path) {
            Some(hint) => LoadError::Unbuilt {
                name: config.name.clone(),
                path: path.to_owned(),
                hint,
            },
            None => LoadError::Read {
                name: config.name.clone(),
                path: path.to_owned(),
                source,
            },
        })?;
        if let Some(message) = not_a_component(&wasm) {
            return Err(LoadError::Compile {
                name: config.name.clone(),
                path: path.to_owned(),
                message,
            });
        }
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&wasm));
        let (component, origin) = runtime
            .inner
            .cache
            .load(&runtime.inner.engine, &wasm)
            .map_err(|e| LoadError::Compile {
                name: config.name.clone(),
                path: path.to_owned(),
                message: format!("{e:#}"),
            })?;
        let world = |e: wasmtime::Error| LoadError::World {
            name: config.name.clone(),
            path: path.to_owned(),
            message: format!(
                "{e:#} (this hub offers {WORLD}; rebuild the plugin against its plugin-api)"
            ),
        };
        let pre = runtime
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(world)?;
        let pre = HandlerPre::new(pre).map_err(world)?;
        let config_json = serde_json::to_string(&config.config).unwrap_or_else(|_| "{}".to_owned());
        let grants = config
            .destinations
            .iter()
            .filter_map(|d| services.destinations.get(d).map(|t| (d.clone(), t.clone())))
            .collect();
        let scope = PluginScope {
            name: config.name.clone(),
            config_json,
            limits: Limits {
                timeout: Duration::from_millis(config.timeout_ms),
                memory_bytes: (config.memory_mb as usize) << 20,
                max_output_bytes: config.max_output_bytes,
                max_host_calls: config.max_host_calls,
                max_forwards: config.max_forwards,
                max_concurrency: config.max_concurrency.max(1) as usize,
                time_share: config.time_share,
            },
            kv: config.kv,
            kv_quota: KvQuota {
                max_keys: config.kv_max_keys,
                max_bytes: config.kv_max_bytes,
                writes_per_call: config.kv_max_writes_per_call,
                bytes_per_call: config.kv_max_bytes_per_call,
            },
            kv_usage: tokio::sync::Mutex::new(None),
            log_window: std::sync::Mutex::new(LogWindow::default()),
            grants,
            services,
            memory: runtime.memory_budget().clone(),
        };
        let plugin = Plugin {
            scope: Arc::new(scope),
            digest,
            running: Arc::new(Semaphore::new(config.max_concurrency.max(1) as usize)),
            share: TimeShare::new(config.time_share),
            runtime: runtime.clone(),
            pre,
            counters: runtime.counters().of(&config.name),
        };
        Ok((plugin, origin))
    }

    pub fn name(&self) -> &str {
        self.scope.name()
    }
    pub fn digest(&self) -> &str {
        &self.digest
    }
    pub fn limits(&self) -> &Limits {
        self.scope.limits()
    }
    pub fn kv_enabled(&self) -> bool {
        self.scope.kv_enabled()
    }
    pub fn services(&self) -> &Services {
        self.scope.services()
    }
    pub fn counters(&self) -> &PluginCounters {
        &self.counters
    }

    /// Runs the plugin on one event. Whatever the guest does, the result is
    /// an outcome or an error, within the plugin's limits. `check` holds the
    /// action to the event kind's rules (and may normalise it); an action it
    /// refuses fails the call like any other invalid output, before the
    /// call's key-value writes are applied.
    pub async fn call(
        self: &Arc<Self>,
        input: &PluginEvent<'_>,
        check: &(dyn Fn(&mut Action) -> Result<(), String> + Sync),
    ) -> Result<Outcome, PluginError> {
        let started = Instant::now();
        let result = self.call_inner(input, check).await;
        self.counters.call(started.elapsed());
        match &result {
            Ok(outcome) => {
                match outcome.action {
                    Action::Drop(_) => self.counters.drop_(),
                    Action::Reply(_) => self.counters.reply(),
                    Action::Continue(_) => {}
                }
                self.counters.forwards(outcome.forwards.len());
            }
            Err(e) => {
                self.counters
                    .failure(e.kind, &input.event.id.to_string(), &e.message);
                tracing::warn!(plugin = %self.scope.name(), event = %input.event.id, kind = e.kind.as_str(), error = %e.message, "plugin call failed");
            }
        }
        result
    }

    async fn call_inner(
        self: &Arc<Self>,
        input: &PluginEvent<'_>,
        check: &(dyn Fn(&mut Action) -> Result<(), String> + Sync),
    ) -> Result<Outcome, PluginError> {
        let channel = input.event.channel_id;
        let heavy = self.admit(channel).await?;
        let (done, deadline) = self.run_sandboxed(input, channel, heavy).await?;
        self.settle(input, done, &deadline, check).await
    }

    /// Waits out the channel's time share. Over it, the channel's call waits
    /// rather than fails at once: a client that floods is slowed down with
    /// it, instead of coming back sooner with the next request. Whether the
    /// channel's calls are heavy (start them on the plugin threads).
    async fn admit(&self, channel: Option<i64>) -> Result<bool, PluginError> {
        let admission = self.share.admit(channel);
        let wait = admission.wait;
        if !wait.is_zero() {
            tokio::time::sleep(wait.min(self.scope.limits.timeout)).await;
            if wait > self.scope.limits.timeout {
                return Err(self.error(
                    ErrorKind::Busy,
                    format!(
                        "this channel's events used up the plugin's time share ({} s of calls \
                         per second) for longer than its {} ms",
                        self.share.per_sec(),
                        self.scope.limits.timeout.as_millis()
                    ),
                ));
            }
        }
        Ok(admission.heavy)
    }

    /// Instantiates and calls the plugin in a fresh sandbox, within its
    /// deadline, inline or on the plugin threads; the sandbox, what the
    /// call returned (`None`: the deadline ended it) and when it was
    /// instantiated, with the deadline that bounded it.
    async fn run_sandboxed(
        self: &Arc<Self>,
        input: &PluginEvent<'_>,
        channel: Option<i64>,
        heavy: bool,
    ) -> Result<(Done, Arc<Deadline>), PluginError> {
        let slot = self
            .runtime
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| self.error(ErrorKind::Instantiate, "the plugin runtime is closed"))?;
        // The deadline starts once the call has a slot: waiting is not running.
        let deadline = Arc::new(Deadline::new(self.scope.limits.timeout));
        // Charged however the call ends.
        let meter = Arc::new(Meter::default());
        let mut charge = Charge {
            share: &self.share,
            channel,
            meter: meter.clone(),
            outside: Duration::ZERO,
            since: Some(Instant::now()),
        };
        let long = Arc::new(AtomicBool::new(false));
        let store = Sandbox {
            store: Some(self.sandbox(
                input.event.id.to_string(),
                deadline.clone(),
                long.clone(),
                meter.clone(),
            )),
            slot: Some(slot),
            charge_to: Some((self.clone(), channel)),
        };

        let event = wit_event(input);
        let started = Instant::now();
        let bound = deadline.clone();
        let pre = self.pre.clone();
        // Owns its store, so that it can move to the plugin threads.
        let run = async move {
            let mut store = store;
            let mut instantiated = Duration::ZERO;
            let run = async {
                let instance = pre
                    .instantiate_async(&mut *store)
                    .await
                    .map_err(Failure::Instantiate)?;
                instantiated = started.elapsed();
                instance
                    .call_handle(&mut *store, &event)
                    .await
                    .map_err(Failure::Call)
            };
            // The epoch deadline stops guest code; this one also bounds host calls.
            let result = bound.bound(run).await;
            Done {
                store,
                result,
                instantiated,
                called: started.elapsed(),
            }
        };
        // Polled here until it has run through an epoch tick; a call still
        // running then goes on on the plugin threads, and this request
        // thread is free. A channel whose calls are heavy starts them there.
        let mut run = Metered::new(run, meter);
        charge.run();
        let inline = if heavy {
            None
        } else {
            std::future::poll_fn(|cx| match std::pin::Pin::new(&mut run).poll(cx) {
                Poll::Ready(done) => Poll::Ready(Some(done)),
                Poll::Pending if long.load(Ordering::Relaxed) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            })
            .await
        };
        let done = match inline {
            Some(done) => done,
            None => self.runtime.inner.threads.run(run).await.ok_or_else(|| {
                self.error(ErrorKind::Instantiate, "the plugin runtime is closed")
            })?,
        };
        charge.back();
        Ok((done, deadline))
    }

    /// What a finished run comes to: the guest's logs and counters
    /// recorded, a failure classified, an outcome checked (by the plugin's
    /// rules, then the event kind's `check`) with its key-value writes.
    async fn settle(
        &self,
        input: &PluginEvent<'_>,
        done: Done,
        deadline: &Deadline,
        check: &(dyn Fn(&mut Action) -> Result<(), String> + Sync),
    ) -> Result<Outcome, PluginError> {
        let Done {
            mut store,
            result,
            instantiated,
            called,
        } = done;
        let state = store.data_mut();
        let (out_bytes, out_dropped) = self.scope.log_stdio("stdout", &state.stdout.contents());
        let (err_bytes, err_dropped) = self.scope.log_stdio("stderr", &state.stderr.contents());
        let dropped = state.logs_dropped + out_dropped + err_dropped;
        if dropped > 0 {
            self.scope
                .warn_dropped(dropped, &input.event.id.to_string());
        }
        self.counters
            .log_bytes(state.log_bytes + out_bytes + err_bytes, dropped);
        self.counters.quota_refusals(state.quota_refusals);
        let answer = match result {
            None if state.turn.waiting() => {
                return Err(self.error(
                    ErrorKind::Busy,
                    format!(
                        "ran past a tick and waited for a turn: {} long calls of this plugin \
                         were running for all of its {} ms (max_concurrency)",
                        self.running_limit(),
                        self.scope.limits.timeout.as_millis()
                    ),
                ));
            }
            None => {
                return Err(self.error(
                    ErrorKind::Timeout,
                    format!(
                        "no answer within {} ms{}",
                        self.scope.limits.timeout.as_millis(),
                        database_wait(deadline)
                    ),
                ));
            }
            Some(Err(Failure::Instantiate(e))) => return Err(self.instantiate_failure(&e)),
            Some(Err(Failure::Call(e))) => return Err(self.classify(state, &e)),
            Some(Ok(answer)) => answer,
        };
        let mut outcome = match answer {
            Ok(outcome) => self.check(outcome)?,
            Err(message) => return Err(self.error(ErrorKind::Failed, message)),
        };
        check(&mut outcome.action).map_err(|e| self.error(ErrorKind::InvalidOutput, e))?;
        outcome.kv_writes = std::mem::take(&mut state.kv_writes);
        self.scope.note_kv_writes(&outcome.kv_writes).await;
        let guest = called.saturating_sub(instantiated);
        let teardown = Instant::now();
        drop(store);
        self.counters
            .phases(instantiated, guest, teardown.elapsed());
        Ok(outcome)
    }

    /// A fresh store for one call that must end by `deadline`, polled
    /// through a [`Metered`] of `meter`.
    fn sandbox(
        self: &Arc<Self>,
        label: String,
        deadline: Arc<Deadline>,
        long: Arc<AtomicBool>,
        meter: Arc<Meter>,
    ) -> wasmtime::Store<HostState> {
        let awake = self.runtime.inner.ticker.awake();
        let state = HostState::new(self.scope.clone(), label, deadline.clone(), awake);
        let mut store = wasmtime::Store::new(&self.runtime.inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the guest hands the hub in one go (its answer, a host call's
        // arguments) is measured before it is copied: past this many bytes it
        // is refused without the hub allocating it.
        store.set_hostcall_fuel(self.hostcall_fuel());
        // Guest code gives the thread back at every epoch tick it ran
        // through, so a busy loop shares the request threads instead of
        // holding one until its deadline; past the deadline the next tick
        // stops it. Ordinary calls take microseconds; one that has run a
        // whole tick is a long call: it moves to the plugin threads, then
        // at its next tick waits for one of the plugin's `max_concurrency`
        // turns (held to its end), then pauses a tick between slices, so
        // long calls of a plugin get at most half a core each and a few of
        // them at once, and leave the machine to everyone else.
        store.set_epoch_deadline(1);
        let turns = self.running.clone();
        let mut ticks = 0u32;
        store.epoch_deadline_callback(move |ctx| {
            let now = Instant::now();
            if now >= deadline.at() {
                return Ok(UpdateDeadline::Interrupt);
            }
            // The epoch also passes while the call is not running: before
            // its first instruction (a microseconds-long call that started
            // just before a tick), while it waits for a core, for a host
            // call or in a pause. Only a tick it ran through counts: an
            // ordinary call is not taken for a long one for when it started
            // or how long it waited.
            if meter.polled_for(now) < engine::EPOCH_TICK {
                return Ok(UpdateDeadline::Continue(1));
            }
            ticks = ticks.saturating_add(1);
            let pause: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match ticks {
                1 => {
                    // The caller sees this and moves the call.
                    long.store(true, Ordering::Relaxed);
                    Box::pin(meter.clone().pause(tokio::task::yield_now()))
                }
                2 => Box::pin(
                    meter
                        .clone()
                        .pause(ctx.data().turn.clone().take(turns.clone())),
                ),
                _ => Box::pin(meter.clone().pause(tokio::time::sleep(engine::EPOCH_TICK))),
            };
            Ok(UpdateDeadline::YieldCustom(1, pause))
        });
        store
    }

    /// Runs the plugin's `validate-config` export on its config table, if
    /// the component has one (plugins built before it existed are not checked),
    /// then asks its `needs-for` what it needs granted with that config (a
    /// component without it needs nothing). An `Err` carries the plugin's own
    /// message, which names the key.
    pub async fn validate_config(self: &Arc<Self>) -> Result<Needs, PluginError> {
        let _slot = self
            .runtime
            .inner
            .slots
            .acquire()
            .await
            .map_err(|_| self.error(ErrorKind::Instantiate, "the plugin runtime is closed"))?;
        let deadline = Arc::new(Deadline::new(self.scope.limits.timeout));
        let meter = Arc::new(Meter::default());
        let mut store = self.sandbox(
            "validate-config".to_owned(),
            deadline.clone(),
            Arc::new(AtomicBool::new(false)),
            meter.clone(),
        );
        // Which export ran out of time or trapped, for the message.
        let asking_needs = AtomicBool::new(false);
        // Metered so that its epoch ticks count as a call's do.
        let run = Metered::new(
            async {
                let instance = self
                    .pre
                    .instance_pre()
                    .instantiate_async(&mut store)
                    .await
                    .map_err(Failure::Instantiate)?;
                if let Ok(validate) = instance.get_typed_func::<(String,), (Result<(), String>,)>(
                    &mut store,
                    "validate-config",
                ) {
                    let (verdict,) = validate
                        .call_async(&mut store, (self.scope.config_json().to_owned(),))
                        .await
                        .map_err(Failure::Call)?;
                    if let Err(message) = verdict {
                        return Ok(Err(message));
                    }
                }
                if instance.get_func(&mut store, "needs-for").is_none() {
                    return Ok(Ok(Needs {
                        kv: false,
                        destinations: Vec::new(),
                    }));
                }
                asking_needs.store(true, Ordering::Relaxed);
                let needs_for = instance
                    .get_typed_func::<(String,), (Result<Needs, String>,)>(&mut store, "needs-for")
                    .map_err(|e| {
                        Failure::Instantiate(e.context(format!(
                            "needs-for does not fit {WORLD} (rebuild the plugin against this hub's plugin-api)"
                        )))
                    })?;
                let (needs,) = needs_for
                    .call_async(&mut store, (self.scope.config_json().to_owned(),))
                    .await
                    .map_err(Failure::Call)?;
                Ok(needs.map_err(|e| format!("needs-for: {e}")))
            },
            meter,
        );
        let result = deadline.bound(run).await;
        let export = if asking_needs.load(Ordering::Relaxed) {
            "needs-for"
        } else {
            "validate-config"
        };
        match result {
            None => Err(self.error(
                ErrorKind::Timeout,
                format!(
                    "{export}: no answer within {} ms",
                    self.scope.limits.timeout.as_millis()
                ),
            )),
            Some(Err(Failure::Instantiate(e))) => Err(self.instantiate_failure(&e)),
            Some(Err(Failure::Call(e))) => {
                let mut e = self.classify(store.data(), &e);
                e.message = format!("{export}: {}", e.message);
                Err(e)
            }
            Some(Ok(Err(message))) => Err(self.error(ErrorKind::Failed, message)),
            Some(Ok(Ok(needs))) => self.check_needs(needs),
        }
    }

    /// Holds what a plugin says it needs to what a `hub.toml` could grant:
    /// the names go into problems and logs, so a name no destination can
    /// have is refused here, not quoted.
    fn check_needs(&self, needs: Needs) -> Result<Needs, PluginError> {
        if needs.destinations.len() > MAX_NEEDED_DESTINATIONS {
            return Err(self.error(
                ErrorKind::InvalidOutput,
                format!(
                    "needs-for: {} destinations needed, more than {MAX_NEEDED_DESTINATIONS}",
                    needs.destinations.len()
                ),
            ));
        }
        if let Some(bad) = needs
            .destinations
            .iter()
            .find(|d| d.len() > MAX_NAME_BYTES || !crate::config::is_name(d))
        {
            return Err(self.error(
                ErrorKind::InvalidOutput,
                format!(
                    "needs-for: `{}` is not a destination name (up to {MAX_NAME_BYTES} letters, \
                     digits, `-` or `_`)",
                    one_line(bad, 64)
                ),
            ));
        }
        Ok(needs)
    }

    /// What an instantiation that failed comes to. A start function still
    /// running at the deadline ran out of time like any guest code: a
    /// timeout, not a broken plugin.
    fn instantiate_failure(&self, e: &wasmtime::Error) -> PluginError {
        if is_interrupt(e) {
            return self.error(
                ErrorKind::Timeout,
                format!(
                    "still starting after {} ms",
                    self.scope.limits.timeout.as_millis()
                ),
            );
        }
        self.error(ErrorKind::Instantiate, format!("{e:#}"))
    }

    /// Names what stopped the guest: a host import's own reason, the memory
    /// cap, the deadline, or a plain trap.
    fn classify(&self, state: &HostState, e: &wasmtime::Error) -> PluginError {
        if let Some((kind, message)) = &state.failure {
            return self.error(*kind, message.clone());
        }
        // wasmtime's own error for data past the store's hostcall fuel.
        if e.chain()
            .any(|cause| cause.to_string().contains("fuel allocated for hostcalls"))
        {
            return self.error(
                ErrorKind::OutputTooLarge,
                format!(
                    "more than {} bytes handed to the hub at once (an answer over \
                     max_output_bytes = {}, or a host call's arguments), refused before \
                     it was copied",
                    self.hostcall_fuel(),
                    self.scope.limits.max_output_bytes
                ),
            );
        }
        if state.limiter.budget_spent {
            return self.error(
                ErrorKind::Memory,
                format!(
                    "the plugins' memory budget ([runtime] max_memory_mb = {}) is in use by other calls",
                    self.runtime.memory_budget().limit() >> 20
                ),
            );
        }
        if state.limiter.exceeded {
            return self.error(
                ErrorKind::Memory,
                format!(
                    "more than {} MiB of memory requested",
                    self.scope.limits.memory_bytes >> 20
                ),
            );
        }
        if is_interrupt(e) {
            return self.error(
                ErrorKind::Timeout,
                format!(
                    "still running after {} ms",
                    self.scope.limits.timeout.as_millis()
                ),
            );
        }
        // One line: what trapped and where; the whole backtrace at debug level.
        tracing::debug!(plugin = %self.scope.name(), backtrace = %format!("{e:?}"), "plugin trap");
        self.error(ErrorKind::Trap, trap_summary(e))
    }

    /// Bytes the guest may hand the hub in one answer or host call: its
    /// output limit, with room for a key-value write and the list overhead of
    /// its forwards, so that only what would be refused anyway is refused
    /// here (sizes between the output limit and this one are refused by
    /// `check`, after the copy, as before).
    fn hostcall_fuel(&self) -> usize {
        const SLACK: usize = 64 * 1024;
        self.scope
            .limits
            .max_output_bytes
            .max(super::host::MAX_VALUE_BYTES + super::host::MAX_KEY_BYTES)
            .saturating_add(SLACK)
    }

    /// Parses the guest's outcome and holds it to the plugin's limits and grants.
    fn check(&self, outcome: bindings::Outcome) -> Result<Outcome, PluginError> {
        let size = match &outcome.action {
            bindings::Action::Continue(Some(p))
            | bindings::Action::Reply(p)
            | bindings::Action::Drop(p) => p.len(),
            bindings::Action::Continue(None) => 0,
        } + outcome
            .forwards
            .iter()
            .map(|f| f.payload.len() + f.destination.len())
            .sum::<usize>();
        if size > self.scope.limits.max_output_bytes {
            return Err(self.error(
                ErrorKind::OutputTooLarge,
                format!(
                    "{size} bytes of output, more than max_output_bytes = {}",
                    self.scope.limits.max_output_bytes
                ),
            ));
        }
        let json = |what: &str, text: &str| {
            serde_json::from_str::<Value>(text).map_err(|e| {
                self.error(ErrorKind::InvalidOutput, format!("{what} is not JSON: {e}"))
            })
        };
        let action = match outcome.action {
            bindings::Action::Continue(None) => Action::Continue(None),
            bindings::Action::Continue(Some(p)) => Action::Continue(Some(json("the payload", &p)?)),
            bindings::Action::Drop(reason) => Action::Drop(reason),
            bindings::Action::Reply(p) => Action::Reply(json("the reply", &p)?),
        };
        if outcome.forwards.len() > self.scope.limits.max_forwards {
            return Err(self.error(
                ErrorKind::Quota,
                format!(
                    "{} forwards in one call, more than max_forwards = {}",
                    outcome.forwards.len(),
                    self.scope.limits.max_forwards
                ),
            ));
        }
        let mut forwards = Vec::with_capacity(outcome.forwards.len());
        for f in outcome.forwards {
            let destination = self.scope.granted(&f.destination).ok_or_else(|| {
                self.error(
                    ErrorKind::Destination,
                    format!(
                        "destination `{}` is not granted to this plugin",
                        f.destination
                    ),
                )
            })?;
            forwards.push(Forward {
                destination,
                payload: json("a forward's payload", &f.payload)?,
            });
        }
        Ok(Outcome {
            action,
            forwards,
            kv_writes: KvWrites::new(),
        })
    }

    /// A failure of this plugin; its text (often the guest's own) is made
    /// one bounded log line here, once.
    pub fn error(&self, kind: ErrorKind, message: impl Into<String>) -> PluginError {
        PluginError {
            plugin: self.scope.name().to_owned(),
            kind,
            message: one_line(&message.into(), MAX_MESSAGE_BYTES),
        }
    }

    fn running_limit(&self) -> usize {
        self.scope.limits.max_concurrency
    }
}

enum Failure {
    Instantiate(wasmtime::Error),
    Call(wasmtime::Error),
}

/// A call's run: its sandbox, what the guest answered (`None` when the
/// deadline ended it), and when it was instantiated and done, from its start.
struct Done {
    store: Sandbox,
    result: Option<Result<Result<bindings::Outcome, String>, Failure>>,
    instantiated: Duration,
    called: Duration,
}

fn wit_event(input: &PluginEvent<'_>) -> bindings::Event {
    let e = input.event;
    bindings::Event {
        id: e.id.to_string(),
        kind: e.kind.as_str().to_owned(),
        direction: match e.direction {
            Direction::In => bindings::Direction::Inbound,
            Direction::Out => bindings::Direction::Outbound,
        },
        channel_id: e.channel_id,
        channel: input.channel.map(str::to_owned),
        chat_id: e.chat_id,
        payload: e.payload.to_string(),
        at: e.at,
        context: input.context.to_string(),
    }
}

/// A store that grew past this is dropped on a blocking thread: giving a
/// large linear memory back to the kernel takes milliseconds.
const OFFLOAD_DROP_BYTES: usize = 16 << 20;

/// One call's store and its slot in the instance pool, released together.
struct Sandbox {
    store: Option<wasmtime::Store<HostState>>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The plugin and channel whose time share pays for a drop done on
    /// another thread (an inline drop is inside the call's own charge).
    charge_to: Option<(Arc<Plugin>, Option<i64>)>,
}

impl std::ops::Deref for Sandbox {
    type Target = wasmtime::Store<HostState>;
    fn deref(&self) -> &Self::Target {
        // Present from construction until `drop`.
        self.store
            .as_ref()
            .expect("the store lives until the sandbox is dropped")
    }
}

impl std::ops::DerefMut for Sandbox {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.store
            .as_mut()
            .expect("the store lives until the sandbox is dropped")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let (Some(store), slot) = (self.store.take(), self.slot.take()) else {
            return;
        };
        // A memory-hungry call (a memory bomb) must not cost the request
        // thread the time to unmap what it grew: the plugin threads' blocking
        // pool does it, at their priority. The slot stays taken until the
        // store is really gone, so the pool is never over-committed.
        if store.data().limiter.held() > OFFLOAD_DROP_BYTES
            && let Some((plugin, channel)) = self.charge_to.take()
        {
            let threads = plugin.runtime.clone();
            threads.inner.threads.spawn_blocking(move || {
                let started = Instant::now();
                drop(store);
                drop(slot);
                // Unmapping what a call grew is work the call caused.
                plugin.share.spend(channel, started.elapsed());
            });
        }
    }
}

/// The WIT world this hub implements, as plugins name it.
pub const WORLD: &str = "hub:plugin/plugin@0.1.0";

/// Why `wasm` cannot be a plugin before compiling it, if that is plain from
/// its header (the compiler's own message for these is cryptic).
fn not_a_component(wasm: &[u8]) -> Option<String> {
    const MAGIC: &[u8] = b"\0asm";
    // Bytes 4..8: version 1 (core module) or the component encoding.
    const CORE_MODULE: &[u8] = &[1, 0, 0, 0];
    if !wasm.starts_with(MAGIC) {
        return Some(
            "not a WebAssembly component (build the plugin with \
             `cargo build --release --target wasm32-wasip2` and point `path` at the .wasm)"
                .to_owned(),
        );
    }
    if wasm.get(4..8) == Some(CORE_MODULE) {
        return Some(
            "a core WebAssembly module, not a component (build for the wasm32-wasip2 target, \
             which makes components)"
                .to_owned(),
        );
    }
    None
}

/// Destinations one plugin may say it needs, and the length of a name:
/// more is no plugin's real need, and each name goes into problem texts.
const MAX_NEEDED_DESTINATIONS: usize = 64;
const MAX_NAME_BYTES: usize = 128;

/// Whether `e` is the epoch deadline stopping guest code.
fn is_interrupt(e: &wasmtime::Error) -> bool {
    e.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::Interrupt)
}

/// A trap as one line: its message and the innermost named frame.
fn trap_summary(e: &wasmtime::Error) -> String {
    let what = match e.downcast_ref::<wasmtime::Trap>() {
        // A Rust guest's stack lives in its linear memory: running out of it
        // shows as an access below address 0.
        Some(wasmtime::Trap::MemoryOutOfBounds) => {
            "wasm trap: out of bounds memory access (a stack overflow, if the plugin recursed deeply)"
                .to_owned()
        }
        Some(wasmtime::Trap::StackOverflow) => "wasm trap: stack overflow".to_owned(),
        Some(trap) => trap.to_string(),
        None => e.root_cause().to_string(),
    };
    let frame = e.downcast_ref::<wasmtime::WasmBacktrace>().and_then(|bt| {
        bt.frames()
            .iter()
            .find_map(|f| f.func_name().map(str::to_owned))
    });
    match frame {
        Some(frame) => format!("{what} (in {frame})"),
        None => what,
    }
}

/// What a timeout's message adds when the call's database waits were left
/// out of its deadline: the call ran longer than `timeout_ms` by that much.
fn database_wait(deadline: &Deadline) -> String {
    let excused = deadline.excused();
    if excused.is_zero() {
        String::new()
    } else {
        format!(
            " (not counting {} ms waiting for the database)",
            excused.as_millis()
        )
    }
}
