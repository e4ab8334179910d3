//! Notices between hub instances on one PostgreSQL database, over
//! `LISTEN`/`NOTIFY` on one channel. A notice too large for `NOTIFY` is
//! kept in `hub_notices` and the notification names its id (`@<id>`).
//! SQLite has one instance: nothing here runs on it.

use sqlx::postgres::PgListener;

use super::{Backend, Ctx, Store, StoreError};
use crate::clock::now_ms;

/// The one channel every instance listens on.
pub const CHANNEL: &str = "hub_notices";
/// NOTIFY's payload limit is 8000 bytes; stay clear of it.
const MAX_INLINE: usize = 7_000;
/// How long a large notice is kept for listeners to read.
const KEEP_MS: i64 = 5 * 60 * 1000;

impl Store {
    /// Sends `payload` to every instance listening (itself included).
    /// Nothing happens on SQLite.
    pub async fn notify(&self, payload: &str) -> Result<(), StoreError> {
        if self.backend() != Backend::Postgres {
            return Ok(());
        }
        let message = if payload.len() <= MAX_INLINE && !payload.starts_with('@') {
            payload.to_owned()
        } else {
            let now = now_ms();
            let mut w = self.begin_write().await?;
            sqlx::query("DELETE FROM hub_notices WHERE created_at < $1")
                .bind(now - KEEP_MS)
                .execute(&mut *w.tx)
                .await
                .ctx("dropping old notices")?;
            let (id,): (i64,) = sqlx::query_as(
                "INSERT INTO hub_notices (payload, created_at) VALUES ($1, $2) RETURNING id",
            )
            .bind(payload)
            .bind(now)
            .fetch_one(&mut *w.tx)
            .await
            .ctx("keeping a notice")?;
            w.commit().await?;
            format!("@{id}")
        };
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(message)
            .execute(self.pool())
            .await
            .ctx("sending a notice")?;
        Ok(())
    }

    /// The payload a notification carried (reading a large one from the table).
    async fn notice_payload(&self, message: &str) -> Result<Option<String>, StoreError> {
        let Some(id) = message.strip_prefix('@') else {
            return Ok(Some(message.to_owned()));
        };
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        let row: Option<(String,)> =
            sqlx::query_as("SELECT payload FROM hub_notices WHERE id = $1")
                .bind(id)
                .fetch_optional(self.pool())
                .await
                .ctx("reading a notice")?;
        Ok(row.map(|(p,)| p))
    }
}

/// This instance's ear on the notices channel (its own connection).
pub struct Listener {
    inner: PgListener,
    store: Store,
}

impl Listener {
    /// Listens on [`CHANNEL`] of the PostgreSQL database at `url`.
    pub async fn connect(store: Store, url: &str) -> Result<Listener, StoreError> {
        let mut inner = PgListener::connect(url)
            .await
            .ctx("connecting to listen for notices")?;
        inner.listen(CHANNEL).await.ctx("listening for notices")?;
        Ok(Listener { inner, store })
    }

    /// The next notice. After the connection broke, the listener connects
    /// again by itself; what was sent meanwhile is lost (callers treat the
    /// error as "you may have missed some").
    pub async fn recv(&mut self) -> Result<Option<String>, StoreError> {
        let n = self.inner.recv().await.ctx("receiving a notice")?;
        self.store.notice_payload(n.payload()).await
    }
}
