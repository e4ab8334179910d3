//! The bot exchange in the core: which bot a channel's new chats start with,
//! what a customer message sends it, what a bot's events do to its chat
//! (messages, hand-off to agents, contacts), what agents accepting and
//! closing tell it, and plugin bots answering in place of a provider.
//!
//! Every request to a bot is an outbox row (`bot.*`, staged so the `bot.*`
//! routes' plugins see it) written in the transaction of the change that
//! caused it; nothing here waits on a request to a provider, so a provider
//! may post its answer while the hub's request to it is still open.

use std::sync::Arc;

use plugin_api::bot::{self, BotAnswer, BotEvent, InviteAgent};
use plugin_api::channel::{AgentMessage, AgentSender, Recipient, Text};
use plugin_api::lenient::Label;
use serde_json::{Value, json};
use tracing::Instrument;
use uuid::Uuid;

use crate::core::bot_hooks::{Directory, queue_notice};
use crate::core::conversations::Conversations;
use crate::core::error::CoreError;
use crate::core::error::Passage;
use crate::core::live::client_view;
use crate::core::webhooks;
use crate::delivery::Final;
use crate::event::{Direction, Event, EventKind};
use crate::ids::constant_time_eq;
use crate::outbound::ExchangeError;
use crate::outbound::oauth::{Credentials, bearer_header};
use crate::pipeline::{Routed, record_effects, record_in};
use crate::runtime::Action;
use crate::store::bots::{
    agents_online, chat_bot_in_tx, done_notice_pending, insert_bot_message, mark_seen, set_chat_bot,
};
use crate::store::chats::{ContactUpdate, set_client_contact, set_client_description};
use crate::store::outbox::enqueue;
use crate::store::{
    Author, Bot, BotState, Channel, Chat, Claimed, Client, DeliveryState, MessageRow, NewDelivery,
    StoreError, WriteTx,
};

/// What became of a bot's event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BotOutcome {
    Applied,
    /// Its `id` was applied before: nothing happened again.
    Repeated,
    /// A plugin on its route dropped it.
    Dropped,
    /// An agent joined (or the chat closed) before the bot heard of it: the
    /// event is recorded and changes nothing.
    Overtaken,
}

impl Conversations {
    pub fn bots(&self) -> Arc<Directory> {
        self.bots.current()
    }

    /// Reads the bots again, after they changed.
    pub async fn reload_bots(&self) -> Result<(), StoreError> {
        let bots = self.store.list_bots().await?;
        self.bots.replace(bots);
        Ok(())
    }

    /// Bots were created, changed or deleted here: other instances are told
    /// (on PostgreSQL) and this one's directory is read again.
    pub async fn bots_changed(&self) -> Result<(), StoreError> {
        self.live().announce_bots_changed();
        self.reload_bots().await
    }

