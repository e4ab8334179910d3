//! Group commit for SQLite: every write transaction of the process runs on one
//! writer connection, inside one open database transaction, each in its own
//! savepoint; a flusher commits once for everything that finished meanwhile
//! and only then answers each of them.
//!
//! Why: SQLite has one writer, each statement costs a round trip to the
//! driver's thread, and each commit an fsync (with `durability = "full"`).
//! Taking turns per transaction made the write path the hub's bottleneck;
//! sharing the `BEGIN`/`COMMIT` and the fsync among whoever is waiting keeps
//! each transaction's own statements as the only serial cost.
//!
//! Invariants: a caller's [`commit`](super::WriteTx::commit) returns `Ok`
//! only after the commit that contains its writes is durable (per the
//! durability setting); a transaction dropped without commit is rolled back
//! to its savepoint before anyone else writes, and nobody else's work is
//! lost with it; a failed commit fails every transaction of its group.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use sqlx::{AnyConnection, Executor};
use tokio::sync::{Mutex, MutexGuard, Notify, oneshot};

use super::{Ctx, StoreError};

/// How far a commit must have gone before a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync on every commit: an acknowledged write survives power loss.
    #[default]
    Full,
    /// No fsync on commit (WAL): survives a crash of the hub, not of the machine.
    Normal,
}

impl Durability {
    pub(super) fn pragma(self) -> &'static str {
        match self {
            Durability::Full => "PRAGMA synchronous = FULL;",
            Durability::Normal => "PRAGMA synchronous = NORMAL;",
        }
    }
}

/// The writer connection and what the open transaction holds.
pub(super) struct Writer {
    conn: AnyConnection,
    /// Whether `BEGIN` ran and no `COMMIT` since.
    in_tx: bool,
    /// A transaction was dropped without commit: its savepoint must be rolled
    /// back before the next statement.
    rollback_pending: bool,
    /// Callers whose work is in the open transaction, waiting for its commit.
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
}

pub(super) struct Group {
    writer: Mutex<Writer>,
    flush: Arc<Notify>,
    closed: AtomicBool,
    pub(super) health: Arc<WriteHealth>,
}

/// Whether the latest commit failed, and why (a full disk, say): readiness
/// reports it until a commit succeeds again, or for [`FAILURE_HOLDS`] when
/// nothing tries (a balancer that moved traffic away must get to try again).
/// Reads and the database's answer to a ping look healthy meanwhile, so only
/// the writes can tell.
#[derive(Debug, Default)]
pub struct WriteHealth {
    failing: std::sync::Mutex<Option<(String, std::time::Instant)>>,
}

/// How long one failed commit keeps the hub unready.
const FAILURE_HOLDS: std::time::Duration = std::time::Duration::from_secs(10);

impl WriteHealth {
    pub(super) fn record<E: std::fmt::Display>(&self, result: &Result<(), E>) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) if failing.is_some() => {
                tracing::info!("writes succeed again");
                *failing = None;
            }
            Ok(()) => {}
            Err(e) => *failing = Some((e.to_string(), std::time::Instant::now())),
        }
    }

    /// Why the latest commit failed, while no commit has succeeded since
    /// and it is recent.
    pub fn failure(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|(_, at)| at.elapsed() < FAILURE_HOLDS)
            .map(|(why, _)| why.clone())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
        self.flush.notify_one();
    }
}

impl Group {
    /// Wraps the writer connection and starts its flusher task.
    pub(super) fn start(conn: AnyConnection) -> Arc<Group> {
        let flush = Arc::new(Notify::new());
        let group = Arc::new(Group {
            writer: Mutex::new(Writer {
                conn,
                in_tx: false,
                rollback_pending: false,
                waiters: Vec::new(),
            }),
            flush: flush.clone(),
            closed: AtomicBool::new(false),
            health: Arc::default(),
        });
        tokio::spawn(flusher(Arc::downgrade(&group), flush));
        group
    }

