//! Channels and the agents assigned to them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Ctx, Store, StoreError, flag};
use crate::clock::now_ms;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Channel {
    pub id: i64,
    pub public_id: String,
    pub name: String,
    pub customer_endpoint: String,
    pub chunked: bool,
    pub declared: bool,
    pub agents: Vec<String>,
    pub created_at: i64,
    /// Receiver of the channel's event webhooks.
    pub webhook_url: Option<String>,
    /// Whether its webhooks are signed (the secret itself is not shown).
    pub webhook_signed: bool,
    pub kind: ChannelKind,
    /// The widget's colour (`#rrggbb`), widget channels only.
    pub color: Option<String>,
    /// Origins allowed to use the widget's endpoints; empty: any.
    pub allowed_origins: Vec<String>,
    /// The widget's callback calls as configured (JSON; the core reads it as
    /// `config::CallsConfig`); `None`: off.
    pub calls: Option<serde_json::Value>,
}

/// How a channel's customers reach the hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelKind {
    /// An integrator's server posts customer messages; agent messages go to
    /// its `customer_endpoint`.
    #[default]
    Custom,
    /// Visitors' browsers talk to the hub through its widget script; the
    /// channel's `public_id` is the widget id, and agent messages reach the
    /// visitor's open page live (no integrator, no outbound request).
    Widget,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Custom => "custom",
            ChannelKind::Widget => "widget",
        }
    }
}

impl Channel {
    pub fn is_widget(&self) -> bool {
        self.kind == ChannelKind::Widget
    }
}

/// What a new channel is made of; `public_id` comes from [`crate::ids`].
pub struct NewChannel<'a> {
    pub public_id: &'a str,
    pub name: &'a str,
    pub customer_endpoint: &'a str,
    pub chunked: bool,
    pub declared: bool,
    pub agents: &'a [String],
    pub kind: ChannelKind,
    pub color: Option<&'a str>,
    pub allowed_origins: &'a [String],
    pub calls: Option<serde_json::Value>,
}

const COLUMNS: &str = "id, public_id, name, customer_endpoint, chunked, declared, created_at, \
     webhook_url, webhook_secret, kind, color, allowed_origins, calls";

fn origins_json(origins: &[String]) -> Option<String> {
    (!origins.is_empty()).then(|| serde_json::Value::from(origins.to_vec()).to_string())
}

fn from_row(row: &AnyRow) -> Result<Channel, sqlx::Error> {
    Ok(Channel {
        id: row.try_get("id")?,
        public_id: row.try_get("public_id")?,
        name: row.try_get("name")?,
        customer_endpoint: row.try_get("customer_endpoint")?,
        chunked: flag(row.try_get("chunked")?),
        declared: flag(row.try_get("declared")?),
        agents: Vec::new(),
        created_at: row.try_get("created_at")?,
        webhook_url: row.try_get("webhook_url")?,
        webhook_signed: row
            .try_get::<Option<String>, _>("webhook_secret")?
            .is_some(),
        kind: match row.try_get::<String, _>("kind")?.as_str() {
            "widget" => ChannelKind::Widget,
            _ => ChannelKind::Custom,
        },
        color: row.try_get("color")?,
        allowed_origins: row
            .try_get::<Option<String>, _>("allowed_origins")?
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default(),
        calls: row
            .try_get::<Option<String>, _>("calls")?
            .and_then(|j| serde_json::from_str(&j).ok()),
    })
}

fn calls_json(calls: Option<&serde_json::Value>) -> Option<String> {
    calls.map(serde_json::Value::to_string)
}

