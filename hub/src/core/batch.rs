//! One writer task per kind of write that is stored in batches (customer
//! messages, delivery results): requests queue their job, the task takes
//! whatever is waiting, writes it in one transaction of the group commit and
//! answers each job once that transaction is durable.
//!
//! Invariants: a job is answered `Ok` only after its commit; one bad job
//! cannot fail the others of its batch (a failed batch is retried one job at
//! a time, unless the database could not be reached: then every job of it
//! is answered at once, not after one acquire timeout per job); the next
//! batch is written while the previous one's commit is awaited by a task of
//! its own.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::core::error::CoreError;
use crate::store::locks::RowLocks;
use crate::store::{Backend, FirstRows, FirstStatement, Store, StoreError, TxConn};

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

    /// What `jobs` share with other writers (PostgreSQL's row mode): locked
    /// in the round trip that begins their transaction.
    fn locks(_jobs: &[Self::Job]) -> RowLocks {
        RowLocks::default()
    }

    /// The statement `write` starts with (a read, or a write nothing
    /// before it decides), sent in the round trip that begins the
    /// transaction (`Store::begin_row_write_reading`).
    fn first_statement(
        _jobs: &[Self::Job],
        _backend: Backend,
    ) -> Result<Option<FirstStatement>, StoreError> {
        Ok(None)
    }

    /// Writes `jobs` in order in the caller's transaction, begun with their
    /// [`locks`](BatchWrite::locks) held and `first` what their
    /// [`first_statement`](BatchWrite::first_statement) returned then
    /// (`None` when there was none); one result per job.
    ///
    /// On PostgreSQL the last statements may carry the commit
    /// ([`TxConn::finish`]); an error after that is answered to every job,
    /// never retried.
    fn write<'a>(
        conn: &'a mut TxConn<'_>,
        jobs: &'a mut [Self::Job],
        first: Option<FirstRows>,
    ) -> impl Future<Output = Result<Vec<Self::Done>, CoreError>> + Send + 'a;
}

/// A job and where its answer goes.
type Asked<J, D> = (J, oneshot::Sender<Result<D, CoreError>>);

/// The queue to one task that answers jobs in batches, started on first
/// use (by `start`, given the receiving end).
struct TaskQueue<J, D> {
    queue: OnceLock<mpsc::Sender<Asked<J, D>>>,
}

impl<J, D> Default for TaskQueue<J, D> {
    fn default() -> Self {
        TaskQueue {
            queue: OnceLock::new(),
        }
    }
}

impl<J, D> TaskQueue<J, D> {
    /// Queues `job` and waits for its answer; `what` names the task in the
    /// error if it stopped.
    async fn ask(
        &self,
        job: J,
        what: &str,
        start: impl FnOnce(mpsc::Receiver<Asked<J, D>>),
    ) -> Result<D, CoreError> {
        let queue = self.queue.get_or_init(|| {
            let (send, receive) = mpsc::channel(QUEUE);
            start(receive);
            send
        });
        let (done, result) = oneshot::channel();
        queue
            .send((job, done))
            .await
            .map_err(|_| stopped(what, "its task stopped"))?;
        result
            .await
            .map_err(|_| stopped(what, "its task dropped one"))?
    }
}

type Queued<W> = Asked<<W as BatchWrite>::Job, <W as BatchWrite>::Done>;

/// The queue to one writer task.
pub(super) struct Batcher<W: BatchWrite> {
    queue: TaskQueue<W::Job, W::Done>,
}

impl<W: BatchWrite> Default for Batcher<W> {
    fn default() -> Self {
        Batcher {
            queue: TaskQueue::default(),
        }
    }
}

impl<W: BatchWrite> Batcher<W> {
    /// Queues `job` and waits until it is stored and committed.
    pub(super) async fn write(&self, store: &Store, job: W::Job) -> Result<W::Done, CoreError> {
        self.queue
            .ask(job, W::WHAT, |receive| {
                tokio::spawn(run::<W>(store.clone(), receive));
            })
            .await
    }
}

