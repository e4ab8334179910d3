//! Bots: providers and plugin bots, the channels whose chats start with them,
//! where each bot chat stands, and the provider events already applied.

use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::batch::Query;
use super::{Ctx, Store, StoreError, flag};
use crate::clock::now_ms;
use crate::event::EventKind;

/// A bot: a provider reached over HTTP, or a plugin of the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bot {
    pub id: i64,
    /// Shown to customers and agents as the sender of its messages.
    pub name: String,
    /// The id in the provider's URLs to the hub.
    pub provider_id: String,
    pub target: BotTarget,
    /// Names of the channels whose new chats start with this bot.
    pub channels: Vec<String>,
    pub declared: bool,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BotTarget {
    /// The hub posts to `{endpoint}/{token}`; the provider posts back with the token.
    Provider {
        endpoint: String,
        token: String,
        auth: Option<BotAuth>,
    },
    /// A plugin answers in the hub (by name, from the wiring).
    Plugin(String),
}

/// The optional OAuth 2.0 client-credentials exchange with the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotAuth {
    pub token_url: String,
    pub client_id: String,
    pub secret: String,
}

impl Bot {
    /// The provider's token; plugin bots have none and take no provider requests.
    pub fn token(&self) -> Option<&str> {
        match &self.target {
            BotTarget::Provider { token, .. } => Some(token),
            BotTarget::Plugin(_) => None,
        }
    }

    pub fn auth(&self) -> Option<&BotAuth> {
        match &self.target {
            BotTarget::Provider { auth, .. } => auth.as_ref(),
            BotTarget::Plugin(_) => None,
        }
    }
}

/// What a bot is created from.
#[derive(Debug, Clone)]
pub struct NewBot<'a> {
    pub name: &'a str,
    pub provider_id: &'a str,
    pub target: &'a BotTarget,
    pub channels: &'a [String],
    pub declared: bool,
}

/// Where a chat that started with a bot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BotState {
    /// The bot holds the chat and hears every customer message.
    Bot,
    /// The bot invited an agent, and one was online: the chat waits for them.
    Invited,
    /// The bot invited an agent while none was online: the chat waits, and
    /// the bot still hears the customer (to collect contacts).
    Unavailable,
    /// An agent joined; the bot is done.
    Joined,
    /// The chat closed; the bot is done.
    Closed,
}

impl BotState {
    pub fn as_str(self) -> &'static str {
        match self {
            BotState::Bot => "bot",
            BotState::Invited => "invited",
            BotState::Unavailable => "unavailable",
            BotState::Joined => "joined",
            BotState::Closed => "closed",
        }
    }

    fn parse(s: &str) -> Result<BotState, StoreError> {
        Ok(match s {
            "bot" => BotState::Bot,
            "invited" => BotState::Invited,
            "unavailable" => BotState::Unavailable,
            "joined" => BotState::Joined,
            "closed" => BotState::Closed,
            other => return Err(StoreError::Corrupt(format!("bot chat state `{other}`"))),
        })
    }

    /// Whether the customer's messages go to the bot.
    pub fn hears_customer(self) -> bool {
        matches!(self, BotState::Bot | BotState::Unavailable)
    }

    /// Whether the bot is done with the chat (its messages are refused).
    pub fn is_done(self) -> bool {
        matches!(self, BotState::Joined | BotState::Closed)
    }
}

/// A chat's bot and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatBot {
    pub bot_id: i64,
    pub state: BotState,
    /// The bot's name, when the bot still exists.
    pub name: Option<String>,
}

const COLUMNS: &str = "id, name, provider_id, endpoint, token, plugin, auth_token_url, \
     auth_client_id, auth_secret, declared, created_at";

fn from_row(row: &AnyRow) -> Result<Bot, StoreError> {
    let get = |col: &str| -> Result<Option<String>, StoreError> {
        row.try_get::<Option<String>, _>(col).ctx("reading a bot")
    };
    let target = match (get("endpoint")?, get("token")?, get("plugin")?) {
        (_, _, Some(plugin)) => BotTarget::Plugin(plugin),
        (Some(endpoint), Some(token), None) => {
            let auth = match (
                get("auth_token_url")?,
                get("auth_client_id")?,
                get("auth_secret")?,
            ) {
                (Some(token_url), Some(client_id), Some(secret)) => Some(BotAuth {
                    token_url,
                    client_id,
                    secret,
                }),
                _ => None,
            };
            BotTarget::Provider {
                endpoint,
                token,
                auth,
            }
        }
        _ => return Err(StoreError::Corrupt("a bot without a target".into())),
    };
    Ok(Bot {
        id: row.try_get("id").ctx("reading a bot")?,
        name: row.try_get("name").ctx("reading a bot")?,
        provider_id: row.try_get("provider_id").ctx("reading a bot")?,
        target,
        channels: Vec::new(),
        declared: flag(row.try_get("declared").ctx("reading a bot")?),
        created_at: row.try_get("created_at").ctx("reading a bot")?,
    })
}

