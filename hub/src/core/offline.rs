//! Messages visitors leave through the widget's offline form: kept as a
//! closed chat agents can read, and sent to the integrator as `offline_message`.

use plugin_api::channel::{CustomerSender, Message, Text};
use plugin_api::lenient::ExternalId;
use plugin_api::widget::{OfflineMessageEvent, OfflineMessageInput};
use serde::Deserialize;
use tracing::Instrument;

use crate::clock::now_ms;
use crate::core::conversations::{Conversations, CoreError};
use crate::core::webhooks::{self, payload};
use crate::event::{Direction, Event, EventKind};
use crate::pipeline::{Routed, Verdict, enqueue_forwards};
use crate::store::chats::{NewMessage, insert_chat, insert_message, set_chat_state, upsert_client};
use crate::store::events::insert_event;
use crate::store::{Author, Channel, ChatState};

/// The offline form, as `sendOfflineMessage` takes it; unknown fields are refused.
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

impl From<OfflineForm> for OfflineMessageInput {
    fn from(f: OfflineForm) -> Self {
        OfflineMessageInput {
            name: f.name,
            email: f.email,
            phone: f.phone,
            description: f.description,
            message: f.message,
        }
    }
}

/// What became of an offline message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfflineOutcome {
    Stored {
        id: i64,
    },
    /// A plugin dropped it (a spam filter, say); the visitor is told it was sent.
    Dropped,
}

impl Conversations {
    /// Records an offline message and queues `offline_message`. The form
    /// crosses the plugins first as `widget.offline_message`, like every event.
    pub async fn offline_message(
        &self,
        channel: &Channel,
        form: OfflineForm,
    ) -> Result<OfflineOutcome, CoreError> {
        let form = OfflineMessageInput::from(form);
        form.validate().map_err(CoreError::Invalid)?;
        let payload = serde_json::to_value(OfflineMessageEvent::from(&form))
            .map_err(|e| CoreError::Invalid(format!("cannot encode the form: {e}")))?;
        let event =
            Event::new(EventKind::OFFLINE_MESSAGE, Direction::In, payload).on_channel(channel.id);
        let span = event.span();
        self.route_offline(channel, event).instrument(span).await
    }

    async fn route_offline(
        &self,
        channel: &Channel,
        event: Event,
    ) -> Result<OfflineOutcome, CoreError> {
        let routed = self.pipeline.run(event).await;
        match routed.verdict {
            Verdict::Reject(reason) => {
                tracing::warn!(%reason, "offline message refused");
                return Err(CoreError::Unavailable(reason));
            }
            Verdict::Drop(ref reason) => {
                tracing::info!(%reason, "offline message dropped");
                self.record_with_forwards(&routed).await?;
                return Ok(OfflineOutcome::Dropped);
            }
            // Nobody could read an answer: the visitor has left the form.
            Verdict::Continue | Verdict::Reply(_) => {}
        }
        // The pipeline checked a changed payload against the form's rules.
        let form = OfflineMessageEvent::from_value(routed.event.payload.clone())
            .map_err(CoreError::Invalid)?;
        self.store_offline(channel, form, &routed)
            .await
            .map(|id| OfflineOutcome::Stored { id })
    }

    async fn store_offline(
        &self,
        channel: &Channel,
        form: OfflineMessageInput,
        routed: &Routed,
    ) -> Result<i64, CoreError> {
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
        let mut event = routed.event.clone();
        event.chat_id = Some(chat.id);
        insert_event(&mut w.tx, &event).await?;
        enqueue_forwards(&mut w.tx, &event, &routed.forwards, now).await?;
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
