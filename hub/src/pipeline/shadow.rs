//! Shadow plugins: a route's `shadow = ["name"]` runs on the same events as
//! the live chain, after it and off the request's path, and nothing it does
//! takes effect (its payload, drop, reply, forwards and key-value writes are
//! only compared; its sends are answered by the runtime without leaving the
//! hub). The comparison is counted per route, plugin and result, and the
//! latest differing events are kept, a bounded ring per plugin, for the
//! admin API and the console.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::event::Event;
use crate::runtime::{Action, Outcome, Plugin, PluginError, PluginEvent};

/// Differing events kept per shadow plugin.
pub const RING: usize = 50;
/// Shadow calls under way at once, over all routes; an event that finds
/// them all taken is not shadowed (counted as skipped), so a slow shadow
/// can never pile up work behind live traffic.
const IN_FLIGHT: usize = 64;

/// How a shadow's outcome compares with the live one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compared {
    Same,
    Changed,
    /// The shadow drops what live kept.
    Dropped,
    /// The shadow keeps what live dropped.
    Kept,
    Failed,
}

impl Compared {
    pub const ALL: [Compared; 5] = [
        Compared::Same,
        Compared::Changed,
        Compared::Dropped,
        Compared::Kept,
        Compared::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Compared::Same => "same",
            Compared::Changed => "changed",
            Compared::Dropped => "dropped",
            Compared::Kept => "kept",
            Compared::Failed => "failed",
        }
    }
}

/// What one side decided, for comparing: a changed payload is carried.
#[derive(Debug, Clone)]
pub enum Decision {
    Continue(Option<Value>),
    Drop(String),
    Reply(Value),
    /// The call failed, with its error kind.
    Failed(&'static str),
}

impl Decision {
    pub fn of(result: &Result<Outcome, PluginError>) -> Decision {
        match result {
            Ok(o) => match &o.action {
                Action::Continue(p) => Decision::Continue(p.clone()),
                Action::Drop(r) => Decision::Drop(r.clone()),
                Action::Reply(r) => Decision::Reply(r.clone()),
            },
            Err(e) => Decision::Failed(e.kind.as_str()),
        }
    }

    /// The decision as shown beside the other: the payload the event would
    /// go on with, or what stopped it.
    pub fn shown(&self, input: &Value) -> Value {
        match self {
            Decision::Continue(None) => input.clone(),
            Decision::Continue(Some(p)) => p.clone(),
            Decision::Drop(reason) => json!({ "dropped": reason }),
            Decision::Reply(r) => json!({ "reply": r }),
            Decision::Failed(kind) => json!({ "failed": kind }),
        }
    }
}

/// Compares a candidate's decision with live's on the same input. A live
/// call that failed let the event go on as it was (`on_error = "skip"`) or
/// refused it; either way the candidate is judged on what it did itself.
pub fn compare(candidate: &Decision, live: &Decision, input: &Value) -> Compared {
    let live_dropped = matches!(live, Decision::Drop(_));
    match candidate {
        Decision::Failed(_) => Compared::Failed,
        Decision::Drop(_) if live_dropped => Compared::Same,
        Decision::Drop(_) => Compared::Dropped,
        _ if live_dropped => Compared::Kept,
        Decision::Reply(a) => match live {
            Decision::Reply(b) if a == b => Compared::Same,
            _ => Compared::Changed,
        },
        Decision::Continue(p) => {
            let live_payload = match live {
                Decision::Continue(q) => q.as_ref().unwrap_or(input),
                Decision::Failed(_) => input,
                _ => return Compared::Changed,
            };
            if p.as_ref().unwrap_or(input) == live_payload {
                Compared::Same
            } else {
                Compared::Changed
            }
        }
    }
}

/// One differing event as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    pub event_id: String,
    pub at: i64,
    pub kind: String,
    pub route: String,
    pub result: Compared,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
    /// What live did (the payload it went on with, or what stopped it).
    pub live: Value,
    /// What the shadow would have done.
    pub shadow: Value,
}

