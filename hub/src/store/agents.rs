//! Agents: their bearer tokens (stored as SHA-256 hashes), console
//! passwords (Argon2id PHC strings), admin flag and online state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// May use the admin API with a console session.
    pub admin: bool,
    pub created_at: i64,
}

pub struct NewAgent<'a> {
    pub name: &'a str,
    pub email: &'a str,
    pub photo: Option<&'a str>,
    pub token_hash: &'a str,
    pub password_hash: Option<&'a str>,
    pub admin: bool,
}

const COLUMNS: &str = "id, name, email, photo, online, admin, created_at";

pub(super) fn from_row(row: &AnyRow) -> Result<Agent, sqlx::Error> {
    Ok(Agent {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        email: row.try_get("email")?,
        photo: row.try_get("photo")?,
        online: flag(row.try_get("online")?),
        admin: flag(row.try_get("admin")?),
        created_at: row.try_get("created_at")?,
    })
}

impl Store {
    /// Inserts an agent; `None` when the e-mail is taken.
    pub async fn insert_agent(&self, new: NewAgent<'_>) -> Result<Option<Agent>, StoreError> {
        let mut w = self.begin_write().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO agents (name, email, photo, token_hash, password_hash, admin, online, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, 0, $7) \
             ON CONFLICT (email) DO NOTHING RETURNING {COLUMNS}"
        ))
        .bind(new.name)
        .bind(new.email.to_lowercase())
        .bind(new.photo)
        .bind(new.token_hash)
        .bind(new.password_hash)
        .bind(i64::from(new.admin))
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
        if let Some(agent) = self.agent_tokens.get(hash) {
            return Ok(Some(agent));
        }
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM agents WHERE token_hash = $1"
        ))
        .bind(hash)
        .fetch_optional(&mut *self.read().await?)
        .await
        .ctx("authenticating an agent")?;
        let agent = row
            .as_ref()
            .map(from_row)
            .transpose()
            .ctx("reading an agent")?;
        if let Some(agent) = &agent {
            self.agent_tokens.put(hash, agent);
        }
        Ok(agent)
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

    /// The agent with this e-mail and its password hash (`None` inside:
    /// the agent has no password).
    pub async fn agent_with_password(
        &self,
        email: &str,
    ) -> Result<Option<(Agent, Option<String>)>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS}, password_hash FROM agents WHERE email = $1"
        ))
        .bind(email.to_lowercase())
        .fetch_optional(self.pool())
        .await
        .ctx("looking up an agent")?;
        row.as_ref()
            .map(|r| Ok((from_row(r)?, r.try_get("password_hash")?)))
            .transpose()
            .ctx("reading an agent")
    }

    /// Sets an agent's password hash and ends its console sessions (a new
    /// password signs out whoever knew the old one); `None` when there is no
    /// such agent.
    pub async fn set_agent_password(
        &self,
        id: i64,
        password_hash: &str,
    ) -> Result<Option<Agent>, StoreError> {
        let mut w = self.begin_write().await?;
        let row = sqlx::query(&format!(
            "UPDATE agents SET password_hash = $1 WHERE id = $2 RETURNING {COLUMNS}"
        ))
        .bind(password_hash)
        .bind(id)
        .fetch_optional(&mut *w.tx)
        .await
        .ctx("setting a password")?;
        let agent = row
            .as_ref()
            .map(from_row)
            .transpose()
            .ctx("reading an agent")?;
        if agent.is_some() {
            sqlx::query("DELETE FROM console_sessions WHERE agent_id = $1")
                .bind(id)
                .execute(&mut *w.tx)
                .await
                .ctx("ending an agent's sessions")?;
        }
        w.commit().await?;
        Ok(agent)
    }

    pub async fn agent_by_email(&self, email: &str) -> Result<Option<Agent>, StoreError> {
        Ok(self.agent_with_password(email).await?.map(|(a, _)| a))
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
        let done = w.commit().await;
        // Whether or not the commit went through: the next request reads.
        self.agent_tokens.clear();
        done
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

/// Agents by token hash as this process last read them, so that an agent's
/// request does not read its token from the database each time (on
/// PostgreSQL that read was one of a delivery's two round trips before its
/// batch). A token never changes and agents are never deleted; the one
/// field that changes, `online`, is written through
/// [`Store::set_agent_online`], which empties this process's cache. What
/// another process writes (the `hub` commands on SQLite, the other
/// instances on PostgreSQL) is seen within [`TokenCache::TTL`], as channels
/// changed elsewhere are.
#[derive(Default)]
pub(crate) struct TokenCache {
    agents: Mutex<HashMap<String, (Instant, Agent)>>,
}

impl TokenCache {
    const TTL: Duration = Duration::from_secs(2);
    /// Past this many tokens the cache starts over (a hub has a few hundred
    /// agents at most; this only bounds memory).
    const MAX: usize = 4096;

    fn get(&self, hash: &str) -> Option<Agent> {
        let agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        agents
            .get(hash)
            .filter(|(at, _)| at.elapsed() < Self::TTL)
            .map(|(_, agent)| agent.clone())
    }

    fn put(&self, hash: &str, agent: &Agent) {
        let mut agents = self.agents.lock().unwrap_or_else(|e| e.into_inner());
        if agents.len() >= Self::MAX {
            agents.clear();
        }
        agents.insert(hash.to_owned(), (Instant::now(), agent.clone()));
    }

    fn clear(&self) {
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
