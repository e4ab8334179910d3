//! Event webhook payloads built from what the hub knows, read in the
//! transaction that queues them. A field the hub cannot know is null or absent
//! as the spec allows; nothing is invented.

use plugin_api::lenient::Label;
use plugin_api::webhook::{
    AssignedAgent, Call, Chat as ChatLog, ChatAssigned, ChatEvent, ChatFinished, ChatMessage,
    ChatMessageKind, ClientAttributeUpdated, ClientUpdated, NumericId, Organization, Page, Rate,
    Session, Status, Tag, Visitor, WebhookEvent,
};
use serde_json::{Map, Value};

use crate::store::webhooks::{self as rows, Titled};
use crate::store::{Conn, StoreError};

/// What every chat and client event says about the client.
struct Known {
    channel_id: i64,
    widget_id: Label,
    user_token: Option<String>,
    visitor: Visitor,
    url: Option<String>,
    page_title: Option<String>,
    /// What a widget visitor's page reported (empty for other channels).
    session: Session,
    organization: Option<Organization>,
    status: Option<Status>,
    assigned_agent: Option<AssignedAgent>,
    tags: Vec<Tag>,
    attributes: Map<String, Value>,
}

async fn known(conn: &mut Conn, client_id: i64) -> Result<Option<Known>, StoreError> {
    match rows::client_card(conn, client_id).await? {
        Some(card) => known_of(conn, card).await.map(Some),
        None => Ok(None),
    }
}

/// What a client card says, with the organization and assigned agent it
/// names (a statement each, only when it names them).
async fn known_of(conn: &mut Conn, card: rows::ClientCard) -> Result<Known, StoreError> {
    let visitor = Visitor {
        name: card.name,
        email: card.email,
        phone: card.phone,
        description: card.description.unwrap_or_default(),
        number: Label(card.visitor_number.unwrap_or_default().to_string()),
        social: None,
        chats_count: u64::try_from(card.chats_count).unwrap_or(0),
    };
    let attributes = card
        .attributes
        .and_then(|a| serde_json::from_str::<Map<String, Value>>(&a).ok())
        .unwrap_or_default();
    let mut known = Known {
        channel_id: card.channel_id,
        widget_id: Label(card.public_id),
        user_token: card.user_token,
        visitor,
        url: card.url,
        page_title: card.page_title,
        session: Session {
            geoip: card.geoip_json.and_then(|g| serde_json::from_str(&g).ok()),
            utm: None,
            utm_json: card.utm_json.and_then(|u| serde_json::from_str(&u).ok()),
            ip_addr: card.ip,
            user_agent: card.user_agent,
        },
        organization: None,
        status: None,
        assigned_agent: None,
        tags: Vec::new(),
        attributes,
    };
    if let Some(id) = card.organization_id {
        known.organization = rows::organization(conn, id).await?.map(|o| Organization {
            id: NumericId(o.id),
            name: o.name,
        });
    }
    known.status = card.status.map(|Titled { id, title }| Status {
        id: NumericId(id),
        title,
    });
    if let Some(id) = card.assigned_agent_id {
        known.assigned_agent = rows::agent(conn, id).await?.map(|a| AssignedAgent {
            id: NumericId(a.id),
            email: a.email,
            name: a.name,
        });
    }
    known.tags = card
        .tags
        .into_iter()
        .map(|Titled { id, title }| Tag {
            id: NumericId(id),
            title,
        })
        .collect();
    Ok(known)
}

async fn agent(conn: &mut Conn, id: i64) -> Result<Option<plugin_api::webhook::Agent>, StoreError> {
    Ok(rows::agent(conn, id).await?.map(webhook_agent))
}

/// An agent as a payload names it.
fn webhook_agent(a: rows::AgentRef) -> plugin_api::webhook::Agent {
    plugin_api::webhook::Agent {
        id: NumericId(a.id),
        name: a.name,
        email: a.email,
        phone: None,
    }
}

/// The page the visitor is on: the one a reply named (`integration`, the
/// chat's integration data as stored), else the customer's `url` (and a
/// widget page's title).
fn page(integration: Option<&str>, k: &Known) -> Page {
    let (url, title) = (k.url.as_deref(), k.page_title.clone());
    let from_reply = integration
        .and_then(|i| serde_json::from_str::<Value>(i).ok())
        .and_then(|i| serde_json::from_value::<Page>(i.get("page")?.clone()).ok());
    from_reply.unwrap_or_else(|| Page {
        url: url.unwrap_or_default().to_owned(),
        title,
    })
}

