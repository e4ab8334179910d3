//! Claiming due rows for the deliverer (the heads of the order keys and the
//! rows behind expired holds), the next due time, and pruning what is done.

use super::*;
impl Store {
    /// Leases up to `limit` rows that are due and not waiting behind an earlier
    /// row of the same order key. An earlier row holds its key while it is in
    /// flight or until its `hold_until` passes: one failing event delays the
    /// rest of its key for a bounded time, not for its whole retry schedule.
    /// The claim counts the attempt it leads to, so the count survives a crash.
    pub async fn claim_due(
        &self,
        now: i64,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let owner = &self.identity().id;
        if self.backend() == Backend::Postgres {
            let script = claim_script(owner, now, lease_ms, limit)?;
            let statements = self.write_rows_script(&script, CLAIMING).await?;
            return claimed_rows(statements.first().map(Vec::as_slice).unwrap_or_default());
        }
        // The claim goes in the round trip that begins its job.
        let claim = claim_query(Backend::Sqlite, owner, now, lease_ms, limit);
        let first = FirstStatement::sqlite(claim, true, CLAIMING)?;
        let (w, rows) = self
            .begin_row_write_reading(&crate::store::locks::RowLocks::default(), Some(first))
            .await?;
        let claimed = claimed_rows(&rows.map(|FirstRows(rows)| rows).unwrap_or_default())?;
        let commit = w.into_commit();
        if claimed.is_empty() {
            // It changed nothing: its commit is not waited for (and a
            // savepoint of its own to roll back would cost a round trip).
            drop(commit);
            return Ok(claimed);
        }
        commit.await?;
        Ok(claimed)
    }

    /// The deliverer's turn: [`claim_due`](Store::claim_due), then, when the
    /// claim took fewer than `limit` rows, [`next_due_at`](Store::next_due_at)
    /// from `now` (else `None`: claim again at once). On PostgreSQL both are
    /// one round trip, the claim's transaction with the look after it.
    pub async fn claim_and_next_due(
        &self,
        now: i64,
        lease_ms: i64,
        limit: i64,
    ) -> Result<(Vec<Claimed>, Option<i64>), StoreError> {
        if self.backend() == Backend::Postgres {
            let mut script = claim_script(&self.identity().id, now, lease_ms, limit)?;
            script.push_str("; ");
            script.push_str(&prepared::NEXT_DUE.execute(&[Literal::Int(now)])?);
            let statements = self.write_rows_script(&script, CLAIMING).await?;
            let claimed = claimed_rows(statements.first().map(Vec::as_slice).unwrap_or_default())?;
            if claimed.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
                return Ok((claimed, None));
            }
            // The rows are leased now: a look that cannot be read must not
            // lose them (the idle poll looks again).
            let next = statements
                .get(1)
                .and_then(|rows| rows.first())
                .and_then(|row| {
                    let at = |i: usize| row.try_get::<Option<i64>, _>(i).ok().flatten();
                    earliest(at(0), at(1))
                });
            return Ok((claimed, next));
        }
        let claimed = self.claim_due(now, lease_ms, limit).await?;
        if claimed.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            return Ok((claimed, None));
        }
        // The rows are leased now: a failed look must not lose them.
        let next = self.next_due_at(now).await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot read the outbox");
            None
        });
        Ok((claimed, next))
    }

    /// Records a failed attempt that will be tried again (or given up) at
    /// `next_at`; later rows of its order key wait for it until `hold_until`.
    pub async fn reschedule_delivery(
        &self,
        id: &str,
        attempts: i64,
        retry: Retry,
        error: &str,
    ) -> Result<(), StoreError> {
        let mut w = self.begin_row_write().await?;
        sqlx::query(
            "UPDATE outbox SET attempts = $1, next_attempt_at = $2, give_up_at = $3, \
             hold_until = $4, last_error = $5, lease_until = NULL WHERE id = $6",
        )
        .bind(attempts)
        .bind(retry.next_at)
        .bind(retry.give_up_at)
        .bind(retry.hold_until)
        .bind(error)
        .bind(id)
        .execute(&mut *w.tx)
        .await
        .ctx("rescheduling a delivery")?;
        w.commit().await
    }

    /// Gives back every lease in the database: a single instance that starts
    /// owns them all (they were taken by a process that is gone), so its
    /// chats need not wait for leases to expire. Returns how many there were.
    pub async fn reclaim_leases(&self) -> Result<u64, StoreError> {
        let mut w = self.begin_write().await?;
        let done = sqlx::query(
            "UPDATE outbox SET lease_until = NULL \
             WHERE state = 'pending' AND lease_until IS NOT NULL",
        )
        .execute(&mut *w.tx)
        .await
        .ctx("reclaiming leases")?;
        w.commit().await?;
        Ok(done.rows_affected())
    }

    /// Gives back leases this process will not use (shutdown), so a restart need not wait.
    pub async fn release_lease(&self, id: &str) -> Result<(), StoreError> {
        let mut w = self.begin_row_write().await?;
        sqlx::query("UPDATE outbox SET lease_until = NULL WHERE id = $1 AND state = 'pending'")
            .bind(id)
            .execute(&mut *w.tx)
            .await
            .ctx("releasing a lease")?;
        w.commit().await
    }

    /// The earliest time after `since` at which a pending row's next
    /// attempt or the hold it puts on its order key falls due: when the
    /// deliverer may find something to claim that nothing kicked it for.
    /// Rows due at `since` are not counted: a claim at `since` took what it
    /// could, and what it could not take waits for a row in flight (whose
    /// end kicks the deliverer). A lease that runs out (an instance that
    /// died) is found by the deliverer's idle poll.
    ///
    /// Why not the exact time the next row becomes claimable: that asks, of
    /// every pending row, whether an earlier one blocks it, a cost that
    /// grows with the backlog (about 200 ms at 100 000 rows behind a
    /// recovering integrator, for every claim); these two are index seeks.
    pub async fn next_due_at(&self, since: i64) -> Result<Option<i64>, StoreError> {
        let row: (Option<i64>, Option<i64>) = sqlx::query_as(next_due_sql(self.backend()))
            .bind(since)
            .fetch_one(self.pool())
            .await
            .ctx("finding the next due delivery")?;
        Ok(earliest(row.0, row.1))
    }
}

fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// PostgreSQL: the claim as a script for `Store::write_rows_script`: one
/// round trip, not four (begin, claim, commit, each apart), planned per
/// claim either way.
fn claim_script(owner: &str, now: i64, lease_ms: i64, limit: i64) -> Result<String, StoreError> {
    prepared::CLAIM.execute(&[
        Literal::Int(now + lease_ms),
        Literal::Int(now),
        Literal::Int(limit),
        Literal::Text(owner),
    ])
}

/// [`Store::next_due_at`]'s statement. SQLite's planner would find the
/// earliest hold by reading every pending row through `outbox_due`, so it
/// is told to use `outbox_held` (only held rows are in it).
pub(in crate::store) fn next_due_sql(backend: Backend) -> &'static str {
    static NEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static NEXT_PG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let (cell, indexed) = match backend {
        Backend::Sqlite => (&NEXT, " INDEXED BY outbox_held"),
        Backend::Postgres => (&NEXT_PG, ""),
    };
    cell.get_or_init(|| {
        format!(
            "SELECT (SELECT MIN(next_attempt_at) FROM outbox \
                     WHERE state = 'pending' AND next_attempt_at > $1), \
                    (SELECT MIN(hold_until) FROM outbox{indexed} \
                     WHERE state = 'pending' AND hold_until IS NOT NULL AND hold_until > $1)"
        )
    })
}

