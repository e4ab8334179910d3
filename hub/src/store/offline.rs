//! Messages left through the widget's offline form (`offline_messages`), as
//! the visitor filled it in; the chat agents read is stored beside it.

use sqlx::AnyConnection;

use super::{Ctx, StoreError};

/// An offline form to keep.
#[derive(Debug, Clone, Copy)]
pub struct NewOfflineMessage<'a> {
    pub channel_id: i64,
    pub client_id: i64,
    pub name: Option<&'a str>,
    pub email: Option<&'a str>,
    pub phone: Option<&'a str>,
    pub description: Option<&'a str>,
    pub message: &'a str,
    pub now: i64,
}

/// Records the form; returns its id (the webhook's `offline_message_id`).
pub async fn insert(
    conn: &mut AnyConnection,
    m: &NewOfflineMessage<'_>,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO offline_messages (channel_id, client_id, name, email, phone, \
         description, message, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         RETURNING id",
    )
    .bind(m.channel_id)
    .bind(m.client_id)
    .bind(m.name)
    .bind(m.email)
    .bind(m.phone)
    .bind(m.description)
    .bind(m.message)
    .bind(m.now)
    .fetch_one(conn)
    .await
    .ctx("recording an offline message")?;
    Ok(id)
}
