//! The conversation actions: what customer and agent actions do to chats,
//! messages and the outbox, reached only through the door (`door.rs`); every
//! change is an event that crossed the pipeline first and is logged in the
//! same transaction. What delivery results mean is in `outcomes.rs`.

use std::sync::Arc;

use plugin_api::channel::{AgentMessage, AgentSender, CustomerMessage, Message, Recipient};
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::config::CrmConfig;
use crate::core::batch::Batcher;
use crate::core::bots::{self, BotDirectory, BotHook};
use crate::core::door::Passage;
use crate::core::ingress::{Ingress, Job, Written};
use crate::core::live::{Live, LiveEvent};
use crate::core::outcomes::Results;
use crate::core::outgoing::{Job as OutgoingJob, Outgoing, writable};
use crate::core::webhooks::{self, reply};
use crate::delivery::Kick;
use crate::event::{Direction, Event, EventKind};
use crate::outbound::oauth::TokenCache;
use crate::pipeline::{Pipeline, Routed, Verdict, auto_reply, record_in};
use crate::store::chats::{chat_in_tx, set_chat_state};
use crate::store::ingress::{CustomerWrite, CustomerWritten};
use crate::store::live::Generation;
use crate::store::outgoing::OutgoingWrite;
use crate::store::{
    Agent, Author, Channel, Chat, ChatState, Client, DeliveryState, MessageRow, NewDelivery, Store,
    StoreError, WriteTx,
};

