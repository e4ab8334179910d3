//! PostgreSQL: the connections the row-mode writers (and the statements
//! on a hot path that are transactions of their own,
//! `Store::fetch_all_hot`) keep between their transactions, outside the
//! pool.
//!
//! Why: sqlx's pool pings every connection it gets back
//! (`PoolConnection::return_to_pool`), so each batch written through it
//! cost one more round trip after its commit: a wake-up of the server's
//! backend and of a hub task per batch. Kept here instead, ingress went
//! 1.20–1.24× and deliveries 1.17× (docs/performance.md). A connection whose transaction ended cleanly (its
//! `COMMIT` answered) is known to be idle and in no transaction, so the
//! ping tells nothing a writer needs; it goes on the shelf instead and the
//! next batch takes it from there.
//!
//! Invariants: a shelved connection finished its last transaction or read
//! (any other goes back to the pool, which pings it or closes it); every
//! [`RETURN_EVERY`] the shelf gives all it holds back to the pool, so the
//! pool's own policy (its connections' most lifetime) still applies to
//! connections that are never idle; the shelf
//! holds at most [`Shelf::cap`] connections, fewer than the pool's most,
//! so reads and exclusive writes always have the rest; one idle for
//! `after_idle` or longer is pinged before use, as the pool does, so a
//! connection the server dropped meanwhile is replaced, not used.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Connection};

use super::{Ctx, StoreError};

/// How often the shelf gives its connections back to the pool: sqlx closes
/// a returned connection past its most lifetime (30 minutes by default),
/// which a connection kept here in constant use would otherwise never be.
pub(super) const RETURN_EVERY: Duration = Duration::from_secs(5 * 60);

pub(super) struct Shelf {
    kept: Mutex<Kept>,
    cap: usize,
    after_idle: Duration,
    return_every: Duration,
}

struct Kept {
    conns: Vec<(PoolConnection<Any>, Instant)>,
    returned_at: Instant,
    /// Cleared for the pool's close: nothing is kept from then on, or the
    /// close (which waits for every connection) would wait forever for one
    /// a transaction still running then put here afterwards.
    closed: bool,
}

impl Shelf {
    /// A shelf for the writers of a pool of `max_connections`, each of its
    /// three batch writers and the deliverer's claims running `lanes`
    /// transactions at once; at most half the pool.
    pub(super) fn new(
        lanes: usize,
        max_connections: u32,
        after_idle: Duration,
        return_every: Duration,
    ) -> Shelf {
        let half = usize::try_from(max_connections / 2).unwrap_or(usize::MAX);
        Shelf {
            kept: Mutex::new(Kept {
                conns: Vec::new(),
                returned_at: Instant::now(),
                closed: false,
            }),
            cap: (4 * lanes).min(half),
            after_idle,
            return_every,
        }
    }

    /// A shelf that keeps nothing (SQLite: its writer has one connection).
    pub(super) fn none() -> Shelf {
        Shelf::new(0, 0, Duration::ZERO, Duration::ZERO)
    }

    /// The most recently shelved connection (pinged first if it was idle
    /// long), else one from `pool`.
    pub(super) async fn take(&self, pool: &AnyPool) -> Result<PoolConnection<Any>, StoreError> {
        while let Some((mut conn, since)) = self.pop() {
            if since.elapsed() < self.after_idle || conn.ping().await.is_ok() {
                return Ok(conn);
            }
            conn.close_on_drop();
        }
        pool.acquire().await.ctx("starting a transaction")
    }

    /// Keeps `conn`, whose transaction ended cleanly, for the next writer;
    /// a full shelf gives it back to the pool, and so does one whose
    /// [`RETURN_EVERY`] has come (with every connection it holds).
    pub(super) fn put(&self, conn: PoolConnection<Any>) {
        let returned: Vec<_> = {
            let mut kept = self.lock();
            if kept.closed {
                vec![conn]
            } else if kept.returned_at.elapsed() >= self.return_every {
                kept.returned_at = Instant::now();
                let mut all: Vec<_> = kept.conns.drain(..).map(|(c, _)| c).collect();
                all.push(conn);
                all
            } else if kept.conns.len() < self.cap {
                kept.conns.push((conn, Instant::now()));
                Vec::new()
            } else {
                vec![conn]
            }
        };
        // Dropped outside the lock: each goes back to the pool.
        drop(returned);
    }

    /// Gives every shelved connection back to the pool (before it closes,
    /// which waits for all of them).
    pub(super) fn clear(&self) {
        let drained: Vec<_> = {
            let mut kept = self.lock();
            kept.closed = true;
            kept.conns.drain(..).collect()
        };
        drop(drained);
    }

    /// How many connections it holds now.
    pub(super) fn len(&self) -> usize {
        self.lock().conns.len()
    }

    fn pop(&self) -> Option<(PoolConnection<Any>, Instant)> {
        self.lock().conns.pop()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }
}
