//! Delivery-outcome bookkeeping: what the deliverer's results mean to the
//! rest of the hub. A staged webhook crosses its plugins when first claimed;
//! a final result updates the message's delivery state, keeps the
//! receiver's answer, applies a `chat_accepted`/`chat_updated` reply to the
//! chat, and is itself an event (`*.delivery_result`) plugins may watch.

use serde_json::json;

use crate::core::conversations::Conversations;
use crate::core::results::{ResultJob, into_store_error};
use crate::core::webhooks::{self, reply};
use crate::delivery::{BoxFuture, Final, Finisher, Staged};
use crate::event::{Direction, Event, EventKind};
use crate::outbound::ExchangeError;
use crate::pipeline::{Verdict, record_effects};
use crate::store::chats::{
    ContactUpdate, integration_of, set_client_contact, set_integration, set_message_delivery,
};
use crate::store::events::insert_event;
use crate::store::locks;
use crate::store::outbox::{Finished, finish, set_response, unstage};
use crate::store::{Chat, Claimed, DeliveryState, OutboxState, RowKind, StoreError};

impl Finisher for Conversations {
    fn stage<'a>(&'a self, row: &'a Claimed) -> BoxFuture<'a, Result<Staged, StoreError>> {
        Box::pin(async move {
            let Some(event) = self.store.event_by_id(&row.event_id).await? else {
                return Ok(Staged::Done(Final::NotSent(
                    "the event behind this delivery is gone".to_owned(),
                )));
            };
            let order = webhooks::OrderFields::of(&event.payload);
            let mut routed = self.pipeline.run(event).await;
            let (staged, body) = match routed.verdict {
                Verdict::Continue => {
                    if routed.changed {
                        order.restore(&mut routed.event.payload);
                    }
                    let body = routed.event.payload.to_string();
                    (Staged::Send { body: body.clone() }, Some(body))
                }
                Verdict::Drop(reason) => (
                    Staged::Done(Final::NotSent(format!("dropped by {reason}"))),
                    None,
                ),
                // A plugin answered in the receiver's place.
                Verdict::Reply(answer) => (
                    Staged::Done(Final::Delivered {
                        answer: Some(answer.to_string()),
                    }),
                    None,
                ),
                Verdict::Reject(reason) => (Staged::Done(Final::Failed(reason)), None),
            };
            if routed.forwards.is_empty() && routed.kv_writes.is_empty() {
                // Nothing else to write with it: the body alone, in one
                // round trip on PostgreSQL instead of a transaction's three
                // (a staged row is a webhook: one per accepted chat).
                if let Some(body) = body {
                    self.store.unstage(&row.id, &body).await?;
                }
                return Ok(staged);
            }
            // The row mode: staging changes one row, and its effects (key-value
            // writes, forwards) lock what they share themselves.
            let mut w = self.store.begin_row_write().await?;
            record_effects(
                &mut w.tx,
                &routed.event,
                &routed.forwards,
                &routed.kv_writes,
                self.clock.now_ms(),
            )
            .await?;
            if let Some(body) = body {
                unstage(&mut w.tx, &row.id, &body).await?;
            }
            w.commit().await?;
            if !routed.forwards.is_empty() {
                self.kick.kick();
            }
            Ok(staged)
        })
    }