/// A chat and its client, as the chat's webhooks describe them: `None` if
/// the chat does not exist.
async fn chat_known(
    conn: &mut Conn,
    chat_id: i64,
) -> Result<Option<(rows::ChatParties, Known)>, StoreError> {
    match rows::chat_cards(conn, &[chat_id]).await?.pop() {
        Some(c) => Ok(Some((c.parties, known_of(conn, c.card).await?))),
        None => Ok(None),
    }
}

/// A `chat_accepted` / `chat_updated` payload and where it goes.
#[derive(Debug)]
pub struct ChatEventOf {
    pub chat_id: i64,
    pub channel_id: i64,
    pub receiver: rows::ChannelReceiver,
    pub body: ChatEvent,
}

/// `chat_accepted` / `chat_updated` (and the base of `chat_assigned`):
/// `(channel id, payload)`. `agent` is the chat's agent, if any.
pub async fn chat_event(
    conn: &mut Conn,
    chat_id: i64,
) -> Result<Option<(i64, ChatEvent)>, StoreError> {
    match rows::chat_cards(conn, &[chat_id]).await?.pop() {
        Some(card) => {
            let e = chat_event_of(conn, card).await?;
            Ok(Some((e.channel_id, e.body)))
        }
        None => Ok(None),
    }
}

/// [`chat_event`]'s payload from a chat's card read already (a batch reads
/// the cards of all its chats at once), and where it goes.
pub async fn chat_event_of(
    conn: &mut Conn,
    rows::ChatCard {
        chat_id,
        parties,
        mut card,
    }: rows::ChatCard,
) -> Result<ChatEventOf, StoreError> {
    let receiver = std::mem::take(&mut card.receiver);
    let k = known_of(conn, card).await?;
    let agent = parties.agent.map(webhook_agent);
    let page = page(parties.integration.as_deref(), &k);
    Ok(ChatEventOf {
        chat_id,
        channel_id: k.channel_id,
        receiver,
        body: ChatEvent {
            widget_id: k.widget_id,
            user_token: k.user_token,
            visitor: k.visitor,
            organization: k.organization,
            status: k.status,
            assigned_agent: k.assigned_agent,
            tags: k.tags,
            chat_id: NumericId(chat_id),
            department: None,
            session: k.session.clone(),
            page,
            analytics: None,
            agent,
            topic: None,
        },
    })
}

pub async fn chat_assigned(
    conn: &mut Conn,
    chat_id: i64,
    assign_to: String,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some((channel, chat)) = chat_event(conn, chat_id).await? else {
        return Ok(None);
    };
    Ok(Some((
        channel,
        WebhookEvent::ChatAssigned(ChatAssigned { chat, assign_to }),
    )))
}

pub async fn client_updated(
    conn: &mut Conn,
    client_id: i64,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let body = ClientUpdated {
        widget_id: k.widget_id,
        user_token: k.user_token,
        visitor: k.visitor,
        organization: k.organization,
        status: k.status,
        assigned_agent: k.assigned_agent,
        tags: k.tags,
        client_id: NumericId(client_id),
    };
    Ok(Some((k.channel_id, WebhookEvent::ClientUpdated(body))))
}

/// `client_attribute_updated` with the client's attributes as stored now.
pub async fn client_attribute_updated(
    conn: &mut Conn,
    client_id: i64,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let body = ClientAttributeUpdated {
        widget_id: k.widget_id,
        user_token: k.user_token,
        client_id: NumericId(client_id),
        attributes: k.attributes,
    };
    Ok(Some((
        k.channel_id,
        WebhookEvent::ClientAttributeUpdated(body),
    )))
}

