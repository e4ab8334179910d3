//! Records what each live plugin did to each event (`plugin_outcomes`) and,
//! when the operator opts in, the inbound payload as it entered. Written by
//! a task of its own in batches, after the event: the request's
//! transaction and its callers stay as they are, and a full queue drops
//! records (counted in the log) rather than slow an event down.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::runtime::ErrorKind;
use crate::store::Store;
use crate::store::outcomes::OutcomeRow;

/// Events whose records may wait to be written.
const QUEUE: usize = 8192;
/// How often kept inbound payloads are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Most events' records written at once.
const MAX_WRITE: usize = 1024;
/// How long the first record of a write waits for more. Why: each write is
/// a transaction, and on PostgreSQL written as soon as records arrived they
/// were half of a busy hub's transactions (about 11 records each); nothing
/// waits for a record but an operator's `hub events` or replay.
const LINGER: Duration = Duration::from_millis(20);

/// One plugin call of an event's chain, as recorded.
#[derive(Debug, Clone)]
pub struct Call {
    pub plugin: Arc<str>,
    pub verdict: &'static str,
    pub payload_hash: Option<String>,
    pub forwards: usize,
    pub error_kind: Option<ErrorKind>,
}

/// The SHA-256 of a payload as stored (its JSON text), in hex.
pub fn payload_hash(payload: &serde_json::Value) -> String {
    hex::encode(Sha256::digest(payload.to_string().as_bytes()))
}

struct Record {
    event_id: String,
    calls: Vec<Call>,
    inbound: Option<String>,
}

/// What the recorder's queue carries: records, and a wait for every record
/// queued before it to be written (the hub stopping).
enum Item {
    Record(Record),
    Flush(oneshot::Sender<()>),
}

pub struct Recorder {
    store: Store,
    /// Kept inbound payloads' age limit; `None` keeps none.
    keep_inbound: OnceLock<Option<Duration>>,
    queue: OnceLock<mpsc::Sender<Item>>,
}

impl Recorder {
    pub fn new(store: Store) -> Recorder {
        Recorder {
            store,
            keep_inbound: OnceLock::new(),
            queue: OnceLock::new(),
        }
    }

    /// `[storage] keep_inbound_hours`: 0 keeps none. Set once, at start.
    pub fn keep_inbound(&self, hours: u64) {
        let keep = (hours > 0).then(|| Duration::from_secs(hours.saturating_mul(3600)));
        let _ = self.keep_inbound.set(keep);
    }

    pub fn keeps_inbound(&self) -> bool {
        self.keep_inbound.get().is_some_and(Option::is_some)
    }