/// The claim statement: `$1` the new lease's end, `$2` now, `$3` the most
/// rows to take, `$4` the instance taking them.
pub(in crate::store) fn claim_sql(backend: Backend) -> &'static str {
    static CLAIM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static CLAIM_PG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    // One statement: the rows it leases come back as they were before
    // (attempts started before this claim, and no first attempt yet).
    // On PostgreSQL the candidate rows are locked and rows another
    // transaction holds are skipped, so claims stay exclusive even
    // without the write turn.
    //
    // A row may go when no earlier pending row of its order key holds the
    // key (one in flight or waiting holds it, one whose hold has passed
    // does not). The free rows are read from two small sets, never from
    // the whole backlog: the keys' heads that are due (`outbox_heads`), and
    // the rows behind a head whose hold has passed (`outbox_held`), up to
    // the first row of that key that holds it. SQLite's planner is told
    // which index to read: without statistics it would rather take every
    // due row through `outbox_due`.
    // (`CROSS JOIN` keeps SQLite's loop over the held heads outside;
    // PostgreSQL knows no `CROSS JOIN … ON`.)
    //
    // On PostgreSQL the rows behind are read per held head (`LATERAL`),
    // whatever the statistics: the plan a connection keeps for the
    // prepared claim may have been made while the table was empty, and a
    // join the planner was free to turn around then read every pending
    // row against every other once the backlog grew (measured: one claim
    // 67 s behind 20 000 rows in ten chats, stalls of seconds in the
    // benchmark).
    let cell = match backend {
        Backend::Sqlite => &CLAIM,
        Backend::Postgres => &CLAIM_PG,
    };
    cell.get_or_init(|| {
        let returned = COLUMNS.replace(
            "attempts, first_attempt_at",
            "attempts - 1 AS attempts, \
                 CASE WHEN attempts = 1 THEN NULL ELSE first_attempt_at END AS first_attempt_at",
        );
        let free = "o.next_attempt_at <= $2 AND (o.lease_until IS NULL OR o.lease_until < $2)";
        let last = format!(
            "COALESCE((SELECT MIN(p.seq) FROM outbox p \
               WHERE p.order_key = h.order_key AND p.state = 'pending' \
               AND (p.hold_until IS NULL OR p.hold_until > $2)), {LAST_SEQ})"
        );
        let held = "h.state = 'pending' AND h.head = 1 AND h.hold_until IS NOT NULL \
             AND h.hold_until <= $2";
        let (heads, behind) = match backend {
            Backend::Sqlite => (
                format!(
                    "SELECT o.seq FROM outbox o INDEXED BY outbox_heads \
                     WHERE o.state = 'pending' AND o.head = 1 AND {free} \
                     ORDER BY o.seq LIMIT $3"
                ),
                format!(
                    "SELECT o.seq FROM outbox h INDEXED BY outbox_held CROSS JOIN outbox o \
                     ON o.order_key = h.order_key AND o.state = 'pending' AND o.seq > h.seq \
                     AND o.seq <= {last} WHERE {held} AND {free} ORDER BY o.seq LIMIT $3"
                ),
            ),
            Backend::Postgres => (
                format!(
                    "SELECT o.seq FROM outbox o \
                     WHERE o.state = 'pending' AND o.head = 1 AND {free} \
                     ORDER BY o.seq LIMIT $3 FOR UPDATE OF o SKIP LOCKED"
                ),
                format!(
                    "SELECT b.seq FROM (SELECT h.order_key, h.seq FROM outbox h \
                     WHERE {held} ORDER BY h.hold_until LIMIT $3) AS h \
                     CROSS JOIN LATERAL (SELECT o.seq FROM outbox o \
                     WHERE o.order_key = h.order_key AND o.state = 'pending' AND o.seq > h.seq \
                     AND o.seq <= {last} AND {free} \
                     ORDER BY o.seq LIMIT $3 FOR UPDATE OF o SKIP LOCKED) AS b LIMIT $3"
                ),
            ),
        };
        format!(
            "UPDATE outbox SET lease_until = $1, lease_owner = $4, attempts = attempts + 1, \
             first_attempt_at = COALESCE(first_attempt_at, $2) WHERE seq IN ( \
             SELECT free.seq FROM ( \
             SELECT heads.seq FROM ({heads}) AS heads \
             UNION ALL \
             SELECT behind.seq FROM ({behind}) AS behind \
             ) AS free ORDER BY free.seq LIMIT $3) RETURNING {returned}, \
             (SELECT c.channel_id FROM chats c WHERE c.id = outbox.chat_id) AS channel_id"
        )
    })
}

/// [`Store::claim_due`]'s statement in the caller's transaction (tests'
/// claims beside other writes): the rows leased, in `seq` order.
#[cfg(test)]
pub(super) async fn claim_in(
    conn: &mut AnyConnection,
    backend: Backend,
    owner: &str,
    now: i64,
    lease_ms: i64,
    limit: i64,
) -> Result<Vec<Claimed>, StoreError> {
    let rows = claim_query(backend, owner, now, lease_ms, limit)
        .fetch_all(&mut *conn)
        .await
        .ctx(CLAIMING)?;
    claimed_rows(&rows)
}

/// [`claim_sql`] with its values.
fn claim_query(
    backend: Backend,
    owner: &str,
    now: i64,
    lease_ms: i64,
    limit: i64,
) -> batch::Query<'static> {
    sqlx::query(claim_sql(backend))
        .bind(now + lease_ms)
        .bind(now)
        .bind(limit)
        .bind(owner.to_owned())
}

const CLAIMING: &str = "leasing due deliveries";

/// The rows a claim returned, in `seq` order.
fn claimed_rows(rows: &[AnyRow]) -> Result<Vec<Claimed>, StoreError> {
    let mut claimed = rows
        .iter()
        .map(from_row)
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading a delivery")?;
    claimed.sort_by_key(|c| c.seq);
    Ok(claimed)
}

/// Greater than any row's `seq`.
const LAST_SEQ: i64 = i64::MAX;

/// [`Store::prune_finished`]'s statement: `$1` the cut-off, `$2` the most
/// rows. Through `outbox_due`: a row's last attempt falls due before it
/// finishes, so the rows old enough are a range of that index.
pub(super) const PRUNE: &str = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox \
     WHERE state IN ('delivered', 'dropped') AND next_attempt_at < $1 AND finished_at < $1 \
     LIMIT $2)";

impl Store {
    /// Deletes up to `limit` rows delivered (or dropped by a plugin) before
    /// `before`; how many went. Dead letters stay until they are replayed.
    pub async fn prune_finished(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        let mut w = self.begin_write().await?;
        let done = sqlx::query(PRUNE)
            .bind(before)
            .bind(limit)
            .execute(&mut *w.tx)
            .await
            .ctx("pruning finished deliveries")?;
        w.commit().await?;
        Ok(done.rows_affected())
    }
}
