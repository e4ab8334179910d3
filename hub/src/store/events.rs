//! The event log: every request that entered and every delivery that left.

use sqlx::{AnyConnection, Row};

use super::{Ctx, Store, StoreError};
use crate::event::{Direction, Event, EventKind};

pub async fn insert_event(conn: &mut AnyConnection, event: &Event) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO events (id, kind, direction, channel_id, chat_id, payload, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(event.id.to_string())
    .bind(event.kind.as_str())
    .bind(event.direction.as_str())
    .bind(event.channel_id)
    .bind(event.chat_id)
    .bind(event.payload.to_string())
    .bind(event.at)
    .execute(conn)
    .await
    .ctx("recording an event")?;
    Ok(())
}

impl Store {
    /// One logged event.
    pub async fn event_by_id(&self, id: &str) -> Result<Option<Event>, StoreError> {
        let row = sqlx::query(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("reading an event")?;
        row.as_ref().map(event_from_row).transpose()
    }

    /// The logged events of a chat, oldest first.
    pub async fn events_of_chat(&self, chat_id: i64) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE chat_id = $1 ORDER BY created_at, id"
        ))
        .bind(chat_id)
        .fetch_all(self.pool())
        .await
        .ctx("listing events")?;
        rows.iter().map(event_from_row).collect()
    }

    /// The logged events of a kind (a glob is not accepted), newest first.
    pub async fn events_of_kind(&self, kind: &str, limit: i64) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE kind = $1 ORDER BY created_at DESC, id DESC \
             LIMIT $2"
        ))
        .bind(kind)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .ctx("listing events")?;
        rows.iter().map(event_from_row).collect()
    }
}

const EVENT_COLUMNS: &str = "id, kind, direction, channel_id, chat_id, payload, created_at";

pub(super) fn event_from_row(row: &sqlx::any::AnyRow) -> Result<Event, StoreError> {
    let id: String = row.try_get("id").ctx("reading an event")?;
    let kind: String = row.try_get("kind").ctx("reading an event")?;
    let direction: String = row.try_get("direction").ctx("reading an event")?;
    let payload: String = row.try_get("payload").ctx("reading an event")?;
    Ok(Event {
        id: id
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("event id: {e}")))?,
        kind: EventKind::from(kind),
        direction: Direction::parse(&direction)
            .ok_or_else(|| StoreError::Corrupt(format!("direction `{direction}`")))?,
        channel_id: row.try_get("channel_id").ctx("reading an event")?,
        chat_id: row.try_get("chat_id").ctx("reading an event")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| StoreError::Corrupt(format!("event payload: {e}")))?,
        at: row.try_get("created_at").ctx("reading an event")?,
    })
}
