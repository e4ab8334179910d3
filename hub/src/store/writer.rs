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
//! With `durability = "full"` the fsync is taken off the writer: SQLite
//! commits without syncing (`synchronous = NORMAL`) and a [`Syncer`] thread
//! syncs the WAL file and only then answers the group, while the writer
//! already writes the next one. What SQLite's own `FULL` does (sync the WAL
//! at each commit) is done once for every group committed meanwhile, and
//! the writer never waits for the disk. Frames leave the WAL only through a
//! checkpoint, which syncs the WAL before it copies and the database file
//! after, so a restarted WAL never drops frames that were not yet synced.
//!
//! Invariants: a caller's [`commit`](super::WriteTx::commit) returns `Ok`
//! only after the commit that contains its writes is durable (per the
//! durability setting); a transaction dropped without commit is rolled back
//! to its savepoint before anyone else writes, and nobody else's work is
//! lost with it; a failed commit (or sync) fails every transaction of its
//! group.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak, mpsc};

use sqlx::any::{AnyArguments, AnyRow};
use sqlx::{AnyConnection, Execute, Executor};
use tokio::sync::{Mutex, MutexGuard, Notify, oneshot};

use super::batch::{self, Query};
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
    /// A job's first statement, which wrote, failed or was cut off: whether
    /// its savepoint was taken is unknown, so the whole open transaction
    /// is rolled back and everyone waiting for it is told (see
    /// [`Group::begin_first`]).
    abort_pending: bool,
    /// Callers whose work is in the open transaction, waiting for its commit.
    waiters: Vec<Waiter>,
    /// Syncs the WAL after each commit and answers the group then; without
    /// it, a commit's end is its durability.
    syncer: Option<Syncer>,
}

