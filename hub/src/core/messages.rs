//! The message actions: a customer's message or typing notice from the
//! integrator (with a plugin's automatic reply), and an agent's reply or
//! typing notice, reached only through the door (`door.rs`). Each crossed
//! the pipeline first; the writers (`ingress.rs`, `outgoing.rs`) store it in
//! batches, with its event row, in one transaction.

use plugin_api::channel::{AgentMessage, AgentSender, CustomerMessage, Message, Recipient};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;
use uuid::Uuid;

use crate::core::bot_hooks::BotHook;
use crate::core::conversations::Conversations;
use crate::core::error::{CoreError, Passage};
use crate::core::ingress::{Job, Written};
use crate::core::live::client_view;
use crate::core::outgoing::{Job as OutgoingJob, writable};
use crate::event::{Direction, Event, EventKind};
use crate::pipeline::{Verdict, auto_reply};
use crate::store::ingress::{CustomerWrite, CustomerWritten};
use crate::store::live::Generation;
use crate::store::outgoing::OutgoingWrite;
use crate::store::{Agent, Author, Channel, Chat, Client, DeliveryState, MessageRow, NewDelivery};

/// What became of an inbound event.
#[derive(Debug)]
pub enum Ingested {
    Stored {
        chat_id: Option<i64>,
        /// The message as stored (`None` for typing).
        message: Option<MessageRow>,
    },
    Dropped {
        reason: String,
    },
}

impl Conversations {
    /// A customer message or typing notification from the integrator.
    pub(super) async fn customer_message(
        &self,
        channel: &Channel,
        message: CustomerMessage,
    ) -> Result<Ingested, CoreError> {
        let kind = if message.message.is_typing() {
            EventKind::CUSTOMER_TYPING
        } else {
            EventKind::CUSTOMER_MESSAGE
        };
        let payload = serde_json::to_value(&message)
            .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
        let mut event = Event::new(kind, Direction::In, payload).on_channel(channel.id);
        // Plugins see the chat the message will join, when there is one
        // already; without routes nobody looks, so ingress skips the read.
        let generation = Generation::now();
        if self.pipeline.has_routes() {
            event.chat_id = self
                .store
                .live_chat_of_sender(generation, channel.id, &message.sender)
                .await?;
        }
        let span = event.span();
        self.ingest_customer_event(channel, message, event, generation)
            .instrument(span)
            .await
    }

    async fn ingest_customer_event(
        &self,
        channel: &Channel,
        message: CustomerMessage,
        event: Event,
        generation: Generation,
    ) -> Result<Ingested, CoreError> {
        let routed = match self.pass(event, "customer message").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(reason) => return Ok(Ingested::Dropped { reason }),
        };
        let reply = match &routed.verdict {
            Verdict::Reply(reply) => Some(reply.clone()),
            _ => None,
        };
        // The pipeline checked a changed payload against the channel's
        // rules and wrote it back in their normal form, which serde reads
        // as it is (`valid_messages_round_trip`), without a copy; an
        // unchanged one is the message we started from.
        let message = if routed.changed {
            CustomerMessage::deserialize(&routed.event.payload)
                .map_err(|e| CoreError::Invalid(format!("a plugin's payload: {e}")))?
        } else {
            message
        };
        let has_forwards = !routed.forwards.is_empty();
        let typing = message.message.is_typing();
        let body = if typing {
            None
        } else {
            Some(
                serde_json::to_string(&message.message)
                    .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?,
            )
        };
        let write = CustomerWrite {
            channel_id: channel.id,
            sender: message.sender,
            body,
            uid: Uuid::now_v7().to_string(),
            event: routed.event,
            now: self.clock.now_ms(),
        };
        let directory = self.bots.current();
        let bot = (!directory.is_empty()).then(|| BotHook {
            directory,
            channel_name: channel.name.clone(),
            channel_public_id: channel.public_id.clone(),
            channel_kind: channel.kind,
            site_id: self.crm.site_id,
        });
        let job = Job {
            write,
            forwards: routed.forwards,
            kv_writes: routed.kv_writes,
            bot,
        };
        let Written { written, updated } = self.ingress.write(&self.store, job).await?;
        if has_forwards || updated {
            self.kick.kick();
        }
        let CustomerWritten {
            client,
            chat,
            opened,
            message: stored,
            ..
        } = written;