/// Binds the target's columns: endpoint, token, plugin, auth token URL,
/// client id, secret.
fn bind_target<'q>(query: Query<'q>, target: &'q BotTarget) -> Query<'q> {
    let columns: [Option<&str>; 6] = match target {
        BotTarget::Provider {
            endpoint,
            token,
            auth,
        } => [
            Some(endpoint),
            Some(token),
            None,
            auth.as_ref().map(|a| a.token_url.as_str()),
            auth.as_ref().map(|a| a.client_id.as_str()),
            auth.as_ref().map(|a| a.secret.as_str()),
        ],
        BotTarget::Plugin(name) => [None, None, Some(name), None, None, None],
    };
    columns.into_iter().fold(query, |q, c| q.bind(c))
}

impl Store {
    /// Inserts a bot and takes its channels from any bot that had them;
    /// `None` when the name or provider id is taken.
    pub async fn insert_bot(&self, new: NewBot<'_>) -> Result<Option<Bot>, StoreError> {
        let mut w = self.begin_write().await?;
        let sql = format!(
            "INSERT INTO bots (name, provider_id, endpoint, token, plugin, auth_token_url, \
             auth_client_id, auth_secret, declared, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT DO NOTHING RETURNING {COLUMNS}"
        );
        let row = sqlx::query(&sql).bind(new.name).bind(new.provider_id);
        let row = bind_target(row, new.target)
            .bind(i64::from(new.declared))
            .bind(now_ms())
            .fetch_optional(&mut *w.tx)
            .await
            .ctx("inserting a bot")?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut bot = from_row(&row)?;
        set_bot_channels(&mut w.tx, bot.id, new.channels).await?;
        w.commit().await?;
        bot.channels = new.channels.to_vec();
        Ok(Some(bot))
    }

    /// Brings a declared bot in line with `hub.toml` (its provider id stays).
    pub async fn update_declared_bot(&self, id: i64, new: NewBot<'_>) -> Result<(), StoreError> {
        let mut w = self.begin_write().await?;
        let update = sqlx::query(
            "UPDATE bots SET endpoint = $1, token = $2, plugin = $3, auth_token_url = $4, \
             auth_client_id = $5, auth_secret = $6, declared = 1 WHERE id = $7",
        );
        bind_target(update, new.target)
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("updating a bot")?;
        set_bot_channels(&mut w.tx, id, new.channels).await?;
        w.commit().await
    }

    /// Every bot with its channels, oldest first.
    pub async fn list_bots(&self) -> Result<Vec<Bot>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM bots ORDER BY id"))
            .fetch_all(self.pool())
            .await
            .ctx("listing bots")?;
        let mut bots = rows.iter().map(from_row).collect::<Result<Vec<_>, _>>()?;
        let channels: Vec<(i64, String)> =
            sqlx::query_as("SELECT bot_id, channel_name FROM bot_channels ORDER BY channel_name")
                .fetch_all(self.pool())
                .await
                .ctx("listing bot channels")?;
        for (bot_id, name) in channels {
            if let Some(bot) = bots.iter_mut().find(|b| b.id == bot_id) {
                bot.channels.push(name);
            }
        }
        Ok(bots)
    }

    /// Deletes a bot; the chats it held wait for agents. False when there was none.
    pub async fn delete_bot(&self, id: i64) -> Result<bool, StoreError> {
        let mut w = self.begin_write().await?;
        let done = sqlx::query("DELETE FROM bots WHERE id = $1")
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("deleting a bot")?
            .rows_affected();
        // The cascade is not relied on: SQLite enforces it only with foreign keys on.
        sqlx::query("DELETE FROM bot_channels WHERE bot_id = $1")
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("deleting a bot")?;
        // Chats the bot still held go to agents, as after INVITE_AGENT: no
        // bot will answer them again.
        sqlx::query(
            "UPDATE chat_bots SET state = 'invited', updated_at = $1 \
             WHERE bot_id = $2 AND state IN ('bot', 'unavailable')",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&mut *w.tx)
        .await
        .ctx("deleting a bot")?;
        w.commit().await?;
        Ok(done > 0)
    }

    /// Whether a provider event id was applied already (read before the
    /// pipeline, so a repeat costs no plugin call; [`mark_seen`] decides
    /// under the write).
    pub async fn bot_event_seen(&self, bot_id: i64, event_id: &str) -> Result<bool, StoreError> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT 1 FROM bot_events_seen WHERE bot_id = $1 AND event_id = $2")
                .bind(bot_id)
                .bind(event_id)
                .fetch_optional(self.pool())
                .await
                .ctx("de-duplicating a provider event")?;
        Ok(row.is_some())
    }

    /// The bot of a chat and where it stands, if the chat started with one.
    pub async fn chat_bot(&self, chat_id: i64) -> Result<Option<ChatBot>, StoreError> {
        let mut conn = self.pool().acquire().await.ctx("reading a chat's bot")?;
        chat_bot_in_tx(&mut conn, chat_id).await
    }
}