type Waiter = oneshot::Sender<Result<(), String>>;

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
    /// Wraps the writer connection and starts its flusher task; with `wal`
    /// (the WAL file of a connection that commits without syncing), a
    /// [`Syncer`] makes each commit durable before it is answered.
    pub(super) fn start(conn: AnyConnection, wal: Option<PathBuf>) -> std::io::Result<Arc<Group>> {
        let flush = Arc::new(Notify::new());
        let health: Arc<WriteHealth> = Arc::default();
        let syncer = wal
            .map(|wal| Syncer::start(wal, health.clone()))
            .transpose()?;
        let group = Arc::new(Group {
            writer: Mutex::new(Writer {
                conn,
                in_tx: false,
                rollback_pending: false,
                abort_pending: false,
                waiters: Vec::new(),
                syncer,
            }),
            flush: flush.clone(),
            closed: AtomicBool::new(false),
            health,
        });
        tokio::spawn(flusher(Arc::downgrade(&group), flush));
        Ok(group)
    }

    /// Joins the open transaction (opening it if needed) in a savepoint of
    /// its own.
    pub(super) async fn begin(&self) -> Result<SharedTx<'_>, StoreError> {
        let mut writer = self.writer.lock().await;
        // After `close` no flusher commits: a transaction opened now would
        // hold the database's write lock until the process exits.
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Commit("the database was closed".into()));
        }
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

    /// [`begin`](Group::begin) with the job's first statement in the same
    /// round trip: `SAVEPOINT` (and `BEGIN` when the group's transaction is
    /// not open yet), then `first`; its rows come back with the savepoint.
    /// Each statement costs a hand-off to the driver's thread and back, and
    /// the writer is held across them, so the savepoint's own round trip
    /// was a third of a busy writer's.
    ///
    /// If `first` fails, whether the savepoint before it was taken is
    /// unknown (a script stops at its first error). A read wrote nothing,
    /// so nothing is rolled back (a savepoint left behind goes with the
    /// group's commit); a write cannot be rolled back to its own savepoint
    /// for certain, so the group's whole transaction is, and its waiting
    /// transactions fail (they were not acknowledged: clients retry). The
    /// same when the job is cut off in its first round trip.
    pub(super) async fn begin_first(
        &self,
        first: Opening,
    ) -> Result<(SharedTx<'_>, Vec<AnyRow>), StoreError> {
        let mut writer = self.writer.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Commit("the database was closed".into()));
        }
        writer.settle().await?;
        let opened = writer.in_tx;
        let (begin, begun) = if opened {
            ("SAVEPOINT job;\n", 1)
        } else {
            ("BEGIN IMMEDIATE; SAVEPOINT job;\n", 2)
        };
        let sql = format!("{begin}{}", first.sql);
        // Until the answer is in, a job dropped (its future cut off) leaves
        // the transaction in an unknown state: the flusher rolls it back.
        writer.abort_pending = first.writes || !opened;
        writer.in_tx = true;
        let cut_off = NotifyOnDrop(Some(&self.flush));
        let ran = batch::run(
            &mut writer.conn,
            sqlx::query_with(&sql, first.args),
            first.what,
        )
        .await;
        cut_off.disarm();
        match ran {
            Ok(statements) => {
                writer.abort_pending = false;
                let rows = statements.into_iter().nth(begun).unwrap_or_default();
                Ok((
                    SharedTx {
                        writer,
                        group: self,
                        committed: false,
                    },
                    rows,
                ))
            }
            Err(e) if !opened => {
                // Nobody else's work is in it: roll back whatever began.
                let _ = writer.conn.execute("ROLLBACK").await;
                writer.in_tx = false;
                writer.abort_pending = false;
                Err(e)
            }
            Err(e) => {
                if writer.abort_pending {
                    tracing::error!(error = %e, waiting = writer.waiters.len(), "a write failed in its first statement; rolling back its group");
                    self.flush.notify_one();
                }
                Err(e)
            }
        }
    }

    /// Commits what is pending, then copies the rest of the WAL into the
    /// database file so that the next group writes it from its start.
    pub(super) async fn restart_wal(&self) -> Result<(), StoreError> {
        let mut writer = self.writer.lock().await;
        let held = std::time::Instant::now();
        writer.flush(&self.health).await;
        writer
            .conn
            .execute("PRAGMA wal_checkpoint(RESTART)")
            .await
            .ctx("restarting the WAL")?;
        let held = held.elapsed();
        crate::obs::wal_restarted(held);
        tracing::debug!(held_ms = held.as_secs_f64() * 1e3, "WAL restarted");
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
    /// Rolls back a savepoint its transaction left behind, or the whole
    /// open transaction when a job's first write failed
    /// ([`Group::begin_first`]).
    async fn settle(&mut self) -> Result<(), StoreError> {
        if self.abort_pending {
            let _ = self.conn.execute("ROLLBACK").await;
            self.in_tx = false;
            self.abort_pending = false;
            self.rollback_pending = false;
            let why =
                Err("rolled back with a transaction of its group whose write failed".to_owned());
            answer(std::mem::take(&mut self.waiters), &why);
            return Ok(());
        }
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
        self.in_tx = false;
        self.rollback_pending = false;
        if self.waiters.is_empty() {
            return;
        }
        let waiters = std::mem::take(&mut self.waiters);
        match (&result, &self.syncer) {
            (Ok(()), Some(syncer)) => syncer.sync_then_answer(waiters),
            _ => {
                health.record(&result);
                answer(waiters, &result);
            }
        }
    }
}

fn answer(waiters: Vec<Waiter>, result: &Result<(), String>) {
    for waiter in waiters {
        let _ = waiter.send(result.clone());
    }
}

/// A thread that syncs the WAL file for the groups committed since its last
/// sync, then answers them: one fsync for however many groups the writer
/// committed while the previous one ran.
struct Syncer {
    groups: mpsc::Sender<Vec<Waiter>>,
}

impl Syncer {
    fn start(wal: PathBuf, health: Arc<WriteHealth>) -> std::io::Result<Syncer> {
        let (groups, pending) = mpsc::channel::<Vec<Waiter>>();
        std::thread::Builder::new()
            .name("hub-wal-sync".into())
            .spawn(move || {
                let mut file: Option<std::fs::File> = None;
                // Ends when the writer (the only sender) is gone, after the
                // groups it handed over are answered.
                while let Ok(mut waiters) = pending.recv() {
                    while let Ok(more) = pending.try_recv() {
                        waiters.extend(more);
                    }
                    let syncing = std::time::Instant::now();
                    let result = sync_wal(&wal, &mut file).map_err(|e| {
                        file = None;
                        format!("syncing the write-ahead log {}: {e}", wal.display())
                    });
                    match &result {
                        Ok(()) => crate::obs::wal_synced(syncing.elapsed()),
                        Err(e) => {
                            tracing::error!(error = %e, waiting = waiters.len(), "a WAL sync failed");
                        }
                    }
                    health.record(&result);
                    answer(waiters, &result);
                }
            })?;
        Ok(Syncer { groups })
    }

