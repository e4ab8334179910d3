//! `hub plugin replay`: a candidate plugin run on recorded events, each
//! outcome compared with what the live plugin did (as recorded in
//! `plugin_outcomes`, or the live plugin run again when nothing was
//! recorded). The hub's database is only read (`ReadOnlyLog`); the
//! candidate's key-value data is a scratch copy and its destinations are
//! stand-ins, as in `hub plugin test`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use super::stand_in::{StandIns, Target};
use super::{Scratch, TryoutError, runtime, stand_in_config};
use crate::config::{Config, PluginConfig};
use crate::event::Event;
use crate::outbound::HttpSender;
use crate::pipeline::record::payload_hash;
use crate::pipeline::shadow::{Compared, Decision, compare};
use crate::pipeline::wiring::glob_matches;
use crate::runtime::destinations::Destinations;
use crate::runtime::{Action, Outcome, Plugin, PluginError, PluginEvent, Runtime, Services};
use crate::store::outcomes::{LogFilter, ReadOnlyLog, Recorded};

/// Events read from the database at a time.
const PAGE: i64 = 500;

/// What to replay and how.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// A plugin of the configuration, or a `.wasm` file.
    pub plugin: String,
    pub plugin_config: Option<String>,
    /// The live plugin to compare with; default: the candidate's name.
    pub against: Option<String>,
    pub filter: LogFilter,
    /// A channel by name (resolved against the database).
    pub channel: Option<String>,
    pub limit: Option<u64>,
    /// Keep each differing event for the report.
    pub diff: bool,
}

/// One event where the candidate differs from live.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub event_id: String,
    pub kind: String,
    pub result: Compared,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// What live did: the recorded payload (or what stopped the event).
    pub live: Value,
    pub candidate: Value,
    /// Leaf by leaf: `{path, live, candidate}` (JSON pointers).
    pub changes: Vec<Value>,
}

/// The replay's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub candidate: String,
    pub against: String,
    pub seen: u64,
    pub same: u64,
    pub changed: u64,
    /// The candidate drops what live kept.
    pub dropped: u64,
    /// The candidate keeps what live dropped.
    pub kept: u64,
    /// Events the candidate answered (a reply).
    pub answered: u64,
    /// Forwards the candidate asked for (none is made).
    pub forwarded: u64,
    pub failed: BTreeMap<String, u64>,
    /// Compared with a recorded outcome, or with the live plugin run again.
    pub compared_with_recorded: u64,
    pub compared_with_rerun: u64,
    /// Events replayed on their inbound payload (kept before any plugin).
    pub on_inbound: u64,
    pub p50_micros: u64,
    pub p99_micros: u64,
    pub events_per_second: f64,
    pub seconds: f64,
    /// Stopped by Ctrl-C before the end.
    pub interrupted: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<Difference>,
}

/// A plugin loaded for the replay, with its stand-in destinations.
struct Loaded {
    plugin: Arc<Plugin>,
    _stand_ins: StandIns,
}