    /// Whether `authorization` (the header's value) carries the token the hub
    /// got from the provider; a bot without `auth` needs none.
    pub async fn provider_authorized(&self, bot: &Bot, authorization: Option<&str>) -> bool {
        let Some(auth) = bot.auth() else {
            return true;
        };
        let Some(presented) = authorization.and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        }) else {
            return false;
        };
        let credentials = credentials(auth);
        let mut held = self.tokens.held(&credentials);
        if held.is_empty() {
            // The hub has not needed a token yet (say, after a restart): get one now.
            match self.tokens.token(&credentials).await {
                Ok(token) => held.push(token),
                Err(e) => {
                    tracing::warn!(bot = %bot.name, error = %e, "cannot get the provider's token");
                    return false;
                }
            }
        }
        held.iter()
            .any(|t| constant_time_eq(t.as_bytes(), presented.trim().as_bytes()))
    }

    /// A bot's event, as the edge parsed it: checked against the bot's chat,
    /// de-duplicated by its `id`, through the pipeline, then applied.
    pub(super) async fn provider_event(
        &self,
        bot: &Arc<Bot>,
        event: BotEvent,
        payload: Value,
    ) -> Result<BotOutcome, CoreError> {
        let kind = match &event {
            BotEvent::BotMessage(_) => EventKind::BOT_MESSAGE,
            BotEvent::InviteAgent(_) => EventKind::BOT_INVITE_AGENT,
            BotEvent::ClientInfo(_) => EventKind::BOT_CLIENT_INFO,
            other => {
                return Err(CoreError::Invalid(format!(
                    "{} is sent by the hub, not to it",
                    other.event_name()
                )));
            }
        };
        let chat = self.bot_chat(bot, event.chat_id()).await?;
        if let Some(id) = event.id()
            && self.store.bot_event_seen(bot.id, id).await?
        {
            return Ok(BotOutcome::Repeated);
        }
        let routed = Event::new(kind, Direction::In, payload)
            .on_channel(chat.channel_id)
            .in_chat(chat.id);
        let span = routed.span();
        async {
            let routed = match self.pass(routed, "bot event").await? {
                Passage::Through(routed) => *routed,
                Passage::Dropped(_) => return Ok(BotOutcome::Dropped),
            };
            let event = if routed.changed {
                serde_json::from_value(routed.event.payload.clone()).map_err(|e| {
                    CoreError::Invalid(format!("a plugin made the event invalid: {e}"))
                })?
            } else {
                event
            };
            self.apply_bot_event(bot, &chat, event, &routed).await
        }
        .instrument(span)
        .await
    }

    /// The chat `chat_id` names, if it is a chat of `bot` (else `NotFound`).
    async fn bot_chat(&self, bot: &Bot, chat_id: &str) -> Result<Chat, CoreError> {
        let id: i64 = chat_id.trim().parse().map_err(|_| CoreError::NotFound)?;
        let chat = self
            .store
            .chat_by_id(id)
            .await?
            .ok_or(CoreError::NotFound)?;
        match self.store.chat_bot(chat.id).await? {
            Some(cb) if cb.bot_id == bot.id => Ok(chat),
            _ => Err(CoreError::NotFound),
        }
    }

    /// What a bot's event does to its chat, in one transaction with the
    /// event's log row and its plugins' effects.
    async fn apply_bot_event(
        &self,
        bot: &Bot,
        chat: &Chat,
        event: BotEvent,
        routed: &Routed,
    ) -> Result<BotOutcome, CoreError> {
        let client = self
            .store
            .client_by_id(chat.client_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let channel = self
            .store
            .channel_by_id(chat.channel_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let mut w = self.store.begin_write().await?;
        let now = self.clock.now_ms();
        let state = chat_bot_in_tx(&mut w.tx, chat.id)
            .await?
            .map(|cb| cb.state)
            .ok_or(CoreError::NotFound)?;
        if let Some(id) = event.id()
            && !mark_seen(&mut w.tx, bot.id, id, now).await?
        {
            // Applied meanwhile by a twin of this request.
            return Ok(BotOutcome::Repeated);
        }
        // An agent joined (or the chat closed) while the bot was answering a
        // customer message it got before: its AGENT_JOINED (CHAT_CLOSED)
        // waits behind that request, so the bot cannot know yet. Refusing its
        // answer would read as a failed one to a provider, which then fails
        // the request the hub retries, twice, for nothing. The answer is
        // taken and recorded, and changes nothing: the agent has the chat.
        // Once the bot was told, its later messages are refused.
        if state.is_done() && matches!(event, BotEvent::BotMessage(_) | BotEvent::InviteAgent(_)) {
            if !done_notice_pending(&mut w.tx, chat.id).await? {
                return Err(done_with(state));
            }
            record_in(&mut w.tx, routed, now).await?;
            w.commit().await?;
            tracing::info!(
                bot = %bot.name,
                chat = chat.id,
                event = event.event_name(),
                state = state.as_str(),
                "a bot answered before it heard it is done with the chat: recorded, not applied"
            );
            return Ok(BotOutcome::Overtaken);
        }
        match event {
            BotEvent::BotMessage(m) => {
                self.bot_message(w, bot, chat, (&client, &channel), &m.message, routed, now)
                    .await?;
            }
            BotEvent::InviteAgent(_) => {
                self.invite_agent(w, bot, chat, &client, state, routed, now)
                    .await?;
            }
            BotEvent::ClientInfo(info) => self.client_info(w, chat, &info, routed, now).await?,
            other => {
                return Err(CoreError::Invalid(format!(
                    "{} is sent by the hub, not to it",
                    other.event_name()
                )));
            }
        }
        Ok(BotOutcome::Applied)
    }

    /// A bot's message: stored, and sent to the customer unless the channel
    /// is a widget (whose page gets it live).
    #[allow(clippy::too_many_arguments)]
    async fn bot_message(
        &self,
        mut w: WriteTx<'_>,
        bot: &Bot,
        chat: &Chat,
        (client, channel): (&Client, &Channel),
        message: &bot::Message,
        routed: &Routed,
        now: i64,
    ) -> Result<(), CoreError> {
        let body = serde_json::to_value(message)
            .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
        // A widget shows every type itself (buttons as buttons) and
        // its visitor's page gets the message live: nothing to send.
        let customer_text = message.customer_text().filter(|_| !channel.is_widget());
        let delivery = if channel.is_widget() {
            Some(DeliveryState::Delivered)
        } else {
            customer_text.as_ref().map(|_| DeliveryState::Pending)
        };
        let uid = Uuid::now_v7().to_string();
        let message_id = insert_bot_message(
            &mut w.tx,
            chat.id,
            &uid,
            &bot.name,
            &body.to_string(),
            delivery,
            now,
        )
        .await?;
        if let Some(text) = customer_text {
            let wire = AgentMessage {
                sender: AgentSender {
                    name: bot.name.clone(),
                    photo: None,
                },
                recipient: Recipient {
                    id: client.external_id.clone(),
                },
                message: plugin_api::channel::Message::Text(Text {
                    id: Some(Label(uid.clone())),
                    text,
                }),
            };
            let wire = serde_json::to_string(&wire)
                .map_err(|e| CoreError::Invalid(format!("cannot encode the message: {e}")))?;
            let mut delivery = NewDelivery::channel_message(
                routed.event.id,
                EventKind::AGENT_MESSAGE.as_str(),
                format!(
                    "{}/{}",
                    channel.customer_endpoint.trim_end_matches('/'),
                    channel.public_id
                ),
                wire,
                channel.chunked,
                chat.id,
                false,
            );
            delivery.message_id = Some(message_id);
            enqueue(&mut w.tx, &delivery, now).await?;
        }
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        let row = MessageRow {
            id: message_id,
            uid,
            chat_id: chat.id,
            author: Author::Bot,
            agent_id: None,
            author_name: Some(bot.name.clone()),
            body,
            delivery,
            delivery_error: None,
            created_at: now,
        };
        self.publish(chat, "chat.message", || json!({ "message": row }));
        Ok(())
    }

    /// A bot hands the chat to agents: invited when one is online, else the
    /// bot hears `AGENT_UNAVAILABLE`. One hand-off per chat.
    #[allow(clippy::too_many_arguments)]
    async fn invite_agent(
        &self,
        mut w: WriteTx<'_>,
        bot: &Bot,
        chat: &Chat,
        client: &Client,
        state: BotState,
        routed: &Routed,
        now: i64,
    ) -> Result<(), CoreError> {
        match state {
            BotState::Bot => {}
            // Invited already: one hand-off, one AGENT_UNAVAILABLE.
            BotState::Invited | BotState::Unavailable => {
                record_in(&mut w.tx, routed, now).await?;
                w.commit().await?;
                return Ok(());
            }
            // Taken above until the bot was told, refused after.
            BotState::Joined | BotState::Closed => return Err(done_with(state)),
        }
        let online = agents_online(&mut w.tx, chat.channel_id).await? > 0;
        let next = if online {
            BotState::Invited
        } else {
            BotState::Unavailable
        };
        set_chat_bot(&mut w.tx, chat.id, bot.id, next, now).await?;
        if !online {
            queue_notice(&mut w.tx, bot, chat, EventKind::BOT_AGENT_UNAVAILABLE, now).await?;
        }
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        self.publish(chat, "chat.invited", || {
            json!({ "chat": chat, "bot": { "id": bot.id, "name": bot.name,
                    "state": next }, "client": client_view(client) })
        });
        Ok(())
    }

    /// What a bot learnt of the customer's contacts.
    async fn client_info(
        &self,
        mut w: WriteTx<'_>,
        chat: &Chat,
        info: &bot::ClientInfo,
        routed: &Routed,
        now: i64,
    ) -> Result<(), CoreError> {
        let contacts = info.contacts();
        let update = ContactUpdate {
            name: contacts.name.as_deref(),
            phone: contacts.phone.as_deref(),
            email: contacts.email.as_deref(),
        };
        set_client_contact(&mut w.tx, chat.client_id, update, now).await?;
        if let Some(description) = &contacts.description {
            set_client_description(&mut w.tx, chat.client_id, description).await?;
        }
        webhooks::queue_chat_event(&mut w.tx, chat.id, false, now).await?;
        record_in(&mut w.tx, routed, now).await?;
        w.commit().await?;
        self.kick.kick();
        // The read is for the update alone.
        if self.live().is_heard("chat.client")
            && let Some(client) = self.store.client_by_id(chat.client_id).await?
        {
            self.publish(
                chat,
                "chat.client",
                || json!({ "client": client_view(&client) }),
            );
        }
        Ok(())
    }

    /// Hands a chat to agents as if its bot had sent `INVITE_AGENT`: the
    /// request to the bot got no regular answer, or the plugin bot failed.
    pub(super) async fn hand_off(&self, chat_id: i64, reason: &str) -> Result<(), CoreError> {
        let Some(cb) = self.store.chat_bot(chat_id).await? else {
            return Ok(());
        };
        if cb.state != BotState::Bot {
            return Ok(());
        }
        let Some(bot) = self.bots().by_id(cb.bot_id).cloned() else {
            return Ok(());
        };
        let chat = self
            .store
            .chat_by_id(chat_id)
            .await?
            .ok_or(CoreError::NotFound)?;
        let invite = InviteAgent {
            id: None,
            client_id: None,
            chat_id: Label(chat_id.to_string()),
        };
        let mut payload = serde_json::to_value(BotEvent::InviteAgent(invite.clone()))
            .map_err(|e| CoreError::Invalid(e.to_string()))?;
        payload["reason"] = json!(reason);
        tracing::info!(chat = chat_id, bot = %bot.name, %reason, "handing the chat to agents");
        let event = Event::new(EventKind::BOT_INVITE_AGENT, Direction::In, payload)
            .on_channel(chat.channel_id)
            .in_chat(chat.id);
        let routed = match self.pass(event, "hand-off").await? {
            Passage::Through(routed) => *routed,
            Passage::Dropped(_) => return Ok(()),
        };
        self.apply_bot_event(&bot, &chat, BotEvent::InviteAgent(invite), &routed)
            .await
            .map(|_| ())
    }

    /// A plugin bot's turn: the plugin gets the `bot.client_message` event
    /// and its reply is applied as the bot's events; a failed call hands off
    /// (through the failed result, in `outcomes.rs`).
    pub(super) async fn answer_as_plugin_bot(&self, row: &Claimed) -> Result<Final, StoreError> {
        let (Some(plugin), Some(chat_id)) = (row.plugin_bot(), row.chat_id) else {
            return Ok(Final::NotSent("not a plugin bot's row".to_owned()));
        };
        let Some(chat) = self.store.chat_by_id(chat_id).await? else {
            return Ok(Final::NotSent("the chat is gone".to_owned()));
        };
        let bot = match self.store.chat_bot(chat_id).await? {
            Some(cb) => self.bots().by_id(cb.bot_id).cloned(),
            None => None,
        };
        let Some(bot) = bot else {
            return Ok(Final::NotSent("the bot is gone".to_owned()));
        };
        let payload: Value = match serde_json::from_str(&row.body) {
            Ok(v) => v,
            Err(e) => return Ok(Final::Failed(format!("the stored event is not JSON: {e}"))),
        };
        let mut event = Event::new(EventKind::BOT_CLIENT_MESSAGE, Direction::Out, payload)
            .on_channel(chat.channel_id)
            .in_chat(chat.id);
        if let Ok(id) = row.event_id.parse() {
            event.id = id;
        }
        let outcome = match self.pipeline.call_plugin(plugin, &event).await {
            Ok(outcome) => outcome,
            Err(reason) => return Ok(Final::Failed(reason)),
        };
        if !outcome.forwards.is_empty() || !outcome.kv_writes.is_empty() {
            let mut w = self.store.begin_write().await?;
            let writes = [(Arc::<str>::from(plugin), outcome.kv_writes)];
            record_effects(
                &mut w.tx,
                &event,
                &outcome.forwards,
                &writes,
                self.clock.now_ms(),
            )
            .await?;
            w.commit().await?;
            self.kick.kick();
        }
        let Action::Reply(reply) = outcome.action else {
            return Ok(Final::Delivered { answer: None });
        };
        let answers = match bot::parse_answers(&reply, self.clock.now_ms() / 1000) {
            Ok(a) => a,
            Err(e) => return Ok(Final::Failed(format!("the plugin's reply: {e}"))),
        };
        for answer in answers {
            if let Err(e) = self.plugin_bot_answer(&bot, &chat, answer).await {
                tracing::warn!(bot = %bot.name, chat = chat.id, error = %e, "a plugin bot's answer was not applied");
            }
        }
        Ok(Final::Delivered {
            answer: Some(reply.to_string()),
        })
    }

    /// One answer of a plugin bot, as the provider event it stands for.
    async fn plugin_bot_answer(
        &self,
        bot: &Arc<Bot>,
        chat: &Chat,
        answer: BotAnswer,
    ) -> Result<BotOutcome, CoreError> {
        let chat_id = Label(chat.id.to_string());
        let event = match answer {
            BotAnswer::Message(message) => BotEvent::BotMessage(bot::BotMessage {
                id: None,
                client_id: None,
                chat_id,
                message,
            }),
            BotAnswer::InviteAgent => BotEvent::InviteAgent(InviteAgent {
                id: None,
                client_id: None,
                chat_id,
            }),
            BotAnswer::ClientInfo(contacts) => BotEvent::ClientInfo(bot::ClientInfo {
                id: None,
                client_id: None,
                chat_id,
                client_info: Some(contacts),
                contact_info: None,
                top_level: bot::Contacts::default(),
            }),
        };
        let payload =
            serde_json::to_value(&event).map_err(|e| CoreError::Invalid(e.to_string()))?;
        self.provider_event(bot, event, payload).await
    }

    /// The provider's bearer token on requests to a bot with `auth`.
    pub(super) async fn bot_request_headers(
        &self,
        row: &Claimed,
    ) -> Result<Vec<(::http::HeaderName, ::http::HeaderValue)>, ExchangeError> {
        let Some(chat_id) = row.chat_id else {
            return Ok(Vec::new());
        };
        let chat_bot =
            self.store.chat_bot(chat_id).await.map_err(|e| {
                ExchangeError::Transient(format!("cannot read the chat's bot: {e}"))
            })?;
        let directory = self.bots();
        let Some(auth) = chat_bot
            .and_then(|cb| directory.by_id(cb.bot_id))
            .and_then(|bot| bot.auth())
        else {
            return Ok(Vec::new());
        };
        let token = self.tokens.token(&credentials(auth)).await?;
        Ok(bearer_header(&token).into_iter().collect())
    }
}

/// A bot's message or hand-off for a chat it is done with: a conflict with
/// where the chat stands, not a malformed request.
fn done_with(state: BotState) -> CoreError {
    CoreError::Conflict(match state {
        BotState::Closed => "the chat is closed: the bot is done with it".to_owned(),
        _ => "an agent joined the chat: the bot is done with it".to_owned(),
    })
}

fn credentials(auth: &crate::store::bots::BotAuth) -> Credentials {
    Credentials {
        token_url: auth.token_url.clone(),
        client_id: auth.client_id.clone(),
        secret: auth.secret.clone(),
    }
}