    fn finish<'a>(
        &'a self,
        row: &'a Claimed,
        result: &'a Final,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let (state, outbox_state, error, answer) = result_facts(result);
            let (event, payload) = result_event(row, outbox_state, error, answer);
            // The result is a fact: plugins may watch and forward it, not change it.
            let routed = self.pipeline.run(event.clone()).await;
            // Only a reply to these is shown to the agent: read the chat for it.
            let chat = match (answer, row.chat_id) {
                (Some(_), Some(id))
                    if matches!(
                        row.kind.as_str(),
                        "webhook.chat_accepted" | "webhook.chat_updated"
                    ) =>
                {
                    self.store.chat_by_id(id).await?
                }
                _ => None,
            };
            let integration = match (answer, &chat) {
                (Some(answer), Some(chat)) => {
                    reply::read(answer, reply::host_of(&row.target_url), self.safe_url)
                        .map(|r| (chat, r))
                }
                _ => None,
            };
            let now = self.clock.now_ms();
            let forwarded = !routed.forwards.is_empty();
            // Whether a row may have become due: unknown but for the
            // results batch, which says whether it made a new head.
            let mut look = true;
            let shown = match &integration {
                // The common case: written with whatever other results wait.
                None => {
                    let job = ResultJob {
                        finished: Finished {
                            seq: row.seq,
                            state: outbox_state,
                            error: error.map(str::to_owned),
                            attempts: row.attempts,
                            answer: answer.map(str::to_owned),
                            message: row.message_id.map(|id| (id, state)),
                            event,
                            now,
                        },
                        forwards: routed.forwards,
                        kv_writes: routed.kv_writes,
                    };
                    look = self
                        .results
                        .write(&self.store, job)
                        .await
                        .map_err(into_store_error)?;
                    None
                }
                Some((chat, read)) => Some(
                    self.finish_with_reply(
                        row,
                        chat,
                        read,
                        (state, outbox_state, error, answer),
                        &event,
                        &routed,
                        now,
                    )
                    .await?,
                ),
            };
            // Logged and counted once committed, so a retried finish counts once.
            if chat.is_some() {
                crate::obs::webhook_reply(integration.is_some());
            }
            if let Some((_, read)) = &integration {
                self.note_skipped(row, read);
            }
            if forwarded {
                self.kick.kick();
            }
            if let (Some(channel_id), Some(chat_id), Some(_)) =
                (row.channel_id, row.chat_id, row.message_id)
            {
                self.publish_to(channel_id, chat_id, "message.delivery", || payload);
            }
            if let (Some((chat, _)), Some(shown)) = (&integration, shown) {
                self.publish(chat, "chat.integration", || json!({ "integration": shown }));
            }
            // A bot that never answered (or a plugin bot that failed): the
            // chat goes to agents as if it had sent INVITE_AGENT.
            if let (Final::Failed(reason), Some(chat_id)) = (result, row.chat_id)
                && row.kind == EventKind::BOT_CLIENT_MESSAGE.as_str()
                && let Err(e) = self
                    .hand_off(chat_id, &format!("the bot did not answer: {reason}"))
                    .await
            {
                tracing::error!(chat = chat_id, error = %e, "cannot hand the chat to agents");
            }
            // A failure may have queued more (a bot's chat handed to agents).
            look |= matches!(result, Final::Failed(_));
            Ok(look)
        })
    }

    fn answer_locally<'a>(&'a self, row: &'a Claimed) -> BoxFuture<'a, Result<Final, StoreError>> {
        Box::pin(self.answer_as_plugin_bot(row))
    }

    fn request_headers<'a>(
        &'a self,
        row: &'a Claimed,
    ) -> BoxFuture<'a, Result<Vec<(::http::HeaderName, ::http::HeaderValue)>, ExchangeError>> {
        Box::pin(self.bot_request_headers(row))
    }
}

impl Conversations {
    /// A final result whose answer is a reply applied to the chat: written
    /// on its own, with the chat's integration data and client.
    #[allow(clippy::too_many_arguments)]
    async fn finish_with_reply(
        &self,
        row: &Claimed,
        chat: &Chat,
        read: &reply::Reply,
        facts: (DeliveryState, OutboxState, Option<&str>, Option<&str>),
        event: &Event,
        routed: &crate::pipeline::Routed,
        now: i64,
    ) -> Result<reply::Integration, StoreError> {
        let (state, outbox_state, error, answer) = facts;
        // The row mode, holding the chat's sender (its integration
        // and client are written) and the row's order key (its next
        // row becomes the head).
        let mut w = self.store.begin_row_write().await?;
        locks::chats(&mut w.tx, &[chat.id], &[]).await?;
        locks::order_keys_of_rows(&mut w.tx, &[row.seq]).await?;
        finish(&mut w.tx, &row.id, outbox_state, error, row.attempts, now).await?;
        if let Some(answer) = answer {
            set_response(&mut w.tx, &row.id, answer).await?;
        }
        if let Some(message_id) = row.message_id {
            set_message_delivery(&mut w.tx, message_id, state, error).await?;
        }
        // Operators find what was left out on the delivery itself.
        for skipped in &read.skipped {
            crate::store::outbox::add_note(&mut w.tx, &row.id, &skipped.to_string()).await?;
        }
        let shown = apply_integration(&mut w.tx, chat, read.integration.clone(), now).await?;
        insert_event(&mut w.tx, event).await?;
        record_effects(&mut w.tx, event, &routed.forwards, &routed.kv_writes, now).await?;
        w.commit().await?;
        Ok(shown)
    }