/// Runs the replay; `progress` is called now and then with (done, limit),
/// `stop` ends it early with the partial summary.
pub async fn replay(
    config: &Config,
    request: &Request,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, Option<u64>),
) -> Result<Summary, TryoutError> {
    let (candidate_config, path) =
        super::plugin_config(config, &request.plugin, request.plugin_config.as_deref())?;
    let against = request
        .against
        .clone()
        .unwrap_or_else(|| candidate_config.name.clone());
    let mut log = ReadOnlyLog::open(&config.storage.url)
        .await
        .map_err(|e| TryoutError::Setup(format!("the hub's database: {e}")))?;
    let result = replay_on(
        config,
        request,
        &mut log,
        (candidate_config, path),
        &against,
        stop,
        progress,
    )
    .await;
    log.close().await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn replay_on(
    config: &Config,
    request: &Request,
    log: &mut ReadOnlyLog,
    (candidate_config, path): (PluginConfig, PathBuf),
    against: &str,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(u64, Option<u64>),
) -> Result<Summary, TryoutError> {
    let db = |e: crate::store::StoreError| TryoutError::Setup(format!("the hub's database: {e}"));
    let channels: BTreeMap<i64, String> = log.channels().await.map_err(db)?.into_iter().collect();
    let mut filter = request.filter.clone();
    if let Some(name) = &request.channel {
        let id = channels
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| {
                TryoutError::Setup(format!("--channel: no channel is named `{name}`"))
            })?;
        filter.channel_id = Some(id);
    }
    // Which events live gives the plugin: those of the routes it is on (or
    // shadows); a plugin on no route is tried on every event.
    let globs: Vec<(Vec<String>, Vec<String>)> = config
        .routes
        .iter()
        .filter(|r| r.plugins.iter().chain(&r.shadow).any(|p| p == against))
        .map(|r| (r.events.clone(), r.channels.clone()))
        .collect();

    let scratch = Scratch::open().await?;
    let cache = match config.source {
        Some(_) => config.resolve(&config.runtime.cache_dir),
        None => scratch.cache_dir(),
    };
    let runtime = runtime(cache)?;
    let candidate = load(&runtime, &scratch, log, &candidate_config, &path).await?;
    if let Err(e) = candidate.plugin.validate_config().await {
        return Err(TryoutError::Plugin(format!("the config is refused: {e}")));
    }
    // The live plugin, loaded only if an event has no recorded outcome.
    let live_entry = config.plugins.iter().find(|p| p.name == against).cloned();
    let mut live: Option<Loaded> = None;

    let mut summary = Summary {
        candidate: candidate_config.name.clone(),
        against: against.to_owned(),
        ..Summary::default()
    };
    let mut micros: Vec<u64> = Vec::new();
    let started = Instant::now();
    let mut after: Option<String> = None;
    let context = Arc::new(json!({}));
    let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
    loop {
        let page = log
            .page(&filter, after.as_deref(), PAGE)
            .await
            .map_err(db)?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some(last.event.id.to_string());
        if stop.load(Ordering::Relaxed) {
            summary.interrupted = true;
            break;
        }
        // The events of this page the candidate gets, in order.
        let mut todo = Vec::new();
        for recorded in page {
            if request
                .limit
                .is_some_and(|l| summary.seen + todo.len() as u64 >= l)
            {
                break;
            }
            let channel = recorded
                .event
                .channel_id
                .and_then(|c| channels.get(&c))
                .cloned();
            if !globs.is_empty()
                && !globs.iter().any(|(events, chans)| {
                    (chans.is_empty() || channel.as_ref().is_some_and(|c| chans.contains(c)))
                        && events
                            .iter()
                            .any(|g| glob_matches(g, recorded.event.kind.as_str()))
                })
            {
                continue;
            }
            let (input, on_inbound) = input_of(&recorded, against);
            todo.push((recorded, Arc::new(input), on_inbound, channel));
        }
        let last_page = request
            .limit
            .is_some_and(|l| summary.seen + todo.len() as u64 >= l);
        // The calls run on every core, as the hub's own would; the
        // comparisons below take them in order.
        let calls = todo.iter().map(|(_, input, _, channel)| {
            let plugin = candidate.plugin.clone();
            let input = input.clone();
            let channel = channel.clone();
            let context = context.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let result = call(&plugin, &input, channel.as_deref(), &context).await;
                (
                    result,
                    u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
                )
            })
        });
        let results: Vec<_> = futures_util::stream::iter(calls)
            .buffered(parallel)
            .collect()
            .await;
        for ((recorded, input, on_inbound, channel), joined) in todo.into_iter().zip(results) {
            let (result, took) =
                joined.map_err(|e| TryoutError::Plugin(format!("a replayed call stopped: {e}")))?;
            micros.push(took);
            let recorded_live = recorded.outcomes.iter().find(|o| o.plugin == against);
            if let Ok(o) = &result {
                summary.forwarded += o.forwards.len() as u64;
                if matches!(o.action, Action::Reply(_)) {
                    summary.answered += 1;
                }
            }
            let decision = Decision::of(&result);
            let (compared, live_shown) = match recorded_live {
                Some(o) => {
                    summary.compared_with_recorded += 1;
                    let c = compare_recorded(
                        &decision,
                        &o.verdict,
                        o.payload_hash.as_deref(),
                        &input.payload,
                    );
                    let shown = match o.verdict.as_str() {
                        "drop" => json!({ "dropped": against }),
                        "reply" => json!({ "reply": "(not recorded)" }),
                        "failed" => json!({ "failed": o.error_kind }),
                        _ => recorded.event.payload.clone(),
                    };
                    (c, shown)
                }
                None => {
                    summary.compared_with_rerun += 1;
                    let live_decision = match &live_entry {
                        None => Decision::Continue(None),
                        Some(entry) => {
                            if live.is_none() {
                                let path = config.resolve(&entry.path);
                                live = Some(load(&runtime, &scratch, log, entry, &path).await?);
                            }
                            let Some(l) = &live else {
                                return Err(TryoutError::Setup(
                                    "the live plugin did not load".into(),
                                ));
                            };
                            Decision::of(
                                &call(&l.plugin, &input, channel.as_deref(), &context).await,
                            )
                        }
                    };
                    (
                        compare(&decision, &live_decision, &input.payload),
                        live_decision.shown(&input.payload),
                    )
                }
            };
            summary.seen += 1;
            if on_inbound {
                summary.on_inbound += 1;
            }
            match compared {
                Compared::Same => summary.same += 1,
                Compared::Changed => summary.changed += 1,
                Compared::Dropped => summary.dropped += 1,
                Compared::Kept => summary.kept += 1,
                Compared::Failed => {}
            }
            let error_kind = match &decision {
                Decision::Failed(k) => {
                    *summary.failed.entry((*k).to_owned()).or_default() += 1;
                    Some((*k).to_owned())
                }
                _ => None,
            };
            if request.diff && compared != Compared::Same {
                let shown = decision.shown(&input.payload);
                summary.differences.push(Difference {
                    event_id: input.id.to_string(),
                    kind: input.kind.to_string(),
                    result: compared,
                    error_kind,
                    changes: changes(&live_shown, &shown),
                    live: live_shown,
                    candidate: shown,
                });
            }
        }
        progress(summary.seen, request.limit);
        if last_page {
            break;
        }
    }
    let elapsed = started.elapsed();
    micros.sort_unstable();
    summary.p50_micros = percentile(&micros, 50);
    summary.p99_micros = percentile(&micros, 99);
    summary.seconds = elapsed.as_secs_f64();
    summary.events_per_second = if elapsed > Duration::ZERO {
        summary.seen as f64 / elapsed.as_secs_f64()
    } else {
        0.0
    };
    drop(candidate);
    drop(live);
    scratch.close().await;
    Ok(summary)
}