/// What is looked up in batches: many requests' keys in one query.
pub(super) trait BatchRead: Send + 'static {
    type Key: Send + 'static;
    type Found: Send + 'static;
    /// Most keys looked up at once.
    const MAX: usize;
    /// What is looked up, for logs.
    const WHAT: &'static str;

    /// What each of `keys` finds, in order.
    fn read<'a>(
        store: &'a Store,
        keys: &'a [Self::Key],
    ) -> impl Future<Output = Result<Vec<Self::Found>, StoreError>> + Send + 'a;
}

/// Lookups at once: a slow one does not hold up the next batch.
const READ_LANES: usize = 4;

/// The queue to one lookup task: requests that ask at the same time share
/// one query (and, on PostgreSQL, one connection's checkout, round trip
/// and release) instead of one each.
pub(super) struct ReadBatcher<R: BatchRead> {
    queue: TaskQueue<R::Key, R::Found>,
}

impl<R: BatchRead> Default for ReadBatcher<R> {
    fn default() -> Self {
        ReadBatcher {
            queue: TaskQueue::default(),
        }
    }
}

impl<R: BatchRead> ReadBatcher<R> {
    /// What `key` finds, read with whatever else is asked meanwhile.
    pub(super) async fn read(&self, store: &Store, key: R::Key) -> Result<R::Found, CoreError> {
        self.queue
            .ask(key, R::WHAT, |receive| {
                tokio::spawn(run_reads::<R>(store.clone(), receive));
            })
            .await
    }
}

async fn run_reads<R: BatchRead>(store: Store, mut queue: mpsc::Receiver<Asked<R::Key, R::Found>>) {
    let lanes = Arc::new(Semaphore::new(READ_LANES));
    while let Some((lane, keys, dones)) = next_batch(&lanes, &mut queue, R::MAX).await {
        let store = store.clone();
        tokio::spawn(async move {
            match R::read(&store, &keys).await {
                Ok(found) if found.len() == dones.len() => {
                    for (done, found) in dones.into_iter().zip(found) {
                        let _ = done.send(Ok(found));
                    }
                }
                Ok(found) => {
                    let e = StoreError::Corrupt(format!(
                        "{} of {} {} came back",
                        found.len(),
                        dones.len(),
                        R::WHAT
                    ));
                    fail_reads(dones, &e, R::WHAT);
                }
                Err(e) => fail_reads(dones, &e, R::WHAT),
            }
            drop(lane);
        });
    }
}

fn fail_reads<F>(
    dones: Vec<oneshot::Sender<Result<F, CoreError>>>,
    error: &StoreError,
    what: &str,
) {
    let text = error.to_string();
    tracing::error!(error = %text, count = dones.len(), what, "lookup failed");
    for done in dones {
        let _ = done.send(Err(CoreError::Store(StoreError::Shared(text.clone()))));
    }
}

fn stopped(what: &str, why: &str) -> CoreError {
    CoreError::Store(StoreError::Commit(format!("{what}: {why}")))
}

async fn run<W: BatchWrite>(store: Store, mut queue: mpsc::Receiver<Queued<W>>) {
    let lanes = Arc::new(Semaphore::new(store.write_lanes()));
    while let Some((lane, jobs, dones)) = next_batch(&lanes, &mut queue, W::MAX).await {
        let store = store.clone();
        tokio::spawn(async move { write_jobs::<W>(&store, jobs, dones, lane).await });
    }
}

/// A batch: the lane it holds, its jobs and where their answers go.
type Batch<J, D> = (
    OwnedSemaphorePermit,
    Vec<J>,
    Vec<oneshot::Sender<Result<D, CoreError>>>,
);