    pub fn record(&self, event_id: String, calls: Vec<Call>, inbound: Option<String>) {
        if calls.is_empty() {
            return;
        }
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            let keep = self.keep_inbound.get().copied().flatten();
            tokio::spawn(write_loop(self.store.clone(), rx, keep));
            tx
        });
        if queue
            .try_send(Item::Record(Record {
                event_id,
                calls,
                inbound,
            }))
            .is_err()
        {
            tracing::warn!("plugin outcomes not recorded: the recorder is behind");
        }
    }

    /// Waits until every record queued so far is written: the hub calls it
    /// as it stops, before it closes the database.
    pub async fn flush(&self) {
        let Some(queue) = self.queue.get() else {
            return;
        };
        let (done, written) = oneshot::channel();
        if queue.send(Item::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

async fn write_loop(store: Store, mut rx: mpsc::Receiver<Item>, keep: Option<Duration>) {
    let mut pruned_at: Option<std::time::Instant> = None;
    let mut batch = Vec::new();
    while gather(&mut rx, &mut batch).await > 0 {
        let mut rows = Vec::new();
        let mut inbound = Vec::new();
        let mut flushes = Vec::new();
        for item in batch.drain(..) {
            let r = match item {
                Item::Record(r) => r,
                Item::Flush(done) => {
                    flushes.push(done);
                    continue;
                }
            };
            for (i, c) in r.calls.iter().enumerate() {
                rows.push(OutcomeRow {
                    event_id: r.event_id.clone(),
                    position: i64::try_from(i).unwrap_or(i64::MAX),
                    plugin: c.plugin.to_string(),
                    verdict: c.verdict.to_owned(),
                    payload_hash: c.payload_hash.clone(),
                    forwards: i64::try_from(c.forwards).unwrap_or(i64::MAX),
                    error_kind: c.error_kind.map(|k| k.as_str().to_owned()),
                });
            }
            if let Some(p) = r.inbound {
                inbound.push((r.event_id, p));
            }
        }
        let now = crate::clock::now_ms();
        if (!rows.is_empty() || !inbound.is_empty())
            && let Err(e) = store.record_outcomes(&rows, &inbound, now).await
        {
            tracing::warn!(error = %e, "plugin outcomes not recorded");
        }
        for done in flushes {
            let _ = done.send(());
        }
        // Without keeping (or after it was turned off), what is left goes.
        if pruned_at.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
            pruned_at = Some(std::time::Instant::now());
            let keep = keep.map_or(0, |k| i64::try_from(k.as_millis()).unwrap_or(i64::MAX));
            let before = now.saturating_sub(keep);
            match store.prune_inbound(before).await {
                Ok(n) if n > 0 => tracing::info!(deleted = n, "kept inbound payloads pruned"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "kept inbound payloads not pruned"),
            }
        }
    }
}

/// Waits for records, then for [`LINGER`] more, until [`MAX_WRITE`] are in
/// `batch` or a flush asks for them; how many items it holds (0: the queue
/// closed and nothing is left).
async fn gather(rx: &mut mpsc::Receiver<Item>, batch: &mut Vec<Item>) -> usize {
    if rx.recv_many(batch, MAX_WRITE).await == 0 {
        return 0;
    }
    let until = tokio::time::Instant::now() + LINGER;
    let flushing = |batch: &[Item]| batch.iter().any(|i| matches!(i, Item::Flush(_)));
    while batch.len() < MAX_WRITE && !flushing(batch) {
        let room = MAX_WRITE - batch.len();
        match tokio::time::timeout_at(until, rx.recv_many(batch, room)).await {
            Ok(n) if n > 0 => {}
            // Closed (what is here is still written) or the time is up.
            _ => break,
        }
    }
    batch.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> Item {
        Item::Record(Record {
            event_id: id.to_owned(),
            calls: Vec::new(),
            inbound: None,
        })
    }

    fn id(item: &Item) -> &str {
        match item {
            Item::Record(r) => &r.event_id,
            Item::Flush(_) => "flush",
        }
    }

    /// Records that arrive while the first waits are written with it; what
    /// was queued when the queue closed (the hub stopping) is still written.
    #[tokio::test]
    async fn records_arriving_meanwhile_share_a_write_and_none_is_left_at_close() {
        let (tx, mut rx) = mpsc::channel(16);
        tx.send(record("a")).await.expect("send");
        let later = tx.clone();
        // Runs once `gather` waits (one thread): while the first record lingers.
        tokio::spawn(async move { later.send(record("b")).await.expect("send") });
        let mut batch = Vec::new();
        assert_eq!(gather(&mut rx, &mut batch).await, 2, "a and b together");
        assert_eq!(id(&batch[1]), "b");
        batch.clear();
        tx.send(record("c")).await.expect("send");
        drop(tx);
        assert_eq!(gather(&mut rx, &mut batch).await, 1, "c, the queue closed");
        batch.clear();
        assert_eq!(gather(&mut rx, &mut batch).await, 0, "nothing left");
    }

    /// What was recorded before a flush is in the database when the flush
    /// returns (the hub stopping loses none), without the linger's wait.
    #[tokio::test]
    async fn what_was_recorded_before_a_flush_is_stored_when_it_returns() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, crate::store::Durability::Normal)
            .await
            .expect("store");
        let recorder = Recorder::new(store.clone());
        let call = Call {
            plugin: "redact".into(),
            verdict: "changed",
            payload_hash: Some("ab".into()),
            forwards: 0,
            error_kind: None,
        };
        recorder.record("e1".into(), vec![call], None);
        recorder.flush().await;
        let rows = store.outcomes_of("e1").await.expect("outcomes");
        assert_eq!(rows.len(), 1, "recorded before the flush returned");
        assert_eq!(rows[0].verdict, "changed");
    }
}
