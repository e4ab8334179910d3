//! Calls agents report in a chat (`calls`); each change is sent as `call_event`.

use sqlx::AnyConnection;

use super::{Ctx, StoreError};

/// A call an agent starts in a chat.
#[derive(Debug, Clone, Copy)]
pub struct NewCall<'a> {
    pub chat_id: i64,
    pub channel_id: i64,
    pub client_id: i64,
    pub agent_id: i64,
    /// `callback`, `incoming` or `outgoing`.
    pub call_type: &'a str,
    pub phone: &'a str,
    pub now: i64,
}

/// Records a new call with status `start`; returns its id.
pub async fn insert(conn: &mut AnyConnection, call: &NewCall<'_>) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO calls (chat_id, channel_id, client_id, agent_id, call_type, \
         phone, status, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, 'start', $7, $7) RETURNING id",
    )
    .bind(call.chat_id)
    .bind(call.channel_id)
    .bind(call.client_id)
    .bind(call.agent_id)
    .bind(call.call_type)
    .bind(call.phone)
    .bind(call.now)
    .fetch_one(conn)
    .await
    .ctx("recording a call")?;
    Ok(id)
}

/// A call as stored: its chat (if it still has one), type and phone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCall {
    pub chat_id: Option<i64>,
    pub call_type: String,
    pub phone: String,
}

/// `agent_id` of a call a widget visitor asked for, until an agent takes it.
pub const NO_AGENT: i64 = 0;

/// The call `call_id` if `agent_id` reported it, or if it is a visitor's
/// request no agent has taken yet (the agent takes it by reporting on it).
pub async fn of_agent(
    conn: &mut AnyConnection,
    call_id: i64,
    agent_id: i64,
) -> Result<Option<StoredCall>, StoreError> {
    sqlx::query("UPDATE calls SET agent_id = $1 WHERE id = $2 AND agent_id = $3")
        .bind(agent_id)
        .bind(call_id)
        .bind(NO_AGENT)
        .execute(&mut *conn)
        .await
        .ctx("taking a call")?;
    let row: Option<(Option<i64>, String, String)> = sqlx::query_as(
        "SELECT chat_id, call_type, phone FROM calls WHERE id = $1 AND agent_id = $2",
    )
    .bind(call_id)
    .bind(agent_id)
    .fetch_optional(conn)
    .await
    .ctx("reading a call")?;
    Ok(row.map(|(chat_id, call_type, phone)| StoredCall {
        chat_id,
        call_type,
        phone,
    }))
}

impl super::Store {
    /// The calls of a chat, oldest first, as agents see them.
    pub async fn calls_of_chat(&self, chat_id: i64) -> Result<Vec<serde_json::Value>, StoreError> {
        type Row = (
            i64,
            i64,
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            i64,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT id, agent_id, call_type, phone, status, reason, record_url, updated_at \
             FROM calls WHERE chat_id = $1 ORDER BY id",
        )
        .bind(chat_id)
        .fetch_all(self.pool())
        .await
        .ctx("reading a chat's calls")?;
        Ok(rows
            .into_iter()
            .map(|(id, agent, kind, phone, status, reason, record_url, at)| {
                serde_json::json!({
                    "id": id,
                    "agent_id": (agent != NO_AGENT).then_some(agent),
                    "type": kind,
                    "phone": phone,
                    "status": status,
                    "reason": reason,
                    "record_url": record_url,
                    "updated_at": at,
                })
            })
            .collect())
    }

    /// Whether the client has a call under way (asked for or running) that
    /// changed since `since` (Unix ms).
    pub async fn client_has_live_call(
        &self,
        client_id: i64,
        since: i64,
    ) -> Result<bool, StoreError> {
        let row: Option<(i64,)> = sqlx::query_as(
            "SELECT id FROM calls WHERE client_id = $1 AND updated_at >= $2 \
             AND status IN ('start', 'agent_connected', 'client_connected') LIMIT 1",
        )
        .bind(client_id)
        .bind(since)
        .fetch_optional(self.pool())
        .await
        .ctx("reading a client's calls")?;
        Ok(row.is_some())
    }
}

/// A new status of a call.
#[derive(Debug, Clone, Copy)]
pub struct CallUpdate<'a> {
    /// `start`, `end`, `agent_connected`, `client_connected` or `error`.
    pub status: &'a str,
    pub reason: Option<&'a str>,
    pub record_url: Option<&'a str>,
    pub now: i64,
}

/// Sets the call's status, reason and recording URL (`None` clears them).
pub async fn update(
    conn: &mut AnyConnection,
    call_id: i64,
    update: &CallUpdate<'_>,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE calls SET status = $1, reason = $2, record_url = $3, updated_at = $4 \
         WHERE id = $5",
    )
    .bind(update.status)
    .bind(update.reason)
    .bind(update.record_url)
    .bind(update.now)
    .bind(call_id)
    .execute(conn)
    .await
    .ctx("updating a call")?;
    Ok(())
}