    /// Joins the open transaction (opening it if needed) in a savepoint of
    /// its own.
    pub(super) async fn begin(&self) -> Result<SharedTx<'_>, StoreError> {
        let mut writer = self.writer.lock().await;
        writer.settle().await?;
        if writer.in_tx {
            writer
                .conn
                .execute("SAVEPOINT job")
                .await
                .ctx("starting a transaction")?;
        } else {
            // IMMEDIATE: take the database's write lock now, so another
            // process cannot make this transaction fail half-way.
            if let Err(e) = writer.conn.execute("BEGIN IMMEDIATE; SAVEPOINT job").await {
                let _ = writer.conn.execute("ROLLBACK").await;
                return Err(StoreError::Db {
                    context: "starting a transaction",
                    source: e,
                });
            }
            writer.in_tx = true;
        }
        Ok(SharedTx {
            writer,
            group: self,
            committed: false,
        })
    }

    /// Commits what is pending, then copies the rest of the WAL into the
    /// database file so that the next group writes it from its start.
    pub(super) async fn restart_wal(&self) -> Result<(), StoreError> {
        let mut writer = self.writer.lock().await;
        writer.flush(&self.health).await;
        writer
            .conn
            .execute("PRAGMA wal_checkpoint(RESTART)")
            .await
            .ctx("restarting the WAL")?;
        Ok(())
    }

    /// Commits what is pending and stops the flusher.
    pub(super) async fn close(&self) {
        let mut writer = self.writer.lock().await;
        writer.flush(&self.health).await;
        self.closed.store(true, Ordering::Release);
        self.flush.notify_one();
    }
}

impl Writer {
    /// Rolls back a savepoint its transaction left behind.
    async fn settle(&mut self) -> Result<(), StoreError> {
        if self.rollback_pending {
            self.conn
                .execute("ROLLBACK TO job; RELEASE job")
                .await
                .ctx("rolling back a transaction")?;
            self.rollback_pending = false;
        }
        Ok(())
    }

    /// Commits the open transaction and answers everyone whose work it holds.
    async fn flush(&mut self, health: &WriteHealth) {
        let settled = self.settle().await.map_err(|e| e.to_string());
        let result = match settled {
            Err(e) => Err(e),
            Ok(()) if self.in_tx => match self.conn.execute("COMMIT").await {
                Ok(_) => Ok(()),
                Err(e) => Err(format!("committing: {e}")),
            },
            Ok(()) => Ok(()),
        };
        if result.is_err() && self.in_tx {
            let _ = self.conn.execute("ROLLBACK").await;
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, waiting = self.waiters.len(), "a group commit failed");
        }
        if !self.waiters.is_empty() {
            health.record(&result);
        }
        self.in_tx = false;
        self.rollback_pending = false;
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(result.clone());
        }
    }
}

/// Commits whenever a transaction finished, until the store is dropped.
/// Transactions that finish while a commit runs wait on the writer's lock
/// and go into the next one: the busier the hub, the larger each group.
async fn flusher(group: Weak<Group>, flush: Arc<Notify>) {
    loop {
        flush.notified().await;
        let Some(group) = group.upgrade() else {
            return;
        };
        if group.closed.load(Ordering::Acquire) {
            return;
        }
        let mut writer = group.writer.lock().await;
        if writer.in_tx || writer.rollback_pending {
            writer.flush(&group.health).await;
        }
    }
}

/// A transaction in the shared one: derefs to the writer connection.
pub struct SharedTx<'a> {
    writer: MutexGuard<'a, Writer>,
    group: &'a Group,
    /// Set by `commit`; dropped without it, the savepoint is rolled back.
    committed: bool,
}

impl SharedTx<'_> {
    pub(super) fn conn(&mut self) -> &mut AnyConnection {
        &mut self.writer.conn
    }

    pub(super) fn conn_ref(&self) -> &AnyConnection {
        &self.writer.conn
    }

    /// Leaves the writer to others; the future resolves with the group
    /// commit (it borrows nothing, so the wait can move to another task).
    pub(super) fn commit(mut self) -> impl Future<Output = Result<(), StoreError>> + 'static {
        let (send, receive) = oneshot::channel();
        self.writer.waiters.push(send);
        self.committed = true;
        let group = self.group;
        drop(self);
        group.flush.notify_one();
        async move {
            match receive.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(StoreError::Commit(e)),
                Err(_) => Err(StoreError::Commit("the writer stopped".to_owned())),
            }
        }
    }
}

impl Drop for SharedTx<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.writer.rollback_pending = true;
            // The flusher rolls back and commits the rest, so the database's
            // write lock is not kept by a transaction nobody will finish.
            self.group.flush.notify_one();
        }
    }
}
