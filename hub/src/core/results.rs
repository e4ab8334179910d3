//! The delivery-result writer: final results that crossed the pipeline
//! queue to a [`Batcher`](super::batch::Batcher) and are stored as many at a
//! time as are waiting, with their plugins' forwards and key-value writes.

use std::sync::Arc;

use crate::core::batch::BatchWrite;
use crate::core::error::CoreError;
use crate::pipeline::{has_effects, record_effects};
use crate::runtime::{Forward, KvWrites};
use crate::store::locks::RowLocks;
use crate::store::outbox::{Finished, MAX_FINISHED, finish_many, finish_statement};
use crate::store::{Backend, FirstRows, FirstStatement, StoreError, TxConn};

/// A final result on its way to the database, with its plugins' effects.
pub(super) struct ResultJob {
    pub(super) finished: Finished,
    pub(super) forwards: Vec<Forward>,
    pub(super) kv_writes: Vec<(Arc<str>, KvWrites)>,
}

/// Delivery results, written in batches (`store::outbox::finish_many`).
pub(super) struct Results;

impl BatchWrite for Results {
    type Job = ResultJob;
    /// Whether the batch made a row its order key's head (it may be due:
    /// the deliverer looks).
    type Done = bool;
    const MAX: usize = MAX_FINISHED;
    const WHAT: &'static str = "delivery results";

    /// The rows' order keys: a row queued and a row finished at once would
    /// each miss the other as the key's next head.
    fn locks(jobs: &[ResultJob]) -> RowLocks {
        RowLocks {
            outbox_rows: jobs.iter().map(|j| j.finished.seq).collect(),
            ..RowLocks::default()
        }
    }

    fn first_statement(
        jobs: &[ResultJob],
        backend: Backend,
    ) -> Result<Option<FirstStatement>, StoreError> {
        let rows: Vec<&Finished> = jobs.iter().map(|j| &j.finished).collect();
        let statement = finish_statement(&rows, backend)?;
        // Without plugin effects to write after them, the results are the
        // whole transaction: one round trip on PostgreSQL.
        let effects = jobs.iter().any(|j| has_effects(&j.forwards, &j.kv_writes));
        Ok(statement.map(|s| if effects { s } else { s.alone() }))
    }

    async fn write(
        conn: &mut TxConn<'_>,
        jobs: &mut [ResultJob],
        first: Option<FirstRows>,
    ) -> Result<Vec<bool>, CoreError> {
        let rows: Vec<&Finished> = jobs.iter().map(|j| &j.finished).collect();
        let headed = finish_many(conn, &rows, first).await?;
        for job in jobs.iter() {
            let event = &job.finished.event;
            record_effects(conn, event, &job.forwards, &job.kv_writes, job.finished.now).await?;
        }
        Ok(vec![headed; jobs.len()])
    }
}

/// A batch failure as the deliverer's store error.
pub(super) fn into_store_error(e: CoreError) -> StoreError {
    match e {
        CoreError::Store(e) => e,
        other => StoreError::Commit(other.to_string()),
    }
}
