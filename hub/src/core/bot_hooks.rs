//! The bot exchange's part of other actions' transactions: the bots by
//! channel, provider id and id (`BotDirectory`), and what a customer message,
//! an agent joining and a chat closing queue for a chat's bot, in the
//! transaction of that change.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use plugin_api::bot::{self, BotEvent, ChatNotice, ClientMessage, Sender, TextMessage, Timestamp};
use plugin_api::lenient::Label;
use serde_json::Value;
use uuid::Uuid;

use crate::event::{Direction, Event, EventKind};
use crate::store::bots::{
    BotTarget, agents_online, chat_bot_in_tx, last_bot_message, set_chat_bot,
};
use crate::store::events::insert_event;
use crate::store::ingress::CustomerWritten;
use crate::store::outbox::{PLUGIN_BOT_PREFIX, enqueue};
use crate::store::{Bot, BotState, Chat, Conn, NewDelivery, StoreError};

/// The bots, by what finds them; replaced whole when bots change.
#[derive(Debug, Default)]
pub struct Directory {
    by_id: HashMap<i64, Arc<Bot>>,
    by_channel: HashMap<String, Arc<Bot>>,
    by_provider: HashMap<String, Arc<Bot>>,
}

impl Directory {
    fn new(bots: Vec<Bot>) -> Directory {
        let mut d = Directory::default();
        for bot in bots {
            let bot = Arc::new(bot);
            for channel in &bot.channels {
                d.by_channel.insert(channel.clone(), bot.clone());
            }
            d.by_provider.insert(bot.provider_id.clone(), bot.clone());
            d.by_id.insert(bot.id, bot);
        }
        d
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The bot new chats of the channel named `channel` start with.
    pub fn for_channel(&self, channel: &str) -> Option<&Arc<Bot>> {
        self.by_channel.get(channel)
    }

    pub fn by_provider_id(&self, provider_id: &str) -> Option<&Arc<Bot>> {
        self.by_provider.get(provider_id)
    }

    pub fn by_id(&self, id: i64) -> Option<&Arc<Bot>> {
        self.by_id.get(&id)
    }
}

/// The current [`Directory`], shared by requests and the deliverer.
#[derive(Debug, Default)]
pub struct BotDirectory(RwLock<Arc<Directory>>);

impl BotDirectory {
    pub fn current(&self) -> Arc<Directory> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn replace(&self, bots: Vec<Bot>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Directory::new(bots));
    }
}

/// What a customer message needs to reach its chat's bot, in the ingress batch.
pub(super) struct BotHook {
    pub(super) directory: Arc<Directory>,
    pub(super) channel_name: String,
    pub(super) channel_public_id: String,
    pub(super) channel_kind: crate::store::ChannelKind,
    pub(super) site_id: i64,
}

/// Where requests to `bot` go.
fn target_of(bot: &Bot) -> String {
    match &bot.target {
        BotTarget::Provider {
            endpoint, token, ..
        } => format!("{}/{token}", endpoint.trim_end_matches('/')),
        BotTarget::Plugin(name) => format!("{PLUGIN_BOT_PREFIX}{name}"),
    }
}

/// Logs and queues an event to a bot; the event's id is the payload's `id`
/// (a UUID, the same on every attempt).
async fn queue_bot_event(
    conn: &mut Conn,
    bot: &Bot,
    chat: &Chat,
    kind: EventKind,
    payload: impl FnOnce(Uuid) -> BotEvent,
    now: i64,
) -> Result<(), StoreError> {
    let id = Uuid::now_v7();
    let body = serde_json::to_value(payload(id))
        .map_err(|e| StoreError::Corrupt(format!("cannot encode a bot event: {e}")))?;
    let mut event = Event::new(kind, Direction::Out, body)
        .on_channel(chat.channel_id)
        .in_chat(chat.id);
    event.id = id;
    event.at = now;
    insert_event(conn, &event).await?;
    let delivery = NewDelivery::bot(
        event.id,
        event.kind.as_str(),
        target_of(bot),
        event.payload.to_string(),
        chat.id,
    );
    enqueue(conn, &delivery, now).await
}

/// `AGENT_JOINED`, `AGENT_UNAVAILABLE` or `CHAT_CLOSED` to a provider; plugin
/// bots hear only the customer.
pub(super) async fn queue_notice(
    conn: &mut Conn,
    bot: &Bot,
    chat: &Chat,
    kind: EventKind,
    now: i64,
) -> Result<(), StoreError> {
    if matches!(bot.target, BotTarget::Plugin(_)) {
        return Ok(());
    }
    let make = |id: Uuid| {
        let notice = ChatNotice {
            id: Label(id.to_string()),
            client_id: Label(chat.client_id.to_string()),
            chat_id: Label(chat.id.to_string()),
        };
        if kind == EventKind::BOT_AGENT_JOINED {
            BotEvent::AgentJoined(notice)
        } else if kind == EventKind::BOT_AGENT_UNAVAILABLE {
            BotEvent::AgentUnavailable(notice)
        } else {
            BotEvent::ChatClosed(notice)
        }
    };
    queue_bot_event(conn, bot, chat, kind.clone(), make, now).await
}

