//! Agents: their bearer tokens (stored as SHA-256 hashes) and online state.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Ctx, Store, StoreError, flag};
use crate::clock::now_ms;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Agent {
    pub id: i64,
    pub name: String,
    pub email: String,
    pub photo: Option<String>,
    pub online: bool,
    pub created_at: i64,
}

pub struct NewAgent<'a> {
    pub name: &'a str,
    pub email: &'a str,
    pub photo: Option<&'a str>,
    pub token_hash: &'a str,
}

const COLUMNS: &str = "id, name, email, photo, online, created_at";

fn from_row(row: &AnyRow) -> Result<Agent, sqlx::Error> {
    Ok(Agent {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        email: row.try_get("email")?,
        photo: row.try_get("photo")?,
        online: flag(row.try_get("online")?),
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// Inserts an agent; `None` when the e-mail is taken.
    pub async fn insert_agent(&self, new: NewAgent<'_>) -> Result<Option<Agent>, StoreError> {
        let mut w = self.begin_write().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO agents (name, email, photo, token_hash, online, created_at) \
             VALUES ($1, $2, $3, $4, 0, $5) ON CONFLICT (email) DO NOTHING RETURNING {COLUMNS}"
        ))
        .bind(new.name)
        .bind(new.email.to_lowercase())
        .bind(new.photo)
        .bind(new.token_hash)
        .bind(now_ms())
        .fetch_optional(&mut *w.tx)
        .await
        .ctx("inserting an agent")?;
        let agent = row
            .as_ref()
            .map(from_row)
            .transpose()
            .ctx("reading an agent")?;
        w.commit().await?;
        Ok(agent)
    }

    pub async fn agent_by_token_hash(&self, hash: &str) -> Result<Option<Agent>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM agents WHERE token_hash = $1"
        ))
        .bind(hash)
        .fetch_optional(self.pool())
        .await
        .ctx("authenticating an agent")?;
        row.as_ref()
            .map(from_row)
            .transpose()
            .ctx("reading an agent")
    }

    pub async fn agent_by_id(&self, id: i64) -> Result<Option<Agent>, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM agents WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("looking up an agent")?;
        row.as_ref()
            .map(from_row)
            .transpose()
            .ctx("reading an agent")
    }

    pub async fn list_agents(&self) -> Result<Vec<Agent>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM agents ORDER BY id"))
            .fetch_all(self.pool())
            .await
            .ctx("listing agents")?;
        rows.iter()
            .map(from_row)
            .collect::<Result<_, _>>()
            .ctx("reading an agent")
    }

    pub async fn set_agent_online(&self, id: i64, online: bool) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        sqlx::query("UPDATE agents SET online = $1 WHERE id = $2")
            .bind(i64::from(online))
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("setting agent status")?;
        w.commit().await
    }

    /// Ids of the channels the agent works on.
    pub async fn agent_channel_ids(&self, email: &str) -> Result<Vec<i64>, StoreError> {
        let rows: Vec<(i64,)> =
            sqlx::query_as("SELECT channel_id FROM channel_agents WHERE agent_email = $1")
                .bind(email.to_lowercase())
                .fetch_all(self.pool())
                .await
                .ctx("listing an agent's channels")?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }
}
