//! Opening SQLite: the pragmas, the reader connections kept outside the
//! pool, the writer connection, and the checkpoint task.

use super::*;

pub(super) const SQLITE_PRAGMAS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
     PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000;";

/// How often the WAL is copied back into the database file. The WAL restart
/// (below) holds the writer while it copies what was written since the last
/// checkpoint: at 250 ms that was up to 4.7 ms, and the acknowledgement p99
/// at half the benchmark's rate 7.5–10.5 ms; at 100 ms, 5.1–6.6 ms for the
/// same throughput.
pub(super) const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// WAL pages past which the writer starts the WAL over (16 MiB of 4 KiB pages).
pub(super) const WAL_LIMIT_PAGES: i64 = 4096;

/// Copies the WAL back into the database file from a reader connection, in
/// the background, until the store is closed. Left to SQLite, the commit
/// that crosses 1000 WAL pages does it, and every group waiting on that
/// commit waits for it too (p99 8 ms against 2 ms without). `PASSIVE` never
/// waits for the writer. Under steady writes the WAL is never wholly copied
/// at a moment a new transaction starts, so SQLite never starts it over:
/// past [`WAL_LIMIT_PAGES`] the writer restarts it between two groups
/// (cheap then: the pages are copied already; `RESTART` reuses the file
/// where `TRUNCATE` also shrank it, which cost p999 15–20 ms against ~11).
pub(super) async fn checkpoints(pool: AnyPool, writer: std::sync::Weak<writer::Group>) {
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // A full disk fails every tick: one warning per spell, not four a second.
    let mut failing = false;
    loop {
        tick.tick().await;
        if pool.is_closed() {
            return;
        }
        let pages: Result<(i64, i64, i64), _> = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&pool)
            .await;
        match pages {
            Ok((_, log, _)) if log > WAL_LIMIT_PAGES => {
                let Some(writer) = writer.upgrade() else {
                    return;
                };
                if let Err(e) = writer.restart_wal().await {
                    tracing::warn!(error = %e, "WAL restart failed; retrying");
                }
            }
            Ok(_) => failing = false,
            Err(e) => {
                if pool.is_closed() {
                    return;
                }
                if !failing {
                    tracing::warn!(error = %e, "WAL checkpoint failed; retrying quietly until it succeeds");
                }
                failing = true;
            }
        }
    }
}

/// A SQLite connection of its own, set up as the pool's connections are.
pub(super) async fn connect_sqlite(url: &str) -> Result<AnyConnection, StoreError> {
    let mut conn = AnyConnection::connect(url)
        .await
        .ctx("connecting to the database")?;
    conn.execute(SQLITE_PRAGMAS)
        .await
        .ctx("setting up the database connection")?;
    Ok(conn)
}

/// SQLite's [`Readers`].
pub(super) async fn open_readers(url: &str) -> Result<Readers, StoreError> {
    let mut conns = Vec::with_capacity(HOT_READERS);
    for _ in 0..HOT_READERS {
        conns.push(Mutex::new(connect_sqlite(url).await?));
    }
    Ok(Readers {
        conns,
        next: Default::default(),
    })
}

/// SQLite's writer connection, with the group commit around it.
pub(super) async fn open_writer(
    url: &str,
    durability: Durability,
) -> Result<Arc<writer::Group>, StoreError> {
    let mut conn = connect_sqlite(url).await?;
    // `full` on a WAL: the commit itself does not sync; the group's answer
    // waits for a sync of the WAL file on a thread of its own (see `writer`).
    let wal = match durability {
        Durability::Full => wal_file(&mut conn).await?,
        Durability::Normal => None,
    };
    let synchronous = if wal.is_some() {
        Durability::Normal
    } else {
        durability
    };
    conn.execute(synchronous.pragma())
        .await
        .ctx("setting the durability")?;
    // Savepoint journals and the ingress batch table in memory, not in temp
    // files; a larger page cache for the one connection that writes; no
    // checkpoint inside a commit (see `checkpoints`); and a WAL file that
    // grew while a restart was late (a busy machine) is cut back to the
    // limit by the first write after the restart.
    conn.execute(
        format!(
            "PRAGMA temp_store = MEMORY; PRAGMA cache_size = -16384; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = {};",
            WAL_LIMIT_PAGES * 4096
        )
        .as_str(),
    )
    .await
    .ctx("setting up the writer connection")?;
    writer::Group::start(conn, wal)
        .map_err(sqlx::Error::Io)
        .ctx("starting the WAL sync thread")
}

/// The WAL file of the writer's database, when it is in WAL mode on a file.
pub(super) async fn wal_file(conn: &mut AnyConnection) -> Result<Option<PathBuf>, StoreError> {
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .ctx("reading the journal mode")?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(None);
    }
    let (file,): (String,) =
        sqlx::query_as("SELECT file FROM pragma_database_list WHERE name = 'main'")
            .fetch_one(&mut *conn)
            .await
            .ctx("reading the database's file name")?;
    Ok((!file.is_empty()).then(|| PathBuf::from(format!("{file}-wal"))))
}