impl Store {
    /// Inserts a channel and its agent list; `None` when its name or public
    /// id is taken (also by another instance inserting at the same moment:
    /// the insert waits for it and then does nothing).
    pub async fn insert_channel(&self, new: NewChannel<'_>) -> Result<Option<Channel>, StoreError> {
        let mut w = self.begin_write().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO channels (public_id, name, customer_endpoint, chunked, declared, created_at, \
             kind, color, allowed_origins, calls) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT DO NOTHING RETURNING {COLUMNS}"
        ))
        .bind(new.public_id)
        .bind(new.name)
        .bind(new.customer_endpoint)
        .bind(i64::from(new.chunked))
        .bind(i64::from(new.declared))
        .bind(now_ms())
        .bind(new.kind.as_str())
        .bind(new.color)
        .bind(origins_json(new.allowed_origins))
        .bind(calls_json(new.calls.as_ref()))
        .fetch_optional(&mut *w.tx)
        .await
        .ctx("inserting a channel")?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut channel = from_row(&row).ctx("reading a channel")?;
        for email in new.agents {
            sqlx::query(
                "INSERT INTO channel_agents (channel_id, agent_email) VALUES ($1, $2) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(channel.id)
            .bind(email.to_lowercase())
            .execute(&mut *w.tx)
            .await
            .ctx("assigning an agent")?;
        }
        w.commit().await?;
        self.channel_cache.clear();
        channel.agents = self.channel_agents(channel.id).await?;
        Ok(Some(channel))
    }

    /// Brings a declared channel's endpoint, chunked flag, widget settings
    /// and agents in line with `hub.toml` (its kind and ids stay).
    pub async fn update_declared_channel(
        &self,
        id: i64,
        new: &NewChannel<'_>,
    ) -> Result<(), StoreError> {
        let agents = new.agents;
        let mut w = self.begin_write().await?;
        sqlx::query(
            "UPDATE channels SET customer_endpoint = $1, chunked = $2, declared = 1, \
             color = $3, allowed_origins = $4, calls = $5 WHERE id = $6",
        )
        .bind(new.customer_endpoint)
        .bind(i64::from(new.chunked))
        .bind(new.color)
        .bind(origins_json(new.allowed_origins))
        .bind(calls_json(new.calls.as_ref()))
        .bind(id)
        .execute(&mut *w.tx)
        .await
        .ctx("updating a channel")?;
        replace_agents(&mut w.tx, id, agents).await?;
        w.commit().await?;
        self.channel_cache.clear();
        Ok(())
    }

    /// Replaces the agents of a channel (by e-mail); `false` when there is
    /// no such channel.
    pub async fn set_channel_agents(&self, id: i64, agents: &[String]) -> Result<bool, StoreError> {
        let mut w = self.begin_write().await?;
        let found: Option<(i64,)> = sqlx::query_as("SELECT id FROM channels WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *w.tx)
            .await
            .ctx("looking up a channel")?;
        if found.is_none() {
            return Ok(false);
        }
        replace_agents(&mut w.tx, id, agents).await?;
        w.commit().await?;
        self.channel_cache.clear();
        Ok(true)
    }

    pub async fn channel_by_name(&self, name: &str) -> Result<Option<Channel>, StoreError> {
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM channels WHERE name = $1"))
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .ctx("looking up a channel")?;
        self.with_agents(row).await
    }

    /// The channel of an endpoint address: every customer message asks, so
    /// found channels are kept for [`CHANNEL_TTL`] (changes made by this
    /// process drop them at once).
    pub async fn channel_by_public_id(
        &self,
        public_id: &str,
    ) -> Result<Option<Channel>, StoreError> {
        if let Some(channel) = self.channel_cache.get(public_id) {
            return Ok(Some(channel));
        }
        let found = self.read_channel_by_public_id(public_id).await?;
        if let Some(channel) = &found {
            self.channel_cache.put(channel);
        }
        Ok(found)
    }

    async fn read_channel_by_public_id(
        &self,
        public_id: &str,
    ) -> Result<Option<Channel>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM channels WHERE public_id = $1"
        ))
        .bind(public_id)
        .fetch_optional(self.pool())
        .await
        .ctx("looking up a channel")?;
        self.with_agents(row).await
    }

    /// A channel by id, from the same cache as [`channel_by_public_id`](Store::channel_by_public_id).
    pub async fn channel_by_id(&self, id: i64) -> Result<Option<Channel>, StoreError> {
        if let Some(channel) = self.channel_cache.get_by_id(id) {
            return Ok(Some(channel));
        }
        let row = sqlx::query(&format!("SELECT {COLUMNS} FROM channels WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .ctx("looking up a channel")?;
        let found = self.with_agents(row).await?;
        if let Some(channel) = &found {
            self.channel_cache.put(channel);
        }
        Ok(found)
    }

    pub async fn list_channels(&self) -> Result<Vec<Channel>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM channels ORDER BY id"))
            .fetch_all(self.pool())
            .await
            .ctx("listing channels")?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let mut ch = from_row(row).ctx("reading a channel")?;
            ch.agents = self.channel_agents(ch.id).await?;
            out.push(ch);
        }
        Ok(out)
    }

    async fn with_agents(&self, row: Option<AnyRow>) -> Result<Option<Channel>, StoreError> {
        let Some(row) = row else { return Ok(None) };
        let mut ch = from_row(&row).ctx("reading a channel")?;
        ch.agents = self.channel_agents(ch.id).await?;
        Ok(Some(ch))
    }

    async fn channel_agents(&self, channel_id: i64) -> Result<Vec<String>, StoreError> {
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT agent_email FROM channel_agents WHERE channel_id = $1 ORDER BY agent_email",
        )
        .bind(channel_id)
        .fetch_all(self.pool())
        .await
        .ctx("listing channel agents")?;
        Ok(rows.into_iter().map(|(e,)| e).collect())
    }

    /// Sets (or with `None`, removes) the receiver of a channel's event webhooks.
    pub async fn set_channel_webhook(
        &self,
        channel_id: i64,
        url: Option<&str>,
        secret: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        sqlx::query("UPDATE channels SET webhook_url = $1, webhook_secret = $2 WHERE id = $3")
            .bind(url)
            .bind(secret)
            .bind(channel_id)
            .execute(&mut *w.tx)
            .await
            .ctx("setting a channel's webhook receiver")?;
        w.commit().await?;
        self.channel_cache.clear();
        Ok(())
    }

    /// True when an agent assigned to the channel is online: the status endpoint's answer.
    pub async fn channel_has_online_agent(&self, channel_id: i64) -> Result<bool, StoreError> {
        let row: Option<(i64,)> = sqlx::query_as(
            "SELECT a.id FROM channel_agents ca JOIN agents a ON a.email = ca.agent_email \
             WHERE ca.channel_id = $1 AND a.online = 1 LIMIT 1",
        )
        .bind(channel_id)
        .fetch_optional(self.pool())
        .await
        .ctx("checking channel availability")?;
        Ok(row.is_some())
    }

    /// How many of the channel's agents are online; plugins see it as context.
    pub async fn channel_online_agents(&self, channel_id: i64) -> Result<i64, StoreError> {
        let row: (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM channel_agents ca JOIN agents a ON a.email = ca.agent_email \
             WHERE ca.channel_id = $1 AND a.online = 1",
        )
        .bind(channel_id)
        .fetch_one(self.pool())
        .await
        .ctx("counting online agents")?;
        Ok(row.0)
    }
}

