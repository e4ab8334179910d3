//! The database: one sqlx `Any` pool over SQLite (default) or PostgreSQL, the
//! embedded migrations, and the queries of each table group in its own file.

mod agents;
mod batch;
pub mod bots;
pub(crate) mod calls;
mod channels;
pub(crate) mod chats;
pub(crate) mod crm;
pub(crate) mod events;
pub(crate) mod ingress;
pub(crate) mod instances;
pub(crate) mod kv;
pub(crate) mod live;
pub(crate) mod locks;
mod migrate;
pub(crate) mod notices;
pub(crate) mod offline;
mod open;
pub(crate) mod outbox;
pub mod outcomes;
pub(crate) mod outgoing;
mod prepared;
pub(crate) mod sessions;
mod shelf;
mod url;
pub(crate) mod webhooks;
pub(crate) mod widget;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::{Any, AnyConnection, AnyPool, Connection, Executor, Transaction};
use tokio::sync::{Mutex, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

pub use agents::{Agent, NewAgent};
pub use bots::{Bot, BotState, NewBot};
pub use channels::{Channel, ChannelKind, NewChannel};
pub use chats::{Author, Chat, ChatState, ChatSummary, Client, DeliveryState, MessageRow};
use open::{SQLITE_PRAGMAS, checkpoints, open_readers, open_writer};
pub use outbox::{
    Claimed, DeliveryView, NewDelivery, OutboxDepth, OutboxState, PendingRows, Retry, RowKind,
};
use url::prepare_sqlite_url;
pub use url::{probe_postgres, redacted_url};
pub use writer::Durability;

/// The connection a write transaction hands to store functions
/// (`&mut w.tx` of a [`WriteTx`]) and every store function takes. Code outside
/// `store/` names this, never sqlx, so the database layer can change here alone.
pub type Conn = sqlx::AnyConnection;

/// The log directive that keeps the database driver's per-statement logs
/// below `info` (`main` adds it to its default filter).
pub const QUIET_DRIVER_LOGS: &str = "sqlx=warn";

/// A failed database operation, with what the hub was doing when it failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{context}: {source}")]
    Db {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("migration {version}: {source}")]
    Migration {
        version: i64,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot prepare the database directory {path}: {source}")]
    Directory {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("stored data is malformed: {0}")]
    Corrupt(String),
    /// The group commit that held this transaction failed.
    #[error("the write was not committed: {0}")]
    Commit(String),
    /// A transaction whose `COMMIT` went with its statements was cut off
    /// before its answer came back: it may be stored, so it is not written
    /// again ([`TxConn::finish`]).
    #[error("{0} (whether it was stored is unknown)")]
    InDoubt(String),
    /// The read or write this request shared with others failed (the
    /// first failure is logged where it happened).
    #[error("{0}")]
    Shared(String),
    /// No connection to the database could be made. `target` names the
    /// database, host and port; neither field carries a password.
    #[error("cannot connect to {target}: {reason}")]
    Unreachable { target: String, reason: String },
}

impl StoreError {
    /// Whether the database itself could not be reached (no connection
    /// within the acquire timeout, a connection lost on the way): no part
    /// of the work was at fault, and doing it again at once fails the same.
    pub fn is_unreachable(&self) -> bool {
        match self {
            StoreError::Unreachable { .. } => true,
            StoreError::Db { source, .. } => matches!(
                source,
                sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::Io(_)
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::WorkerCrashed
            ),
            _ => false,
        }
    }
}

/// Attaches context to sqlx errors: `.ctx("inserting a message")?`.
pub trait Ctx<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Ctx<T> for Result<T, sqlx::Error> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Db { context, source })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// How a PostgreSQL pool is sized and how long it waits (`[storage]`).
/// SQLite keeps its own small pool: one writer and a few readers of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    /// Most connections this process holds open at once.
    pub max_connections: u32,
    /// PostgreSQL: batches of each batch writer written at once
    /// ([`Store::write_lanes`]).
    pub write_lanes: usize,
    /// How long taking a connection may wait, all of them busy or the
    /// database down; the request then fails (a 503 the client retries).
    pub acquire_timeout: Duration,
    /// How long opening the first connection may take at start.
    pub connect_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_connections: 16,
            write_lanes: 2,
            acquire_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// What [`Store::open`] is told besides the URL; a bare [`Durability`]
/// converts with the default [`PoolSettings`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenOptions {
    pub durability: Durability,
    pub pool: PoolSettings,
    /// Who this process is to the outbox's leases; anonymous when `None`.
    pub identity: Option<instances::Identity>,
}

impl From<Durability> for OpenOptions {
    fn from(durability: Durability) -> Self {
        OpenOptions {
            durability,
            pool: PoolSettings::default(),
            identity: None,
        }
    }
}

/// The pool's connections at one moment (`/metrics`). On SQLite the
/// writer's own connection is not among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUse {
    pub in_use: u32,
    pub idle: u32,
    pub max: u32,
}

/// Shared handle to the database.
#[derive(Clone)]
pub struct Store {
    /// Readers (and, on PostgreSQL, writers).
    pool: AnyPool,
    backend: Backend,
    /// SQLite's one writer connection with its group commit.
    writer: Option<Arc<writer::Group>>,
    /// PostgreSQL: this process's side of the database's write modes (see
    /// [`Store::begin_write`] and [`Store::begin_row_write`]).
    pg_turn: Arc<RwLock<()>>,
    channel_cache: Arc<channels::ChannelCache>,
    /// Senders' live chats (see `live.rs`).
    live_chats: Arc<live::LiveChats>,
    /// Agents by token hash (see `agents::TokenCache`).
    agent_tokens: Arc<agents::TokenCache>,
    /// Whether commits fail now (SQLite's writer records it; PostgreSQL's
    /// commits here).
    health: Arc<writer::WriteHealth>,
    /// SQLite: reader connections of the hot paths, outside the pool (see
    /// [`Store::read`]).
    readers: Option<Arc<Readers>>,
    /// This process as the owner of the leases it takes.
    identity: Arc<instances::Identity>,
    /// See [`Store::write_lanes`].
    write_lanes: usize,
    /// PostgreSQL: the connections the row-mode writers and
    /// [`Store::fetch_all_hot`] keep between their transactions.
    shelf: Arc<shelf::Shelf>,
    /// Rows leased to this process's deliverer as they were queued.
    handoff: Arc<outbox::Handoff>,
}

/// Reader connections the store keeps itself. sqlx's pool pings every
/// connection it gets back, a second round trip to the driver's thread
/// after each query; on a local file nothing can have broken it, so the
/// reads on every request's path (an agent's token, a chat's visibility, a
/// sender's live chat) take a connection here instead.
struct Readers {
    conns: Vec<Mutex<AnyConnection>>,
    next: std::sync::atomic::AtomicUsize,
}

/// How many [`Readers`] SQLite gets, besides the pool's connections.
const HOT_READERS: usize = 3;

/// A connection for reads: one of SQLite's [`Readers`], or from the pool.
pub(crate) enum ReadConn<'a> {
    Own(tokio::sync::MutexGuard<'a, AnyConnection>),
    Pooled(sqlx::pool::PoolConnection<sqlx::Any>),
}

impl std::ops::Deref for ReadConn<'_> {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            ReadConn::Own(c) => c,
            ReadConn::Pooled(c) => c,
        }
    }
}

impl std::ops::DerefMut for ReadConn<'_> {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            ReadConn::Own(c) => c,
            ReadConn::Pooled(c) => c,
        }
    }
}

