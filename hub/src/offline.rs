//! Messages visitors leave through the widget's offline form: kept as a
//! closed chat agents can read, and sent to the integrator as `offline_message`.

use plugin_api::channel::{CustomerSender, Message, Text};
use plugin_api::lenient::ExternalId;
use serde::Deserialize;

use crate::clock::now_ms;
use crate::conversations::{Conversations, CoreError};
use crate::store::chats::{NewMessage, insert_chat, insert_message, set_chat_state, upsert_client};
use crate::store::{Author, Channel, ChatState};
use crate::webhooks::{self, payload};

/// Longest offline message kept, in characters.
const MAX_MESSAGE_CHARS: usize = 4000;

/// The offline form, as `sendOfflineMessage` takes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfflineForm {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    #[serde(default)]
    pub phone: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    pub message: String,
}

impl OfflineForm {
    /// The spec's validation: a message, and a way to answer it.
    pub fn validate(&self) -> Result<(), String> {
        if self.message.trim().is_empty() {
            return Err("message must not be empty".into());
        }
        if self.message.chars().count() > MAX_MESSAGE_CHARS {
            return Err(format!(
                "message is longer than {MAX_MESSAGE_CHARS} characters"
            ));
        }
        let blank = |v: &Option<String>| v.as_deref().is_none_or(|s| s.trim().is_empty());
        if blank(&self.email) && blank(&self.phone) {
            return Err("an e-mail address or a phone number is required".into());
        }
        if let Some(email) = self.email.as_deref().filter(|e| !e.trim().is_empty())
            && !email.contains('@')
        {
            return Err(format!("`{email}` is not an e-mail address"));
        }
        Ok(())
    }
}

impl Conversations {
    /// Records an offline message and queues `offline_message`; returns its id.
    pub async fn offline_message(
        &self,
        channel: &Channel,
        form: OfflineForm,
    ) -> Result<i64, CoreError> {
        form.validate().map_err(CoreError::Invalid)?;
        let contact = form
            .email
            .as_deref()
            .or(form.phone.as_deref())
            .unwrap_or_default()
            .trim()
            .to_lowercase();
        // The same address leaves its messages under one client.
        let sender = CustomerSender {
            id: ExternalId::Str(format!("offline:{contact}")),
            name: form.name.clone().filter(|n| !n.trim().is_empty()),
            phone: form.phone.clone().filter(|p| !p.trim().is_empty()),
            email: form.email.clone().filter(|e| !e.trim().is_empty()),
            photo: None,
            url: None,
            invite: None,
        };
        let now = now_ms();
        let mut w = self.store.begin_write().await?;
        let client = upsert_client(&mut w.tx, channel.id, &sender, now).await?;
        if let Some(description) = form.description.as_deref().filter(|d| !d.trim().is_empty()) {
            sqlx::query("UPDATE clients SET description = $1 WHERE id = $2")
                .bind(description)
                .bind(client.id)
                .execute(&mut *w.tx)
                .await
                .map_err(|source| crate::store::StoreError::Db {
                    context: "saving a client description",
                    source,
                })?;
        }
        let chat = insert_chat(&mut w.tx, channel.id, client.id, now).await?;
        let body = serde_json::to_value(Message::Text(Text {
            text: form.message.clone(),
            id: None,
        }))
        .map_err(|e| CoreError::Invalid(e.to_string()))?;
        insert_message(
            &mut w.tx,
            NewMessage {
                uid: &uuid::Uuid::now_v7().to_string(),
                chat_id: chat.id,
                author: Author::Client,
                agent_id: None,
                body: &body,
                delivery: None,
                now,
            },
        )
        .await?;
        // Nobody can answer in the chat itself: the visitor is not connected.
        set_chat_state(&mut w.tx, chat.id, ChatState::Closed, None, now).await?;
        let (id,): (i64,) = sqlx::query_as(
            "INSERT INTO offline_messages (channel_id, client_id, name, email, phone, \
             description, message, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             RETURNING id",
        )
        .bind(channel.id)
        .bind(client.id)
        .bind(form.name.as_deref())
        .bind(form.email.as_deref())
        .bind(form.phone.as_deref())
        .bind(form.description.as_deref())
        .bind(form.message.as_str())
        .bind(now)
        .fetch_one(&mut *w.tx)
        .await
        .map_err(|source| crate::store::StoreError::Db {
            context: "recording an offline message",
            source,
        })?;
        if let Some((channel_id, event)) =
            payload::offline_message(&mut w.tx, client.id, chat.id, id, form.message).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        w.commit().await?;
        self.kick.kick();
        Ok(id)
    }
}