/// How stale a cached channel may be when another process (the CLI, a
/// second hub) changed it.
pub const CHANNEL_TTL: Duration = Duration::from_secs(1);

/// Channels by public id (and their ids), each with the time it was read.
#[derive(Default)]
pub(super) struct ChannelCache(Mutex<CacheMaps>);

#[derive(Default)]
struct CacheMaps {
    by_public_id: HashMap<String, (Instant, Channel)>,
    public_ids: HashMap<i64, String>,
}

impl ChannelCache {
    fn get(&self, public_id: &str) -> Option<Channel> {
        let maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match maps.by_public_id.get(public_id) {
            Some((at, channel)) if at.elapsed() < CHANNEL_TTL => Some(channel.clone()),
            _ => None,
        }
    }

    fn get_by_id(&self, id: i64) -> Option<Channel> {
        let maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let public_id = maps.public_ids.get(&id)?;
        match maps.by_public_id.get(public_id) {
            Some((at, channel)) if at.elapsed() < CHANNEL_TTL => Some(channel.clone()),
            _ => None,
        }
    }

    fn put(&self, channel: &Channel) {
        let mut maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        maps.public_ids
            .insert(channel.id, channel.public_id.clone());
        maps.by_public_id
            .insert(channel.public_id.clone(), (Instant::now(), channel.clone()));
    }

    fn clear(&self) {
        let mut maps = self.0.lock().unwrap_or_else(|e| e.into_inner());
        maps.by_public_id.clear();
        maps.public_ids.clear();
    }
}

async fn replace_agents(
    tx: &mut super::Conn,
    channel_id: i64,
    agents: &[String],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM channel_agents WHERE channel_id = $1")
        .bind(channel_id)
        .execute(&mut *tx)
        .await
        .ctx("clearing channel agents")?;
    for email in agents {
        sqlx::query(
            "INSERT INTO channel_agents (channel_id, agent_email) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(channel_id)
        .bind(email.to_lowercase())
        .execute(&mut *tx)
        .await
        .ctx("assigning an agent")?;
    }
    Ok(())
}