    /// Logs and counts the fields of a webhook reply that were left out.
    fn note_skipped(&self, row: &Claimed, read: &reply::Reply) {
        let event_name = row
            .kind
            .strip_prefix(webhooks::EVENT_PREFIX)
            .unwrap_or(&row.kind);
        for skipped in &read.skipped {
            tracing::warn!(
                delivery = %row.id,
                event = event_name,
                field = %skipped.path,
                problem = %skipped.problem,
                "left out a malformed field of a webhook reply"
            );
            self.reply_skips.count(event_name, skipped.field);
        }
    }
}

/// What a final result means for the message and the outbox row, with its
/// reason and the receiver's answer.
fn result_facts(result: &Final) -> (DeliveryState, OutboxState, Option<&str>, Option<&str>) {
    match result {
        Final::Delivered { answer } => (
            DeliveryState::Delivered,
            OutboxState::Delivered,
            None,
            answer.as_deref(),
        ),
        Final::Failed(reason) => (
            DeliveryState::Failed,
            OutboxState::Failed,
            Some(reason.as_str()),
            None,
        ),
        Final::NotSent(reason) => (
            DeliveryState::Failed,
            OutboxState::Dropped,
            Some(reason.as_str()),
            None,
        ),
    }
}

/// The result as an event (`*.delivery_result`), and its payload, which is
/// also the agents' live update.
fn result_event(
    row: &Claimed,
    outbox_state: OutboxState,
    error: Option<&str>,
    answer: Option<&str>,
) -> (Event, serde_json::Value) {
    let row_kind = row.row_kind();
    let webhook = row_kind.is_webhook() || row_kind == RowKind::Bot;
    let kind = match row_kind {
        RowKind::Forward => EventKind::FORWARD_RESULT,
        RowKind::EventWebhook | RowKind::CrmWebhook => EventKind::WEBHOOK_RESULT,
        RowKind::ChannelMessage => EventKind::DELIVERY_RESULT,
        RowKind::Bot => EventKind::BOT_DELIVERY_RESULT,
    };
    let mut payload = json!({
        "delivery_id": row.id,
        "event_id": row.event_id,
        "message_id": row.message_id,
        "state": outbox_state.as_str(),
        "error": error,
    });
    if webhook {
        payload["kind"] = json!(row.kind);
        payload["answer"] = json!(answer);
    }
    let mut event = Event::new(kind, Direction::In, payload.clone());
    event.channel_id = row.channel_id;
    event.chat_id = row.chat_id;
    (event, payload)
}

/// Merges what a reply showed into the chat's integration data, and applies
/// its contact details to the client as if the visitor had given them.
async fn apply_integration(
    conn: &mut crate::store::Conn,
    chat: &Chat,
    newer: reply::Integration,
    now: i64,
) -> Result<reply::Integration, StoreError> {
    let mut shown: reply::Integration = integration_of(conn, chat.id).await?.unwrap_or_default();
    if let Some(contact) = &newer.contact_info {
        let update = ContactUpdate {
            name: contact.name.as_deref(),
            phone: contact.phone.as_deref(),
            email: contact.email.as_deref(),
        };
        set_client_contact(conn, chat.client_id, update, now).await?;
    }
    shown.merge(newer);
    set_integration(conn, chat.id, &shown).await?;
    Ok(shown)
}