        if let Some(chat) = &chat
            && self.pipeline.has_routes()
        {
            // The next message of this sender finds its chat without a read.
            self.store.remember_live_chat(
                generation,
                channel.id,
                client.external_id.as_key(),
                chat.id,
            );
        }
        if let Some(chat) = &chat {
            if opened {
                self.publish(
                    chat,
                    "chat.opened",
                    || json!({ "chat": chat, "client": client_view(&client) }),
                );
            }
            match &stored {
                Some(m) => self.publish(
                    chat,
                    "chat.message",
                    || json!({ "message": m, "client": client_view(&client) }),
                ),
                None => self.publish(
                    chat,
                    "chat.typing",
                    || json!({ "typing": message.message == Message::Typein, "by": "client" }),
                ),
            }
        }
        if let (Some(reply), Some(chat)) = (reply, &chat)
            && let Err(e) = self.auto_reply(chat, &client, reply).await
        {
            // The customer's message is stored either way; only the answer is lost.
            tracing::warn!(error = %e, "a plugin's reply was not sent");
        }
        Ok(Ingested::Stored {
            chat_id: chat.map(|c| c.id),
            message: stored,
        })
    }

    /// Sends a plugin's answer to a customer message as an automatic message
    /// in the chat; it crosses the pipeline like any agent message.
    async fn auto_reply(
        &self,
        chat: &Chat,
        client: &Client,
        reply: serde_json::Value,
    ) -> Result<(), CoreError> {
        let reply = auto_reply(reply).map_err(CoreError::Invalid)?;
        let channel = self
            .store
            .channel_by_id(chat.channel_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let uid = Uuid::now_v7().to_string();
        let mut message = reply.message;
        message.set_label(uid.clone());
        let wire = AgentMessage {
            sender: reply.sender.unwrap_or_else(|| AgentSender {
                name: channel.name.clone(),
                photo: None,
            }),
            recipient: Recipient {
                id: client.external_id.clone(),
            },
            message,
        };
        let payload = serde_json::to_value(&wire)
            .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
        let event = Event::new(EventKind::AGENT_MESSAGE, Direction::Out, payload)
            .on_channel(channel.id)
            .in_chat(chat.id);
        self.send_agent_event(OutgoingAgentEvent {
            by: By::Auto,
            chat: chat.clone(),
            channel,
            uid,
            typing: false,
            wire,
            event,
        })
        .await
        .map(|_| ())
    }

    /// An agent's reply or typing notification: stored and queued for the
    /// integrator in one transaction. Replying to a waiting chat accepts it.
    pub(super) async fn agent_message(
        &self,
        agent: &Agent,
        chat_id: i64,
        message: Message,
    ) -> Result<Option<MessageRow>, CoreError> {
        let (chat, client) = self.visible_chat_and_client(agent, chat_id).await?;
        writable(&chat, Some(agent.id))?;
        let channel = self
            .store
            .channel_by_id(chat.channel_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let typing = message.is_typing();
        let uid = Uuid::now_v7().to_string();
        let mut message = message;
        message.set_label(uid.clone());
        let wire = AgentMessage {
            sender: AgentSender {
                name: agent.name.clone(),
                photo: agent.photo.clone(),
            },
            recipient: Recipient {
                id: client.external_id.clone(),
            },
            message,
        };
        let kind = if typing {
            EventKind::AGENT_TYPING
        } else {
            EventKind::AGENT_MESSAGE
        };
        let payload = serde_json::to_value(&wire)
            .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
        let event = Event::new(kind, Direction::Out, payload)
            .on_channel(channel.id)
            .in_chat(chat.id);
        let span = event.span();
        self.send_agent_event(OutgoingAgentEvent {
            by: By::Agent(agent),
            chat,
            channel,
            uid,
            typing,
            wire,
            event,
        })
        .instrument(span)
        .await
    }

    async fn send_agent_event(
        &self,
        out: OutgoingAgentEvent<'_>,
    ) -> Result<Option<MessageRow>, CoreError> {
        let OutgoingAgentEvent {
            by,
            chat,
            channel,
            uid,
            typing,
            wire,
            event,
        } = out;
        let routed = match self.pass(event, "agent message").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(reason) => {
                return Err(CoreError::Conflict(format!(
                    "dropped by a plugin: {reason}"
                )));
            }
        };
        // A plugin that answers an outbound message stands in for the
        // integrator; a widget has none: its visitor's page gets the message
        // live from the hub, so there is nothing to send.
        let answered = matches!(routed.verdict, Verdict::Reply(_)) || channel.is_widget();
        let wire: AgentMessage = if routed.changed {
            serde_json::from_value(routed.event.payload.clone()).map_err(|e| {
                CoreError::Invalid(format!("a plugin produced an invalid message: {e}"))
            })?
        } else {
            wire
        };
        let now = self.clock.now_ms();
        let agent = match by {
            By::Agent(agent) => Some(agent),
            By::Auto => None,
        };
        let stored_body = if typing {
            None
        } else {
            let body = serde_json::to_value(&wire.message)
                .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
            Some(body)
        };
        let event = routed.event;
        let delivery = NewDelivery::channel_message(
            event.id,
            event.kind.as_str(),
            format!(
                "{}/{}",
                channel.customer_endpoint.trim_end_matches('/'),
                channel.public_id
            ),
            event.payload.to_string(),
            channel.chunked,
            chat.id,
            typing,
        );
        let author = if agent.is_some() {
            Author::Agent
        } else {
            Author::Auto
        };
        let job = OutgoingJob {
            write: OutgoingWrite {
                chat_id: chat.id,
                uid: uid.clone(),
                author,
                agent_id: agent.map(|a| a.id),
                body: stored_body.as_ref().map(|b| b.to_string()),
                answered,
                event,
                delivery,
                now,
            },
            agent: agent.map(|a| a.id),
            forwards: routed.forwards,
            kv_writes: routed.kv_writes,
        };
        let forwards = !job.forwards.is_empty();
        let sent = self.outgoing.write(&self.store, job).await??;
        // A row handed over needs no claim; one queued behind its chat's
        // pending row, an accept's webhook or a plugin's forward does.
        if !sent.handed || sent.accepted || forwards {
            self.kick.kick();
        }
        let chat = sent.chat;
        let accepting = sent.accepted.then_some(chat.agent_id).flatten();
        let stored = match (sent.message_id, stored_body) {
            (Some(id), Some(body)) => Some(MessageRow {
                id,
                author_name: None,
                uid,
                chat_id: chat.id,
                author,
                agent_id: agent.map(|a| a.id),
                body,
                delivery: Some(if answered {
                    DeliveryState::Delivered
                } else {
                    DeliveryState::Pending
                }),
                delivery_error: None,
                created_at: now,
            }),
            _ => None,
        };

        if let Some(agent_id) = accepting {
            let accepted = chat.clone();
            self.publish(
                &accepted,
                "chat.accepted",
                || json!({ "chat": accepted, "agent_id": agent_id }),
            );
        }
        if let Some(m) = &stored {
            self.publish(&chat, "chat.message", || json!({ "message": m }));
        } else if let Some(agent) = agent {
            // A widget visitor sees the agent typing; agents see each other.
            let typing = wire.message == Message::Typein;
            self.publish(
                &chat,
                "chat.typing",
                || json!({ "typing": typing, "by": "agent", "name": agent.name }),
            );
        }
        Ok(stored)
    }
}

/// Who a message to the customer is from.
#[derive(Clone, Copy)]
enum By<'a> {
    Agent(&'a Agent),
    /// A plugin's reply, sent on the hub's behalf.
    Auto,
}

/// An agent's message on its way from the API to the outbox.
struct OutgoingAgentEvent<'a> {
    by: By<'a>,
    chat: Chat,
    channel: Channel,
    uid: String,
    typing: bool,
    /// The typed message, used as is when no plugin changes the event.
    wire: AgentMessage,
    event: Event,
}
