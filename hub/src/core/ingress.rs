//! The customer-message writer: messages that passed the pipeline queue here
//! and are stored by one task, as many at a time as are waiting, in one
//! transaction of the group commit; each request is answered once the batch
//! holding it is durable.
//!
//! Invariants: a message is acknowledged only after its commit; one bad
//! message cannot fail the others of its batch (a failed batch is retried one
//! message at a time); a message's forwards, key-value writes and
//! `chat_updated` webhook are written in the transaction of the message.

use std::sync::{Arc, OnceLock};

use tokio::sync::{mpsc, oneshot};

use crate::core::conversations::CoreError;
use crate::core::webhooks;
use crate::pipeline::record_effects;
use crate::runtime::{Forward, KvWrites};
use crate::store::ingress::{CustomerWrite, CustomerWritten, MAX_BATCH, write_customer_messages};
use crate::store::{Store, StoreError};

/// How many stored messages may wait for the writer before senders wait too.
const QUEUE: usize = 4096;

/// A stored customer message, as its request learns it.
#[derive(Debug)]
pub(super) struct Written {
    pub(super) written: CustomerWritten,
    /// Whether a `chat_updated` webhook was queued (the visitor's profile changed).
    pub(super) updated: bool,
}

/// A message on its way to the database, with its plugins' effects.
pub(super) struct Job {
    pub(super) write: CustomerWrite,
    pub(super) forwards: Vec<Forward>,
    pub(super) kv_writes: Vec<(Arc<str>, KvWrites)>,
    done: Option<oneshot::Sender<Result<Written, CoreError>>>,
}

impl Job {
    pub(super) fn new(
        write: CustomerWrite,
        forwards: Vec<Forward>,
        kv_writes: Vec<(Arc<str>, KvWrites)>,
    ) -> Job {
        Job {
            write,
            forwards,
            kv_writes,
            done: None,
        }
    }
}

/// The queue to the writer task, started on first use.
#[derive(Default)]
pub(super) struct IngressWriter {
    queue: OnceLock<mpsc::Sender<Job>>,
}

impl IngressWriter {
    /// Queues `job` and waits until it is stored and committed.
    pub(super) async fn write(&self, store: &Store, mut job: Job) -> Result<Written, CoreError> {
        let queue = self.queue.get_or_init(|| {
            let (send, receive) = mpsc::channel(QUEUE);
            tokio::spawn(run(store.clone(), receive));
            send
        });
        let (done, result) = oneshot::channel();
        job.done = Some(done);
        queue
            .send(job)
            .await
            .map_err(|_| stopped("the message writer stopped"))?;
        result
            .await
            .map_err(|_| stopped("the message writer dropped a message"))?
    }
}

fn stopped(what: &str) -> CoreError {
    CoreError::Store(StoreError::Commit(what.to_owned()))
}

/// Takes whatever is queued (up to a batch), writes it, and hands the wait
/// for the commit to a task of its own so the next batch can start.
async fn run(store: Store, mut queue: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        let mut batch = std::mem::take(&mut jobs);
        match write_batch(&store, &mut batch).await {
            Ok(answer) => {
                tokio::spawn(answer);
            }
            Err(e) if batch.len() > 1 => {
                tracing::warn!(error = %e, messages = batch.len(), "a batch of customer messages failed; storing them one by one");
                for job in batch {
                    let mut one = vec![job];
                    match write_batch(&store, &mut one).await {
                        Ok(answer) => answer.await,
                        Err(e) => answer_all(one, e),
                    }
                }
            }
            Err(e) => answer_all(batch, e),
        }
    }
}

/// Writes `jobs` in one transaction; the future it returns waits for the
/// commit and answers each job.
async fn write_batch(
    store: &Store,
    jobs: &mut [Job],
) -> Result<impl Future<Output = ()> + Send + 'static, CoreError> {
    let mut w = store.begin_write().await?;
    let writes: Vec<&CustomerWrite> = jobs.iter().map(|j| &j.write).collect();
    let written = write_customer_messages(&mut w.tx, &writes).await?;
    let mut results = Vec::with_capacity(jobs.len());
    for (job, written) in jobs.iter_mut().zip(written) {
        let chat_id = written.chat.as_ref().map(|c| c.id);
        job.write.event.chat_id = chat_id;
        let now = job.write.now;
        record_effects(
            &mut w.tx,
            &job.write.event,
            &job.forwards,
            &job.kv_writes,
            now,
        )
        .await?;
        let updated = match &written.chat {
            Some(chat) if written.profile_changed && !written.opened => {
                webhooks::queue_chat_event(&mut w.tx, chat.id, false, now).await?;
                true
            }
            _ => false,
        };
        results.push(Written { written, updated });
    }
    let commit = w.into_commit();
    let done: Vec<_> = jobs.iter_mut().filter_map(|j| j.done.take()).collect();
    Ok(async move {
        match commit.await {
            Ok(()) => {
                for (done, result) in done.into_iter().zip(results) {
                    let _ = done.send(Ok(result));
                }
            }
            Err(e) => {
                let e = e.to_string();
                for done in done {
                    let _ = done.send(Err(CoreError::Store(StoreError::Commit(e.clone()))));
                }
            }
        }
    })
}

fn answer_all(jobs: Vec<Job>, error: CoreError) {
    let text = error.to_string();
    tracing::error!(error = %text, messages = jobs.len(), "customer messages were not stored");
    for mut job in jobs {
        if let Some(done) = job.done.take() {
            let _ = done.send(Err(CoreError::Store(StoreError::Commit(text.clone()))));
        }
    }
}