/// One call of `plugin` on `input`, its outcome checked as the hub checks it.
async fn call(
    plugin: &Arc<Plugin>,
    input: &Event,
    channel: Option<&str>,
    context: &Value,
) -> Result<Outcome, PluginError> {
    let kind = input.kind.clone();
    let check = move |action: &mut Action| crate::pipeline::check_action(&kind, action);
    let event = PluginEvent {
        event: input,
        channel,
        context,
    };
    plugin.call(&event, &check).await
}

/// The event the candidate gets: the payload as it entered, when it was
/// kept and the live plugin was first in its chain; otherwise as recorded.
fn input_of(recorded: &Recorded, against: &str) -> (Event, bool) {
    let mut event = recorded.event.clone();
    let head = recorded
        .outcomes
        .iter()
        .find(|o| o.plugin == against)
        .is_some_and(|o| o.position == 0);
    if head
        && let Some(inbound) = &recorded.inbound
        && let Ok(payload) = serde_json::from_str(inbound)
    {
        event.payload = payload;
        return (event, true);
    }
    (event, false)
}

/// Compares a candidate with a recorded outcome, which keeps the hash of a
/// changed payload, not the payload.
fn compare_recorded(
    candidate: &Decision,
    verdict: &str,
    hash: Option<&str>,
    input: &Value,
) -> Compared {
    match (candidate, verdict) {
        (Decision::Failed(_), _) => Compared::Failed,
        (Decision::Drop(_), "drop") => Compared::Same,
        (Decision::Drop(_), _) => Compared::Dropped,
        (_, "drop") => Compared::Kept,
        // The reply itself is not recorded: replying again counts as the same.
        (Decision::Reply(_), "reply") => Compared::Same,
        (Decision::Reply(_), _) | (Decision::Continue(_), "reply") => Compared::Changed,
        (Decision::Continue(p), v) => {
            let out = payload_hash(p.as_ref().unwrap_or(input));
            let live = match (v, hash) {
                ("changed", Some(h)) => h.to_owned(),
                _ => payload_hash(input),
            };
            if out == live {
                Compared::Same
            } else {
                Compared::Changed
            }
        }
    }
}