/// A write transaction: [`tx`](WriteTx::tx) is the connection store
/// functions take; [`commit`](WriteTx::commit) returns once the write is
/// durable; dropped without commit, nothing of it happened.
pub struct WriteTx<'a> {
    pub tx: TxConn<'a>,
}

/// The connection of a write transaction (derefs to [`Conn`]).
pub struct TxConn<'a>(TxInner<'a>, outbox::Handing);

enum TxInner<'a> {
    /// SQLite: a savepoint in the group's shared transaction.
    Shared(writer::SharedTx<'a>),
    /// PostgreSQL: a transaction of its own, holding its write mode.
    Own {
        tx: Transaction<'static, Any>,
        /// Held until the commit is done, so the process's next writer does
        /// not take a pool connection only to wait on the database's lock.
        turn: Turn,
        health: Arc<writer::WriteHealth>,
    },
    /// PostgreSQL: a transaction begun by a simple query of its own
    /// ([`Store::begin_row_write_reading`]), so its first read came back in
    /// the begin's round trip.
    Raw {
        tx: RawTx,
        turn: Turn,
        health: Arc<writer::WriteHealth>,
    },
}

impl std::ops::Deref for TxConn<'_> {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match &self.0 {
            TxInner::Shared(tx) => tx.conn_ref(),
            TxInner::Own { tx, .. } => tx,
            TxInner::Raw { tx, .. } => tx.conn_ref(),
        }
    }
}

impl std::ops::DerefMut for TxConn<'_> {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.0 {
            TxInner::Shared(tx) => tx.conn(),
            TxInner::Own { tx, .. } => tx,
            TxInner::Raw { tx, .. } => tx.conn(),
        }
    }
}

/// A PostgreSQL transaction sqlx does not know it is in: committed by
/// [`RawTx::commit`], rolled back when dropped before (the connection goes
/// back to the pool only once the `ROLLBACK` is done, and is closed if it
/// fails), as sqlx's own transactions are.
struct RawTx {
    /// Present until the commit or the drop takes it.
    conn: Option<sqlx::pool::PoolConnection<Any>>,
    /// Set once its last statements ended it ([`TxConn::finish`]):
    /// nothing is left to commit or roll back.
    ended: bool,
    /// Where the connection goes once the transaction ended cleanly.
    shelf: Arc<shelf::Shelf>,
}

impl RawTx {
    fn conn_ref(&self) -> &AnyConnection {
        self.conn
            .as_deref()
            .expect("a transaction's connection until its end")
    }

    fn conn(&mut self) -> &mut AnyConnection {
        self.conn
            .as_deref_mut()
            .expect("a transaction's connection until its end")
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        if self.ended {
            self.shelf.put(conn);
            return Ok(());
        }
        let done = batch::run_simple(&mut conn, "COMMIT", "committing")
            .await
            .map(|_| ());
        match done {
            Ok(()) => self.shelf.put(conn),
            // Whether it still is in the transaction is unknown.
            Err(_) => conn.close_on_drop(),
        }
        done
    }
}

impl Drop for RawTx {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.ended {
            self.shelf.put(conn);
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let rolled = batch::run_simple(&mut conn, "ROLLBACK", "rolling back").await;
                    if rolled.is_err() {
                        conn.close_on_drop();
                    }
                });
            }
            Err(_) => conn.close_on_drop(),
        }
    }
}

impl TxConn<'_> {
    /// How long a row queued in this transaction is leased to this
    /// process's deliverer, if one runs here (`outbox/handoff.rs`), with
    /// the owner the rows' leases name. PostgreSQL only: SQLite's claims
    /// are a job of its one writer that takes ~20 rows at a time, and its
    /// results script does not say whether it made a new head, so a claim
    /// would follow every result anyway (handed over there too: deliveries
    /// 0.97×, 2026-12-03).
    pub(crate) fn handoff_lease(&self) -> Option<(i64, &str)> {
        if !matches!(self.0, TxInner::Raw { .. } | TxInner::Own { .. }) {
            return None;
        }
        self.1
            .to
            .lease_ms()
            .map(|ms| (ms, self.1.owner.id.as_str()))
    }

    /// Rows this transaction leased to this process's deliverer, handed to
    /// it once the transaction committed.
    pub(crate) fn hand_over(&mut self, rows: Vec<outbox::Claimed>) {
        self.1.rows.extend(rows);
    }

    /// Whether [`finish`](TxConn::finish) commits in its statements' round
    /// trip: a PostgreSQL transaction begun with its first statement
    /// ([`Store::begin_row_write_reading`]), whose connection has every
    /// [`prepared`] statement. Elsewhere the commit is a step of its own
    /// (SQLite's group commit, sqlx's transactions).
    pub fn can_finish(&self) -> bool {
        matches!(&self.0, TxInner::Raw { tx, .. } if !tx.ended)
    }

    /// Whether [`finish`](TxConn::finish) ended the transaction: it
    /// committed, or its round trip failed on the way and whether it
    /// committed is unknown. Either way its work must not be done again.
    pub fn ended(&self) -> bool {
        matches!(&self.0, TxInner::Raw { tx, .. } if tx.ended)
    }

    /// Runs `sql`, the transaction's last statements (values written in,
    /// `batch::inline`), and `COMMIT` as one simple query: one round trip
    /// less per transaction. Their rows, per statement. If one fails the
    /// rest do not run and the transaction is rolled back when dropped, as
    /// before; once this returns `Ok` the transaction is committed and
    /// nothing may be written in it (its commit then waits for nothing).
    /// Only where [`can_finish`](TxConn::can_finish).
    pub(crate) async fn finish(
        &mut self,
        sql: &str,
        what: &'static str,
    ) -> Result<Vec<Vec<sqlx::any::AnyRow>>, StoreError> {
        let TxInner::Raw { tx, .. } = &mut self.0 else {
            return Err(StoreError::Commit(format!(
                "{what}: this transaction commits on its own"
            )));
        };
        if tx.ended {
            return Err(StoreError::Commit(format!("{what}: already committed")));
        }
        let done = batch::run_simple(tx.conn(), &format!("{sql}; COMMIT"), what).await;
        match done {
            Ok(mut statements) => {
                tx.ended = true;
                statements.pop();
                Ok(statements)
            }
            Err(e) => Err(tx.failed_commit(e)),
        }
    }
}

impl RawTx {
    /// The error of a round trip that carried `COMMIT` and failed. The
    /// server's refusal of a statement stops the rest, `COMMIT` with them:
    /// the transaction is rolled back when dropped. A failure on the way
    /// (or a row not read back) may come after the commit: the transaction
    /// has ended, in doubt, and its connection is closed.
    fn failed_commit(&mut self, error: StoreError) -> StoreError {
        let from_server = matches!(&error, StoreError::Db { source, .. }
            if source.as_database_error().is_some());
        if from_server {
            return error;
        }
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
        self.ended = true;
        StoreError::InDoubt(error.to_string())
    }
}

/// A batch's first statement (its read, or a write whose result nothing
/// before it decides), sent in the round trip that begins its transaction
/// ([`Store::begin_row_write_reading`]).
pub struct FirstStatement(First);

enum First {
    /// PostgreSQL: an `EXECUTE` of a [`prepared::Prepared`] statement, its
    /// values written in; `commits`: the transaction's only statement, its
    /// `COMMIT` in the same round trip ([`FirstStatement::alone`]).
    Postgres { sql: String, commits: bool },
    /// SQLite: a statement or script with its values, sent after the
    /// savepoint that begins the job (`writer::Group::begin_first`).
    Sqlite(writer::Opening),
}