    fn sync_then_answer(&self, waiters: Vec<Waiter>) {
        if let Err(mpsc::SendError(waiters)) = self.groups.send(waiters) {
            answer(waiters, &Err("the WAL sync thread stopped".to_owned()));
        }
    }
}

/// Makes what was written to the WAL durable; the first time, also the
/// WAL's entry in its directory (SQLite created the file without syncing it).
fn sync_wal(wal: &std::path::Path, file: &mut Option<std::fs::File>) -> std::io::Result<()> {
    let opened = match file {
        Some(f) => f,
        None => {
            let opened = std::fs::File::open(wal)?;
            if let Some(dir) = wal.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::File::open(dir)?.sync_all()?;
            }
            file.insert(opened)
        }
    };
    opened.sync_data()
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
        if writer.in_tx || writer.rollback_pending || writer.abort_pending {
            writer.flush(&group.health).await;
        }
    }
}

/// A job's first statement for [`Group::begin_first`].
pub(super) struct Opening {
    sql: &'static str,
    args: AnyArguments<'static>,
    /// It changes something (a claim, results), not only reads.
    writes: bool,
    what: &'static str,
}

impl Opening {
    pub(super) fn new(
        mut query: Query<'static>,
        writes: bool,
        what: &'static str,
    ) -> Result<Opening, StoreError> {
        let sql = query.sql();
        let args = query
            .take_arguments()
            .map_err(|e| StoreError::Db {
                context: what,
                source: sqlx::Error::Encode(e),
            })?
            .unwrap_or_default();
        Ok(Opening {
            sql,
            args,
            writes,
            what,
        })
    }
}

/// Wakes the flusher if dropped before [`disarm`](NotifyOnDrop::disarm):
/// a job cut off in its first round trip leaves work for it.
struct NotifyOnDrop<'a>(Option<&'a Notify>);

impl NotifyOnDrop<'_> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for NotifyOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(flush) = self.0 {
            flush.notify_one();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose WAL cannot be synced is not acknowledged: every waiter
    /// gets the error, and readiness reports the failing writes.
    #[tokio::test]
    async fn a_group_whose_wal_cannot_be_synced_is_answered_with_the_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal = dir.path().join("missing").join("hub.db-wal");
        let health: Arc<WriteHealth> = Arc::default();
        let syncer = Syncer::start(wal, health.clone()).expect("syncer");
        let (first, first_answer) = oneshot::channel();
        let (second, second_answer) = oneshot::channel();
        syncer.sync_then_answer(vec![first, second]);
        for answer in [first_answer, second_answer] {
            let error = answer.await.expect("answered").expect_err("not durable");
            assert!(error.contains("syncing the write-ahead log"), "{error}");
        }
        assert!(health.failure().is_some(), "readiness sees the failure");
    }

    /// Synced groups are answered `Ok`, and the sync thread ends with the
    /// writer once what it was handed is answered.
    #[tokio::test]
    async fn synced_groups_are_answered_and_the_thread_ends_with_the_writer() {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal = dir.path().join("hub.db-wal");
        std::fs::write(&wal, b"frames").expect("wal");
        let health: Arc<WriteHealth> = Arc::default();
        let syncer = Syncer::start(wal, health.clone()).expect("syncer");
        let mut answers = Vec::new();
        for _ in 0..3 {
            let (send, answer) = oneshot::channel();
            syncer.sync_then_answer(vec![send]);
            answers.push(answer);
        }
        drop(syncer);
        for answer in answers {
            assert_eq!(answer.await.expect("answered"), Ok(()));
        }
        assert!(health.failure().is_none());
    }
}
