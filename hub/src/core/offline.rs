//! Messages visitors leave through the widget's offline form: kept as a
//! closed chat agents can read, and sent to the integrator as `offline_message`.

use plugin_api::channel::{CustomerSender, Message, Text};
use plugin_api::lenient::ExternalId;
use plugin_api::widget::{OfflineMessageEvent, OfflineMessageInput};
use tracing::Instrument;

use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::core::error::Passage;
use crate::core::webhooks::{self, payload};
use crate::event::{Direction, Event, EventKind};
use crate::pipeline::{Routed, record_effects};
use crate::store::chats::{
    ContactUpdate, NewMessage, insert_chat, insert_message, set_chat_state, set_client_contact,
    set_client_description, upsert_client,
};
use crate::store::events::insert_event;
use crate::store::offline::{self as offline_messages, NewOfflineMessage};
use crate::store::{Author, Channel, ChatState, Client};

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
    /// A widget visitor's form goes under their client, so the webhook
    /// carries what their page reported (user token, session, page).
    pub(super) async fn offline_message(
        &self,
        channel: &Channel,
        form: OfflineMessageInput,
        visitor: Option<&Client>,
    ) -> Result<OfflineOutcome, CoreError> {
        form.validate().map_err(CoreError::Invalid)?;
        let payload = serde_json::to_value(OfflineMessageEvent::from(&form))
            .map_err(|e| CoreError::Invalid(format!("cannot encode the form: {e}")))?;
        let event =
            Event::new(EventKind::OFFLINE_MESSAGE, Direction::In, payload).on_channel(channel.id);
        let span = event.span();
        self.route_offline(channel, form, visitor, event)
            .instrument(span)
            .await
    }

    async fn route_offline(
        &self,
        channel: &Channel,
        form: OfflineMessageInput,
        visitor: Option<&Client>,
        event: Event,
    ) -> Result<OfflineOutcome, CoreError> {
        // A plugin's reply is ignored: nobody is there to read it.
        let routed = match self.pass(event, "offline message").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(_) => return Ok(OfflineOutcome::Dropped),
        };
        // The pipeline checked a changed payload against the form's rules.
        let form = if routed.changed {
            OfflineMessageEvent::from_value(routed.event.payload.clone())
                .map_err(CoreError::Invalid)?
        } else {
            form
        };
        self.store_offline(channel, form, visitor, &routed)
            .await
            .map(|id| OfflineOutcome::Stored { id })
    }

    async fn store_offline(
        &self,
        channel: &Channel,
        form: OfflineMessageInput,
        visitor: Option<&Client>,
        routed: &Routed,
    ) -> Result<i64, CoreError> {
        let now = self.clock.now_ms();
        let mut w = self.store.begin_write().await?;
        let client_id = match visitor.filter(|v| v.channel_id == channel.id) {
            Some(visitor) => {
                // What the visitor typed in is their contact details now,
                // as with the contacts form.
                let contact = ContactUpdate {
                    name: given(&form.name),
                    phone: given(&form.phone),
                    email: given(&form.email),
                };
                set_client_contact(&mut w.tx, visitor.id, contact, now).await?;
                visitor.id
            }
            None => {
                let contact = given(&form.email)
                    .or(given(&form.phone))
                    .unwrap_or_default()
                    .trim()
                    .to_lowercase();
                // The same address leaves its messages under one client.
                let sender = CustomerSender {
                    id: ExternalId::Str(format!("offline:{contact}")),
                    name: given(&form.name).map(str::to_owned),
                    phone: given(&form.phone).map(str::to_owned),
                    email: given(&form.email).map(str::to_owned),
                    photo: None,
                    url: None,
                    invite: None,
                };
                upsert_client(&mut w.tx, channel.id, &sender, now).await?.id
            }
        };
        if let Some(description) = form.description.as_deref().filter(|d| !d.trim().is_empty()) {
            set_client_description(&mut w.tx, client_id, description).await?;
        }
        let chat = insert_chat(&mut w.tx, channel.id, client_id, now).await?;
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
        let kept = NewOfflineMessage {
            channel_id: channel.id,
            client_id,
            name: form.name.as_deref(),
            email: form.email.as_deref(),
            phone: form.phone.as_deref(),
            description: form.description.as_deref(),
            message: form.message.as_str(),
            now,
        };
        let id = offline_messages::insert(&mut w.tx, &kept).await?;
        let mut event = routed.event.clone();
        event.chat_id = Some(chat.id);
        insert_event(&mut w.tx, &event).await?;
        record_effects(&mut w.tx, &event, &routed.forwards, &routed.kv_writes, now).await?;
        if let Some((channel_id, event)) =
            payload::offline_message(&mut w.tx, client_id, chat.id, id, form.message).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        w.commit().await?;
        self.kick.kick();
        Ok(id)
    }
}

/// A form field that says something.
fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|v| !v.trim().is_empty())
}