/// Loads `entry` against the scratch database (with a copy of its live
/// key-value data) and stand-ins for its destinations.
async fn load(
    runtime: &Runtime,
    scratch: &Scratch,
    log: &mut ReadOnlyLog,
    entry: &PluginConfig,
    path: &std::path::Path,
) -> Result<Loaded, TryoutError> {
    if entry.kv {
        let entries = log
            .kv_entries(&entry.name)
            .await
            .map_err(|e| TryoutError::Setup(format!("the hub's database: {e}")))?;
        scratch
            .store
            .kv_seed(&entry.name, &entries)
            .await
            .map_err(|e| TryoutError::Setup(format!("scratch database: {e}")))?;
    }
    let sender = HttpSender::new().map_err(|e| TryoutError::Setup(e.to_string()))?;
    let stand_ins = StandIns::start(sender.clone())
        .await
        .map_err(|e| TryoutError::Setup(format!("stand-in destinations: {e}")))?;
    let mut destinations = Vec::new();
    for name in &entry.destinations {
        let url = stand_ins.url(name, Target::Stub);
        destinations.push(stand_in_config(name, &url, super::STAND_IN_TIMEOUT_MS)?);
    }
    let services = Services {
        store: scratch.store.clone(),
        destinations: Arc::new(Destinations::from_config(&destinations)),
        sender,
        shadow: false,
    };
    let (plugin, _) = Plugin::load(runtime, entry, path, services)
        .map_err(|e| TryoutError::Setup(e.to_string()))?;
    Ok(Loaded {
        plugin: Arc::new(plugin),
        _stand_ins: stand_ins,
    })
}

fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)]
}

/// The leaves where two JSON values differ, as `{path, live, candidate}`.
pub fn changes(live: &Value, candidate: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    walk("", live, candidate, &mut out);
    out
}

fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<Value>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                walk(&p, v, y.get(k).unwrap_or(&Value::Null), out);
            }
            for (k, v) in y.iter().filter(|(k, _)| !x.contains_key(*k)) {
                let p = format!("{path}/{}", k.replace('~', "~0").replace('/', "~1"));
                walk(&p, &Value::Null, v, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                walk(&format!("{path}/{i}"), v, w, out);
            }
        }
        _ if a == b => {}
        _ => out.push(json!({ "path": path, "live": a, "candidate": b })),
    }
}

/// The summary as an operator reads it.
pub fn render(summary: &Summary) -> String {
    let mut text = format!(
        "replayed `{}` against `{}`: {} events{}\n  same {}  changed {}  dropped (live kept) {}  kept (live dropped) {}\n  answered {}  forwarded {}  failed {}\n",
        summary.candidate,
        summary.against,
        summary.seen,
        if summary.interrupted {
            " (interrupted: partial)"
        } else {
            ""
        },
        summary.same,
        summary.changed,
        summary.dropped,
        summary.kept,
        summary.answered,
        summary.forwarded,
        summary.failed.values().sum::<u64>(),
    );
    for (kind, n) in &summary.failed {
        text.push_str(&format!("    {kind}: {n}\n"));
    }
    text.push_str(&format!(
        "  compared with recorded outcomes {}, with the live plugin run again {}; on kept inbound payloads {}\n  time per call p50 {} µs  p99 {} µs; {:.0} events/s ({:.2} s)",
        summary.compared_with_recorded,
        summary.compared_with_rerun,
        summary.on_inbound,
        summary.p50_micros,
        summary.p99_micros,
        summary.events_per_second,
        summary.seconds,
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_listed_leaf_by_leaf() {
        let a = json!({"message": {"text": "mail a@b.c", "type": "text"}, "id": 1});
        let b = json!({"message": {"text": "mail [email]", "type": "text"}, "id": 1});
        assert_eq!(
            changes(&a, &b),
            vec![
                json!({"path": "/message/text", "live": "mail a@b.c", "candidate": "mail [email]"})
            ]
        );
        assert!(changes(&a, &a).is_empty());
    }

    #[test]
    fn a_recorded_change_is_compared_by_its_hash() {
        let input = json!({"t": "a"});
        let out = json!({"t": "b"});
        let h = payload_hash(&out);
        assert_eq!(
            compare_recorded(
                &Decision::Continue(Some(out.clone())),
                "changed",
                Some(&h),
                &input
            ),
            Compared::Same
        );
        assert_eq!(
            compare_recorded(&Decision::Continue(None), "continue", None, &input),
            Compared::Same
        );
        assert_eq!(
            compare_recorded(&Decision::Continue(Some(out)), "continue", None, &input),
            Compared::Changed
        );
        assert_eq!(
            compare_recorded(&Decision::Drop("x".into()), "continue", None, &input),
            Compared::Dropped
        );
        assert_eq!(percentile(&[1, 2, 3, 4], 50), 2);
        assert_eq!(percentile(&[1, 2, 3, 4], 99), 4);
    }
}