/// In the transaction of a stored customer message: a new chat on a bot's
/// channel starts with the bot, and a message of a chat whose bot hears the
/// customer becomes a `CLIENT_MESSAGE` to it. True when a request was queued.
pub(super) async fn on_customer_message(
    conn: &mut Conn,
    hook: &BotHook,
    written: &CustomerWritten,
    now: i64,
) -> Result<bool, StoreError> {
    let (Some(chat), Some(message)) = (&written.chat, &written.message) else {
        return Ok(false);
    };
    let found = if written.opened {
        match hook.directory.for_channel(&hook.channel_name) {
            Some(bot) => {
                set_chat_bot(conn, chat.id, bot.id, BotState::Bot, now).await?;
                Some((bot.clone(), BotState::Bot))
            }
            None => None,
        }
    } else {
        chat_bot_in_tx(conn, chat.id).await?.and_then(|cb| {
            hook.directory
                .by_id(cb.bot_id)
                .map(|bot| (bot.clone(), cb.state))
        })
    };
    let Some((bot, state)) = found else {
        return Ok(false);
    };
    if !state.hears_customer() {
        return Ok(false);
    }
    let text = text_for_bot(&message.body);
    let button_id = last_bot_message(conn, chat.id)
        .await?
        .and_then(|body| serde_json::from_str::<bot::Message>(&body).ok())
        .and_then(|m| m.button_for(&text).and_then(|b| b.id.clone()));
    let online = agents_online(conn, chat.channel_id).await? > 0;
    let client = &written.client;
    let has_contacts = client.phone.is_some() || client.email.is_some();
    let make = |id: Uuid| {
        BotEvent::ClientMessage(ClientMessage {
            id: Label(id.to_string()),
            site_id: Some(Label(hook.site_id.to_string())),
            client_id: Label(client.id.to_string()),
            chat_id: Label(chat.id.to_string()),
            agents_online: Some(online),
            sender: Some(Sender {
                id: plugin_api::webhook::NumericId(client.id),
                name: client.name.clone(),
                url: client.url.clone(),
                has_contacts: Some(has_contacts),
                email: client.email.clone(),
                phone: client.phone.clone(),
            }),
            message: bot::Message::Text(TextMessage {
                text,
                button_id,
                timestamp: Timestamp::from_unix(now / 1000),
            }),
            channel: Some(bot::Channel {
                id: Label(hook.channel_public_id.clone()),
                kind: hook.channel_kind.as_str().to_owned(),
            }),
        })
    };
    queue_bot_event(conn, &bot, chat, EventKind::BOT_CLIENT_MESSAGE, make, now).await?;
    Ok(true)
}

/// What a bot reads of a customer's message: the text, or for media the
/// file's URL (after the caption), never nothing.
fn text_for_bot(body: &Value) -> String {
    use plugin_api::channel::Message as M;
    match serde_json::from_value::<M>(body.clone()) {
        Ok(M::Text(t)) => t.text,
        Ok(
            M::Video(m) | M::Audio(m) | M::Voice(m) | M::Photo(m) | M::Sticker(m) | M::Document(m),
        ) => match m.text.filter(|t| !t.trim().is_empty()) {
            Some(caption) => format!("{caption}\n{}", m.file),
            None => m.file,
        },
        Ok(M::Location(l)) => format!("{}, {}", l.latitude, l.longitude),
        Ok(other) => other.preview(),
        Err(_) => body.to_string(),
    }
}

/// In the transaction of an agent accepting `chat`: a bot that had it hears
/// `AGENT_JOINED` and is done. True when a request was queued.
pub(super) async fn on_agent_joined(
    conn: &mut Conn,
    directory: &Directory,
    chat: &Chat,
    now: i64,
) -> Result<bool, StoreError> {
    settle(conn, directory, chat, BotState::Joined, now).await
}

/// In the transaction of closing `chat`: its bot hears `CHAT_CLOSED` (also
/// after an agent joined) and is done.
pub(super) async fn on_chat_closed(
    conn: &mut Conn,
    directory: &Directory,
    chat: &Chat,
    now: i64,
) -> Result<bool, StoreError> {
    settle(conn, directory, chat, BotState::Closed, now).await
}

async fn settle(
    conn: &mut Conn,
    directory: &Directory,
    chat: &Chat,
    to: BotState,
    now: i64,
) -> Result<bool, StoreError> {
    let Some(cb) = chat_bot_in_tx(conn, chat.id).await? else {
        return Ok(false);
    };
    let already = match to {
        BotState::Joined => cb.state.is_done(),
        _ => cb.state == BotState::Closed,
    };
    if already {
        return Ok(false);
    }
    set_chat_bot(conn, chat.id, cb.bot_id, to, now).await?;
    let Some(bot) = directory.by_id(cb.bot_id) else {
        return Ok(false);
    };
    let kind = match to {
        BotState::Joined => EventKind::BOT_AGENT_JOINED,
        _ => EventKind::BOT_CHAT_CLOSED,
    };
    queue_notice(conn, bot, chat, kind, now).await?;
    Ok(true)
}