/// The next batch of up to `max` jobs, once a lane is free (`None` once the
/// queue closed). A free lane first, then whatever waits: a batch grows
/// while every lane is busy, not while one is free.
async fn next_batch<J, D>(
    lanes: &Arc<Semaphore>,
    queue: &mut mpsc::Receiver<Asked<J, D>>,
    max: usize,
) -> Option<Batch<J, D>> {
    let lane = lanes.clone().acquire_owned().await.ok()?;
    let mut waiting = Vec::with_capacity(max);
    if queue.recv_many(&mut waiting, max).await == 0 {
        return None;
    }
    gather(queue, &mut waiting, max).await;
    let (jobs, dones) = waiting.into_iter().unzip();
    Some((lane, jobs, dones))
}

/// Most turns [`gather`] gives the runtime.
const GATHER_TURNS: usize = 8;

/// Lets the runtime run its other ready tasks while they keep adding jobs.
///
/// Why: a lane that frees takes what is queued at that instant, while the
/// requests about to queue (their plugin call done, their task woken) sit
/// in the runtime's run queue behind this task. Taking them too halves the
/// batches' number under load, and a batch costs mostly the same whatever
/// its length (round trips, begin and commit; on PostgreSQL, statements'
/// start). Measured with the channel bench on PostgreSQL (`BENCH_AB`):
/// 1.22× ingress with `redact`, 1.27× deliveries, 0.81× hub CPU per message.
/// When a turn brings nothing the load is light and the batch goes at once.
async fn gather<T>(queue: &mut mpsc::Receiver<T>, waiting: &mut Vec<T>, max: usize) {
    for _ in 0..GATHER_TURNS {
        if waiting.len() >= max {
            return;
        }
        tokio::task::yield_now().await;
        let before = waiting.len();
        while waiting.len() < max {
            match queue.try_recv() {
                Ok(job) => waiting.push(job),
                Err(_) => break,
            }
        }
        if waiting.len() == before {
            return;
        }
    }
}

/// Writes one batch and answers its jobs once it is committed; the lane is
/// free again once the transaction let go of the database.
async fn write_jobs<W: BatchWrite>(
    store: &Store,
    mut jobs: Vec<W::Job>,
    dones: Vec<oneshot::Sender<Result<W::Done, CoreError>>>,
    lane: OwnedSemaphorePermit,
) {
    match write_batch::<W>(store, &mut jobs).await {
        Ok(written) => {
            drop(lane);
            answer_after(written, dones).await;
        }
        Err(Failed {
            error: e,
            ended: false,
        }) if jobs.len() > 1 && !unreachable(&e) => {
            tracing::warn!(error = %e, count = jobs.len(), what = W::WHAT, "a batch failed; writing its jobs one by one");
            for (job, done) in jobs.into_iter().zip(dones) {
                let mut one = [job];
                match write_batch::<W>(store, &mut one).await {
                    Ok(written) => answer_after(written, vec![done]).await,
                    Err(failed) => answer_all(vec![done], failed.error, W::WHAT),
                }
            }
            drop(lane);
        }
        Err(failed) => answer_all(dones, failed.error, W::WHAT),
    }
}

/// Why a batch was not written, and whether its transaction had ended
/// (its last statements carried the commit): then nothing of it may be
/// written again.
struct Failed {
    error: CoreError,
    ended: bool,
}

impl From<StoreError> for Failed {
    fn from(error: StoreError) -> Failed {
        Failed::from(CoreError::Store(error))
    }
}

/// Ended when the error says the commit is in doubt
/// (`StoreError::InDoubt`); a caller that knows more sets `ended`.
impl From<CoreError> for Failed {
    fn from(error: CoreError) -> Failed {
        Failed {
            ended: matches!(error, CoreError::Store(StoreError::InDoubt(_))),
            error,
        }
    }
}

fn unreachable(error: &CoreError) -> bool {
    matches!(error, CoreError::Store(e) if e.is_unreachable())
}

/// The batch's results and the wait for its commit.
type Written<D> = (Vec<D>, crate::store::Committing);

