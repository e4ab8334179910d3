//! The customer-message writer: messages that passed the pipeline queue to a
//! [`Batcher`](super::batch::Batcher) and are stored as many at a time as
//! are waiting; a message's forwards, key-value writes and `chat_updated`
//! webhook are written in the transaction of the message.

use std::sync::Arc;

use crate::core::batch::BatchWrite;
use crate::core::bot_hooks::{self, BotHook};
use crate::core::error::CoreError;
use crate::core::webhooks;
use crate::pipeline::{has_effects, record_effects};
use crate::runtime::{Forward, KvWrites};
use crate::store::ingress::{
    CustomerWrite, CustomerWritten, MAX_BATCH, Then, known_read, write_customer_messages,
};
use crate::store::locks::RowLocks;
use crate::store::{Backend, FirstRows, FirstStatement, StoreError, TxConn};

/// A stored customer message, as its request learns it.
#[derive(Debug)]
pub(super) struct Written {
    pub(super) written: CustomerWritten,
    /// Whether something was queued for the deliverer (a `chat_updated`
    /// webhook, a request to the chat's bot).
    pub(super) updated: bool,
}

/// A message on its way to the database, with its plugins' effects.
pub(super) struct Job {
    pub(super) write: CustomerWrite,
    pub(super) forwards: Vec<Forward>,
    pub(super) kv_writes: Vec<(Arc<str>, KvWrites)>,
    /// Set when the hub has bots: the message may be for its chat's bot.
    pub(super) bot: Option<BotHook>,
}

/// Customer messages, written in batches.
pub(super) struct Ingress;

impl BatchWrite for Ingress {
    type Job = Job;
    type Done = Written;
    const MAX: usize = MAX_BATCH;
    const WHAT: &'static str = "customer messages";

    /// The senders: their clients, live chats and messages' order.
    fn locks(jobs: &[Job]) -> RowLocks {
        RowLocks {
            senders: jobs
                .iter()
                .map(|j| (j.write.channel_id, j.write.sender.id.as_key()))
                .collect(),
            ..RowLocks::default()
        }
    }

    fn first_statement(
        jobs: &[Job],
        backend: Backend,
    ) -> Result<Option<FirstStatement>, StoreError> {
        let writes: Vec<&CustomerWrite> = jobs.iter().map(|j| &j.write).collect();
        known_read(&writes, backend)
    }

    async fn write(
        conn: &mut TxConn<'_>,
        jobs: &mut [Job],
        first: Option<FirstRows>,
    ) -> Result<Vec<Written>, CoreError> {
        let writes: Vec<&CustomerWrite> = jobs.iter().map(|j| &j.write).collect();
        // Below, each message's plugin effects and bot hook, and the
        // `chat_updated` webhook of a known chat whose profile changed.
        let effects = jobs
            .iter()
            .any(|j| has_effects(&j.forwards, &j.kv_writes) || j.bot.is_some());
        let then = if effects {
            Then::More
        } else {
            Then::ChatUpdates
        };
        let written = write_customer_messages(conn, &writes, first, then).await?;
        let mut results = Vec::with_capacity(jobs.len());
        for (job, written) in jobs.iter_mut().zip(written) {
            let chat_id = written.chat.as_ref().map(|c| c.id);
            job.write.event.chat_id = chat_id;
            let now = job.write.now;
            record_effects(conn, &job.write.event, &job.forwards, &job.kv_writes, now).await?;
            let mut updated = match &written.chat {
                Some(chat) if written.profile_changed && !written.opened => {
                    webhooks::queue_chat_event(conn, chat.id, false, now).await?;
                    true
                }
                _ => false,
            };
            if let Some(hook) = &job.bot {
                updated |= bot_hooks::on_customer_message(conn, hook, &written, now).await?;
            }
            results.push(Written { written, updated });
        }
        Ok(results)
    }
}