impl FirstStatement {
    /// SQLite: `query` as the first statement of its job; `writes` when it
    /// changes anything (a claim, a batch of results), not only reads;
    /// `what` names it in errors.
    pub(super) fn sqlite(
        query: batch::Query<'static>,
        writes: bool,
        what: &'static str,
    ) -> Result<Self, StoreError> {
        writer::Opening::new(query, writes, what)
            .map(|opening| FirstStatement(First::Sqlite(opening)))
    }

    /// This statement as all its transaction writes: on PostgreSQL its
    /// `COMMIT` goes in the round trip that begins it, and the transaction
    /// [`begin_row_write_reading`](Store::begin_row_write_reading) returns
    /// has [`ended`](TxConn::ended). (SQLite's group commit is unchanged.)
    pub fn alone(self) -> Self {
        match self.0 {
            First::Postgres { sql, .. } => FirstStatement(First::Postgres { sql, commits: true }),
            sqlite => FirstStatement(sqlite),
        }
    }
}

/// What a [`FirstStatement`] returned, for the store function that asked for it.
pub struct FirstRows(Vec<sqlx::any::AnyRow>);

/// A PostgreSQL write transaction's mode (see [`Store::begin_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exclusive,
    Rows,
}

/// This process's side of a PostgreSQL write mode, held to the commit.
enum Turn {
    Exclusive(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
    Rows(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
}

/// The rest of a commit once the transaction let go of the database.
pub type Committing = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

impl WriteTx<'_> {
    pub async fn commit(self) -> Result<(), StoreError> {
        self.into_commit().await
    }

    /// Ends the transaction now and returns the wait for its commit, which
    /// borrows nothing: a writer hands it to another task and goes on.
    pub fn into_commit(self) -> Committing {
        let TxConn(inner, handing) = self.tx;
        let committing: Committing = match inner {
            TxInner::Shared(tx) => Box::pin(tx.commit()),
            TxInner::Own { tx, turn, health } => Box::pin(async move {
                let done = tx.commit().await.ctx("committing");
                drop(turn);
                health.record(&done);
                done
            }),
            TxInner::Raw { tx, turn, health } => Box::pin(async move {
                let done = tx.commit().await;
                drop(turn);
                health.record(&done);
                done
            }),
        };
        if handing.rows.is_empty() {
            return committing;
        }
        Box::pin(async move {
            committing.await?;
            handing.committed();
            Ok(())
        })
    }
}

/// [`PG_KEYED_PLANS`]' settings, as the columns of a `SELECT`.
macro_rules! keyed_settings {
    () => {
        "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true), \
         set_config('plan_cache_mode', 'force_generic_plan', true)"
    };
}

/// [`PG_KEYED_PLANS`] as a literal, for the statements that begin a write
/// transaction.
macro_rules! keyed_plans {
    () => {
        concat!("SELECT ", keyed_settings!())
    };
}

/// The row mode's lock (the write turn, shared), as a `SELECT`'s column.
macro_rules! shared_lock {
    () => {
        "pg_advisory_xact_lock_shared(7527030514385054068)"
    };
}

/// The row mode's lock as a statement.
macro_rules! shared_turn {
    () => {
        concat!("SELECT ", shared_lock!())
    };
}

/// A PostgreSQL connection idle for this long is pinged before it is handed
/// out; one returned more recently was pinged when it came back to the pool
/// or, kept by the writers (`shelf.rs`), ended its last transaction cleanly.
const PG_PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// How a PostgreSQL write transaction in the exclusive mode starts: `BEGIN`,
/// [`PG_KEYED_PLANS`] and the lock in one round trip. The mode is an advisory lock: held
/// exclusively (this, and the migration) it is the one write turn SQLite
/// has, for every instance on the database; the hot paths hold it shared
/// ([`PG_BEGIN_ROWS`]) and run side by side. Its key is "hub_writ" in ASCII
/// (0x6875_625f_7772_6974).
const PG_BEGIN_WRITE: &str = concat!(
    "BEGIN; ",
    keyed_plans!(),
    "; SELECT pg_advisory_xact_lock(7527030514385054068)"
);
/// How a PostgreSQL write transaction in the row mode starts: the same lock,
/// shared, and [`PG_KEYED_PLANS`]. Row-mode writers never wait for one
/// another on it, only for an exclusive writer (and it for them).
const PG_BEGIN_ROWS: &str = concat!("BEGIN; ", keyed_plans!(), "; ", shared_turn!());
/// The row mode's lock with [`PG_KEYED_PLANS`] as one statement, prepared
/// on each connection (`prepared::ROWS_TURN`), for the begins that give a
/// connection without it every prepared statement
/// ([`Store::begin_row_write_reading`], [`Store::write_rows_script`]).
const ROWS_TURN_SQL: &str = concat!("SELECT ", keyed_settings!(), ", ", shared_lock!());
/// [`ROWS_TURN_SQL`] run: the first statement of a transaction in one
/// simple query ([`Store::write_rows_script`]; after `BEGIN` in
/// [`Store::begin_row_write_reading`]).
const PG_ROWS_TURN: &str = "EXECUTE hub_rows_turn";
/// How many statements [`PG_ROWS_TURN`] is.
const PG_ROWS_TURN_STATEMENTS: usize = 1;
/// What write transactions plan with, set for the transaction in their
/// first round trip: no table read whole where an index finds the rows,
/// and no JIT compilation (a plan that must still scan a table it has no
/// index for, a one-row table, is costed past the JIT's threshold:
/// compiling it took 18 ms a run), and a prepared statement's kept
/// (generic) plan from its first run: left to choose, PostgreSQL planned
/// the messages statement of 20–85 % of the customer batches anew in the
/// channel benchmark (a young database, whose tables autovacuum analyzes
/// again and again as they grow), planning 20–70 % as long as running
/// them (`pg_stat_statements`, 2026-12-03). Their statements read and write a
/// batch's rows by key; their plans are made once per connection and kept
/// (a batch planned anew costs more planning than execution), and a plan
/// made while a table was small and analyzed as such (a new database)
/// would otherwise go on scanning it whole as it grows (a sudden backlog)
/// until autovacuum analyzes it again. (The statements that begin a write
/// transaction take it as `keyed_plans!`; tests plan under it.)
#[cfg(test)]
pub(crate) const PG_KEYED_PLANS: &str = keyed_plans!();

impl Store {
    /// Opens (creating if needed) the database at `url` and applies pending
    /// migrations; on SQLite, the durability sets what a commit waits for; on
    /// PostgreSQL, the pool settings size the pool and bound its waits.
    ///
    /// PostgreSQL first gets one connection of its own within the connect
    /// timeout, so a database that is not there is named with the reason
    /// (the pool retries a refused connection until its acquire timeout and
    /// then says only that it timed out). The pool opens connections when
    /// they are needed and replaces broken ones (each is pinged when it comes
    /// back, and again before use after a second idle), so the hub recovers
    /// by itself once a database that went away is back.
    pub async fn open(url: &str, options: impl Into<OpenOptions>) -> Result<Store, StoreError> {
        let OpenOptions {
            durability,
            pool: settings,
            identity,
        } = options.into();
        install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            Backend::Postgres
        };
        let url = match backend {
            Backend::Sqlite => prepare_sqlite_url(url)?,
            Backend::Postgres => url.to_owned(),
        };
        let pool = match backend {
            Backend::Sqlite => AnyPoolOptions::new()
                .max_connections(4)
                // A ping per acquire is a round trip to the driver's thread
                // for nothing on a local file; PostgreSQL keeps the check.
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(10))
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute(SQLITE_PRAGMAS).await?;
                        Ok(())
                    })
                })
                .connect(&url)
                .await
                .ctx("connecting to the database")?,
            Backend::Postgres => {
                probe_postgres(&url, settings.connect_timeout).await?;
                AnyPoolOptions::new()
                    .max_connections(settings.max_connections)
                    // sqlx pings every connection it takes back; pinging it
                    // again when it is handed out was a second round trip
                    // per read, and one inside the write turn. A connection
                    // idle for `PG_PING_AFTER_IDLE` or longer is pinged, so
                    // one the server dropped meanwhile is replaced, not used.
                    .test_before_acquire(false)
                    // The statements a begin may `EXECUTE` (`prepared.rs`),
                    // once the schema is this build's: preparing them on an
                    // older one would fail (an `ERROR` line in the server's
                    // log). The connection the migrations ran on is closed
                    // after them, so every later one has them.
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            if migrate::is_current(conn).await? {
                                // In order, up to the first that fails: a
                                // connection that has one has those before it
                                // (`prepared::ALL`); the rest it gets as a
                                // begin finds one missing.
                                for statement in prepared::prepare_statements(&[]) {
                                    if batch::run_simple(conn, &statement, "preparing")
                                        .await
                                        .is_err()
                                    {
                                        break;
                                    }
                                }
                            }
                            Ok(())
                        })
                    })
                    .before_acquire(|conn, meta| {
                        Box::pin(async move {
                            if meta.idle_for < PG_PING_AFTER_IDLE {
                                return Ok(true);
                            }
                            Ok(conn.ping().await.is_ok())
                        })
                    })
                    .acquire_timeout(settings.acquire_timeout)
                    .connect_lazy(&url)
                    .ctx("setting up the connection pool")?
            }
        };
        let writer = match backend {
            Backend::Sqlite => {
                let writer = open_writer(&url, durability).await?;
                tokio::spawn(checkpoints(pool.clone(), Arc::downgrade(&writer)));
                Some(writer)
            }
            Backend::Postgres => None,
        };
        let readers = match backend {
            Backend::Sqlite => Some(Arc::new(open_readers(&url).await?)),
            Backend::Postgres => None,
        };
        let health = writer
            .as_ref()
            .map(|w| w.health.clone())
            .unwrap_or_default();
        let store = Store {
            pool,
            backend,
            writer,
            pg_turn: Arc::default(),
            channel_cache: Arc::default(),
            live_chats: Arc::default(),
            agent_tokens: Arc::default(),
            health,
            readers,
            identity: Arc::new(identity.unwrap_or_else(instances::Identity::anonymous)),
            write_lanes: match backend {
                Backend::Sqlite => 1,
                Backend::Postgres => settings.write_lanes.max(1),
            },
            shelf: Arc::new(match backend {
                Backend::Sqlite => shelf::Shelf::none(),
                Backend::Postgres => shelf::Shelf::new(
                    settings.write_lanes.max(1),
                    settings.max_connections,
                    PG_PING_AFTER_IDLE,
                    shelf::RETURN_EVERY,
                ),
            }),
            handoff: Arc::default(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// Opens a SQLite database with only the first `upto` migrations applied
    /// (tests of later migrations against data written before them).
    #[cfg(test)]
    async fn open_at(url: &str, upto: i64) -> Result<Store, StoreError> {
        install_default_drivers();
        let url = prepare_sqlite_url(url)?;
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .ctx("connecting to the database")?;
        let writer = open_writer(&url, Durability::Normal).await?;
        let store = Store {
            pool,
            backend: Backend::Sqlite,
            health: writer.health.clone(),
            writer: Some(writer),
            pg_turn: Arc::default(),
            channel_cache: Arc::default(),
            live_chats: Arc::default(),
            agent_tokens: Arc::default(),
            readers: None,
            identity: Arc::new(instances::Identity::anonymous()),
            write_lanes: 1,
            shelf: Arc::new(shelf::Shelf::none()),
            handoff: Arc::default(),
        };
        let first: Vec<(i64, &str)> = migrate::SQLITE_MIGRATIONS
            .iter()
            .copied()
            .filter(|(v, _)| *v <= upto)
            .collect();
        store.apply(&first).await?;
        Ok(store)
    }

    /// Whether the database answers a trivial query within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> bool {
        let query = sqlx::query("SELECT 1").execute(&self.pool);
        matches!(tokio::time::timeout(timeout, query).await, Ok(Ok(_)))
    }

    /// Why writes fail now (the latest commit failed, none succeeded
    /// since: a full disk, say), or `None`.
    pub fn write_failure(&self) -> Option<String> {
        self.health.failure()
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// How many batches of each batch writer run at once: on PostgreSQL
    /// `[storage] write_lanes`, each in a transaction of its own in the row
    /// mode (kept apart by their locks); on SQLite one, since the group
    /// commit puts every writer in one transaction and the next batch is
    /// written while the previous one's commit is awaited.
    pub fn write_lanes(&self) -> usize {
        self.write_lanes
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A connection for a read on a request's path: a free one of SQLite's
    /// own readers (or the next one's turn), else one from the pool.
    pub(crate) async fn read(&self) -> Result<ReadConn<'_>, StoreError> {
        if let Some(readers) = &self.readers {
            let n = readers.conns.len();
            let start = readers
                .next
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for i in 0..n {
                if let Ok(conn) = readers.conns[(start + i) % n].try_lock() {
                    return Ok(ReadConn::Own(conn));
                }
            }
            return Ok(ReadConn::Own(readers.conns[start % n].lock().await));
        }
        self.pool
            .acquire()
            .await
            .map(ReadConn::Pooled)
            .ctx("taking a database connection")
    }

    /// `query`'s rows, on a hot path (a statement that is its own
    /// transaction: a read, the notices of a batch): on SQLite by one of
    /// its readers, on PostgreSQL on a writers' kept connection
    /// (`shelf.rs`), kept again if it succeeded (a failed one's connection
    /// goes back to the pool, which checks it).
    pub(crate) async fn fetch_all_hot(
        &self,
        query: batch::Query<'_>,
        what: &'static str,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        if self.backend == Backend::Sqlite {
            return query.fetch_all(&mut *self.read().await?).await.ctx(what);
        }
        let mut conn = self.shelf.take(&self.pool).await?;
        let rows = query.fetch_all(&mut *conn).await.ctx(what)?;
        self.shelf.put(conn);
        Ok(rows)
    }

    pub fn pool_use(&self) -> PoolUse {
        let open = self.pool.size();
        // The writers' shelved connections are idle too, out of the pool.
        let idle = u32::try_from(self.pool.num_idle() + self.shelf.len())
            .unwrap_or(u32::MAX)
            .min(open);
        PoolUse {
            in_use: open - idle,
            idle,
            max: self.pool.options().get_max_connections(),
        }
    }

    /// Starts a transaction that will write, in the exclusive mode.
    ///
    /// On PostgreSQL such a transaction holds one advisory lock exclusively,
    /// so it sees no other writer of any instance between its reads and its
    /// writes (as on SQLite): the core decides on state it read in its
    /// transaction (a chat's state, a client's live chat, the visitor
    /// counter). Reads need no mode. The hot paths use
    /// [`begin_row_write`](Store::begin_row_write) instead.
    pub async fn begin_write(&self) -> Result<WriteTx<'_>, StoreError> {
        self.begin(Mode::Exclusive).await
    }

    /// Starts a transaction that will write, in the row mode: customer and
    /// agent messages, claims and delivery results. On PostgreSQL it runs
    /// beside every other row-mode writer of every instance and must lock
    /// what it shares itself: a sender's rows with
    /// [`begin_row_write_locking`](Store::begin_row_write_locking) or
    /// [`locks::chats`], an order key's head with [`locks::order_keys`]
    /// (the outbox's `enqueue` does). On SQLite it is
    /// [`begin_write`](Store::begin_write): one writer, the group commit.
    pub async fn begin_row_write(&self) -> Result<WriteTx<'_>, StoreError> {
        self.begin(Mode::Rows).await
    }

    /// [`begin_row_write`](Store::begin_row_write) with `locks` taken in
    /// the round trip that begins the transaction (on SQLite nothing to
    /// take: one writer).
    pub async fn begin_row_write_locking(
        &self,
        locks: &locks::RowLocks,
    ) -> Result<WriteTx<'_>, StoreError> {
        if self.writer.is_some() || locks.is_empty() {
            return self.begin(Mode::Rows).await;
        }
        let begin = format!("{PG_BEGIN_ROWS}; {}", locks.statements()?);
        self.begin_with(Mode::Rows, begin.into()).await
    }

    /// [`begin_row_write_locking`](Store::begin_row_write_locking) with
    /// `read` (a batch's first statement) in the same round trip: its rows
    /// come back with the transaction (`None` without a `read`). On SQLite
    /// the round trip is the job's savepoint (and the group's `BEGIN`)
    /// with its first statement, so a job's statements are its only round
    /// trips.
    pub async fn begin_row_write_reading(
        &self,
        locks: &locks::RowLocks,
        read: Option<FirstStatement>,
    ) -> Result<(WriteTx<'_>, Option<FirstRows>), StoreError> {
        if let Some(group) = &self.writer {
            let Some(FirstStatement(First::Sqlite(opening))) = read else {
                return Ok((self.begin(Mode::Rows).await?, None));
            };
            let (tx, rows) = group.begin_first(opening).await?;
            let w = WriteTx {
                tx: TxConn(TxInner::Shared(tx), self.handing()),
            };
            return Ok((w, Some(FirstRows(rows))));
        }
        let Some(FirstStatement(First::Postgres { sql: read, commits })) = read else {
            return Ok((self.begin_row_write_locking(locks).await?, None));
        };
        let started = std::time::Instant::now();
        let turn = self.rows_turn().await?;
        let mut conn = self.shelf.take(&self.pool).await?;
        crate::obs::write_turn_waited(false, started.elapsed());
        let locked = locks.executes()?;
        let commit = if commits { "; COMMIT" } else { "" };
        let sql = if locked.is_empty() {
            format!("BEGIN; {PG_ROWS_TURN}; {read}{commit}")
        } else {
            format!("BEGIN; {PG_ROWS_TURN}; {locked}; {read}{commit}")
        };
        let mut begun = batch::run_simple(&mut conn, &sql, "starting a transaction").await;
        if begun.as_ref().is_err_and(prepared::is_missing) {
            // A connection without them (deallocated): it gets them.
            prepare_on(&mut conn, true).await?;
            begun = batch::run_simple(&mut conn, &sql, "starting a transaction").await;
        }
        let mut tx = RawTx {
            conn: Some(conn),
            ended: false,
            shelf: self.shelf.clone(),
        };
        let statements = match begun {
            Ok(statements) => statements,
            Err(e) if commits => return Err(tx.failed_commit(e)),
            // Dropped, the transaction is rolled back.
            Err(e) => return Err(e),
        };
        tx.ended = commits;
        self.health.record(&Ok::<(), StoreError>(()));
        let mut statements = statements.into_iter();
        if commits {
            statements.next_back();
        }
        let rows = statements.next_back().unwrap_or_default();
        let w = WriteTx {
            tx: TxConn(
                TxInner::Raw {
                    tx,
                    turn: Turn::Rows(turn),
                    health: self.health.clone(),
                },
                self.handing(),
            ),
        };
        Ok((w, Some(FirstRows(rows))))
    }

    /// What a transaction of this store hands over when it commits: nothing
    /// yet.
    fn handing(&self) -> outbox::Handing {
        outbox::Handing {
            to: self.handoff.clone(),
            owner: self.identity.clone(),
            rows: Vec::new(),
        }
    }

    /// The rows queued here already leased to this process's deliverer
    /// (`outbox/handoff.rs`).
    pub fn handoff(&self) -> &outbox::Handoff {
        &self.handoff
    }

    /// This process's side of the row mode, waited for as long as a
    /// connection would be.
    async fn rows_turn(&self) -> Result<OwnedRwLockReadGuard<()>, StoreError> {
        let wait = self.pool.options().get_acquire_timeout();
        tokio::time::timeout(wait, self.pg_turn.clone().read_owned())
            .await
            .map_err(|_| StoreError::Db {
                context: "waiting for the write turn",
                source: sqlx::Error::PoolTimedOut,
            })
    }

    /// PostgreSQL: `script`, statements with their values written in
    /// (`batch::inline`), written as one row-mode transaction in one round
    /// trip: a simple query's statements are one transaction (committed at
    /// its end, rolled back whole if one fails), here after the write
    /// turn's shared lock. For a write that reads nothing between its
    /// statements (a claim; a batch of results with no plugin effects).
    /// The rows of each statement, in order.
    pub(crate) async fn write_rows_script(
        &self,
        script: &str,
        what: &'static str,
    ) -> Result<Vec<Vec<sqlx::any::AnyRow>>, StoreError> {
        let started = std::time::Instant::now();
        let _turn = self.rows_turn().await?;
        let mut conn = self.shelf.take(&self.pool).await?;
        crate::obs::write_turn_waited(false, started.elapsed());
        let sql = format!("{PG_ROWS_TURN}; {script}");
        let mut statements = batch::run_simple(&mut conn, &sql, what).await;
        if statements.as_ref().is_err_and(prepared::is_missing) {
            // A connection without them (deallocated): it gets the
            // statements a claim `EXECUTE`s (one simple query is one
            // transaction: nothing of the failed one happened).
            prepare_on(&mut conn, false).await?;
            statements = batch::run_simple(&mut conn, &sql, what).await;
        }
        let mut statements = statements?;
        self.shelf.put(conn);
        self.health.record(&Ok::<(), StoreError>(()));
        // The setting's and the lock's results are no concern of the caller's.
        statements.drain(..PG_ROWS_TURN_STATEMENTS.min(statements.len()));
        Ok(statements)
    }

    /// `sql`, one statement with its values (`$1`, …), in a row-mode
    /// transaction of its own: on PostgreSQL one round trip (the values
    /// written in, [`Store::write_rows_script`]), not the three of a
    /// transaction begun, written and committed statement by statement.
    pub(in crate::store) async fn write_alone(
        &self,
        sql: &str,
        values: &[batch::Literal<'_>],
        what: &'static str,
    ) -> Result<(), StoreError> {
        if self.backend() == Backend::Postgres {
            let script = batch::inline(sql, values)?;
            self.write_rows_script(&script, what).await?;
            return Ok(());
        }
        let mut w = self.begin_row_write().await?;
        let mut query = sqlx::query(sql);
        for value in values {
            query = match value {
                batch::Literal::Int(n) => query.bind(*n),
                batch::Literal::Text(text) => query.bind(text.to_string()),
            };
        }
        query.execute(&mut *w.tx).await.ctx(what)?;
        w.commit().await
    }

    async fn begin(&self, mode: Mode) -> Result<WriteTx<'_>, StoreError> {
        let begin = match mode {
            Mode::Exclusive => PG_BEGIN_WRITE,
            Mode::Rows => PG_BEGIN_ROWS,
        };
        self.begin_with(mode, begin.into()).await
    }

    /// Begins a write in `mode`; on PostgreSQL with `begin`, a simple query
    /// that starts with `BEGIN` and the write turn's lock of that mode.
    async fn begin_with(
        &self,
        mode: Mode,
        begin: std::borrow::Cow<'static, str>,
    ) -> Result<WriteTx<'_>, StoreError> {
        let inner = match &self.writer {
            Some(group) => TxInner::Shared(group.begin().await?),
            None => {
                let started = std::time::Instant::now();
                // Waiting for the turn is bounded as waiting for a
                // connection is: while the database is down each writer
                // ahead fails after its acquire timeout, and a queue of
                // them must not add up to more than one.
                let wait = self.pool.options().get_acquire_timeout();
                let turn = self.pg_turn.clone();
                let turn = match mode {
                    Mode::Exclusive => tokio::time::timeout(wait, turn.write_owned())
                        .await
                        .map(Turn::Exclusive),
                    Mode::Rows => tokio::time::timeout(wait, turn.read_owned())
                        .await
                        .map(Turn::Rows),
                };
                let turn = turn.map_err(|_| StoreError::Db {
                    context: "waiting for the write turn",
                    source: sqlx::Error::PoolTimedOut,
                })?;
                let tx = self
                    .pool
                    .begin_with(begin)
                    .await
                    .ctx("starting a transaction")?;
                crate::obs::write_turn_waited(mode == Mode::Exclusive, started.elapsed());
                TxInner::Own {
                    tx,
                    turn,
                    health: self.health.clone(),
                }
            }
        };
        Ok(WriteTx {
            tx: TxConn(inner, self.handing()),
        })
    }

    /// A value of the `settings` table, created with `init` on first use.
    pub async fn setting_or_init(
        &self,
        key: &str,
        init: impl FnOnce() -> String,
    ) -> Result<String, StoreError> {
        // Insert-or-keep, then read: instances starting together on one
        // database agree on the first value written, without a lock.
        let mut w = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
        )
        .bind(key)
        .bind(init())
        .execute(&mut *w.tx)
        .await
        .ctx("writing a setting")?;
        let (value,): (String,) = sqlx::query_as("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_one(&mut *w.tx)
            .await
            .ctx("reading a setting")?;
        w.commit().await?;
        Ok(value)
    }

    pub async fn close(&self) {
        if let Some(group) = &self.writer {
            group.close().await;
        }
        self.shelf.clear();
        self.pool.close().await;
    }
}

