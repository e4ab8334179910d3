//! Outbox benchmark: what the deliverer's claim and its look for the next
//! due row cost behind a backlog (an integrator that was down), now (the
//! store's own `claim_due` and `next_due_at`) and as the queries were before
//! migration 11 and before migration 12 (their row choice, run on the same
//! file), side by side.
//!
//! `cargo bench -p hub --bench outbox`; BENCH_BACKLOG (default 100000)
//! pending rows over BENCH_KEYS (default 5000) chats, after BENCH_HISTORY
//! (default 200000) delivered rows. Prints, for four states of the backlog,
//! the median ms of each query over BENCH_RUNS (default 5) runs.

use std::time::Instant;

use hub::store::{Durability, Store};
use sqlx::{Connection, SqliteConnection};

mod common;

use common::env_or;

/// The claim's choice of rows before migration 11 (the planner took every
/// due row through `outbox_due`, checked each and sorted them) and before
/// migration 12 (pending rows in order, each checked, until 64 were found:
/// all of them when fewer are free).
const CLAIM_BEFORE: [&str; 2] = [
    claim_before!(""),
    claim_before!(" INDEXED BY outbox_pending"),
];

macro_rules! claim_before {
    ($indexed:literal) => {
        concat!(
            "SELECT o.seq FROM outbox o",
            $indexed,
            " WHERE o.state = 'pending' \
             AND o.next_attempt_at <= ?1 AND (o.lease_until IS NULL OR o.lease_until < ?1) \
             AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.order_key = o.order_key \
             AND p.state = 'pending' AND p.seq < o.seq \
             AND (p.hold_until IS NULL OR p.hold_until > ?1)) ORDER BY o.seq LIMIT 64"
        )
    };
}
use claim_before;

/// The next due time as it was: every pending row checked against the rows
/// ahead of it.
const NEXT_BEFORE: &str = "SELECT MIN(t) FROM ( \
     SELECT CASE WHEN o.lease_until IS NOT NULL AND o.lease_until > o.next_attempt_at \
     THEN o.lease_until ELSE o.next_attempt_at END AS t \
     FROM outbox o WHERE o.state = 'pending' \
     AND NOT EXISTS (SELECT 1 FROM outbox p WHERE p.order_key = o.order_key \
     AND p.state = 'pending' AND p.seq < o.seq \
     AND (p.hold_until IS NULL OR p.hold_until > ?1)) \
     UNION ALL SELECT hold_until AS t FROM outbox WHERE state = 'pending' AND hold_until > ?1) due";

const NOW: i64 = 10_000_000_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    common::guard_backtraces();
    let backlog = env_or("BENCH_BACKLOG", 100_000) as i64;
    let keys = env_or("BENCH_KEYS", 5_000).max(1) as i64;
    let history = env_or("BENCH_HISTORY", 200_000) as i64;
    let runs = env_or("BENCH_RUNS", 5).max(1) as usize;
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = Store::open(&url, Durability::Normal).await.expect("store");
    let mut conn = SqliteConnection::connect(&url).await.expect("connection");
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 + ?2 - 1) \
         INSERT INTO outbox (id, event_id, kind, policy, target_url, body, order_key, state, \
         attempts, next_attempt_at, created_at) \
         SELECT 'row-' || i, 'event-' || i, 'forward', 'dest:bench', 'http://127.0.0.1:9/', '{}', \
         'dest:bench:chat:' || (i % ?3), CASE WHEN i < ?1 THEN 'delivered' ELSE 'pending' END, \
         0, 1000 + i, 1000 + i FROM n",
    )
    .bind(history)
    .bind(backlog)
    .bind(keys)
    .execute(&mut conn)
    .await
    .expect("fill the outbox");
    mark_heads(&mut conn).await;
    println!(
        "outbox benchmark: {history} delivered rows, then {backlog} pending over {keys} order keys; \
         median of {runs} runs"
    );
    println!(
        "{:<44} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "state", "claim <11", "claim <12", "claim now", "next <11", "next now"
    );
    state(&store, &mut conn, runs, "every key's first row free").await;
    // Each key's first row in flight (leased), 64 of them delivered since:
    // their successors are what a claim must find.
    lease_first_rows(&mut conn).await;
    sqlx::query(
        "UPDATE outbox SET state = 'delivered', lease_until = NULL WHERE seq IN \
         (SELECT MIN(seq) FROM outbox WHERE state = 'pending' GROUP BY order_key LIMIT 64)",
    )
    .execute(&mut conn)
    .await
    .expect("deliver some");
    mark_heads(&mut conn).await;
    state(
        &store,
        &mut conn,
        runs,
        "first rows in flight, 64 successors free",
    )
    .await;
    lease_first_rows(&mut conn).await;
    state(&store, &mut conn, runs, "every key's first row in flight").await;
    // Each key's first row failed and waits for its retry, its hold on the
    // key passed: the rows behind it may go (the claim's slower path).
    sqlx::query(
        "UPDATE outbox SET lease_until = NULL, next_attempt_at = ?1, hold_until = ?2 \
         WHERE lease_until IS NOT NULL",
    )
    .bind(NOW * 2)
    .bind(NOW - 1)
    .execute(&mut conn)
    .await
    .expect("hold the first rows");
    state(
        &store,
        &mut conn,
        runs,
        "first rows wait for a retry, holds passed",
    )
    .await;
}

