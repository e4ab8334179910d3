//! Task reminders: sends `fired_task` once for each active task whose
//! `notify_ts` has passed. Fired is recorded on the task in the transaction
//! that queues the webhook, so a reminder fires once however often the hub
//! restarts, and reminders that fell due while it was down fire at start.

use std::time::Duration;

use plugin_api::crm::{CrmEvent, TaskEvent};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::CrmConfig;
use crate::delivery::Kick;
use crate::store::crm::tasks;
use crate::store::{Store, StoreError};

/// Longest sleep between looks for due reminders: tasks created or moved
/// meanwhile are noticed within it.
const POLL: Duration = Duration::from_secs(1);
/// Reminders fired per transaction.
const BATCH: i64 = 100;

/// Runs until `shutdown` turns true (or its sender is gone).
pub async fn run(
    store: Store,
    crm: CrmConfig,
    kick: Kick,
    clock: Clock,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        if *shutdown.borrow() {
            break;
        }
        // Read before the look, so a clock that moved on meanwhile wakes
        // the loop at once.
        let looked_at = clock.now_ms();
        let wake_at = match fire_due(&store, &crm, &kick, looked_at).await {
            Ok(next) => wake_at(next, looked_at),
            Err(e) => {
                tracing::error!(error = %e, "task reminders failed; retrying");
                wake_at(None, looked_at)
            }
        };
        tokio::select! {
            _ = clock.sleep_until_ms(wake_at) => {}
            changed = shutdown.changed() => {
                if changed.is_err() {
                    break;
                }
            }
        }
    }
}

/// When (Unix ms) to look again after a look at `now_ms`: when the reminder
/// due at `next` (Unix seconds) is, at most [`POLL`] later.
fn wake_at(next: Option<i64>, now_ms: i64) -> i64 {
    let poll = now_ms.saturating_add(i64::try_from(POLL.as_millis()).unwrap_or(i64::MAX));
    next.map_or(poll, |next| next.saturating_mul(1000).min(poll))
}

/// Fires every due reminder; returns when the next one is due.
async fn fire_due(
    store: &Store,
    crm: &CrmConfig,
    kick: &Kick,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    loop {
        // Most looks find nothing due: read that without taking the
        // exclusive write turn, which would pause every hot writer.
        {
            let mut conn = store.read().await?;
            if tasks::due(&mut conn, now / 1000, 1).await?.is_empty() {
                return tasks::next_due(&mut conn).await;
            }
        }
        let mut w = store.begin_write().await?;
        let due = tasks::due(&mut w.tx, now / 1000, BATCH).await?;
        let mut fired = 0_usize;
        for id in &due {
            if !tasks::mark_fired(&mut w.tx, *id).await? {
                continue;
            }
            if let Some(task) = tasks::get(&mut w.tx, *id).await? {
                crate::core::webhooks::queue_crm(
                    &mut w.tx,
                    crm,
                    CrmEvent::CrmTask(TaskEvent::FiredTask(task)),
                    now,
                )
                .await?;
                fired += 1;
            }
        }
        let full = i64::try_from(due.len()).is_ok_and(|n| n >= BATCH);
        let next = if full {
            None
        } else {
            tasks::next_due(&mut w.tx).await?
        };
        w.commit().await?;
        if fired > 0 {
            tracing::debug!(fired, "task reminders fired");
            kick.kick();
        }
        if !full {
            return Ok(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_at_most_a_poll() {
        assert_eq!(wake_at(None, 5_000), 6_000);
        assert_eq!(wake_at(Some(0), 5_000), 0);
        assert_eq!(wake_at(Some(5), 4_700), 5_000);
        assert_eq!(wake_at(Some(i64::MAX / 2000), 5_000), 6_000);
    }
}