/// The shadows' counters and recent differences, for one hub; survives reloads.
pub struct Board {
    counts: Mutex<BTreeMap<(String, String, Compared), u64>>,
    failures: Mutex<BTreeMap<(String, String, &'static str), u64>>,
    skipped: Mutex<BTreeMap<(String, String), u64>>,
    recent: Mutex<HashMap<String, VecDeque<Difference>>>,
    in_flight: Arc<Semaphore>,
}

impl Default for Board {
    fn default() -> Self {
        Board {
            counts: Mutex::default(),
            failures: Mutex::default(),
            skipped: Mutex::default(),
            recent: Mutex::default(),
            in_flight: Arc::new(Semaphore::new(IN_FLIGHT)),
        }
    }
}

/// A shadow call to make, with what live did at the same place.
pub struct Job {
    pub route: String,
    pub shadow: Arc<Plugin>,
    /// The event as the shadow's live counterpart got it.
    pub input: Event,
    pub live: Decision,
}

impl Board {
    /// Starts `jobs` on their own task: the caller (the request) goes on at once.
    pub fn start(self: &Arc<Self>, jobs: Vec<Job>, channel: Option<Arc<str>>, context: Arc<Value>) {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            for job in &jobs {
                *lock(&self.skipped)
                    .entry((job.route.clone(), job.shadow.name().to_owned()))
                    .or_default() += 1;
            }
            return;
        };
        let board = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            for job in jobs {
                board.run(job, channel.as_deref(), &context).await;
            }
        });
    }

    async fn run(&self, job: Job, channel: Option<&str>, context: &Value) {
        let input = PluginEvent {
            event: &job.input,
            channel,
            context,
        };
        let kind = job.input.kind.clone();
        let check = move |action: &mut Action| super::validate::action(&kind, action);
        // Its forwards, key-value writes and reply are dropped here: only
        // the decision is kept, to compare.
        let result = job.shadow.call(&input, &check).await;
        let decision = Decision::of(&result);
        let compared = compare(&decision, &job.live, &job.input.payload);
        let plugin = job.shadow.name().to_owned();
        *lock(&self.counts)
            .entry((job.route.clone(), plugin.clone(), compared))
            .or_default() += 1;
        let error_kind = match decision {
            Decision::Failed(kind) => {
                *lock(&self.failures)
                    .entry((job.route.clone(), plugin.clone(), kind))
                    .or_default() += 1;
                Some(kind)
            }
            _ => None,
        };
        if compared == Compared::Same {
            return;
        }
        let difference = Difference {
            event_id: job.input.id.to_string(),
            at: job.input.at,
            kind: job.input.kind.to_string(),
            route: job.route,
            result: compared,
            error_kind,
            live: job.live.shown(&job.input.payload),
            shadow: decision.shown(&job.input.payload),
        };
        let mut recent = lock(&self.recent);
        let ring = recent.entry(plugin).or_default();
        if ring.len() == RING {
            ring.pop_front();
        }
        ring.push_back(difference);
    }

    /// The latest differences of `plugin`, newest first, with its counts.
    pub fn report(&self, plugin: &str) -> Value {
        let recent: Vec<Difference> = lock(&self.recent)
            .get(plugin)
            .map(|r| r.iter().rev().cloned().collect())
            .unwrap_or_default();
        let mut counts = serde_json::Map::new();
        for c in Compared::ALL {
            counts.insert(c.as_str().to_owned(), json!(0));
        }
        for ((_, p, c), n) in lock(&self.counts).iter() {
            if p == plugin
                && let Some(v) = counts.get_mut(c.as_str())
            {
                *v = json!(v.as_u64().unwrap_or(0) + n);
            }
        }
        json!({ "plugin": plugin, "counts": counts, "recent": recent })
    }

    /// The shadow families of `/metrics`.
    pub fn render(&self, out: &mut String) {
        let rows = lock(&self.counts)
            .iter()
            .map(|((r, p, c), n)| {
                (
                    r.clone(),
                    p.clone(),
                    format!(",result=\"{}\"", c.as_str()),
                    *n,
                )
            })
            .collect();
        family(
            out,
            "hub_shadow_outcomes_total",
            "Shadow plugin calls by route, plugin and how they compare with the live outcome.",
            rows,
        );
        let rows = lock(&self.failures)
            .iter()
            .map(|((r, p, k), n)| (r.clone(), p.clone(), format!(",kind=\"{k}\""), *n))
            .collect();
        family(
            out,
            "hub_shadow_failures_total",
            "Shadow plugin calls that failed, by error kind (never a failure of the live route).",
            rows,
        );
        let rows = lock(&self.skipped)
            .iter()
            .map(|((r, p), n)| (r.clone(), p.clone(), String::new(), *n))
            .collect();
        family(
            out,
            "hub_shadow_skipped_total",
            "Events not shadowed because every shadow slot was busy.",
            rows,
        );
    }
}

/// One counter family: rows of (route, plugin, further labels, count).
fn family(out: &mut String, name: &str, help: &str, rows: Vec<(String, String, String, u64)>) {
    crate::obs::header(out, name, "counter", help);
    for (route, plugin, more, n) in rows {
        let _ = writeln!(
            out,
            "{name}{{route=\"{}\",plugin=\"{}\"{more}}} {n}",
            crate::obs::escape(&route),
            crate::obs::escape(&plugin),
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_compare_as_an_operator_reads_them() {
        let input = json!({"text": "a@b.c"});
        let masked = json!({"text": "[email]"});
        let live = Decision::Continue(None);
        assert_eq!(
            compare(&Decision::Continue(None), &live, &input),
            Compared::Same
        );
        assert_eq!(
            compare(&Decision::Continue(Some(input.clone())), &live, &input),
            Compared::Same
        );
        assert_eq!(
            compare(&Decision::Continue(Some(masked.clone())), &live, &input),
            Compared::Changed
        );
        assert_eq!(
            compare(&Decision::Drop("x".into()), &live, &input),
            Compared::Dropped
        );
        assert_eq!(
            compare(
                &Decision::Continue(None),
                &Decision::Drop("y".into()),
                &input
            ),
            Compared::Kept
        );
        assert_eq!(
            compare(&Decision::Failed("trap"), &live, &input),
            Compared::Failed
        );
        assert_eq!(
            compare(
                &Decision::Continue(Some(masked.clone())),
                &Decision::Continue(Some(masked)),
                &input
            ),
            Compared::Same
        );
    }
}
