//! Console sessions: the SHA-256 of each session cookie, its agent, its
//! CSRF token and when it ends.

use sqlx::Row;

use super::agents::from_row;
use super::{Agent, Ctx, Store, StoreError};

impl Store {
    /// Stores a new session and drops every expired one (sign-ins are rare
    /// enough to carry the clean-up).
    pub async fn insert_session(
        &self,
        id_hash: &str,
        agent_id: i64,
        csrf_token: &str,
        now: i64,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *w.tx)
            .await
            .ctx("dropping expired sessions")?;
        sqlx::query(
            "INSERT INTO console_sessions (id_hash, agent_id, csrf_token, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id_hash)
        .bind(agent_id)
        .bind(csrf_token)
        .bind(now)
        .bind(expires_at)
        .execute(&mut *w.tx)
        .await
        .ctx("storing a session")?;
        w.commit().await
    }

    /// The agent of a live session and the session's CSRF token.
    pub async fn session_agent(
        &self,
        id_hash: &str,
        now: i64,
    ) -> Result<Option<(Agent, String)>, StoreError> {
        let row = sqlx::query(
            "SELECT s.csrf_token, a.id, a.name, a.email, a.photo, a.online, a.admin, a.created_at \
             FROM console_sessions s JOIN agents a ON a.id = s.agent_id \
             WHERE s.id_hash = $1 AND s.expires_at > $2",
        )
        .bind(id_hash)
        .bind(now)
        .fetch_optional(self.pool())
        .await
        .ctx("looking up a session")?;
        row.as_ref()
            .map(|r| Ok((from_row(r)?, r.try_get("csrf_token")?)))
            .transpose()
            .ctx("reading a session")
    }

    pub async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(&mut *w.tx)
            .await
            .ctx("ending a session")?;
        w.commit().await
    }
}