/// Why an action was refused; edges map each case to their status codes.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("not found")]
    NotFound,
    /// Not found, naming what ("no such deal").
    #[error("{0}")]
    Missing(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    /// Refused for now (a plugin failed on a route that rejects); the sender may retry.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

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

pub struct Conversations {
    pub(crate) store: Store,
    live: Live,
    pub(crate) pipeline: Arc<Pipeline>,
    pub(crate) kick: Kick,
    /// The Safe URL setting for custom data from webhook replies.
    pub(super) safe_url: bool,
    /// Malformed reply fields left out, for `/metrics`.
    pub(super) reply_skips: reply::SkippedCounts,
    /// Where customer messages are stored, in batches.
    ingress: Batcher<Ingress>,
    /// Where delivery results are stored, in batches.
    pub(super) results: Batcher<Results>,
    /// Where agent messages are stored, in batches.
    outgoing: Batcher<Outgoing>,
    /// The bots, by channel, provider id and id.
    pub(super) bots: BotDirectory,
    /// Bot providers' access tokens (the optional authorization).
    pub(super) tokens: Arc<TokenCache>,
    /// The CRM's account (`site_id`, also of bot events) and webhook receiver.
    pub(super) crm: CrmConfig,
}

impl Conversations {
    pub fn new(
        store: Store,
        live: Live,
        pipeline: Arc<Pipeline>,
        kick: Kick,
        safe_url: bool,
        tokens: Arc<TokenCache>,
        crm: CrmConfig,
    ) -> Arc<Conversations> {
        Arc::new(Conversations {
            bots: BotDirectory::default(),
            tokens,
            crm,
            store,
            live,
            pipeline,
            kick,
            safe_url,
            reply_skips: reply::SkippedCounts::default(),
            ingress: Batcher::default(),
            results: Batcher::default(),
            outgoing: Batcher::default(),
        })
    }

    pub fn reply_skips(&self) -> &reply::SkippedCounts {
        &self.reply_skips
    }

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
            now: now_ms(),
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

    /// Records an event a plugin dropped: it changes no state, but its log
    /// row and its plugins' forwards and key-value writes are kept.
    pub(crate) async fn record_dropped(&self, routed: &Routed) -> Result<(), CoreError> {
        let mut w = self.store.begin_write().await?;
        record_in(&mut w.tx, routed, now_ms()).await?;
        w.commit().await?;
        if !routed.forwards.is_empty() {
            self.kick.kick();
        }
        Ok(())
    }

    /// An agent goes on- or offline: the channel status endpoint and the
    /// context plugins see follow at once.
    pub async fn set_agent_online(&self, agent: &Agent, online: bool) -> Result<(), StoreError> {
        self.store.set_agent_online(agent.id, online).await?;
        self.pipeline.forget_context();
        // Widget pages show whether anyone is there: tell them at once.
        for channel_id in self.store.agent_channel_ids(&agent.email).await? {
            let available = self.store.channel_has_online_agent(channel_id).await?;
            self.publish_to(
                channel_id,
                0,
                "channel.availability",
                || json!({ "online": available }),
            );
        }
        Ok(())
    }

    /// A chat the agent may see, or `NotFound` (also for chats of other channels).
    pub async fn visible_chat(&self, agent: &Agent, chat_id: i64) -> Result<Chat, CoreError> {
        Ok(self.visible_chat_and_client(agent, chat_id).await?.0)
    }

    async fn visible_chat_and_client(
        &self,
        agent: &Agent,
        chat_id: i64,
    ) -> Result<(Chat, Client), CoreError> {
        self.store
            .chat_visible_to(chat_id, &agent.email)
            .await?
            .ok_or(CoreError::NotFound)
    }

    /// Accepts a chat the agent may see; `routed` is the `agent.accept`
    /// event, recorded with the change.
    pub(super) async fn accept(
        &self,
        agent: &Agent,
        chat_id: i64,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        // Decide on the state read under the write turn, so that two agents
        // accepting at once cannot both win.
        let mut w = self.store.begin_write().await?;
        let chat = chat_in_tx(&mut w.tx, chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        match (chat.state, chat.agent_id) {
            (ChatState::Accepted, Some(id)) if id == agent.id => {
                return self.unchanged(w, chat, routed).await;
            }
            (ChatState::Accepted, _) => {
                return Err(CoreError::Conflict(
                    "the chat was accepted by another agent".into(),
                ));
            }
            (ChatState::Closed, _) => return Err(CoreError::Conflict("the chat is closed".into())),
            (ChatState::Open, _) => {}
        }
        let now = now_ms();
        set_chat_state(&mut w.tx, chat.id, ChatState::Accepted, Some(agent.id), now).await?;
        webhooks::queue_chat_event(&mut w.tx, chat.id, true, now).await?;
        bots::on_agent_joined(&mut w.tx, &self.bots.current(), &chat, now).await?;
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.announce(chat_id, "chat.accepted", agent).await
    }

    /// An action that found its work done (accepting a chat one has, closing a
    /// closed one): nothing changes, but the event is logged like any other.
    async fn unchanged(
        &self,
        mut w: WriteTx<'_>,
        chat: Chat,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        record_in(&mut w.tx, routed, now_ms()).await?;
        w.commit().await?;
        if !routed.forwards.is_empty() {
            self.kick.kick();
        }
        Ok(chat)
    }

    /// After an agent changed a chat's state: wakes the deliverer for the
    /// webhook it queued and tells the agents' streams, with the chat as stored.
    async fn announce(
        &self,
        chat_id: i64,
        kind: &'static str,
        agent: &Agent,
    ) -> Result<Chat, CoreError> {
        self.kick.kick();
        let chat = self
            .store
            .chat_by_id(chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        self.publish(
            &chat,
            kind,
            || json!({ "chat": chat, "agent_id": agent.id }),
        );
        Ok(chat)
    }

    /// Closes a chat the agent may see; `routed` is the `agent.close` event.
    pub(super) async fn close(
        &self,
        agent: &Agent,
        chat_id: i64,
        routed: &Routed,
    ) -> Result<Chat, CoreError> {
        let mut w = self.store.begin_write().await?;
        let chat = chat_in_tx(&mut w.tx, chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        match (chat.state, chat.agent_id) {
            (ChatState::Closed, _) => return self.unchanged(w, chat, routed).await,
            (ChatState::Accepted, Some(id)) if id != agent.id => {
                return Err(CoreError::Conflict(
                    "the chat belongs to another agent".into(),
                ));
            }
            _ => {}
        }
        let now = now_ms();
        set_chat_state(&mut w.tx, chat.id, ChatState::Closed, Some(agent.id), now).await?;
        bots::on_chat_closed(&mut w.tx, &self.bots.current(), &chat, now).await?;
        if let Some((channel_id, event)) =
            webhooks::payload::chat_finished(&mut w.tx, chat.id).await?
        {
            webhooks::queue_event(&mut w.tx, channel_id, Some(chat.id), event, now).await?;
        }
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.announce(chat_id, "chat.closed", agent).await
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
        let now = now_ms();
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
        let sent = self.outgoing.write(&self.store, job).await??;
        self.kick.kick();
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

    /// The live broadcast this core publishes to.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// Publishes a live update; `data` is built only when someone receives
    /// it (an open agent or visitor stream, or other instances).
    pub(crate) fn publish(
        &self,
        chat: &Chat,
        kind: &'static str,
        data: impl FnOnce() -> serde_json::Value,
    ) {
        self.publish_to(chat.channel_id, chat.id, kind, data);
    }

    pub(crate) fn publish_to(
        &self,
        channel_id: i64,
        chat_id: i64,
        kind: &'static str,
        data: impl FnOnce() -> serde_json::Value,
    ) {
        if !self.live.is_heard() {
            return;
        }
        self.live.publish(LiveEvent {
            kind,
            channel_id,
            chat_id,
            data: data(),
        });
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

/// The client as agents see it.
pub fn client_view(client: &Client) -> serde_json::Value {
    json!({
        "id": client.id,
        "external_id": client.external_id,
        "name": client.display_name(),
        "visitor_number": client.visitor_number,
        "phone": client.phone,
        "email": client.email,
        "photo": client.photo,
        "url": client.url,
        "invite": client.invite,
    })
}
