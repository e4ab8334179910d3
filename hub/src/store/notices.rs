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
        self.notify_all(&[payload]).await
    }

    /// Sends `payloads`, in order, as [`Store::notify`] sends one; notices
    /// small enough for `NOTIFY` go together, one statement and one commit
    /// for a run of them. Why: each `NOTIFY` is a transaction, and the
    /// server commits transactions that notify one at a time; one round
    /// trip per update made the relay the slowest writer of a busy hub.
    pub async fn notify_all(&self, payloads: &[&str]) -> Result<(), StoreError> {
        if self.backend() != Backend::Postgres {
            return Ok(());
        }
        let mut run: Vec<&str> = Vec::new();
        for payload in payloads {
            if payload.len() <= MAX_INLINE && !payload.starts_with('@') {
                run.push(payload);
                continue;
            }
            self.notify_inline(&run).await?;
            run.clear();
            let kept = self.keep_notice(payload).await?;
            self.notify_inline(&[kept.as_str()]).await?;
        }
        self.notify_inline(&run).await
    }

    /// `NOTIFY` for each of `messages`, in order, in one transaction.
    async fn notify_inline(&self, messages: &[&str]) -> Result<(), StoreError> {
        match messages {
            [] => Ok(()),
            [message] => {
                let query = sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(CHANNEL)
                    .bind(*message);
                self.fetch_all_hot(query, "sending a notice").await?;
                Ok(())
            }
            _ => {
                let list = serde_json::to_string(messages)
                    .map_err(|e| StoreError::Corrupt(format!("notices: {e}")))?;
                // A volatile call in the select list runs after the sort:
                // the notices go out in the list's order.
                let query = sqlx::query(
                    "SELECT pg_notify($1, m.value) FROM json_array_elements_text($2::JSON) \
                     WITH ORDINALITY AS m(value, n) ORDER BY m.n",
                )
                .bind(CHANNEL)
                .bind(list);
                self.fetch_all_hot(query, "sending notices").await?;
                Ok(())
            }
        }
    }

    /// Keeps a notice too large for `NOTIFY` in `hub_notices`; the message
    /// that names it. In the row mode: it decides nothing on what it reads,
    /// and the hot paths' notices (a run of delivery results, say) must not
    /// wait for the exclusive turn, nor make everyone else wait for theirs.
    async fn keep_notice(&self, payload: &str) -> Result<String, StoreError> {
        let now = now_ms();
        let mut w = self.begin_row_write().await?;
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
        Ok(format!("@{id}"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Durability, required_test_postgres_url};

    /// Notices sent together arrive all and in order, a large one (kept in
    /// the table) in its place among them. PostgreSQL only
    /// (`scripts/with-postgres.sh`); SQLite has one instance.
    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn notices_sent_together_arrive_in_order() {
        let url = required_test_postgres_url().await;
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let mut listener = Listener::connect(store.clone(), &url)
            .await
            .expect("listen");
        let large = "x".repeat(MAX_INLINE + 1);
        let sent = [
            "one",
            "two",
            large.as_str(),
            "four",
            "@not-a-reference",
            "six",
        ];
        store.notify_all(&sent).await.expect("notify");
        for expected in sent {
            let got = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
                .await
                .expect("a notice within 5 s")
                .expect("receive");
            assert_eq!(got.as_deref(), Some(expected));
        }
    }
}
