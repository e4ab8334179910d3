//! Where every event is routed before it touches core state (inbound) or the
//! outbox (outbound): the matching routes' plugins run in order, each able to
//! change, drop or answer the event and to forward payloads. Edges and the
//! core never skip this step.

pub(crate) mod record;
pub(crate) mod shadow;
mod validate;
pub mod wiring;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::config::OnError;
use crate::event::Event;
use crate::pipeline::wiring::{Route, WiringHandle};
use crate::runtime::{Action, Forward, KvWrites, Outcome, Plugin, PluginError, PluginEvent};
use crate::store::outbox::enqueue;
use crate::store::{NewDelivery, Store, StoreError};
use record::{Call, Recorder};
use shadow::{Decision, Job};

pub use validate::{AutoReply, action as check_action, auto_reply};

/// Kinds of the hub's own reports on forwards; what plugins do with them may
/// not forward again, or a forward could feed itself.
const FORWARD_PREFIX: &str = "forward.";

/// What the chain decided for an event.
#[derive(Debug)]
pub enum Verdict {
    /// Go on with the (possibly changed) event.
    Continue,
    /// Stop here; the reason is logged.
    Drop(String),
    /// A plugin answered on the hub's behalf; the JSON is checked for the kind.
    Reply(Value),
    /// A plugin failed on a route with `on_error = "reject"`.
    Reject(String),
}

/// The event after its chain, with the forwards its plugins asked for.
#[derive(Debug)]
pub struct Routed {
    pub event: Event,
    pub verdict: Verdict,
    pub forwards: Vec<Forward>,
    /// Each plugin's key-value writes, applied with the event's change
    /// ([`record_effects`]); none when the event was refused.
    pub kv_writes: Vec<(Arc<str>, KvWrites)>,
    /// Whether a plugin replaced the payload: when not, the caller keeps the
    /// typed value it started from instead of parsing the JSON back.
    pub changed: bool,
}

pub struct Pipeline {
    wiring: WiringHandle,
    store: Store,
    /// Channel names by id, for routes that name channels; names never change.
    channel_names: Mutex<HashMap<i64, Arc<str>>>,
    /// Online agents by channel, read at most once per [`CONTEXT_TTL`]
    /// (agents of this hub going on- or offline clear it at once).
    online: Mutex<HashMap<i64, (Instant, i64)>>,
    recorder: Recorder,
}

/// What a chain did besides its result: each call for the outcome log,
/// and the shadow calls to make once the event is on its way.
#[derive(Default)]
struct Trace {
    calls: Vec<Call>,
    inbound: Option<String>,
    jobs: Vec<Job>,
    /// The wiring the chain ran on, and the indexes of its routes that
    /// took the event.
    wiring: Option<Arc<wiring::Wiring>>,
    taken: Vec<usize>,
    channel: Option<Arc<str>>,
    context: Option<Arc<Value>>,
}

/// How stale the context plugins see may be when another process (a second
/// hub on the same database) changed it.
const CONTEXT_TTL: Duration = Duration::from_secs(1);

/// Whether [`record_effects`] writes anything for these effects: a batch
/// whose jobs have none may end its transaction with its own last
/// statement (`TxConn::finish`).
pub fn has_effects(forwards: &[Forward], kv_writes: &[(Arc<str>, KvWrites)]) -> bool {
    !forwards.is_empty() || !kv_writes.is_empty()
}

/// Records what the plugins did besides deciding, in the caller's
/// transaction: the event's forwards are queued and their key-value writes
/// applied if and only if the event's own change is committed. `event` is the
/// routed event as the caller stores it (it may have learnt its chat since).
pub async fn record_effects(
    conn: &mut crate::store::Conn,
    event: &Event,
    forwards: &[Forward],
    kv_writes: &[(Arc<str>, KvWrites)],
    now: i64,
) -> Result<(), StoreError> {
    for (plugin, writes) in kv_writes {
        crate::store::kv::apply(conn, plugin, writes, now).await?;
    }
    for f in forwards {
        let delivery = NewDelivery::forward(
            event.id,
            &f.destination.name,
            f.destination.url.clone(),
            f.payload.to_string(),
            event.chat_id,
        );
        enqueue(conn, &delivery, now).await?;
    }
    Ok(())
}

/// Records a routed event that changed state and its plugins' effects, in
/// the transaction of the change.
pub async fn record_in(
    conn: &mut crate::store::Conn,
    routed: &Routed,
    now: i64,
) -> Result<(), StoreError> {
    crate::store::events::insert_event(conn, &routed.event).await?;
    record_effects(
        conn,
        &routed.event,
        &routed.forwards,
        &routed.kv_writes,
        now,
    )
    .await
}

impl Pipeline {
    pub fn new(wiring: WiringHandle, store: Store) -> Pipeline {
        Pipeline {
            wiring,
            recorder: Recorder::new(store.clone()),
            store,
            channel_names: Mutex::new(HashMap::new()),
            online: Mutex::new(HashMap::new()),
        }
    }

