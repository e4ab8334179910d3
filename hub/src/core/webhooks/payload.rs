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
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use crate::store::{Ctx, StoreError};

/// What every chat and client event says about the client.
struct Known {
    channel_id: i64,
    widget_id: Label,
    user_token: Option<String>,
    visitor: Visitor,
    url: Option<String>,
    organization: Option<Organization>,
    status: Option<Status>,
    assigned_agent: Option<AssignedAgent>,
    tags: Vec<Tag>,
    attributes: Map<String, Value>,
}

async fn known(conn: &mut AnyConnection, client_id: i64) -> Result<Option<Known>, StoreError> {
    let row = sqlx::query(
        "SELECT c.channel_id, ch.public_id, c.name, c.email, c.phone, c.url, c.description, \
         c.user_token, c.attributes, c.organization_id, c.status_id, c.assigned_agent_id, \
         c.visitor_number, (SELECT COUNT(*) FROM chats WHERE client_id = c.id) AS chats_count \
         FROM clients c JOIN channels ch ON ch.id = c.channel_id WHERE c.id = $1",
    )
    .bind(client_id)
    .fetch_optional(&mut *conn)
    .await
    .ctx("reading a client for a webhook")?;
    let Some(row) = row else { return Ok(None) };
    let get = |r: &AnyRow, c: &str| r.try_get::<Option<String>, _>(c).ctx("reading a client");
    let chats_count: i64 = row.try_get("chats_count").ctx("reading a client")?;
    let visitor = Visitor {
        name: get(&row, "name")?,
        email: get(&row, "email")?,
        phone: get(&row, "phone")?,
        description: get(&row, "description")?.unwrap_or_default(),
        number: Label(
            row.try_get::<Option<i64>, _>("visitor_number")
                .ctx("reading a client")?
                .unwrap_or_default()
                .to_string(),
        ),
        social: None,
        chats_count: u64::try_from(chats_count).unwrap_or(0),
    };
    let organization_id: Option<i64> = row.try_get("organization_id").ctx("reading a client")?;
    let status_id: Option<i64> = row.try_get("status_id").ctx("reading a client")?;
    let agent_id: Option<i64> = row.try_get("assigned_agent_id").ctx("reading a client")?;
    let attributes = get(&row, "attributes")?
        .and_then(|a| serde_json::from_str::<Map<String, Value>>(&a).ok())
        .unwrap_or_default();
    let mut known = Known {
        channel_id: row.try_get("channel_id").ctx("reading a client")?,
        widget_id: Label(row.try_get("public_id").ctx("reading a client")?),
        user_token: get(&row, "user_token")?,
        visitor,
        url: get(&row, "url")?,
        organization: None,
        status: None,
        assigned_agent: None,
        tags: Vec::new(),
        attributes,
    };
    if let Some(id) = organization_id {
        known.organization = sqlx::query_as::<_, (i64, String)>(
            "SELECT id, name FROM crm_organizations WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .ctx("reading an organization")?
        .map(|(id, name)| Organization {
            id: NumericId(id),
            name,
        });
    }
    known.status = client_status(conn, status_id).await?;
    if let Some(id) = agent_id {
        known.assigned_agent = sqlx::query_as::<_, (i64, String, String)>(
            "SELECT id, email, name FROM agents WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .ctx("reading an agent")?
        .map(|(id, email, name)| AssignedAgent {
            id: NumericId(id),
            email,
            name,
        });
    }
    known.tags = sqlx::query_as::<_, (i64, String)>(
        "SELECT t.id, t.title FROM crm_client_tags ct JOIN crm_tags t ON t.id = ct.tag_id \
         WHERE ct.client_id = $1 ORDER BY t.id",
    )
    .bind(client_id)
    .fetch_all(&mut *conn)
    .await
    .ctx("reading client tags")?
    .into_iter()
    .map(|(id, title)| Tag {
        id: NumericId(id),
        title,
    })
    .collect();
    Ok(Some(known))
}

/// The client's category; clients without one are in the default category.
async fn client_status(
    conn: &mut AnyConnection,
    status_id: Option<i64>,
) -> Result<Option<Status>, StoreError> {
    let row: Option<(i64, String)> = match status_id {
        Some(id) => sqlx::query_as("SELECT id, title FROM crm_statuses WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await
            .ctx("reading a category")?,
        None => sqlx::query_as(
            "SELECT id, title FROM crm_statuses WHERE is_default = 1 ORDER BY position LIMIT 1",
        )
        .fetch_optional(&mut *conn)
        .await
        .ctx("reading the default category")?,
    };
    Ok(row.map(|(id, title)| Status {
        id: NumericId(id),
        title,
    }))
}

async fn agent(
    conn: &mut AnyConnection,
    id: i64,
) -> Result<Option<plugin_api::webhook::Agent>, StoreError> {
    Ok(sqlx::query_as::<_, (i64, String, String)>(
        "SELECT id, name, email FROM agents WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .ctx("reading an agent")?
    .map(|(id, name, email)| plugin_api::webhook::Agent {
        id: NumericId(id),
        name,
        email,
        phone: None,
    }))
}

/// The page the visitor is on: the one a reply named, else the customer's `url`.
async fn page(
    conn: &mut AnyConnection,
    chat_id: i64,
    url: Option<&str>,
) -> Result<Page, StoreError> {
    let integration: Option<(Option<String>,)> =
        sqlx::query_as("SELECT integration FROM chats WHERE id = $1")
            .bind(chat_id)
            .fetch_optional(&mut *conn)
            .await
            .ctx("reading a chat")?;
    let from_reply = integration
        .and_then(|(i,)| i)
        .and_then(|i| serde_json::from_str::<Value>(&i).ok())
        .and_then(|i| serde_json::from_value::<Page>(i.get("page")?.clone()).ok());
    Ok(from_reply.unwrap_or_else(|| Page {
        url: url.unwrap_or_default().to_owned(),
        title: None,
    }))
}

async fn chat_client(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<(i64, Option<i64>)>, StoreError> {
    sqlx::query_as::<_, (i64, Option<i64>)>("SELECT client_id, agent_id FROM chats WHERE id = $1")
        .bind(chat_id)
        .fetch_optional(&mut *conn)
        .await
        .ctx("reading a chat")
}

/// `chat_accepted` / `chat_updated` (and the base of `chat_assigned`):
/// `(channel id, payload)`. `agent` is the chat's agent, if any.
pub async fn chat_event(
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<(i64, ChatEvent)>, StoreError> {
    let Some((client_id, agent_id)) = chat_client(conn, chat_id).await? else {
        return Ok(None);
    };
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let agent = match agent_id {
        Some(id) => agent(conn, id).await?,
        None => None,
    };
    let page = page(conn, chat_id, k.url.as_deref()).await?;
    Ok(Some((
        k.channel_id,
        ChatEvent {
            widget_id: k.widget_id,
            user_token: k.user_token,
            visitor: k.visitor,
            organization: k.organization,
            status: k.status,
            assigned_agent: k.assigned_agent,
            tags: k.tags,
            chat_id: NumericId(chat_id),
            department: None,
            session: Session::default(),
            page,
            analytics: None,
            agent,
            topic: None,
        },
    )))
}

pub async fn chat_assigned(
    conn: &mut AnyConnection,
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
    conn: &mut AnyConnection,
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
    conn: &mut AnyConnection,
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
    conn: &mut AnyConnection,
    chat_id: i64,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some((client_id, _)) = chat_client(conn, chat_id).await? else {
        return Ok(None);
    };
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT author, agent_id, body, created_at FROM messages WHERE chat_id = $1 ORDER BY id",
    )
    .bind(chat_id)
    .fetch_all(&mut *conn)
    .await
    .ctx("reading a chat log")?;
    let mut messages = Vec::with_capacity(rows.len());
    let mut agent_ids: Vec<i64> = Vec::new();
    let mut plain = String::new();
    let mut html = String::new();
    for row in &rows {
        let author: String = row.try_get("author").ctx("reading a message")?;
        let agent_id: Option<i64> = row.try_get("agent_id").ctx("reading a message")?;
        let body: String = row.try_get("body").ctx("reading a message")?;
        let at: i64 = row.try_get("created_at").ctx("reading a message")?;
        let text = serde_json::from_str::<plugin_api::channel::Message>(&body)
            .map(|m| m.preview())
            .unwrap_or_default();
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
        let who = match kind {
            ChatMessageKind::Visitor => k.visitor.name.clone().unwrap_or_else(|| "Visitor".into()),
            ChatMessageKind::Agent => "Agent".to_owned(),
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
    let (rate, blacklisted): (Option<String>, i64) = sqlx::query_as(
        "SELECT ch.rate, (SELECT COUNT(*) FROM crm_blacklist b WHERE b.client_id = ch.client_id) \
         FROM chats ch WHERE ch.id = $1",
    )
    .bind(chat_id)
    .fetch_one(&mut *conn)
    .await
    .ctx("reading a chat")?;
    let page = page(conn, chat_id, k.url.as_deref()).await?;
    let body = ChatFinished {
        widget_id: Some(k.widget_id),
        user_token: k.user_token,
        visitor: k.visitor,
        agents,
        chat: ChatLog {
            messages,
            blacklisted: blacklisted > 0,
            rate: match rate.as_deref() {
                Some("positive") => Some(Rate::Positive),
                Some("negative") => Some(Rate::Negative),
                _ => None,
            },
            invitation: None,
        },
        chat_id: NumericId(chat_id),
        session: Session::default(),
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
pub async fn call_event(
    conn: &mut AnyConnection,
    chat_id: i64,
    agent_id: i64,
    call: Call,
) -> Result<Option<(i64, WebhookEvent)>, StoreError> {
    let Some((client_id, _)) = chat_client(conn, chat_id).await? else {
        return Ok(None);
    };
    let Some(k) = known(conn, client_id).await? else {
        return Ok(None);
    };
    let Some(agent) = agent(conn, agent_id).await? else {
        return Ok(None);
    };
    let page = page(conn, chat_id, k.url.as_deref()).await?;
    let body = plugin_api::webhook::CallEvent {
        chat_id: NumericId(chat_id),
        widget_id: k.widget_id,
        visitor: k.visitor,
        agent,
        department: None,
        session: Session::default(),
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
    conn: &mut AnyConnection,
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
        session: Session::default(),
        page: Page {
            url: k.url.unwrap_or_default(),
            title: None,
        },
        analytics: None,
        chat_id: NumericId(chat_id),
        message,
        offline_message_id: plugin_api::lenient::ExternalId::Int(offline_message_id),
    };
    Ok(Some((k.channel_id, WebhookEvent::OfflineMessage(body))))
}