async fn write_batch<W: BatchWrite>(
    store: &Store,
    jobs: &mut [W::Job],
) -> Result<Written<W::Done>, Failed> {
    let read = W::first_statement(jobs, store.backend())?;
    let (mut w, first) = store.begin_row_write_reading(&W::locks(jobs), read).await?;
    match W::write(&mut w.tx, jobs, first).await {
        Ok(results) => Ok((results, w.into_commit())),
        Err(error) => {
            let mut failed = Failed::from(error);
            failed.ended |= w.tx.ended();
            Err(failed)
        }
    }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::JoinSet;

    use super::*;
    use crate::store::{Durability, OpenOptions, PoolSettings};

    /// Writes nothing: one read per job, in the batch's transaction.
    struct Probe;

    impl BatchWrite for Probe {
        type Job = i64;
        type Done = i64;
        const MAX: usize = 16;
        const WHAT: &'static str = "probes";

        async fn write(
            conn: &mut TxConn<'_>,
            jobs: &mut [i64],
            _: Option<FirstRows>,
        ) -> Result<Vec<i64>, CoreError> {
            for job in jobs.iter() {
                crate::store::outgoing::chats_by_ids(conn, &[*job], None).await?;
            }
            Ok(jobs.to_vec())
        }
    }

    /// Each job `n` sets the plugin key `k<n>` to `n`; a negative job sets
    /// its key, then fails, as a job the database refuses half-way does.
    /// Every batch it is given is kept, in order.
    struct Keys;

    static KEY_BATCHES: std::sync::Mutex<Vec<Vec<i64>>> = std::sync::Mutex::new(Vec::new());

    impl BatchWrite for Keys {
        type Job = i64;
        type Done = i64;
        const MAX: usize = 16;
        const WHAT: &'static str = "keys";

        async fn write(
            conn: &mut TxConn<'_>,
            jobs: &mut [i64],
            _: Option<FirstRows>,
        ) -> Result<Vec<i64>, CoreError> {
            KEY_BATCHES.lock().expect("batches").push(jobs.to_vec());
            for &job in jobs.iter() {
                let key = format!("k{}", job.abs());
                let writes = [(key, Some(job.abs().to_string()))].into();
                crate::store::kv::apply(conn, "batch-test", &writes, 0).await?;
                if job < 0 {
                    return Err(CoreError::Invalid(format!("job {job} is bad")));
                }
            }
            Ok(jobs.to_vec())
        }
    }

    /// Sets each job's key, commits with its last statement (PostgreSQL,
    /// `TxConn::finish`), then fails, as a batch whose results could not be
    /// read back after its commit. Every batch it is given is kept.
    struct EndsThenFails;

    static ENDED_BATCHES: std::sync::Mutex<Vec<Vec<i64>>> = std::sync::Mutex::new(Vec::new());

    impl BatchWrite for EndsThenFails {
        type Job = i64;
        type Done = i64;
        const MAX: usize = 16;
        const WHAT: &'static str = "ending keys";

        /// Any first statement: the transaction begins with it.
        fn first_statement(
            jobs: &[i64],
            backend: Backend,
        ) -> Result<Option<FirstStatement>, StoreError> {
            crate::store::outgoing::chats_read(jobs, backend)
        }

        async fn write(
            conn: &mut TxConn<'_>,
            jobs: &mut [i64],
            _: Option<FirstRows>,
        ) -> Result<Vec<i64>, CoreError> {
            ENDED_BATCHES.lock().expect("batches").push(jobs.to_vec());
            for &job in jobs.iter() {
                let writes = [(format!("k{job}"), Some(job.to_string()))].into();
                crate::store::kv::apply(conn, "ending-test", &writes, 0).await?;
            }
            assert!(conn.can_finish(), "begun with its first statement");
            conn.finish("SELECT 1", "ending").await?;
            Err(CoreError::Invalid("its results could not be read".into()))
        }
    }

    /// Writes nothing; keeps the length of every batch it is given.
    struct Sizes;

    static SIZES: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

    impl BatchWrite for Sizes {
        type Job = usize;
        type Done = usize;
        const MAX: usize = 16;
        const WHAT: &'static str = "sizes";

        async fn write(
            _conn: &mut TxConn<'_>,
            jobs: &mut [usize],
            _: Option<FirstRows>,
        ) -> Result<Vec<usize>, CoreError> {
            SIZES.lock().expect("sizes").push(jobs.len());
            Ok(jobs.to_vec())
        }
    }

    /// Requests whose tasks are ready together share one batch: the writer
    /// task, started by the first of them (and run before the others, as
    /// the runtime runs a task just spawned), lets the ready tasks queue
    /// their jobs before it takes its batch.
    /// (The multi-threaded runtime, as `hub serve` runs; the tasks are
    /// spawned from one of its tasks, so all are ready before any runs.)
    /// Five rounds, each with a writer task of its own: now and then (one
    /// round in forty here) the runtime runs the yielded writer again
    /// before the other ready tasks (presumably its periodic look at the
    /// driver, which wakes yielded tasks, falls on that turn), and that
    /// round writes one job and then seven; without the gathering every
    /// round does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn jobs_of_tasks_ready_together_share_a_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let mut rounds = Vec::new();
        for _ in 0..5 {
            SIZES.lock().expect("sizes").clear();
            let batcher = Arc::new(Batcher::<Sizes>::default());
            let store = store.clone();
            let written = tokio::spawn(async move {
                let mut tasks = JoinSet::new();
                for job in 0..8 {
                    let (batcher, store) = (batcher.clone(), store.clone());
                    tasks.spawn(async move { batcher.write(&store, job).await });
                }
                tasks.join_all().await
            })
            .await
            .expect("the tasks");
            let mut written: Vec<usize> =
                written.into_iter().map(|r| r.expect("written")).collect();
            written.sort_unstable();
            assert_eq!(written, (0..8).collect::<Vec<_>>());
            rounds.push(SIZES.lock().expect("sizes").clone());
        }
        let whole = rounds.iter().filter(|sizes| **sizes == [8]).count();
        assert!(
            whole >= 3,
            "one batch of all eight in most rounds: {rounds:?}"
        );
    }

    /// On PostgreSQL a batch that failed after its last statement committed
    /// it is answered as failed, and not written again job by job (each
    /// job would be stored twice): its jobs are stored once.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_batch_that_failed_after_its_commit_is_not_written_again() {
        let store = crate::store::required_test_postgres().await;
        let batcher = Batcher::<EndsThenFails>::default();
        // Queued together before the writer runs: one batch.
        let results =
            futures_util::future::join_all([1, 2, 3].map(|n| batcher.write(&store, n))).await;
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert_eq!(
            *ENDED_BATCHES.lock().expect("batches"),
            [vec![1, 2, 3]],
            "written once, not again job by job"
        );
        let stored: Vec<String> = store
            .kv_entries("ending-test")
            .await
            .expect("keys")
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(stored, ["k1", "k2", "k3"]);
    }

    /// On SQLite, the group commit's database: a bad job fails its batch,
    /// which is written again one job at a time, so the bad job fails alone,
    /// the others are stored once each, and nothing of the bad one stays.
    #[tokio::test]
    async fn a_bad_job_fails_alone_and_the_rest_of_its_batch_is_stored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        let batcher = Batcher::<Keys>::default();
        // Queued together before the writer runs: one batch.
        let results =
            futures_util::future::join_all([1, 2, -3, 4].map(|n| batcher.write(&store, n))).await;
        let outcome: Vec<Result<i64, String>> = results
            .into_iter()
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
        assert_eq!(
            outcome,
            [
                Ok(1),
                Ok(2),
                Err("the write was not committed: job -3 is bad".to_owned()),
                Ok(4)
            ]
        );
        assert_eq!(
            *KEY_BATCHES.lock().expect("batches"),
            [vec![1, 2, -3, 4], vec![1], vec![2], vec![-3], vec![4]],
            "the failed batch, then each of its jobs alone"
        );
        let stored: Vec<(String, String)> = store
            .kv_entries("batch-test")
            .await
            .expect("keys")
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect();
        let want =
            [("k1", "1"), ("k2", "2"), ("k4", "4")].map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(stored, want);

        // The writer goes on: a batch after it is written whole.
        let next = futures_util::future::join_all([5, 6].map(|n| batcher.write(&store, n))).await;
        assert_eq!(
            next.into_iter()
                .map(|r| r.expect("written"))
                .collect::<Vec<_>>(),
            [5, 6]
        );
    }

    /// A loopback relay in front of the test PostgreSQL. Taken down, it cuts
    /// the connections it carries and hangs up on every new one at once
    /// (counted), as a database host that went away would.
    struct Relay {
        port: u16,
        down: Arc<AtomicBool>,
        refused: Arc<AtomicUsize>,
        carried: Arc<std::sync::Mutex<JoinSet<()>>>,
    }

    impl Relay {
        async fn start(target: String) -> Relay {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let port = listener.local_addr().expect("addr").port();
            let relay = Relay {
                port,
                down: Arc::default(),
                refused: Arc::default(),
                carried: Arc::default(),
            };
            let (down, refused, carried) = (
                relay.down.clone(),
                relay.refused.clone(),
                relay.carried.clone(),
            );
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    if down.load(Ordering::SeqCst) {
                        refused.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    let target = target.clone();
                    carried.lock().expect("relay").spawn(async move {
                        if let Ok(mut server) = TcpStream::connect(&target).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                }
            });
            relay
        }

        fn set_down(&self, down: bool) {
            self.down.store(down, Ordering::SeqCst);
            if down {
                self.carried.lock().expect("relay").abort_all();
            }
        }
    }

    /// Four jobs queued together, so the writer takes them as one batch.
    async fn four_at_once(batcher: &Batcher<Probe>, store: &Store) -> Vec<Result<i64, CoreError>> {
        let jobs = (1..=4).map(|n| batcher.write(store, n));
        futures_util::future::join_all(jobs).await
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn a_batch_that_cannot_reach_the_database_fails_at_once_and_the_next_one_is_written() {
        let url = crate::store::required_test_postgres_url().await;
        // postgres://user@host:port/database
        let server = url
            .split_once('@')
            .and_then(|(_, rest)| rest.split_once('/'))
            .map(|(server, _)| server.to_owned())
            .expect("a test database URL");
        let relay = Relay::start(server.clone()).await;
        let relayed = url.replacen(&server, &format!("127.0.0.1:{}", relay.port), 1);
        let store = Store::open(
            &relayed,
            OpenOptions {
                durability: Durability::Normal,
                pool: PoolSettings {
                    max_connections: 4,
                    write_lanes: 4,
                    acquire_timeout: Duration::from_secs(2),
                    connect_timeout: Duration::from_secs(5),
                },
                identity: None,
            },
        )
        .await
        .expect("store");
        let batcher = Batcher::<Probe>::default();
        let written = |results: Vec<Result<i64, CoreError>>, when: &str| -> Vec<i64> {
            results
                .into_iter()
                .map(|r| r.unwrap_or_else(|e| panic!("not written {when}: {e}")))
                .collect()
        };
        let up = written(
            four_at_once(&batcher, &store).await,
            "while the database is there",
        );
        assert_eq!(up, [1, 2, 3, 4]);

        relay.set_down(true);
        let down = four_at_once(&batcher, &store).await;
        for result in &down {
            match result {
                Err(CoreError::Store(e)) => assert!(
                    e.is_unreachable() || matches!(e, StoreError::Commit(_)),
                    "{e}"
                ),
                other => panic!("written while the database is gone: {other:?}"),
            }
        }
        // Retried one job at a time, each would have asked for a connection
        // of its own (and waited out the acquire timeout on a refusal).
        let asked = relay.refused.load(Ordering::SeqCst);
        assert!(asked <= 1, "{asked} connections asked for one failed batch");

        relay.set_down(false);
        let back = written(
            four_at_once(&batcher, &store).await,
            "once the database is back",
        );
        assert_eq!(back, [1, 2, 3, 4]);
    }
}
