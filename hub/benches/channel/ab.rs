//! Side-by-side mode of the channel benchmark (`BENCH_AB=<another hub
//! binary>`): this build's `hub serve` and another one, alternated run by
//! run on fresh databases, with the hub's CPU per message from `/proc` and
//! a paced run at half the rate each run reached (p99, refusals).
//!
//! With a PostgreSQL server named as for the rest of the benchmark
//! (`HUB_BENCH_DATABASE_URL` or `HUB_TEST_DATABASE_URL`), each run gets a
//! fresh database there instead of a SQLite file.
//!
//! Why: on a shared machine two runs minutes apart differ by more than most
//! changes are worth; alternating the binaries several times and comparing
//! means (and each run's CPU per message, which load noise moves less than
//! req/s) is what tells a change from the weather.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::common::CpuClock;
use super::{
    Database, SETUPS, ServedHub, Setup, customer_message, deliveries, env_or,
    hello_process_baseline, load, plugin_counters, plugins_meanwhile, postgres_server, refusals,
    serve_hello, served_binary,
};

/// One run of one binary.
struct Sample {
    rps: f64,
    p99_ms: f64,
    cpu_us: Option<f64>,
    delivered: Option<f64>,
    /// The paced run at half the rate (p99, refusals).
    paced: Paced,
}

struct Paced {
    p99_ms: f64,
    refused: usize,
    /// The run's figures, printed under its round.
    line: String,
}

/// The two binaries' runs of one setup.
#[derive(Default)]
struct Pair {
    a: Vec<Sample>,
    b: Vec<Sample>,
}

pub async fn compare(
    other: &Path,
    conns: usize,
    duration: Duration,
    replies: usize,
    plugins: &Path,
) {
    let rounds = env_or("BENCH_AB_ROUNDS", 3).max(1);
    let (this, built_here) = served_binary();
    let this = this.as_path();
    let server = postgres_server();
    println!(
        "side by side: A = {}{}, B = {}; {rounds} rounds, the order alternated, \
         {conns} connections, {} s per run, a fresh {} database per run",
        this.display(),
        if built_here { " (this build)" } else { "" },
        other.display(),
        duration.as_secs(),
        if server.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    let base = hello_process_baseline(conns, duration).await;
    let (integrator, received) = serve_hello().await;
    let setups = [SETUPS[0], SETUPS[2]];
    let mut pairs: Vec<Pair> = setups.iter().map(|_| Pair::default()).collect();
    for round in 0..rounds {
        // A then B, then B then A: a drift of the machine during a round
        // falls on both sides.
        let order = if round % 2 == 0 {
            [("A", this), ("B", other)]
        } else {
            [("B", other), ("A", this)]
        };
        for (name, binary) in order {
            for (setup, pair) in setups.iter().zip(&mut pairs) {
                let sample = run(
                    binary,
                    server.as_deref(),
                    *setup,
                    plugins,
                    integrator,
                    &received,
                    conns,
                    duration,
                    replies,
                )
                .await;
                println!(
                    "round {} {name}  {:<18} {:>8.0} req/s ({:.1} %)  p99 {:>6.2} ms  {}{}",
                    round + 1,
                    setup.label(),
                    sample.rps,
                    100.0 * sample.rps / base.rps(),
                    sample.p99_ms,
                    sample.cpu_us.map_or("hub CPU n/a".to_owned(), |c| format!(
                        "{c:.1} µs hub CPU per message"
                    )),
                    sample
                        .delivered
                        .map_or(String::new(), |d| format!("  {d:.0} deliveries/s"))
                );
                println!("        {}", sample.paced.line);
                if name == "A" {
                    pair.a.push(sample);
                } else {
                    pair.b.push(sample);
                }
            }
        }
    }
    println!("means (B against A):");
    for (setup, pair) in setups.iter().zip(&pairs) {
        let line = |what: &str, f: &dyn Fn(&Sample) -> Option<f64>| {
            let (a, b) = (mean(&pair.a, f), mean(&pair.b, f));
            if let (Some(a), Some(b)) = (a, b) {
                println!(
                    "  {:<18} {what:<22} A {a:>9.1}  B {b:>9.1}  B/A {:.3}",
                    setup.label(),
                    b / a
                );
            }
        };
        line("req/s", &|s| Some(s.rps));
        line("hub CPU µs/message", &|s| s.cpu_us);
        line("p99 ms", &|s| Some(s.p99_ms));
        line("deliveries/s", &|s| s.delivered);
        line("paced p99 ms", &|s| Some(s.paced.p99_ms));
        line("paced refused", &|s| Some(s.paced.refused as f64));
    }
}

/// One binary, one setup, a fresh database: ingress, and for `redact` the
/// agent messages end to end.
#[allow(clippy::too_many_arguments)]
async fn run(
    binary: &Path,
    server: Option<&str>,
    setup: Setup,
    plugins: &Path,
    integrator: SocketAddr,
    received: &AtomicUsize,
    conns: usize,
    duration: Duration,
    replies: usize,
) -> Sample {
    let dir = tempfile::tempdir().expect("temp dir");
    let database = match server {
        Some(server) => Some(Database::create(server).await),
        None => None,
    };
    let storage = match &database {
        Some(database) => database.url.clone(),
        None => format!("sqlite://{}", dir.path().join("bench.db").display()),
    };
    let mut hub =
        ServedHub::start_binary(binary, dir.path(), "hub", &storage, setup, plugins).await;
    hub.provision(integrator).await;
    let pid = hub.child.id();
    let cpu = CpuClock::start(pid);
    let ingress = load(
        hub.addr,
        &hub.path,
        conns,
        duration,
        &customer_message,
        None,
    )
    .await;
    let cpu_us = cpu.per_item_us(ingress.count);
    let mut delivered = None;
    // Half the rate this run reached: nothing should wait or be refused.
    let before = plugin_counters(&hub.base).await;
    let run = load(
        hub.addr,
        &hub.path,
        conns,
        duration,
        &customer_message,
        Some(ingress.rps() / 2.0),
    )
    .await;
    let paced = Paced {
        p99_ms: run.pct(0.99).as_secs_f64() * 1e3,
        refused: run.errors,
        line: format!(
            "paced at {:.0} msg/s: p99 {:.2} ms, p999 {:.2} ms, refused: {}; {}",
            ingress.rps() / 2.0,
            run.pct(0.99).as_secs_f64() * 1e3,
            run.pct(0.999).as_secs_f64() * 1e3,
            refusals(&run.refused),
            plugins_meanwhile(&before, &plugin_counters(&hub.base).await)
        ),
    };
    if setup.redact {
        received.store(0, Ordering::Relaxed);
        let bases = [hub.base.clone()];
        delivered = Some(
            deliveries(&bases, &hub.token, replies, conns, received)
                .await
                .rate(),
        );
    }
    hub.stop();
    if let Some(database) = database {
        database.drop().await;
    }
    Sample {
        rps: ingress.rps(),
        p99_ms: ingress.pct(0.99).as_secs_f64() * 1e3,
        cpu_us,
        delivered,
        paced,
    }
}

fn mean(samples: &[Sample], f: &dyn Fn(&Sample) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = samples.iter().filter_map(f).collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}
