//! The agent-message writer: agents' messages and typing notices, and the
//! replies plugins send on the hub's behalf, that passed the pipeline queue
//! to a [`Batcher`](super::batch::Batcher) and are stored as many at a time
//! as are waiting (`store::outgoing`), each with its outbox row.
//!
//! Invariants: whether the chat may be written is decided on its state in
//! the writing transaction, after the messages before it in the batch (an
//! agent's first reply accepts an open chat, so a second agent's reply in
//! the same batch is refused); a refused message fails alone.

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::batch::BatchWrite;
use crate::core::error::CoreError;
use crate::core::webhooks;
use crate::pipeline::{has_effects, record_effects};
use crate::runtime::{Forward, KvWrites};
use crate::store::locks::RowLocks;
use crate::store::outgoing::{
    MAX_OUTGOING, OutgoingWrite, OutgoingWritten, accept_chats, chats_by_ids, chats_read,
    write_outgoing,
};
use crate::store::{Backend, Chat, ChatState, FirstRows, FirstStatement, StoreError, TxConn};

/// A message on its way to the database, with its plugins' effects.
pub(super) struct Job {
    pub(super) write: OutgoingWrite,
    /// `None` for a reply on the hub's behalf (no agent to check).
    pub(super) agent: Option<i64>,
    pub(super) forwards: Vec<Forward>,
    pub(super) kv_writes: Vec<(Arc<str>, KvWrites)>,
}

/// What storing one message did.
#[derive(Debug)]
pub(super) struct Sent {
    /// The chat as the message left it.
    pub(super) chat: Chat,
    /// Whether this message accepted the chat for its agent.
    pub(super) accepted: bool,
    pub(super) message_id: Option<i64>,
    /// Its outbox row went to this process's deliverer leased, once
    /// committed (`store/outbox/handoff.rs`): no claim needs to find it.
    pub(super) handed: bool,
}

/// Agent messages, written in batches.
pub(super) struct Outgoing;

impl BatchWrite for Outgoing {
    type Job = Job;
    type Done = Result<Sent, CoreError>;
    const MAX: usize = MAX_OUTGOING;
    const WHAT: &'static str = "agent messages";

    /// The chats' senders and the replies' order keys: beside the batch's
    /// customers' writers and the results of their order keys, before the
    /// chats are read.
    fn locks(jobs: &[Job]) -> RowLocks {
        RowLocks {
            chats: jobs.iter().map(|j| j.write.chat_id).collect(),
            order_keys: jobs
                .iter()
                .filter_map(|j| j.write.delivery.order_key.clone())
                .collect(),
            ..RowLocks::default()
        }
    }

    fn first_statement(
        jobs: &[Job],
        backend: Backend,
    ) -> Result<Option<FirstStatement>, StoreError> {
        let ids: Vec<i64> = jobs.iter().map(|j| j.write.chat_id).collect();
        chats_read(&ids, backend)
    }

    async fn write(
        conn: &mut TxConn<'_>,
        jobs: &mut [Job],
        first: Option<FirstRows>,
    ) -> Result<Vec<Self::Done>, CoreError> {
        let ids: Vec<i64> = jobs.iter().map(|j| j.write.chat_id).collect();
        let mut chats: HashMap<i64, Chat> = chats_by_ids(conn, &ids, first).await?;
        let mut decided = Vec::with_capacity(jobs.len());
        // (chat, agent, time) of each chat an agent's reply accepts.
        let mut accepts: Vec<(i64, i64, i64)> = Vec::new();
        for job in jobs.iter() {
            let now = job.write.now;
            let Some(chat) = chats.get_mut(&job.write.chat_id) else {
                decided.push(Err(CoreError::NotFound));
                continue;
            };
            if let Err(e) = writable(chat, job.agent) {
                decided.push(Err(e));
                continue;
            }
            let accepted = match job.agent {
                Some(agent) if chat.state == ChatState::Open => {
                    accepts.push((chat.id, agent, now));
                    chat.state = ChatState::Accepted;
                    chat.agent_id = Some(agent);
                    chat.accepted_at = Some(now);
                    true
                }
                _ => false,
            };
            if job.write.body.is_some() {
                chat.last_message_at = now;
            }
            decided.push(Ok((chat.clone(), accepted)));
        }
        // The accepts of the whole batch at once (one round trip on
        // PostgreSQL): their chats' state, the cards and numbers of their
        // `chat_accepted` webhooks, which are written with the messages.
        let queued = if accepts.is_empty() {
            Vec::new()
        } else {
            let read = accept_chats(conn, &accepts).await?;
            let chats: Vec<(i64, i64)> =
                accepts.iter().map(|(chat, _, now)| (*chat, *now)).collect();
            webhooks::chat_accepted_rows(conn, read, &chats).await?
        };
        let writes: Vec<&OutgoingWrite> = jobs
            .iter()
            .zip(&decided)
            .filter(|(_, d)| d.is_ok())
            .map(|(j, _)| &j.write)
            .collect();
        // Below, only the messages' plugin effects: without any, the
        // messages' statement ends the transaction.
        let last = jobs.iter().all(|j| !has_effects(&j.forwards, &j.kv_writes));
        let mut written = write_outgoing(conn, &writes, &queued, last)
            .await?
            .into_iter();
        let mut results = Vec::with_capacity(jobs.len());
        for (job, decided) in jobs.iter().zip(decided) {
            let result = match decided {
                Ok((chat, accepted)) => {
                    let write = &job.write;
                    record_effects(conn, &write.event, &job.forwards, &job.kv_writes, write.now)
                        .await?;
                    let OutgoingWritten { message_id, handed } = written.next().unwrap_or_default();
                    Ok(Sent {
                        chat,
                        accepted,
                        message_id,
                        handed,
                    })
                }
                Err(e) => Err(e),
            };
            results.push(result);
        }
        Ok(results)
    }
}

/// Refuses a message to a closed chat, or an agent's to a chat another
/// agent accepted.
pub(super) fn writable(chat: &Chat, agent: Option<i64>) -> Result<(), CoreError> {
    match (chat.state, chat.agent_id, agent) {
        (ChatState::Closed, _, _) => Err(CoreError::Conflict("the chat is closed".into())),
        (ChatState::Accepted, Some(owner), Some(agent)) if owner != agent => Err(
            CoreError::Conflict("the chat belongs to another agent".into()),
        ),
        _ => Ok(()),
    }
}