/// Gives a bot exactly `channels` (by name), taking them from other bots.
pub async fn set_bot_channels(
    conn: &mut AnyConnection,
    bot_id: i64,
    channels: &[String],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM bot_channels WHERE bot_id = $1")
        .bind(bot_id)
        .execute(&mut *conn)
        .await
        .ctx("assigning a bot's channels")?;
    for name in channels {
        sqlx::query(
            "INSERT INTO bot_channels (channel_name, bot_id) VALUES ($1, $2) \
             ON CONFLICT (channel_name) DO UPDATE SET bot_id = excluded.bot_id",
        )
        .bind(name)
        .bind(bot_id)
        .execute(&mut *conn)
        .await
        .ctx("assigning a bot's channels")?;
    }
    Ok(())
}

/// The bot of a chat, read in the caller's transaction.
pub async fn chat_bot_in_tx(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<ChatBot>, StoreError> {
    let row: Option<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT cb.bot_id, cb.state, b.name FROM chat_bots cb \
         LEFT JOIN bots b ON b.id = cb.bot_id WHERE cb.chat_id = $1",
    )
    .bind(chat_id)
    .fetch_optional(conn)
    .await
    .ctx("reading a chat's bot")?;
    row.map(|(bot_id, state, name)| {
        Ok(ChatBot {
            bot_id,
            state: BotState::parse(&state)?,
            name,
        })
    })
    .transpose()
}

/// Sets where a bot chat stands (the first call makes it a bot chat).
pub async fn set_chat_bot(
    conn: &mut AnyConnection,
    chat_id: i64,
    bot_id: i64,
    state: BotState,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO chat_bots (chat_id, bot_id, state, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (chat_id) DO UPDATE SET state = excluded.state, \
         updated_at = excluded.updated_at",
    )
    .bind(chat_id)
    .bind(bot_id)
    .bind(state.as_str())
    .bind(now)
    .execute(conn)
    .await
    .ctx("setting a chat's bot state")?;
    Ok(())
}

/// Whether the bot of `chat_id` is still to hear that it is done with the
/// chat: its `AGENT_JOINED` or `CHAT_CLOSED` waits to be sent (in order,
/// behind a request the bot is still answering).
pub async fn done_notice_pending(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<bool, StoreError> {
    let row: Option<(i64,)> = sqlx::query_as(
        "SELECT 1 FROM outbox WHERE order_key = $1 AND state = 'pending' \
         AND kind IN ($2, $3) LIMIT 1",
    )
    .bind(super::outbox::bot_order_key(chat_id))
    .bind(EventKind::BOT_AGENT_JOINED.as_str())
    .bind(EventKind::BOT_CHAT_CLOSED.as_str())
    .fetch_optional(conn)
    .await
    .ctx("looking for a bot's pending notice")?;
    Ok(row.is_some())
}

/// Records a provider event id; false when it was applied already.
pub async fn mark_seen(
    conn: &mut AnyConnection,
    bot_id: i64,
    event_id: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO bot_events_seen (bot_id, event_id, seen_at) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(bot_id)
    .bind(event_id)
    .bind(now)
    .execute(conn)
    .await
    .ctx("de-duplicating a provider event")?
    .rows_affected();
    Ok(done > 0)
}

/// The body of the chat's latest bot message, to match a customer's answer to its buttons.
pub async fn last_bot_message(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<String>, StoreError> {
    let row: Option<(String,)> = sqlx::query_as(
        "SELECT body FROM messages WHERE chat_id = $1 AND author = 'bot' \
         ORDER BY id DESC LIMIT 1",
    )
    .bind(chat_id)
    .fetch_optional(conn)
    .await
    .ctx("reading a chat's last bot message")?;
    Ok(row.map(|(body,)| body))
}

/// Stores a bot's message in its chat (and touches the chat); returns its id.
pub async fn insert_bot_message(
    conn: &mut AnyConnection,
    chat_id: i64,
    uid: &str,
    bot_name: &str,
    body: &str,
    delivery: Option<super::DeliveryState>,
    now: i64,
) -> Result<i64, StoreError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO messages (uid, chat_id, author, agent_id, body, delivery_state, \
         created_at, author_name) VALUES ($1, $2, 'bot', NULL, $3, $4, $5, $6) RETURNING id",
    )
    .bind(uid)
    .bind(chat_id)
    .bind(body)
    .bind(delivery.map(super::DeliveryState::as_str))
    .bind(now)
    .bind(bot_name)
    .fetch_one(&mut *conn)
    .await
    .ctx("storing a bot message")?;
    sqlx::query("UPDATE chats SET last_message_at = $1 WHERE id = $2")
        .bind(now)
        .bind(chat_id)
        .execute(conn)
        .await
        .ctx("touching a chat")?;
    Ok(id)
}

/// How many of the channel's agents are online.
pub async fn agents_online(conn: &mut AnyConnection, channel_id: i64) -> Result<i64, StoreError> {
    let (n,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM agents a JOIN channel_agents ca ON ca.agent_email = a.email \
         WHERE ca.channel_id = $1 AND a.online = 1",
    )
    .bind(channel_id)
    .fetch_one(conn)
    .await
    .ctx("counting agents online")?;
    Ok(n)
}
