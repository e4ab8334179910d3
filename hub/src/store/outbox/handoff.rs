//! Rows leased to this process as they are queued, handed to its deliverer
//! without a claim.
//!
//! Why: an agent's reply is written by the process whose deliverer will
//! send it. Writing its outbox row already leased to this instance (when
//! it is its order key's head, so it may go at once) and handing the row
//! over in memory once the transaction committed saves the deliverer the
//! claim that would otherwise lease it a moment later: a statement, and on
//! PostgreSQL a transaction, per few deliveries.
//!
//! Invariants: a row is handed over only after its transaction committed,
//! and only while a deliverer runs here ([`Handoff::open`]); a handed row
//! is leased like a claimed one, so if this process dies before sending
//! it, another instance (or this one after a restart) claims it once the
//! lease runs out. A row queued behind a pending row of its order key is
//! not leased: the claim takes it when it becomes the head.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::Notify;

use super::Claimed;

/// The rows handed to this process's deliverer, and whether it takes any.
#[derive(Default)]
pub struct Handoff {
    /// The lease a handed row gets, in ms; 0 while no deliverer runs.
    lease_ms: AtomicI64,
    rows: Mutex<Vec<Claimed>>,
    ready: Notify,
}

impl Handoff {
    /// A deliverer runs here with leases of `lease_ms` (again after a
    /// reload changed them).
    pub fn open(&self, lease_ms: i64) {
        self.lease_ms.store(lease_ms.max(0), Ordering::Relaxed);
    }

    /// The deliverer stopped: nothing more is leased for it; the rows
    /// handed and not taken, whose leases it should give back.
    pub fn close(&self) -> Vec<Claimed> {
        self.lease_ms.store(0, Ordering::Relaxed);
        self.take()
    }

    /// The lease a row queued now gets, if a deliverer takes rows.
    pub(in crate::store) fn lease_ms(&self) -> Option<i64> {
        let ms = self.lease_ms.load(Ordering::Relaxed);
        (ms > 0).then_some(ms)
    }

    /// Rows whose transaction committed.
    pub(in crate::store) fn put(&self, rows: Vec<Claimed>) {
        if rows.is_empty() {
            return;
        }
        self.lock().extend(rows);
        self.ready.notify_one();
    }

    /// The rows handed over since the last take, in the order they came.
    pub fn take(&self) -> Vec<Claimed> {
        std::mem::take(&mut *self.lock())
    }

    /// Resolves when rows were handed over (at once if some came since the
    /// last wait).
    pub async fn ready(&self) {
        self.ready.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Claimed>> {
        // A panic while holding it cannot leave the list half-written.
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Rows a transaction hands over when it commits.
pub(in crate::store) struct Handing {
    pub(in crate::store) to: std::sync::Arc<Handoff>,
    /// This process, as the handed rows' `lease_owner`.
    pub(in crate::store) owner: std::sync::Arc<crate::store::instances::Identity>,
    pub(in crate::store) rows: Vec<Claimed>,
}

impl Handing {
    /// After the commit succeeded.
    pub(in crate::store) fn committed(self) {
        self.to.put(self.rows);
    }
}
