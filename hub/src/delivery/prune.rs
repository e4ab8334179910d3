//! Outbox housekeeping: rows that were delivered (or dropped by a plugin)
//! are deleted once they are older than `[storage] delivered_retention_hours`,
//! so the outbox and its indexes stay the size of the recent traffic.
//!
//! Why in batches: each batch is a write transaction of its own, so a large
//! first prune (a hub that ran for months without it) never holds the
//! writer for long; other writes go between the batches.

use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// How often the outbox is pruned.
const EVERY: Duration = Duration::from_secs(600);
/// Rows deleted per transaction.
const BATCH: i64 = 1_000;
/// The pause between batches, for the writes waiting behind one.
const BETWEEN: Duration = Duration::from_millis(20);

/// Prunes at start and then every [`EVERY`], until `shutdown` turns true
/// (or its sender is gone); with `retention_hours` 0, does nothing.
pub async fn run(
    store: Store,
    retention_hours: u64,
    clock: Clock,
    mut shutdown: watch::Receiver<bool>,
) {
    if retention_hours == 0 {
        return;
    }
    let keep = i64::try_from(retention_hours.saturating_mul(3_600_000)).unwrap_or(i64::MAX);
    loop {
        match prune_before(&store, clock.now_ms().saturating_sub(keep), &shutdown).await {
            Ok(0) => {}
            Ok(pruned) => {
                tracing::info!(
                    pruned,
                    retention_hours,
                    "pruned delivered requests from the outbox"
                );
            }
            Err(e) => tracing::warn!(error = %e, "cannot prune the outbox"),
        }
        tokio::select! {
            _ = clock.sleep(EVERY) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Deletes every row finished before `before`, [`BATCH`] rows per
/// transaction; how many went.
async fn prune_before(
    store: &Store,
    before: i64,
    shutdown: &watch::Receiver<bool>,
) -> Result<u64, StoreError> {
    let mut pruned = 0;
    while !*shutdown.borrow() {
        let n = store.prune_finished(before, BATCH).await?;
        pruned += n;
        if n < BATCH.unsigned_abs() {
            break;
        }
        tokio::time::sleep(BETWEEN).await;
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::outbox::{enqueue, finish};
    use crate::store::{Durability, NewDelivery, OutboxState};

    /// A backlog larger than a batch goes in several transactions; rows
    /// finished after the cut-off stay.
    #[tokio::test]
    async fn a_large_backlog_is_pruned_batch_by_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = delivered_rows(&dir, 2_510, 2_500).await;
        let (_stop, shutdown) = watch::channel(false);
        let pruned = prune_before(&store, 5_000, &shutdown).await;
        assert_eq!(pruned.expect("prune"), 2_500);
        assert_eq!(delivered(&store).await, 10);
    }

    /// The task prunes at start and ends at shutdown; with a retention of
    /// 0 hours it keeps every row.
    #[tokio::test]
    async fn the_task_prunes_at_start_and_zero_hours_keeps_everything() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Finished in 1970: older than any retention.
        let store = delivered_rows(&dir, 30, 20).await;
        let (stop, shutdown) = watch::channel(false);
        tokio::time::timeout(
            Duration::from_secs(5),
            run(store.clone(), 0, Clock::system(), shutdown.clone()),
        )
        .await
        .expect("with 0 hours the task ends at once");
        assert_eq!(delivered(&store).await, 30);

        let task = tokio::spawn(run(store.clone(), 1, Clock::system(), shutdown));
        let started = std::time::Instant::now();
        while delivered(&store).await > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "not pruned at start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send(true).expect("task listens");
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends at shutdown, not after its 10 minutes")
            .expect("task");
    }

    /// A store with `rows` delivered rows: the first `old` finished at
    /// 2 000 ms since the epoch, the rest at 9 000.
    async fn delivered_rows(dir: &tempfile::TempDir, rows: usize, old: usize) -> Store {
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let mut w = store.begin_write().await.expect("write");
        for i in 0..rows {
            let d = NewDelivery::forward(
                uuid::Uuid::now_v7(),
                "crm",
                "http://127.0.0.1:9/".into(),
                "{}".into(),
                None,
            );
            enqueue(&mut w.tx, &d, 1_000).await.expect("enqueue");
            let finished = if i < old { 2_000 } else { 9_000 };
            finish(
                &mut w.tx,
                &d.id.to_string(),
                OutboxState::Delivered,
                None,
                1,
                finished,
            )
            .await
            .expect("finish");
        }
        w.commit().await.expect("commit");
        store
    }

    async fn delivered(store: &Store) -> usize {
        store
            .list_deliveries(OutboxState::Delivered, 10_000)
            .await
            .expect("list")
            .len()
    }
}