/// Ends the failed transaction block on `conn` (`in_block`: the failed
/// script began one; else it was one implicit transaction, over already)
/// and gives it every prepared statement it lacks, one at a time.
async fn prepare_on(conn: &mut AnyConnection, in_block: bool) -> Result<(), StoreError> {
    if in_block {
        batch::run_simple(conn, "ROLLBACK", "preparing statements").await?;
    }
    let have: Vec<String> = sqlx::query_scalar("SELECT name FROM pg_prepared_statements")
        .fetch_all(&mut *conn)
        .await
        .ctx("preparing statements")?;
    for statement in prepared::prepare_statements(&have) {
        match batch::run_simple(conn, &statement, "preparing statements").await {
            Err(e) if !prepared::is_duplicate(&e) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Whether `conn` talks to PostgreSQL: the batch writers take another way
/// there (one statement per item), as SQLite's scripts do not run on it.
pub(crate) fn is_postgres(conn: &AnyConnection) -> bool {
    conn.backend_name() == "PostgreSQL"
}

/// The URL of a fresh database on the PostgreSQL server that
/// HUB_TEST_DATABASE_URL names (`scripts/with-postgres.sh`), if one is named.
#[cfg(test)]
pub(crate) async fn test_postgres_url() -> Option<String> {
    use sqlx::Connection;
    let server = std::env::var("HUB_TEST_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())?;
    let name = format!("hub_u_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&server)
        .await
        .expect("the test server");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("a test database");
    let (base, _) = server.rsplit_once('/').expect("a database URL");
    Some(format!("{base}/{name}"))
}

/// The URL of a fresh database on the test server, for a unit test that
/// needs PostgreSQL: such a test is `#[ignore = "needs PostgreSQL"]` and
/// `scripts/test.sh` runs it under `with-postgres.sh`; run without a server
/// it fails instead of passing untested.
#[cfg(test)]
pub(crate) async fn required_test_postgres_url() -> String {
    test_postgres_url()
        .await
        .expect("this test needs PostgreSQL: run it under scripts/with-postgres.sh")
}

/// As [`required_test_postgres_url`], opened.
#[cfg(test)]
pub(crate) async fn required_test_postgres() -> Store {
    let url = required_test_postgres_url().await;
    Store::open(&url, Durability::Normal).await.expect("store")
}

/// As [`required_test_postgres`], with one pooled connection (made after
/// the migrations ran): what a test does to it, the store's next statement
/// meets.
#[cfg(test)]
pub(crate) async fn test_postgres_one_connection() -> Store {
    test_postgres_one_connection_at(&required_test_postgres_url().await).await
}

/// As [`test_postgres_one_connection`], on the database `url` names.
#[cfg(test)]
pub(crate) async fn test_postgres_one_connection_at(url: &str) -> Store {
    let options = OpenOptions {
        durability: Durability::Normal,
        pool: PoolSettings {
            max_connections: 1,
            write_lanes: 1,
            ..PoolSettings::default()
        },
        identity: None,
    };
    Store::open(url, options).await.expect("store")
}

/// Deallocates the prepared statement `name` on `store`'s one connection
/// if it has it; whether it had.
#[cfg(test)]
pub(crate) async fn deallocate_if_prepared(store: &Store, name: &str) -> bool {
    let (had,): (i64,) =
        sqlx::query_as("SELECT COUNT(*) FROM pg_prepared_statements WHERE name = $1")
            .bind(name)
            .fetch_one(store.pool())
            .await
            .expect("statements");
    if had > 0 {
        sqlx::raw_sql(&format!("DEALLOCATE {name}"))
            .execute(store.pool())
            .await
            .expect("deallocated");
    }
    had > 0
}

/// Tests' SQL for clients `from..=to` of `channel` (their external keys and
/// visitor numbers the numbers themselves), each with an open chat.
#[cfg(test)]
pub(crate) fn test_clients_with_chats_sql(channel: i64, from: i64, to: i64) -> String {
    format!(
        "INSERT INTO clients (channel_id, external_key, external_id_json, name, \
         created_at, updated_at, visitor_number) SELECT {channel}, g::TEXT, g::TEXT, \
         'Busy', 0, 0, g FROM generate_series({from}, {to}) g; \
         INSERT INTO chats (channel_id, client_id, state, opened_at, last_message_at) \
         SELECT channel_id, id, 'open', 0, 0 FROM clients \
         WHERE visitor_number BETWEEN {from} AND {to}"
    )
}

/// A store on a fresh SQLite file (tests); the directory lives as long as
/// the returned guard.
#[cfg(test)]
pub(crate) async fn test_sqlite() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("hub.db").display());
    let store = Store::open(&url, Durability::Normal).await.expect("store");
    (dir, store)
}

/// Tests' custom channel `public_id`; its id.
#[cfg(test)]
pub(crate) async fn test_channel(store: &Store, public_id: &str) -> i64 {
    store
        .insert_channel(channels::NewChannel {
            public_id,
            name: public_id,
            customer_endpoint: "http://127.0.0.1:9/",
            chunked: false,
            declared: false,
            agents: &[],
            kind: channels::ChannelKind::Custom,
            color: None,
            allowed_origins: &[],
            calls: None,
        })
        .await
        .expect("channel")
        .expect("a new channel")
        .id
}

/// Reads a 0/1 integer column as a bool.
pub(crate) fn flag(v: i64) -> bool {
    v != 0
}

#[cfg(test)]
mod tests {
    use super::open::{CHECKPOINT_EVERY, WAL_LIMIT_PAGES};
    use super::url::{postgres_target, scrub};
    use super::*;

    #[test]
    fn database_urls_in_messages_carry_no_password() {
        let url = "postgres://hub:s3cr%40t@db.example.com:5433/hubdb?sslmode=disable";
        assert_eq!(
            redacted_url(url),
            "postgres://hub:***@db.example.com:5433/hubdb?sslmode=disable"
        );
        assert_eq!(
            redacted_url("postgres://hub@127.0.0.1/hub"),
            "postgres://hub@127.0.0.1/hub"
        );
        assert_eq!(redacted_url("sqlite://data/hub.db"), "sqlite://data/hub.db");
        assert_eq!(
            scrub("auth failed: s3cr@t and s3cr%40t", url),
            "auth failed: *** and ***"
        );
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(url).expect("a URL");
        assert_eq!(
            postgres_target(&options),
            "database `hubdb` on db.example.com:5433 as user `hub`"
        );
    }

    /// The row writers' connection is kept between their transactions
    /// (no ping after each): the next batch runs on it. One the server
    /// dropped while it was kept is not used once it idled for the
    /// pool's ping interval: the next write succeeds on another.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_kept_writers_connection_the_server_dropped_is_replaced_on_postgres() {
        use sqlx::Row;
        let store = required_test_postgres().await;
        let pid = |store: Store| async move {
            let rows = store
                .write_rows_script("SELECT pg_backend_pid()", "the backend")
                .await
                .expect("a write");
            let pid: i32 = rows[0][0].try_get(0).expect("a pid");
            pid
        };
        let first = pid(store.clone()).await;
        assert_eq!(store.shelf.len(), 1, "the connection is kept");
        assert_eq!(pid(store.clone()).await, first, "the next write runs on it");
        let mut other = store.pool.acquire().await.expect("a connection");
        let (ended,): (bool,) = sqlx::query_as("SELECT pg_terminate_backend($1)")
            .bind(first)
            .fetch_one(&mut *other)
            .await
            .expect("terminate");
        assert!(ended);
        drop(other);
        tokio::time::sleep(PG_PING_AFTER_IDLE + Duration::from_millis(200)).await;
        let next = pid(store.clone()).await;
        assert_ne!(next, first, "a new connection");
        store.close().await;
    }

    /// The kept connections go back to the pool every `return_every`, so
    /// the pool's most lifetime still applies to connections never idle.
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn kept_connections_go_back_to_the_pool_now_and_then_on_postgres() {
        let store = required_test_postgres().await;
        let every = Duration::from_millis(300);
        let kept = shelf::Shelf::new(2, 16, PG_PING_AFTER_IDLE, every);
        let first = kept.take(&store.pool).await.expect("a connection");
        let second = kept.take(&store.pool).await.expect("another");
        kept.put(first);
        kept.put(second);
        assert_eq!(kept.len(), 2, "kept between uses");
        tokio::time::sleep(every + Duration::from_millis(100)).await;
        let conn = kept.take(&store.pool).await.expect("a kept one");
        kept.put(conn);
        assert_eq!(kept.len(), 0, "all given back once it was time");
        let conn = kept.take(&store.pool).await.expect("from the pool");
        kept.put(conn);
        assert_eq!(kept.len(), 1, "kept again after");
        kept.clear();
        store.close().await;
    }

    /// A connection a writer still held when the store began to close goes
    /// back to the pool when its transaction ends, not onto the emptied
    /// shelf: the pool's close, which waits for every connection, ends
    /// (a notice sent as a hub stopped once left its close waiting forever).
    #[tokio::test]
    #[ignore = "needs PostgreSQL"]
    async fn a_connection_kept_after_the_close_began_does_not_hold_it_up_on_postgres() {
        let store = required_test_postgres().await;
        let late = store.shelf.take(&store.pool).await.expect("a connection");
        store.shelf.clear();
        store.shelf.put(late);
        assert_eq!(store.shelf.len(), 0, "nothing kept once cleared");
        tokio::time::timeout(Duration::from_secs(10), store.close())
            .await
            .expect("the close waited for a kept connection");
    }

    /// A write begun on a closed store fails at once instead of opening a
    /// transaction no flusher will commit: the database stays writable by
    /// whoever opens it next (the next start of the hub, its CLI).
    #[tokio::test]
    async fn a_closed_store_begins_no_write_and_leaves_the_file_writable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let old = Store::open(&url, Durability::Normal).await.expect("store");
        old.close().await;
        assert!(old.begin_write().await.is_err(), "a write after close");
        let next = Store::open(&url, Durability::Normal)
            .await
            .expect("reopened");
        let mut w = next.begin_write().await.expect("write");
        sqlx::query("INSERT INTO settings (key, value) VALUES ('k', 'v')")
            .execute(&mut *w.tx)
            .await
            .expect("insert");
        w.commit().await.expect("commit");
    }

    #[tokio::test]
    async fn a_refused_postgresql_connection_names_the_database_host_and_port() {
        // A port nobody listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("postgres://hub:s3cret@127.0.0.1:{port}/hubdb");
        let started = std::time::Instant::now();
        let err = probe_postgres(&url, Duration::from_secs(10))
            .await
            .expect_err("nobody listens there")
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
        for needle in ["`hubdb`", "127.0.0.1", &format!(":{port}")] {
            assert!(err.contains(needle), "`{needle}` missing: {err}");
        }
        assert!(!err.contains("s3cret"), "{err}");
    }

    /// The token cache (both databases) never shows an agent's `online`
    /// from before this process wrote it.
    async fn authenticated_again_shows_the_online_state_just_written(store: Store) {
        let agent = store
            .insert_agent(agents::NewAgent {
                name: "Ann",
                email: "ann@example.com",
                photo: None,
                token_hash: "h-ann",
                password_hash: None,
                admin: false,
            })
            .await
            .expect("insert")
            .expect("a new agent");
        let by_token = |store: Store| async move {
            store
                .agent_by_token_hash("h-ann")
                .await
                .expect("read")
                .expect("known token")
        };
        assert!(!by_token(store.clone()).await.online);
        // Now remembered; the write must not leave the old state behind.
        store
            .set_agent_online(agent.id, true)
            .await
            .expect("online");
        assert!(by_token(store.clone()).await.online);
        store
            .set_agent_online(agent.id, false)
            .await
            .expect("offline");
        assert!(!by_token(store.clone()).await.online);
        assert!(
            store
                .agent_by_token_hash("h-other")
                .await
                .expect("read")
                .is_none(),
            "an unknown token stays unknown"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn an_agent_authenticated_again_shows_the_online_state_just_written() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, Durability::Normal).await.expect("store");
        authenticated_again_shows_the_online_state_just_written(store).await;
    }

    #[tokio::test]
    #[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
    async fn an_agent_authenticated_again_shows_the_online_state_just_written_postgres() {
        let store = crate::store::required_test_postgres().await;
        authenticated_again_shows_the_online_state_just_written(store).await;
    }

    #[tokio::test]
    async fn existing_clients_get_visitor_numbers_in_creation_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let old = Store::open_at(&url, 4).await.expect("schema 4");
        sqlx::query(
            "INSERT INTO channels (public_id, name, customer_endpoint, created_at) \
             VALUES ('p', 'web', 'http://127.0.0.1:9/', 1)",
        )
        .execute(old.pool())
        .await
        .expect("channel");
        // Ids with gaps (burnt by upserts) and creation times out of id order.
        for (id, key, created) in [(3, "c", 300), (7, "a", 100), (9, "b", 200)] {
            sqlx::query(
                "INSERT INTO clients (id, channel_id, external_key, external_id_json, \
                 created_at, updated_at) VALUES ($1, 1, $2, '\"x\"', $3, $3)",
            )
            .bind(id)
            .bind(key)
            .bind(created)
            .execute(old.pool())
            .await
            .expect("client");
        }
        old.close().await;
        let store = Store::open(&url, Durability::Normal)
            .await
            .expect("migrated");
        let numbers: Vec<(String, i64)> = sqlx::query_as(
            "SELECT external_key, visitor_number FROM clients ORDER BY visitor_number",
        )
        .fetch_all(store.pool())
        .await
        .expect("numbers");
        assert_eq!(
            numbers,
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)],
            "numbered by creation"
        );
        let mut w = store.begin_write().await.expect("tx");
        let sender: plugin_api::channel::CustomerSender =
            serde_json::from_value(serde_json::json!({ "id": "d" })).expect("sender");
        let d = chats::upsert_client(&mut w.tx, 1, &sender, 400)
            .await
            .expect("new client");
        let again = chats::upsert_client(&mut w.tx, 1, &sender, 500)
            .await
            .expect("same client");
        let sender: plugin_api::channel::CustomerSender =
            serde_json::from_value(serde_json::json!({ "id": "e" })).expect("sender");
        let e = chats::upsert_client(&mut w.tx, 1, &sender, 600)
            .await
            .expect("another client");
        w.commit().await.expect("commit");
        assert_eq!(
            (d.visitor_number, again.visitor_number, e.visitor_number),
            (4, 4, 5),
            "the sequence goes on after the migrated clients, burning nothing"
        );
    }

    /// Concurrent transactions share commits; one dropped without commit
    /// (an error half-way) loses only its own writes, before and after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_transaction_loses_only_its_own_writes_in_a_group() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("hub.db").display());
        let store = Store::open(&url, Durability::Full).await.expect("store");
        let mut tasks = Vec::new();
        for i in 0..60 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut w = store.begin_write().await.expect("begin");
                sqlx::query("INSERT INTO settings (key, value) VALUES ($1, 'x')")
                    .bind(format!("k{i}"))
                    .execute(&mut *w.tx)
                    .await
                    .expect("insert");
                if i % 7 == 3 {
                    // Dropped: as when a later statement fails.
                    return false;
                }
                w.commit().await.expect("commit");
                true
            }));
        }
        let mut kept = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            if t.await.expect("task") {
                kept.push(format!("k{i}"));
            }
        }
        // Committed means visible to a reader at once.
        let mut stored: Vec<(String,)> =
            sqlx::query_as("SELECT key FROM settings WHERE key LIKE 'k%'")
                .fetch_all(store.pool())
                .await
                .expect("read");
        stored.sort();
        kept.sort();
        let stored: Vec<String> = stored.into_iter().map(|(k,)| k).collect();
        assert_eq!(stored, kept, "every committed write, and no dropped one");
        assert_eq!(kept.len(), 51);
    }

    /// On SQLite a job's first statement goes in the round trip of its
    /// savepoint. One that reads and fails leaves the group alone; one that
    /// writes and fails half-way takes the group's open transaction with it:
    /// nothing of it is stored, and the transaction waiting in the same
    /// group is told, not acknowledged. (One thread: nothing yields between
    /// a transaction's commit and the next job's begin, so the flusher has
    /// not committed it yet.)
    #[tokio::test]
    async fn a_failed_first_write_rolls_back_its_group_and_a_failed_read_does_not() {
        let (_dir, store) = test_sqlite().await;
        // Yields the wait for the commit, awaited once the next job began.
        #[allow(clippy::async_yields_async)]
        let put = async |key: &'static str| {
            let mut w = store.begin_write().await.expect("begin");
            sqlx::query("INSERT INTO settings (key, value) VALUES ($1, 'x')")
                .bind(key)
                .execute(&mut *w.tx)
                .await
                .expect("insert");
            w.into_commit()
        };
        let none = locks::RowLocks::default();

        let a = put("a").await;
        let read = sqlx::query("SELECT value FROM settings WHERE nonsense = $1").bind(1_i64);
        let read = FirstStatement::sqlite(read, false, "reading").expect("read");
        let failed = store.begin_row_write_reading(&none, Some(read)).await;
        assert!(failed.is_err(), "the read fails");
        a.await.expect("a failed read takes nothing with it");

        let b = put("b").await;
        let write = sqlx::query(
            "INSERT INTO settings (key, value) VALUES ($1, 'y'); \
             INSERT INTO settings (key, value) VALUES ($1, 'y')",
        )
        .bind("c");
        let write = FirstStatement::sqlite(write, true, "writing").expect("write");
        let failed = store.begin_row_write_reading(&none, Some(write)).await;
        assert!(failed.is_err(), "the second insert fails");
        let told = b.await.expect_err("b's group was rolled back");
        assert!(told.to_string().contains("rolled back"), "{told}");

        put("d").await.await.expect("the writer goes on");
        let stored: Vec<(String,)> = sqlx::query_as(
            "SELECT key FROM settings WHERE key IN ('a', 'b', 'c', 'd') ORDER BY key",
        )
        .fetch_all(store.pool())
        .await
        .expect("read");
        let stored: Vec<&str> = stored.iter().map(|(k,)| k.as_str()).collect();
        assert_eq!(stored, ["a", "d"]);
    }

    /// Steady writes never let SQLite start the WAL over by itself; the
    /// store keeps it bounded (it grew to 840 MB in a 40 s benchmark before).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_stays_bounded_under_steady_writes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("hub.db");
        let store = Store::open(&format!("sqlite://{}", path.display()), Durability::Normal)
            .await
            .expect("store");
        let value = "x".repeat(1000);
        // About 30 MB of rows, written as fast as they go.
        for batch in 0..60 {
            let mut w = store.begin_write().await.expect("begin");
            for i in 0..500 {
                sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2)")
                    .bind(format!("k{batch}-{i}"))
                    .bind(&value)
                    .execute(&mut *w.tx)
                    .await
                    .expect("insert");
            }
            w.commit().await.expect("commit");
        }
        tokio::time::sleep(CHECKPOINT_EVERY * 4).await;
        // Writes go on: the first one after the restart cuts the file back.
        let mut w = store.begin_write().await.expect("begin");
        sqlx::query("INSERT INTO settings (key, value) VALUES ('last', 'x')")
            .execute(&mut *w.tx)
            .await
            .expect("insert");
        w.commit().await.expect("commit");
        let wal = std::fs::metadata(dir.path().join("hub.db-wal")).map_or(0, |m| m.len());
        assert!(
            wal < (WAL_LIMIT_PAGES as u64) * 4096 + 8 * 1024 * 1024,
            "WAL is {wal} bytes"
        );
        store.close().await;
    }
}
