//! The outbox as operators see it: depth by policy for `/metrics`, the
//! delivery views of the admin API, and replays of dead letters.

use super::write::parse_notes;
use super::*;
/// Pending rows of one retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRows {
    pub policy: String,
    pub rows: i64,
    /// When the oldest of them was queued (Unix ms).
    pub oldest_created_at: i64,
}

/// What waits in the outbox and what failed for good, for every instance
/// on the database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxDepth {
    /// By policy name, in name order.
    pub pending: Vec<PendingRows>,
    /// Rows in state `failed`.
    pub dead_letters: i64,
}

impl Store {
    /// Counts pending rows by policy (with the oldest) and failed rows, in
    /// one statement over the `(state, …)` index.
    pub async fn outbox_depth(&self) -> Result<OutboxDepth, StoreError> {
        let rows: Vec<(String, String, i64, Option<i64>)> = sqlx::query_as(
            "SELECT state, policy, COUNT(*), MIN(created_at) FROM outbox \
             WHERE state IN ('pending', 'failed') GROUP BY state, policy ORDER BY policy",
        )
        .fetch_all(self.pool())
        .await
        .ctx("measuring the outbox")?;
        let mut depth = OutboxDepth::default();
        for (state, policy, rows, oldest) in rows {
            if state == OutboxState::Failed.as_str() {
                depth.dead_letters += rows;
            } else {
                depth.pending.push(PendingRows {
                    policy,
                    rows,
                    oldest_created_at: oldest.unwrap_or_default(),
                });
            }
        }
        Ok(depth)
    }
}

/// An outbox row as operators see it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeliveryView {
    pub id: String,
    pub event_id: String,
    pub kind: String,
    pub state: String,
    pub target_url: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub response: Option<String>,
    pub chat_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    /// What operators should know about how the answer was read.
    pub notes: Vec<String>,
    pub body: serde_json::Value,
}

const VIEW_COLUMNS: &str = "id, event_id, kind, state, target_url, attempts, last_error, \
     response, chat_id, created_at, finished_at, notes, body";

fn view_from_row(r: &AnyRow) -> Result<DeliveryView, StoreError> {
    let body: String = r.try_get("body").ctx("reading a delivery")?;
    Ok(DeliveryView {
        id: r.try_get("id").ctx("reading a delivery")?,
        event_id: r.try_get("event_id").ctx("reading a delivery")?,
        kind: r.try_get("kind").ctx("reading a delivery")?,
        state: r.try_get("state").ctx("reading a delivery")?,
        target_url: r.try_get("target_url").ctx("reading a delivery")?,
        attempts: r.try_get("attempts").ctx("reading a delivery")?,
        last_error: r.try_get("last_error").ctx("reading a delivery")?,
        response: r.try_get("response").ctx("reading a delivery")?,
        chat_id: r.try_get("chat_id").ctx("reading a delivery")?,
        created_at: r.try_get("created_at").ctx("reading a delivery")?,
        finished_at: r.try_get("finished_at").ctx("reading a delivery")?,
        notes: parse_notes(r.try_get("notes").ctx("reading a delivery")?),
        body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
    })
}

impl Store {
    /// Deliveries in `state`, newest first.
    pub async fn list_deliveries(
        &self,
        state: OutboxState,
        limit: i64,
    ) -> Result<Vec<DeliveryView>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {VIEW_COLUMNS} FROM outbox WHERE state = $1 ORDER BY seq DESC LIMIT $2"
        ))
        .bind(state.as_str())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("listing deliveries")?;
        rows.iter().map(view_from_row).collect()
    }

    /// One delivery by id, whatever its state.
    pub async fn delivery(&self, id: &str) -> Result<Option<DeliveryView>, StoreError> {
        let row = sqlx::query(&format!("SELECT {VIEW_COLUMNS} FROM outbox WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("reading a delivery")?;
        row.as_ref().map(view_from_row).transpose()
    }

    /// Sends dead letters again, with their delivery ids: `ids` or, when
    /// empty, every failed webhook. Returns the ids put back in the queue.
    pub async fn replay_dead(&self, ids: &[String], now: i64) -> Result<Vec<String>, StoreError> {
        let mut w = self.begin_write().await?;
        let candidates: Vec<(String,)> = if ids.is_empty() {
            sqlx::query_as(
                "SELECT id FROM outbox WHERE state = 'failed' \
                 AND (kind LIKE 'webhook.%' OR kind LIKE 'crm.%') ORDER BY seq",
            )
            .fetch_all(&mut *w.tx)
            .await
            .ctx("finding dead letters")?
        } else {
            let mut found = Vec::new();
            for id in ids {
                let row: Option<(String,)> =
                    sqlx::query_as("SELECT id FROM outbox WHERE id = $1 AND state = 'failed'")
                        .bind(id.as_str())
                        .fetch_optional(&mut *w.tx)
                        .await
                        .ctx("finding a dead letter")?;
                found.extend(row);
            }
            found
        };
        for (id,) in &candidates {
            sqlx::query(
                "UPDATE outbox SET state = 'pending', attempts = 0, next_attempt_at = $1, \
                 give_up_at = NULL, first_attempt_at = NULL, hold_until = NULL, \
                 lease_until = NULL, finished_at = NULL, head = 1 WHERE id = $2",
            )
            .bind(now)
            .bind(id.as_str())
            .execute(&mut *w.tx)
            .await
            .ctx("replaying a delivery")?;
            // Back in the queue it may come before rows of its key that
            // are there: the key's first pending row is its head again.
            sqlx::query(
                "UPDATE outbox SET head = CASE WHEN seq = (SELECT MIN(p.seq) FROM outbox p \
                 WHERE p.order_key = outbox.order_key AND p.state = 'pending') THEN 1 ELSE 0 END \
                 WHERE state = 'pending' AND order_key = \
                 (SELECT r.order_key FROM outbox r WHERE r.id = $1)",
            )
            .bind(id.as_str())
            .execute(&mut *w.tx)
            .await
            .ctx("replaying a delivery")?;
        }
        w.commit().await?;
        Ok(candidates.into_iter().map(|(id,)| id).collect())
    }
}
