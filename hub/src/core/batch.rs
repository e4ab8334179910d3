//! One writer task per kind of write that is stored in batches (customer
//! messages, delivery results): requests queue their job, the task takes
//! whatever is waiting, writes it in one transaction of the group commit and
//! answers each job once that transaction is durable.
//!
//! Invariants: a job is answered `Ok` only after its commit; one bad job
//! cannot fail the others of its batch (a failed batch is retried one job at
//! a time); the next batch is written while the previous one's commit is
//! awaited by a task of its own.

use std::future::Future;
use std::sync::OnceLock;

use tokio::sync::{mpsc, oneshot};

use crate::core::conversations::CoreError;
use crate::store::{Conn, Store, StoreError};

/// How many jobs may wait for a writer before their senders wait too.
const QUEUE: usize = 4096;

/// What a batch writer stores.
pub(super) trait BatchWrite: Send + 'static {
    type Job: Send + 'static;
    type Done: Send + 'static;
    /// Most jobs written in one transaction.
    const MAX: usize;
    /// What the jobs are, for logs.
    const WHAT: &'static str;

    /// Writes `jobs` in order in the caller's transaction; one result per job.
    fn write<'a>(
        conn: &'a mut Conn,
        jobs: &'a mut [Self::Job],
    ) -> impl Future<Output = Result<Vec<Self::Done>, CoreError>> + Send + 'a;
}

type Queued<W> = (
    <W as BatchWrite>::Job,
    oneshot::Sender<Result<<W as BatchWrite>::Done, CoreError>>,
);

/// The queue to one writer task, started on first use.
pub(super) struct Batcher<W: BatchWrite> {
    queue: OnceLock<mpsc::Sender<Queued<W>>>,
}

impl<W: BatchWrite> Default for Batcher<W> {
    fn default() -> Self {
        Batcher {
            queue: OnceLock::new(),
        }
    }
}

impl<W: BatchWrite> Batcher<W> {
    /// Queues `job` and waits until it is stored and committed.
    pub(super) async fn write(&self, store: &Store, job: W::Job) -> Result<W::Done, CoreError> {
        let queue = self.queue.get_or_init(|| {
            let (send, receive) = mpsc::channel(QUEUE);
            tokio::spawn(run::<W>(store.clone(), receive));
            send
        });
        let (done, result) = oneshot::channel();
        queue
            .send((job, done))
            .await
            .map_err(|_| stopped(W::WHAT, "the writer stopped"))?;
        result
            .await
            .map_err(|_| stopped(W::WHAT, "the writer dropped one"))?
    }
}

fn stopped(what: &str, why: &str) -> CoreError {
    CoreError::Store(StoreError::Commit(format!("{what}: {why}")))
}

async fn run<W: BatchWrite>(store: Store, mut queue: mpsc::Receiver<Queued<W>>) {
    let mut waiting = Vec::with_capacity(W::MAX);
    while queue.recv_many(&mut waiting, W::MAX).await > 0 {
        let (mut jobs, dones): (Vec<_>, Vec<_>) = std::mem::take(&mut waiting).into_iter().unzip();
        match write_batch::<W>(&store, &mut jobs).await {
            Ok(written) => {
                tokio::spawn(answer_after(written, dones));
            }
            Err(e) if jobs.len() > 1 => {
                tracing::warn!(error = %e, count = jobs.len(), what = W::WHAT, "a batch failed; writing its jobs one by one");
                for (job, done) in jobs.into_iter().zip(dones) {
                    let mut one = [job];
                    match write_batch::<W>(&store, &mut one).await {
                        Ok(written) => answer_after(written, vec![done]).await,
                        Err(e) => answer_all(vec![done], e, W::WHAT),
                    }
                }
            }
            Err(e) => answer_all(dones, e, W::WHAT),
        }
    }
}

/// The batch's results and the wait for its commit.
type Written<D> = (Vec<D>, crate::store::Committing);

async fn write_batch<W: BatchWrite>(
    store: &Store,
    jobs: &mut [W::Job],
) -> Result<Written<W::Done>, CoreError> {
    let mut w = store.begin_write().await?;
    let results = W::write(&mut w.tx, jobs).await?;
    Ok((results, w.into_commit()))
}

async fn answer_after<D>(written: Written<D>, dones: Vec<oneshot::Sender<Result<D, CoreError>>>) {
    let (results, commit) = written;
    match commit.await {
        Ok(()) => {
            for (done, result) in dones.into_iter().zip(results) {
                let _ = done.send(Ok(result));
            }
        }
        Err(e) => {
            let e = commit_failure(&CoreError::Store(e));
            for done in dones {
                let _ = done.send(Err(CoreError::Store(StoreError::Commit(e.clone()))));
            }
        }
    }
}

/// Why a write failed, once: a commit's failure is not wrapped in another.
fn commit_failure(error: &CoreError) -> String {
    match error {
        CoreError::Store(StoreError::Commit(why)) => why.clone(),
        other => other.to_string(),
    }
}

fn answer_all<D>(dones: Vec<oneshot::Sender<Result<D, CoreError>>>, error: CoreError, what: &str) {
    let text = commit_failure(&error);
    tracing::error!(error = %text, count = dones.len(), what, "not stored");
    for done in dones {
        let _ = done.send(Err(CoreError::Store(StoreError::Commit(text.clone()))));
    }
}