/// `chat_finished`: the whole chat log, as plain text and as escaped HTML too.
pub async fn chat_finished(
    conn: &mut Conn,
    chat_id: i64,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some((parties, k)) = chat_known(conn, chat_id).await? else {
        return Ok(None);
    };
    let log = rows::chat_log(conn, chat_id).await?;
    let mut messages = Vec::with_capacity(log.len());
    let mut agent_ids: Vec<i64> = Vec::new();
    let mut plain = String::new();
    let mut html = String::new();
    for entry in log {
        let rows::LogEntry {
            author,
            agent_id,
            author_name,
            body,
            created_at: at,
        } = entry;
        // A bot's message is stored as the bot sent it (TEXT, MARKDOWN, BUTTONS).
        let text = if author == "bot" {
            serde_json::from_str::<plugin_api::bot::Message>(&body)
                .map(|m| m.display_text())
                .unwrap_or_default()
        } else {
            serde_json::from_str::<plugin_api::channel::Message>(&body)
                .map(|m| m.preview())
                .unwrap_or_default()
        };
        let kind = if author == "client" {
            ChatMessageKind::Visitor
        } else {
            ChatMessageKind::Agent
        };
        if let Some(id) = agent_id
            && !agent_ids.contains(&id)
        {
            agent_ids.push(id);
        }
        let who = match (kind, author_name) {
            (ChatMessageKind::Visitor, _) => {
                k.visitor.name.clone().unwrap_or_else(|| "Visitor".into())
            }
            (ChatMessageKind::Agent, Some(name)) => name,
            (ChatMessageKind::Agent, None) => "Agent".to_owned(),
        };
        plain.push_str(&format!("{who}: {text}\n"));
        html.push_str(&format!(
            "<p><b>{}</b>: {}</p>",
            escape_html(&who),
            escape_html(&text)
        ));
        messages.push(ChatMessage {
            message: text,
            timestamp: at / 1000,
            kind,
            agent_id: agent_id.map(NumericId),
            blacklisted: None,
        });
    }
    let mut agents = Vec::with_capacity(agent_ids.len());
    for id in agent_ids {
        if let Some(a) = agent(conn, id).await? {
            agents.push(a);
        }
    }
    let rows::ChatEnd { rate, blacklisted } = rows::chat_end(conn, chat_id).await?;
    let page = page(parties.integration.as_deref(), &k);
    let body = ChatFinished {
        widget_id: Some(k.widget_id),
        user_token: k.user_token,
        visitor: k.visitor,
        agents,
        chat: ChatLog {
            messages,
            blacklisted,
            rate: match rate.as_deref() {
                Some("positive") => Some(Rate::Positive),
                Some("negative") => Some(Rate::Negative),
                _ => None,
            },
            invitation: None,
        },
        chat_id: NumericId(chat_id),
        session: k.session.clone(),
        page,
        plain_messages: plain,
        html_messages: html,
        organization: k.organization,
        status: k.status,
        assigned_agent: k.assigned_agent,
        tags: k.tags,
        analytics: None,
        topic: None,
    };
    Ok(Some((k.channel_id, WebhookEvent::ChatFinished(body))))
}

/// `call_event` for a call the agent reported.
/// `call_event`; `agent_id` is `None` for a widget visitor's callback
/// request no agent has taken yet (the payload then has no `agent`).
pub async fn call_event(
    conn: &mut Conn,
    chat_id: i64,
    agent_id: Option<i64>,
    call: Call,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some((parties, k)) = chat_known(conn, chat_id).await? else {
        return Ok(None);
    };
    let agent = match agent_id {
        Some(id) => match agent(conn, id).await? {
            Some(a) => Some(a),
            None => return Ok(None),
        },
        None => None,
    };
    let page = page(parties.integration.as_deref(), &k);
    let body = plugin_api::webhook::CallEvent {
        chat_id: NumericId(chat_id),
        widget_id: k.widget_id,
        visitor: k.visitor,
        agent,
        department: None,
        session: k.session.clone(),
        page,
        call,
        analytics: None,
        topic: None,
    };
    Ok(Some((k.channel_id, WebhookEvent::CallEvent(body))))
}

/// Text shown as text: `<`, `>`, `&` and quotes cannot become markup.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `offline_message` for a message left through the widget's offline form.
pub async fn offline_message(
    conn: &mut Conn,
    client_id: i64,
    chat_id: i64,
    offline_message_id: i64,
    message: String,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let body = plugin_api::webhook::OfflineMessage {
        widget_id: k.widget_id,
        user_token: k.user_token,
        visitor: k.visitor,
        session: k.session.clone(),
        page: Page {
            url: k.url.unwrap_or_default(),
            title: k.page_title,
        },
        analytics: None,
        chat_id: NumericId(chat_id),
        message,
        offline_message_id: plugin_api::lenient::ExternalId::Int(offline_message_id),
    };
    Ok(Some((k.channel_id, WebhookEvent::OfflineMessage(body))))
}
