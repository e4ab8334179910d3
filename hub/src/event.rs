//! The one envelope every request and delivery becomes on its way through the hub.

use std::borrow::Cow;

use serde::Serialize;
use uuid::Uuid;

/// Dotted event kind, for example `channel.customer_message`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct EventKind(Cow<'static, str>);

impl EventKind {
    pub const CUSTOMER_MESSAGE: EventKind = EventKind::fixed("channel.customer_message");
    pub const CUSTOMER_TYPING: EventKind = EventKind::fixed("channel.customer_typing");
    pub const AGENT_MESSAGE: EventKind = EventKind::fixed("channel.agent_message");
    pub const AGENT_TYPING: EventKind = EventKind::fixed("channel.agent_typing");
    /// Agent actions integrators hear of; plugins see them before anything
    /// changes, and may drop or refuse them.
    pub const AGENT_ACCEPT: EventKind = EventKind::fixed("agent.accept");
    pub const AGENT_CLOSE: EventKind = EventKind::fixed("agent.close");
    pub const AGENT_CRM_LINK: EventKind = EventKind::fixed("agent.crm_link");
    pub const AGENT_ATTRIBUTES: EventKind = EventKind::fixed("agent.attributes");
    pub const AGENT_CALL: EventKind = EventKind::fixed("agent.call");
    /// A visitor's message through the widget's offline form.
    pub const OFFLINE_MESSAGE: EventKind = EventKind::fixed("widget.offline_message");
    /// The bot exchange: what the hub sends a bot (out) and what a bot
    /// sends the hub (in); a plugin bot's answers are `bot.*` events too.
    pub const BOT_CLIENT_MESSAGE: EventKind = EventKind::fixed("bot.client_message");
    pub const BOT_AGENT_JOINED: EventKind = EventKind::fixed("bot.agent_joined");
    pub const BOT_AGENT_UNAVAILABLE: EventKind = EventKind::fixed("bot.agent_unavailable");
    pub const BOT_CHAT_CLOSED: EventKind = EventKind::fixed("bot.chat_closed");
    pub const BOT_MESSAGE: EventKind = EventKind::fixed("bot.bot_message");
    pub const BOT_INVITE_AGENT: EventKind = EventKind::fixed("bot.invite_agent");
    pub const BOT_CLIENT_INFO: EventKind = EventKind::fixed("bot.client_info");
    /// How a request to a bot provider (or a plugin bot's call) ended.
    pub const BOT_DELIVERY_RESULT: EventKind = EventKind::fixed("bot.delivery_result");
    pub const DELIVERY_RESULT: EventKind = EventKind::fixed("channel.delivery_result");
    /// How a plugin's forward to a destination ended.
    pub const FORWARD_RESULT: EventKind = EventKind::fixed("forward.delivery_result");
    /// How an event or CRM webhook ended, with the receiver's answer.
    pub const WEBHOOK_RESULT: EventKind = EventKind::fixed("webhook.delivery_result");

    const fn fixed(kind: &'static str) -> EventKind {
        EventKind(Cow::Borrowed(kind))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for EventKind {
    fn from(s: String) -> Self {
        EventKind(Cow::Owned(s))
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Received by the hub.
    In,
    /// To be sent by the hub.
    Out,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
    pub fn parse(s: &str) -> Option<Direction> {
        match s {
            "in" => Some(Direction::In),
            "out" => Some(Direction::Out),
            _ => None,
        }
    }
}

/// Something that crossed (or is about to cross) the hub's boundary.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub id: Uuid,
    pub kind: EventKind,
    pub direction: Direction,
    pub channel_id: Option<i64>,
    pub chat_id: Option<i64>,
    /// The payload exactly as on the wire.
    pub payload: serde_json::Value,
    /// Unix milliseconds.
    pub at: i64,
}

impl Event {
    pub fn new(kind: EventKind, direction: Direction, payload: serde_json::Value) -> Event {
        Event {
            id: Uuid::now_v7(),
            kind,
            direction,
            channel_id: None,
            chat_id: None,
            payload,
            at: crate::clock::now_ms(),
        }
    }

    pub fn on_channel(mut self, channel_id: i64) -> Event {
        self.channel_id = Some(channel_id);
        self
    }

    pub fn in_chat(mut self, chat_id: i64) -> Event {
        self.chat_id = Some(chat_id);
        self
    }

    /// A tracing span carrying the event's id, kind, channel and chat.
    pub fn span(&self) -> tracing::Span {
        tracing::info_span!(
            "event",
            id = %self.id,
            kind = %self.kind,
            channel = self.channel_id,
            chat = self.chat_id
        )
    }
}