    /// Waits until the plugin outcomes recorded so far are written: before
    /// the database closes.
    pub async fn flush_records(&self) {
        self.recorder.flush().await;
    }

    /// Drops cached context, after a change this process made.
    pub fn forget_context(&self) {
        self.online
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Whether any route is configured, i.e. whether plugins may see events.
    pub fn has_routes(&self) -> bool {
        !self.wiring.current().routes.is_empty()
    }

    pub fn wiring(&self) -> &WiringHandle {
        &self.wiring
    }

    /// `[storage] keep_inbound_hours`, set once at start.
    pub fn keep_inbound(&self, hours: u64) {
        self.recorder.keep_inbound(hours);
    }

    pub async fn run(&self, event: Event) -> Routed {
        let mut trace = Trace::default();
        let routed = self.chain(event, &mut trace).await;
        self.after(&routed, trace);
        let verdict = match routed.verdict {
            Verdict::Continue if routed.changed => crate::obs::Verdict::Transformed,
            Verdict::Continue => crate::obs::Verdict::Passed,
            Verdict::Drop(_) => crate::obs::Verdict::Dropped,
            Verdict::Reply(_) => crate::obs::Verdict::Replied,
            Verdict::Reject(_) => crate::obs::Verdict::Rejected,
        };
        crate::obs::event(routed.event.kind.as_str(), verdict);
        routed
    }

    /// Records the chain's calls and starts its shadows, off the request's path.
    fn after(&self, routed: &Routed, mut trace: Trace) {
        let routes = trace.wiring.as_ref().map_or(&[][..], |w| &w.routes[..]);
        for &i in &trace.taken {
            let Some(route) = routes.get(i) else {
                continue;
            };
            for s in route.shadows.iter().filter(|s| s.pairs.is_none()) {
                let live = match &routed.verdict {
                    Verdict::Continue => Decision::Continue(None),
                    Verdict::Drop(r) => Decision::Drop(r.clone()),
                    Verdict::Reply(r) => Decision::Reply(r.clone()),
                    Verdict::Reject(_) => Decision::Failed("rejected"),
                };
                trace.jobs.push(Job {
                    route: route_label(i),
                    shadow: s.plugin.clone(),
                    input: routed.event.clone(),
                    live,
                });
            }
        }
        self.recorder
            .record(routed.event.id.to_string(), trace.calls, trace.inbound);
        if !trace.jobs.is_empty() {
            let context = trace.context.unwrap_or_default();
            self.wiring
                .shadows()
                .start(trace.jobs, trace.channel, context);
        }
    }

    async fn chain(&self, event: Event, trace: &mut Trace) -> Routed {
        let wiring = self.wiring.current();
        let mut routed = Routed {
            event,
            verdict: Verdict::Continue,
            forwards: Vec::new(),
            kv_writes: Vec::new(),
            changed: false,
        };
        if wiring.routes.is_empty() {
            return routed;
        }
        let channel = self.channel_name(routed.event.channel_id).await;
        let taken: Vec<(usize, &Route)> = wiring
            .routes
            .iter()
            .enumerate()
            .filter(|(_, r)| r.takes(routed.event.kind.as_str(), channel.as_deref()))
            .collect();
        trace.taken = taken.iter().map(|(i, _)| *i).collect();
        if taken.iter().any(|(_, r)| !r.shadows.is_empty()) {
            trace.wiring = Some(wiring.clone());
        }
        // A plugin that did not load fails every call: a rejecting route refuses.
        if let Some(name) = taken
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.on_error == OnError::Reject)
            .find_map(|r| r.missing.first())
        {
            routed.verdict = Verdict::Reject(format!("plugin `{name}` is not loaded"));
            return routed;
        }
        let chain: Vec<(usize, &Route, &Arc<Plugin>)> = taken
            .iter()
            .flat_map(|(i, r)| r.plugins.iter().map(move |p| (*i, *r, p)))
            .collect();
        let shadowed = taken.iter().any(|(_, r)| !r.shadows.is_empty());
        if chain.is_empty() && !shadowed {
            return routed;
        }
        let context = self.context(&routed.event).await;
        if shadowed {
            trace.channel = channel.clone();
            trace.context = Some(Arc::new(context.clone()));
        }
        if self.recorder.keeps_inbound() && routed.event.direction == crate::event::Direction::In {
            trace.inbound = Some(routed.event.payload.to_string());
        }
        let may_forward = !routed.event.kind.as_str().starts_with(FORWARD_PREFIX);
        for (route_index, route, plugin) in chain {
            let input = PluginEvent {
                event: &routed.event,
                channel: channel.as_deref(),
                context: &context,
            };
            let kind = routed.event.kind.clone();
            let check = move |action: &mut Action| validate::action(&kind, action);
            // A shadow paired with this plugin sees what it saw.
            let before = route
                .shadows
                .iter()
                .any(|s| s.pairs.as_deref() == Some(plugin.name()))
                .then(|| routed.event.clone());
            let result = plugin.call(&input, &check).await;
            trace.calls.push(call_of(plugin, &result));
            if let Some(before) = before {
                let live = Decision::of(&result);
                for s in route
                    .shadows
                    .iter()
                    .filter(|s| s.pairs.as_deref() == Some(plugin.name()))
                {
                    trace.jobs.push(Job {
                        route: route_label(route_index),
                        shadow: s.plugin.clone(),
                        input: before.clone(),
                        live: live.clone(),
                    });
                }
            }
            let outcome = match result {
                Ok(o) => o,
                Err(e) => match route.on_error {
                    OnError::Skip => {
                        // The failure itself was logged by the call.
                        tracing::debug!(plugin = %e.plugin, kind = e.kind.as_str(), "plugin skipped");
                        continue;
                    }
                    OnError::Reject => {
                        routed.verdict = Verdict::Reject(e.to_string());
                        routed.forwards.clear();
                        routed.kv_writes.clear();
                        return routed;
                    }
                },
            };
            if !outcome.kv_writes.is_empty() {
                routed
                    .kv_writes
                    .push((plugin.name().into(), outcome.kv_writes));
            }
            if may_forward {
                routed.forwards.extend(outcome.forwards);
            } else if !outcome.forwards.is_empty() {
                tracing::warn!(
                    plugin = plugin.name(),
                    "forwards of a forward report are ignored"
                );
            }
            match outcome.action {
                Action::Continue(None) => {}
                Action::Continue(Some(payload)) => {
                    routed.event.payload = payload;
                    routed.changed = true;
                }
                Action::Drop(reason) => {
                    routed.verdict = Verdict::Drop(format!("{}: {reason}", plugin.name()));
                    return routed;
                }
                Action::Reply(reply) => {
                    routed.verdict = Verdict::Reply(reply);
                    return routed;
                }
            }
        }
        routed
    }