/// Marks each order key's first pending row its head, as the store's
/// writes do.
async fn mark_heads(conn: &mut SqliteConnection) {
    sqlx::query(
        "UPDATE outbox SET head = 1 WHERE head = 0 AND seq IN \
         (SELECT MIN(seq) FROM outbox WHERE state = 'pending' GROUP BY order_key)",
    )
    .execute(conn)
    .await
    .expect("mark the heads");
}

/// Leases each order key's first pending row, as if it were in flight.
async fn lease_first_rows(conn: &mut SqliteConnection) {
    sqlx::query(
        "UPDATE outbox SET lease_until = ?1 WHERE seq IN \
         (SELECT MIN(seq) FROM outbox WHERE state = 'pending' GROUP BY order_key)",
    )
    .bind(NOW * 2)
    .execute(conn)
    .await
    .expect("lease the first rows");
}

/// One line: the median ms of each query in the outbox's current state.
async fn state(store: &Store, conn: &mut SqliteConnection, runs: usize, label: &str) {
    let claim_10 = select(conn, CLAIM_BEFORE[0], runs).await;
    let claim_11 = select(conn, CLAIM_BEFORE[1], runs).await;
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let claimed = store.claim_due(NOW, 60_000, 64).await.expect("claim");
        ms.push(started.elapsed());
        // Give the rows back, so that every run finds the same state.
        let seqs: Vec<String> = claimed.iter().map(|c| c.seq.to_string()).collect();
        sqlx::query(&format!(
            "UPDATE outbox SET lease_until = NULL, attempts = 0, first_attempt_at = NULL \
             WHERE seq IN ({})",
            seqs.join(", ")
        ))
        .execute(&mut *conn)
        .await
        .expect("give the rows back");
    }
    let claim_now = median(ms);
    let next_before = select(conn, NEXT_BEFORE, runs).await;
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        store.next_due_at(NOW).await.expect("next due");
        ms.push(started.elapsed());
    }
    let next_now = median(ms);
    println!(
        "{label:<44} {claim_10:>9.2} ms {claim_11:>9.2} ms {claim_now:>9.2} ms {next_before:>9.2} ms {next_now:>9.2} ms"
    );
}

/// The median ms of `runs` runs of `sql`.
async fn select(conn: &mut SqliteConnection, sql: &str, runs: usize) -> f64 {
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        sqlx::query(sql)
            .bind(NOW)
            .fetch_all(&mut *conn)
            .await
            .expect("query");
        ms.push(started.elapsed());
    }
    median(ms)
}

fn median(mut runs: Vec<std::time::Duration>) -> f64 {
    runs.sort();
    runs.get(runs.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}