    /// Calls the plugin `name` alone on `event`, outside any route (a
    /// plugin bot): its checked outcome, or why the call failed (also when
    /// the plugin is not loaded).
    pub async fn call_plugin(&self, name: &str, event: &Event) -> Result<Outcome, String> {
        let wiring = self.wiring.current();
        let plugin = wiring
            .plugins
            .get(name)
            .ok_or_else(|| format!("plugin `{name}` is not loaded"))?;
        let channel = self.channel_name(event.channel_id).await;
        let context = self.context(event).await;
        let input = PluginEvent {
            event,
            channel: channel.as_deref(),
            context: &context,
        };
        let kind = event.kind.clone();
        let check = move |action: &mut Action| validate::action(&kind, action);
        plugin.call(&input, &check).await.map_err(|e| e.to_string())
    }

    /// What plugins learn besides the payload.
    async fn context(&self, event: &Event) -> Value {
        let Some(channel_id) = event.channel_id else {
            return json!({});
        };
        let cached = self
            .online
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&channel_id)
            .filter(|(at, _)| at.elapsed() < CONTEXT_TTL)
            .map(|(_, n)| *n);
        if let Some(n) = cached {
            return json!({ "agents_online": n });
        }
        match self.store.channel_online_agents(channel_id).await {
            Ok(n) => {
                self.online
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(channel_id, (Instant::now(), n));
                json!({ "agents_online": n })
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot count online agents for plugin context");
                json!({})
            }
        }
    }

    async fn channel_name(&self, id: Option<i64>) -> Option<Arc<str>> {
        let id = id?;
        if let Some(name) = self.names().get(&id) {
            return Some(name.clone());
        }
        match self.store.channel_by_id(id).await {
            Ok(Some(channel)) => {
                let name: Arc<str> = channel.name.into();
                self.names().insert(id, name.clone());
                Some(name)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a channel name for routing");
                None
            }
        }
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Arc<str>>> {
        self.channel_names.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How routes are named in metrics and the admin API: their place in `hub.toml`.
pub fn route_label(index: usize) -> String {
    format!("routes[{index}]")
}

/// One call as the outcome log keeps it.
fn call_of(plugin: &Plugin, result: &Result<Outcome, PluginError>) -> Call {
    let (verdict, payload_hash, forwards, error_kind) = match result {
        Ok(o) => {
            let (verdict, hash) = match &o.action {
                Action::Continue(None) => ("continue", None),
                Action::Continue(Some(p)) => ("changed", Some(record::payload_hash(p))),
                Action::Drop(_) => ("drop", None),
                Action::Reply(_) => ("reply", None),
            };
            (verdict, hash, o.forwards.len(), None)
        }
        Err(e) => ("failed", None, 0, Some(e.kind)),
    };
    Call {
        plugin: plugin.name().into(),
        verdict,
        payload_hash,
        forwards,
        error_kind,
    }
}
