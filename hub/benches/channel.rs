//! Channel benchmark: customer-message ingress against a bare hyper
//! hello-world under the same closed-loop load, in one run: in-process and
//! against the real `hub serve` binary over loopback; with no plugin and with
//! the default `redact`; with `durability = "full"` and `"normal"`; with
//! `full`, a paced run at half the measured rate (ack latency when not
//! saturated, and what was refused: by status, by the plugin errors counted
//! meanwhile, and each plugin's time per call; the run without plugins is
//! the control for stalls that are not the plugins'), agent-message
//! deliveries/s end to end, and the served hub's RSS.
//! Run: `cargo bench -p hub --bench channel`.
//! Environment: BENCH_SECS (default 5), BENCH_CONNS (default 32),
//! BENCH_REPLIES (default 20000), BENCH_SENDERS (distinct customers, default
//! 1000), BENCH_SKIP_SERVE=1 (in-process only),
//! BENCH_SOAK_SECS (a soak of the served hub at half rate, RSS every 30 s),
//! BENCH_HUB_LOG (the served hub's log filter, default `info` as `hub.toml`'s),
//! BENCH_HUB (the served `hub` binary, default this build's; see `served_binary`),
//! BENCH_PG_LANES (each PostgreSQL instance's `[storage] write_lanes`,
//! default 1: see `config_text`), BENCH_PG_ROUNDS (rounds of one and two
//! PostgreSQL instances taking turns, default 1; with more, each round
//! measures SQLite again first, and the ratios of each round with their
//! medians),
//! BENCH_BUSY_DISK=<MiB/s> (another writer on the databases' disk meanwhile,
//! synced per MiB: what `durability = "full"` costs when the disk is shared).
//!
//! Side by side: `BENCH_AB=<path of another hub binary>` runs this build's
//! `hub serve` and that one alternately (`BENCH_AB_ROUNDS`, default 3),
//! without plugins and with `redact` (`full`), each on a fresh database, and
//! prints both (req/s also as a share of a hello-world process) with the
//! hub's CPU per message, the paced run at half the rate and the ratios of
//! the means (`channel/ab.rs`).
//!
//! PostgreSQL: with HUB_BENCH_DATABASE_URL (or else HUB_TEST_DATABASE_URL, as
//! `scripts/with-postgres.sh` sets it) naming a server (a URL of any database
//! there, as a user allowed to create databases), the black-box part also
//! measures `hub serve` on PostgreSQL, each measurement on a fresh database
//! (`bench_<random>`, dropped afterwards): ingress and agent-message
//! deliveries with one instance, then with two instances on one database
//! (the same connections in total, half to each), each with the waits for
//! locks sampled on the server (`LockSampler`) and the CPU per item of the
//! hubs, the server (when it runs on this machine) and this process
//! (`CpuShares`), next to the SQLite figures
//! of the same run at the durability the server matches (`normal` when its
//! `fsync` or `synchronous_commit` is off, else `full`):
//! `BENCH_SECS=5 scripts/with-postgres.sh cargo bench -p hub --bench channel`.
//!
//! Operators' mode: `BENCH_ENDPOINT=http://host:port/<secret>/<public_id>`
//! drives a hub already running (a channel's customer-message endpoint, as
//! `hub channel create` prints it) next to the same hello-world baseline;
//! `BENCH_PID=<pid of hub serve>` adds its RSS. The messages it posts are
//! stored.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::{
    BusyDisk, CpuClock, CpuPerItem, CpuShares, create_channel, env_or, guard_backtraces,
    local_postmaster, memory_kib, plugins_dir,
};

#[path = "channel/ab.rs"]
mod ab;

const ADMIN: &str = "bench-admin-token-0123456789";

/// The allocator `hub serve` runs with, so that the in-process figures are
/// the served binary's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    guard_backtraces();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    if std::env::var_os("BENCH_SERVE_HELLO").is_some() {
        runtime.block_on(hello_process());
        return;
    }
    runtime.block_on(bench());
}

/// The settings of one measured hub.
#[derive(Clone, Copy)]
struct Setup {
    redact: bool,
    durability: &'static str,
    /// Example plugins configured besides, on no route (memory per plugin).
    idle_plugins: &'static [&'static str],
}

impl Setup {
    fn label(self) -> String {
        format!(
            "{}, {}",
            if self.redact { "redact" } else { "no plugin" },
            self.durability
        )
    }
}

const SETUPS: [Setup; 4] = [
    Setup {
        redact: false,
        durability: "full",
        idle_plugins: &[],
    },
    Setup {
        redact: false,
        durability: "normal",
        idle_plugins: &[],
    },
    Setup {
        redact: true,
        durability: "full",
        idle_plugins: &[],
    },
    Setup {
        redact: true,
        durability: "normal",
        idle_plugins: &[],
    },
];

async fn bench() {
    let _busy_disk = BusyDisk::from_env();
    let secs = env_or("BENCH_SECS", 5);
    let conns = env_or("BENCH_CONNS", 32) as usize;
    // Long enough for a steady state: at 5 000 a served SQLite hub's run
    // lasted half a second, and the first replies to the ~450 chats (each
    // accepts its chat) were one in eleven of it.
    let replies = env_or("BENCH_REPLIES", 20_000) as usize;
    let duration = Duration::from_secs(secs);

    let (hello, _) = serve_hello().await;
    let hello_body = |_: usize| Bytes::from_static(b"{}");
    let base = load(hello, "/", conns, duration, &hello_body, None).await;
    if let Ok(endpoint) = std::env::var("BENCH_ENDPOINT") {
        black_box(&endpoint, conns, duration, &base).await;
        return;
    }
    let plugins = plugins_dir();
    if let Some(other) = std::env::var_os("BENCH_AB") {
        ab::compare(Path::new(&other), conns, duration, replies, &plugins).await;
        return;
    }
    println!(
        "channel benchmark: {conns} connections, {secs} s per run, 2 cores shared with the load generator"
    );
    println!("\nin-process (hub and load generator in one process):");
    base.print("hello-world (bare hyper)", None);
    let (integrator, received) = serve_hello().await;
    let mut kept = None;
    for setup in SETUPS {
        let dir = tempfile::tempdir().expect("temp dir");
        let (hub, endpoint_path, token) = start_hub(dir.path(), integrator, setup, &plugins).await;
        let run = ingress(
            (hub.addr(), None),
            &endpoint_path,
            conns,
            duration,
            setup,
            &base,
        )
        .await;
        if setup.durability == "full" {
            paced(
                (hub.addr(), Some(hub.base_url())),
                &endpoint_path,
                conns,
                duration,
                &run,
            )
            .await;
        }
        if setup.redact && setup.durability == "full" {
            kept = Some((hub, token, dir));
        } else {
            hub.shutdown().await;
        }
    }
    if let Some((hub, token, _dir)) = kept {
        let bases = [hub.base_url().to_owned()];
        let done = deliveries(&bases, &token, replies, conns, &received).await;
        println!(
            "agent messages end to end (redact, full): {} delivered to a loopback integrator in {:.2} s = {:.0} deliveries/s",
            done.delivered,
            done.elapsed.as_secs_f64(),
            done.rate()
        );
        hub.shutdown().await;
    }
    if std::env::var_os("BENCH_SKIP_SERVE").is_none() {
        served(conns, duration, replies, &plugins).await;
    }
}

/// The same figures against the real `hub serve` binary, a separate process,
/// next to a hello-world in a separate process too; then, with a PostgreSQL
/// server, the same binary on PostgreSQL.
async fn served(conns: usize, duration: Duration, replies: usize, plugins: &Path) {
    println!("\nblack box (`hub serve` and a hello-world process, driven over loopback):");
    let base = hello_process_baseline(conns, duration).await;
    let (integrator, received) = serve_hello().await;
    let mut sqlite = Vec::new();
    for setup in [SETUPS[0], SETUPS[2], SETUPS[3]] {
        let dir = tempfile::tempdir().expect("temp dir");
        let storage = format!("sqlite://{}", dir.path().join("bench.db").display());
        let mut hub = ServedHub::start(dir.path(), "hub", &storage, setup, plugins).await;
        hub.provision(integrator).await;
        let idle = memory_kib(hub.child.id(), "VmRSS");
        let served = (hub.addr, Some(hub.child.id()));
        let run = ingress(served, &hub.path, conns, duration, setup, &base).await;
        let mut delivered = None;
        if setup.durability == "full" {
            paced(
                (hub.addr, Some(hub.base.as_str())),
                &hub.path,
                conns,
                duration,
                &run,
            )
            .await;
        }
        if setup.redact {
            received.store(0, Ordering::Relaxed);
            let bases = [hub.base.clone()];
            let done = deliveries(&bases, &hub.token, replies, conns, &received).await;
            done.print(None, None);
            delivered = Some(done.rate());
        }
        if setup.redact && setup.durability == "full" {
            let size = |name: &str| {
                std::fs::metadata(dir.path().join(name)).map_or(0.0, |m| m.len() as f64 / 1e6)
            };
            println!(
                "  hub RSS: idle {:.1} MB, after the runs {:.1} MB; database {:.1} MB, WAL {:.1} MB",
                idle as f64 / 1024.0,
                memory_kib(hub.child.id(), "VmRSS") as f64 / 1024.0,
                size("bench.db"),
                size("bench.db-wal")
            );
            soak(&hub, &run).await;
        }
        hub.stop();
        sqlite.push(Measured {
            setup,
            run,
            delivered,
        });
    }
    plugin_memory(plugins).await;
    if let Some(server) = postgres_server() {
        postgres(&server, conns, duration, replies, plugins, &base, &sqlite).await;
    }
}

/// Idle RSS of `hub serve` without plugins, with one example plugin, and
/// with the five that need no settings configured (on no route) at its
/// first start, which compiles them, and at the next, which loads them
/// from its cache; what the first plugin adds (it also maps wasmtime's own
/// code) and what each further one adds.
async fn plugin_memory(plugins: &Path) {
    const EXAMPLES: &[&str] = &[
        "redact",
        "auto_reply",
        "crm_enrich",
        "faq_bot",
        "spam_guard",
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = format!("sqlite://{}", dir.path().join("idle.db").display());
    let none = Setup {
        redact: false,
        durability: "full",
        idle_plugins: &[],
    };
    let one = Setup {
        idle_plugins: &EXAMPLES[..1],
        ..none
    };
    let five = Setup {
        idle_plugins: EXAMPLES,
        ..none
    };
    let mut idle = Vec::new();
    for (name, setup) in [
        ("none", none),
        ("first", five),
        ("cached", five),
        ("one", one),
    ] {
        let mut hub = ServedHub::start(dir.path(), name, &storage, setup, plugins).await;
        // What the start allocates last (the plugins' config checks) settles.
        tokio::time::sleep(Duration::from_secs(1)).await;
        idle.push(memory_kib(hub.child.id(), "VmRSS") as f64 / 1024.0);
        hub.stop();
    }
    let further = (EXAMPLES.len() - 1) as f64;
    println!(
        "  idle RSS by configured plugins: none {:.1} MB, one {:.1} MB; {} example plugins {:.1} MB at the first start (compiling them), {:.1} MB from the cache: the first plugin {:.2} MB, each further one {:.2} MB",
        idle[0],
        idle[3],
        EXAMPLES.len(),
        idle[1],
        idle[2],
        idle[3] - idle[0],
        (idle[2] - idle[3]) / further
    );
}

/// A SQLite figure of the black-box run, for the PostgreSQL ratios.
struct Measured {
    setup: Setup,
    run: Run,
    delivered: Option<f64>,
}

/// The PostgreSQL server the benchmark may create databases on, if any.
fn postgres_server() -> Option<String> {
    ["HUB_BENCH_DATABASE_URL", "HUB_TEST_DATABASE_URL"]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
}

/// Ingress and deliveries of `hub serve` with `redact` on PostgreSQL, one
/// instance and then two on one database, each on a fresh database; with
/// ratios to the SQLite run of the durability the server matches and to the
/// hello-world.
async fn postgres(
    server: &str,
    conns: usize,
    duration: Duration,
    replies: usize,
    plugins: &Path,
    base: &Run,
    sqlite: &[Measured],
) {
    let (version, relaxed, postmaster) = server_settings(server).await;
    let durability = if relaxed { "normal" } else { "full" };
    let Some(like) = sqlite
        .iter()
        .find(|m| m.setup.redact && m.setup.durability == durability)
    else {
        return;
    };
    println!(
        "\nPostgreSQL {version} (`hub serve`, redact, a fresh database per measurement; {}: compared with SQLite redact, {durability}):",
        if relaxed {
            "the server's fsync or synchronous_commit is off"
        } else {
            "the server fsyncs every commit"
        }
    );
    let (integrator, received) = serve_hello().await;
    // One and two instances take turns (1 2, then 2 1, …), so a ratio
    // of one round compares measurements seconds apart and the machine's
    // drift falls on both sides.
    let rounds = env_or("BENCH_PG_ROUNDS", 1).max(1);
    if rounds > 1 {
        println!("(each round measures SQLite again first, and its lines compare with that)");
    }
    let mut ratios: Vec<[Option<f64>; 6]> = Vec::new();
    // With rounds, one instance against SQLite measured at the start of
    // its round (ingress, deliveries).
    let mut against_sqlite: Vec<[Option<f64>; 2]> = Vec::new();
    for round in 0..rounds {
        if rounds > 1 {
            println!("round {} of {rounds}:", round + 1);
        }
        let order = if round % 2 == 0 { [1, 2] } else { [2, 1] };
        let mut measured = [PgMeasured::default(); 2];
        // Every line of the round against SQLite of the round.
        let same_round = if rounds > 1 {
            Some(
                sqlite_again(
                    like.setup,
                    (conns, duration, replies),
                    plugins,
                    base,
                    (integrator, &received),
                )
                .await,
            )
        } else {
            None
        };
        for instances in order {
            let like = same_round.as_ref().unwrap_or(like);
            measured[instances - 1] = postgres_instances(
                server,
                instances,
                (conns, duration, replies),
                plugins,
                (base, like, postmaster),
                (integrator, &received),
            )
            .await;
        }
        ratios.push(measured[1].against(&measured[0]));
        if let Some(sqlite) = &same_round {
            against_sqlite.push([
                Some(measured[0].ingress / sqlite.run.rps()),
                sqlite.delivered.map(|d| measured[0].deliveries / d),
            ]);
        }
    }
    if rounds > 1 {
        let list = |pick: usize| per_round(ratios.iter().filter_map(|r| r[pick]));
        println!(
            "two instances against one, per round: ingress {}; deliveries {}",
            list(0),
            list(1)
        );
        println!(
            "  CPU per item of the hubs and the server together, two instances against one: ingress {}; deliveries {}",
            list(2),
            list(3)
        );
        println!(
            "  the same, each over this process's (the same work in both: a yardstick of the machine's speed): ingress {}; deliveries {}",
            list(4),
            list(5)
        );
        let each = |pick: usize| per_round(against_sqlite.iter().filter_map(|r| r[pick]));
        println!(
            "one instance against SQLite {durability} of its round: ingress {}; deliveries {}",
            each(0),
            each(1)
        );
    }
}

/// Ratios of the rounds, as `0.91×, 1.03× (median 1.03×)`.
fn per_round(ratios: impl Iterator<Item = f64>) -> String {
    let mut each: Vec<f64> = ratios.collect();
    let shown: Vec<String> = each.iter().map(|r| format!("{r:.2}×")).collect();
    each.sort_by(f64::total_cmp);
    match each.get(each.len() / 2) {
        Some(median) => format!("{} (median {median:.2}×)", shown.join(", ")),
        None => "not measured".to_owned(),
    }
}

/// The SQLite figures the PostgreSQL ones are compared with, measured
/// again within a round of [`postgres`] (a served hub on a fresh file,
/// `setup`: ingress, then deliveries), so that a ratio compares
/// measurements a minute apart, not the machine's speed at two times.
async fn sqlite_again(
    setup: Setup,
    (conns, duration, replies): (usize, Duration, usize),
    plugins: &Path,
    base: &Run,
    (integrator, received): (SocketAddr, &AtomicUsize),
) -> Measured {
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = format!("sqlite://{}", dir.path().join("bench.db").display());
    let mut hub = ServedHub::start(dir.path(), "hub", &storage, setup, plugins).await;
    hub.provision(integrator).await;
    let run = spread_load(&[hub.addr], &hub.path, conns, duration).await;
    println!(
        "{}",
        run.line(&format!("ingress, SQLite {}", setup.label()), Some(base))
    );
    received.store(0, Ordering::Relaxed);
    let done = deliveries(&[hub.base.clone()], &hub.token, replies, conns, received).await;
    done.print(Some(base), None);
    hub.stop();
    Measured {
        setup,
        run,
        delivered: Some(done.rate()),
    }
}

/// What one PostgreSQL measurement gave: ingress req/s, deliveries/s, and
/// each one's CPU per item (when the server runs on this machine).
#[derive(Clone, Copy, Default)]
struct PgMeasured {
    ingress: f64,
    deliveries: f64,
    ingress_cpu: CpuPerItem,
    deliveries_cpu: CpuPerItem,
}

impl PgMeasured {
    /// `self` (two instances) against `one`: throughput ratios (ingress,
    /// deliveries), CPU per item ratios of the hubs and the server
    /// together, and the same over this process's CPU per item. The load
    /// generator and the integrator do the same work per item in both, so
    /// theirs moves only with the machine's speed, which drifts by a
    /// quarter within minutes on a shared machine.
    fn against(&self, one: &PgMeasured) -> [Option<f64>; 6] {
        let tested = |c: &CpuPerItem| c.pids.zip(c.server).map(|(h, s)| h + s);
        let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let over_own = |c: &CpuPerItem| ratio(tested(c), c.own);
        [
            Some(self.ingress / one.ingress),
            Some(self.deliveries / one.deliveries),
            ratio(tested(&self.ingress_cpu), tested(&one.ingress_cpu)),
            ratio(tested(&self.deliveries_cpu), tested(&one.deliveries_cpu)),
            ratio(over_own(&self.ingress_cpu), over_own(&one.ingress_cpu)),
            ratio(
                over_own(&self.deliveries_cpu),
                over_own(&one.deliveries_cpu),
            ),
        ]
    }
}

/// As `CPU per item: hubs 61.2 µs, PostgreSQL server 95.3 µs, this process
/// (load, integrator, lock sampler) 14.1 µs; the machine 82 % busy, 21.3
/// context switches per item`.
fn cpu_shares_line(cpu: CpuPerItem) -> String {
    let us = |v: Option<f64>| v.map_or_else(|| "not measured".to_owned(), |v| format!("{v:.1} µs"));
    let busy = cpu
        .busy
        .map_or_else(String::new, |b| format!("; the machine {b:.0} % busy"));
    let switches = cpu.switches.map_or_else(String::new, |n| {
        format!(", {n:.1} context switches per item")
    });
    format!(
        "CPU per item: hubs {}, PostgreSQL server {}, this process (load, integrator, lock sampler) {}{busy}{switches}",
        us(cpu.pids),
        us(cpu.server),
        us(cpu.own)
    )
}

/// One PostgreSQL measurement of [`postgres`]: `instances` hubs on a fresh
/// database, ingress then deliveries; their rates and CPU per item.
async fn postgres_instances(
    server: &str,
    instances: usize,
    (conns, duration, replies): (usize, Duration, usize),
    plugins: &Path,
    (base, like, postmaster): (&Run, &Measured, Option<u32>),
    (integrator, received): (SocketAddr, &AtomicUsize),
) -> PgMeasured {
    let setup = SETUPS[2];
    let database = Database::create(server).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut hubs = Vec::new();
    for i in 0..instances {
        let name = format!("hub-{i}");
        let hub = ServedHub::start(dir.path(), &name, &database.url, setup, plugins).await;
        hubs.push(hub);
    }
    hubs[0].provision(integrator).await;
    let (path, token) = (hubs[0].path.clone(), hubs[0].token.clone());
    for hub in &mut hubs[1..] {
        hub.path.clone_from(&path);
        hub.token.clone_from(&token);
    }
    let label = if instances == 1 {
        "1 instance".to_owned()
    } else {
        format!("{instances} instances")
    };
    let addrs: Vec<SocketAddr> = hubs.iter().map(|h| h.addr).collect();
    let bases: Vec<String> = hubs.iter().map(|h| h.base.clone()).collect();
    let pids: Vec<u32> = hubs.iter().map(|h| h.child.id()).collect();
    let before = write_waits(&bases).await;
    let locks = LockSampler::start(&database.url).await;
    let cpu = CpuShares::start(&pids, postmaster);
    let run = spread_load(&addrs, &path, conns, duration).await;
    let ingress_cpu = cpu.per_item_us(run.count);
    let locks = locks.stop().await;
    println!(
        "{}, {:.2}× SQLite",
        run.line(&format!("ingress, redact, {label}"), Some(base)),
        run.rps() / like.run.rps()
    );
    println!(
        "  {}",
        waits_meanwhile(&before, &write_waits(&bases).await, run.count as u64)
    );
    println!("  {}", locks.per_item(run.count as u64));
    println!("  {}", cpu_shares_line(ingress_cpu));
    received.store(0, Ordering::Relaxed);
    let before = write_waits(&bases).await;
    let locks = LockSampler::start(&database.url).await;
    let cpu = CpuShares::start(&pids, postmaster);
    let done = deliveries(&bases, &token, replies, conns, received).await;
    let deliveries_cpu = cpu.per_item_us(replies);
    let locks = locks.stop().await;
    done.print(Some(base), like.delivered);
    println!(
        "  {}",
        waits_meanwhile(&before, &write_waits(&bases).await, replies as u64)
    );
    println!("  {}", locks.per_item(replies as u64));
    println!("  {}", cpu_shares_line(deliveries_cpu));
    for hub in &mut hubs {
        hub.stop();
    }
    database.drop().await;
    PgMeasured {
        ingress: run.rps(),
        deliveries: done.rate(),
        ingress_cpu,
        deliveries_cpu,
    }
}

/// Samples, every few milliseconds, how many of the database's sessions
/// wait for a lock on the server and how many are running a statement. By
/// Little's law the mean number waiting times the time sampled, divided by
/// the messages of the run, is the lock wait per message, whoever held the
/// lock: the write turn, a sender's, an order key's (advisory locks) or a
/// row's (a counter, a chat). Measured by the server, so a wait inside the
/// round trip that begins a transaction counts too.
struct LockSampler {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<LockSamples>,
}

#[derive(Default)]
struct LockSamples {
    samples: u64,
    /// Sum over the samples of the sessions waiting for an advisory lock.
    advisory: u64,
    /// … for any other lock (rows, tuples, relations, transactions).
    other: u64,
    /// … running a statement.
    active: u64,
    elapsed: Duration,
}

impl LockSampler {
    async fn start(url: &str) -> LockSampler {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL {url}: {e}"));
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = LockSamples::default();
            let started = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    _ = tick.tick() => {}
                }
                let row: Result<(i64, i64, i64), _> = sqlx::query_as(
                    "SELECT COUNT(*) FILTER (WHERE wait_event_type = 'Lock' \
                     AND wait_event = 'advisory'), \
                     COUNT(*) FILTER (WHERE wait_event_type = 'Lock' \
                     AND wait_event <> 'advisory'), \
                     COUNT(*) FILTER (WHERE state = 'active') \
                     FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                )
                .fetch_one(&mut conn)
                .await;
                if let Ok((advisory, other, active)) = row {
                    seen.samples += 1;
                    seen.advisory += advisory as u64;
                    seen.other += other as u64;
                    seen.active += active as u64;
                }
            }
            seen.elapsed = started.elapsed();
            let _ = conn.close().await;
            seen
        });
        LockSampler { stop, task }
    }

    async fn stop(self) -> LockSamples {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

impl LockSamples {
    /// As `lock waits on the server: advisory 3.1 µs per item, rows 0.2 µs;
    /// 1.4 sessions running a statement on average (812 samples)`.
    fn per_item(&self, items: u64) -> String {
        let samples = self.samples.max(1) as f64;
        let per_item = |sum: u64| {
            sum as f64 / samples * self.elapsed.as_secs_f64() * 1e6 / items.max(1) as f64
        };
        format!(
            "lock waits on the server: advisory {:.1} µs per item, other locks {:.1} µs; \
             {:.2} sessions running a statement on average ({} samples)",
            per_item(self.advisory),
            per_item(self.other),
            self.active as f64 / samples,
            self.samples
        )
    }
}

/// The server's version, whether a commit returns before it is on disk
/// (`fsync` or `synchronous_commit` off), and its postmaster's pid if it
/// runs on this machine (its CPU is then measured).
async fn server_settings(server: &str) -> (String, bool, Option<u32>) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(server)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL server {server}: {e}"));
    let version = show(&mut conn, "server_version").await;
    let relaxed = show(&mut conn, "fsync").await == "off"
        || show(&mut conn, "synchronous_commit").await == "off";
    let backend: Option<i32> = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .ok();
    let postmaster = backend
        .and_then(|pid| u32::try_from(pid).ok())
        .and_then(local_postmaster);
    let _ = conn.close().await;
    (version, relaxed, postmaster)
}

/// A setting of the server, as `SHOW` gives it.
async fn show(conn: &mut sqlx::PgConnection, name: &str) -> String {
    sqlx::query_scalar(&format!("SHOW {name}"))
        .fetch_one(conn)
        .await
        .unwrap_or_else(|e| panic!("SHOW {name}: {e}"))
}

/// A database of its own on the PostgreSQL server, for one measurement.
struct Database {
    server: String,
    name: String,
    url: String,
}

impl Database {
    async fn create(server: &str) -> Database {
        let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
        admin_sql(server, &format!("CREATE DATABASE {name}")).await;
        let (base, query) = match server.split_once('?') {
            Some((base, query)) => (base, format!("?{query}")),
            None => (server, String::new()),
        };
        let authority_start = base.find("://").map_or(0, |i| i + 3);
        let root = match base[authority_start..].find('/') {
            Some(i) => &base[..authority_start + i],
            None => base,
        };
        Database {
            server: server.to_owned(),
            url: format!("{root}/{name}{query}"),
            name,
        }
    }

    /// Drops the database once its hubs are stopped.
    async fn drop(self) {
        admin_sql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        )
        .await;
    }
}

/// Runs one statement on the server's database named in its URL.
async fn admin_sql(server: &str, sql: &str) {
    use sqlx::{Connection, Executor};
    let mut conn = sqlx::PgConnection::connect(server)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL server {server}: {e}"));
    conn.execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql} on {server}: {e}"));
    let _ = conn.close().await;
}

/// The closed-loop ingress load split over `addrs` (hubs on one database
/// with the same channel), `conns` connections in all: one run over all.
async fn spread_load(addrs: &[SocketAddr], path: &str, conns: usize, duration: Duration) -> Run {
    let n = addrs.len();
    // One count of messages over every hub, as a load balancer spreads one
    // stream of customers: sender `i`'s next message is `BENCH_SENDERS`
    // messages later, wherever it lands. (A count per hub sent the same
    // senders to every hub in lockstep, each batch waiting for the other
    // hubs' batches of the same senders: a collision on every message.)
    let next = Arc::new(AtomicUsize::new(0));
    let runs = futures_util::future::join_all(addrs.iter().enumerate().map(|(i, &addr)| {
        let share = conns / n + usize::from(i < conns % n);
        let body = &customer_message;
        load_counted(addr, path, share, duration, body, None, next.clone())
    }))
    .await;
    Run::merge(runs)
}

/// With `BENCH_SOAK_SECS`, keeps the served hub at half the measured rate
/// for that long and prints its RSS every 30 s: memory must stay flat.
async fn soak(hub: &ServedHub, closed: &Run) {
    let secs = env_or("BENCH_SOAK_SECS", 0);
    if secs == 0 {
        return;
    }
    let rate = closed.rps() / 2.0;
    println!("  soak: {rate:.0} msg/s for {secs} s, RSS every 30 s:");
    let chunk = Duration::from_secs(30);
    let mut done = Duration::ZERO;
    let mut samples = Vec::new();
    while done.as_secs() < secs {
        let run = load(
            hub.addr,
            &hub.path,
            32,
            chunk,
            &customer_message,
            Some(rate),
        )
        .await;
        done += chunk;
        let rss = memory_kib(hub.child.id(), "VmRSS") as f64 / 1024.0;
        samples.push(rss);
        println!(
            "    {:4} s  {:6.1} MB  ({:.0} msg/s, {} errors)",
            done.as_secs(),
            rss,
            run.rps(),
            run.errors
        );
    }
    if let (Some(first), Some(last)) = (samples.first(), samples.last()) {
        println!(
            "  soak RSS: first {first:.1} MB, last {last:.1} MB, max {:.1} MB",
            samples.iter().cloned().fold(0.0, f64::max)
        );
    }
}

/// The customer messages every mode posts: `BENCH_SENDERS` customers (1000
/// unless set; 10 is the other load shape of docs/operations.md's scale
/// model), one short text with something `redact` masks.
fn customer_message(i: usize) -> Bytes {
    static SENDERS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let senders = *SENDERS.get_or_init(|| (env_or("BENCH_SENDERS", 1000) as usize).max(1));
    Bytes::from(
        json!({ "sender": { "id": i % senders, "name": "Bench" },
                "message": { "type": "text", "text": "How much is the premium plan? Call me at +1 555 0100" } })
        .to_string(),
    )
}

/// Loads a running hub's customer-message endpoint, next to the baseline.
async fn black_box(endpoint: &str, conns: usize, duration: Duration, base: &Run) {
    let Some(rest) = endpoint.strip_prefix("http://") else {
        eprintln!("BENCH_ENDPOINT must be an http:// URL of a channel endpoint");
        return;
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let Some(addr) = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut a| a.next())
    else {
        eprintln!("cannot resolve {authority}");
        return;
    };
    println!(
        "channel benchmark, black box: {conns} connections, {} s per run, against {endpoint}",
        duration.as_secs()
    );
    base.print("hello-world (bare hyper)", None);
    let pid = std::env::var("BENCH_PID").ok().and_then(|p| p.parse().ok());
    if let Some(pid) = pid {
        println!(
            "hub RSS before: {:.1} MB",
            memory_kib(pid, "VmRSS") as f64 / 1024.0
        );
    }
    let clocks = pid.map(cpu_clocks);
    let ingress = load(addr, path, conns, duration, &customer_message, None)
        .await
        .with_cpu(clocks);
    ingress.print("customer-message ingress", Some(base));
    paced((addr, None), path, conns, duration, &ingress).await;
    if let Some(pid) = pid {
        println!(
            "hub RSS after: {:.1} MB",
            memory_kib(pid, "VmRSS") as f64 / 1024.0
        );
    }
}

/// The closed-loop ingress run of a setup, printed next to `base`.
/// With `pid`, the served hub's process, also the CPU per message.
async fn ingress(
    (addr, pid): (SocketAddr, Option<u32>),
    path: &str,
    conns: usize,
    duration: Duration,
    setup: Setup,
    base: &Run,
) -> Run {
    let clocks = pid.map(cpu_clocks);
    let run = load(addr, path, conns, duration, &customer_message, None)
        .await
        .with_cpu(clocks);
    run.print(&format!("ingress, {}", setup.label()), Some(base));
    run
}

/// Customer messages at half the rate `closed` reached: the latency of
/// acknowledgements when the hub is not saturated, and what was refused, by
/// status and, with `metrics` (the hub's base URL, this benchmark's admin
/// token), by the plugin errors counted meanwhile, with the plugins' time
/// per call. A hub at half its capacity should refuse nothing.
async fn paced(
    (addr, metrics): (SocketAddr, Option<&str>),
    path: &str,
    conns: usize,
    duration: Duration,
    closed: &Run,
) -> Run {
    let rate = Some(closed.rps() / 2.0);
    let before = match metrics {
        Some(base) => plugin_counters(base).await,
        None => BTreeMap::new(),
    };
    let run = load(addr, path, conns, duration, &customer_message, rate).await;
    run.print("  paced at half that rate", None);
    let mut line = format!("    refused: {}", refusals(&run.refused));
    if let Some(base) = metrics {
        line += "; ";
        line += &plugins_meanwhile(&before, &plugin_counters(base).await);
    }
    println!("{line}");
    run
}

/// Refusals by status, as `503 × 12, no answer × 1`.
fn refusals(refused: &BTreeMap<u16, usize>) -> String {
    if refused.is_empty() {
        return "none".to_owned();
    }
    refused
        .iter()
        .map(|(status, n)| match status {
            0 => format!("no answer × {n}"),
            s => format!("{s} × {n}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The hub's `/metrics` page (empty if it does not answer).
async fn metrics_text(base: &str) -> String {
    match reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The write transactions of `bases` (summed over the instances) and the
/// time they waited to begin, by mode: `[exclusive, row]` × (count, seconds).
async fn write_waits(bases: &[String]) -> [(f64, f64); 2] {
    let mut sums = [(0.0, 0.0); 2];
    for base in bases {
        let text = metrics_text(base).await;
        for line in text.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let mode = usize::from(series.ends_with("{mode=\"row\"}"));
            if series.starts_with("hub_store_write_transactions_total{") {
                sums[mode].0 += value;
            } else if series.starts_with("hub_store_write_wait_seconds_total{") {
                sums[mode].1 += value;
            }
        }
    }
    sums
}

/// The write transactions between two [`write_waits`] and their waits to
/// begin per item (`items` messages or replies): as `write transactions:
/// row 412 (0.4 µs waited per message), exclusive 3 (0.0 µs)`.
fn waits_meanwhile(before: &[(f64, f64); 2], after: &[(f64, f64); 2], items: u64) -> String {
    let items = items.max(1) as f64;
    let part = |mode: usize, name: &str| {
        let n = after[mode].0 - before[mode].0;
        let waited = (after[mode].1 - before[mode].1) * 1e6 / items;
        format!("{name} {n:.0} ({waited:.1} µs waited per item)")
    };
    format!(
        "write transactions meanwhile: {}, {}",
        part(1, "row mode"),
        part(0, "exclusive")
    )
}

/// The hub's plugin counters (`hub_plugin_…` series but the histogram's)
/// and its WAL restarts (`hub_store_wal_…`), from its `/metrics`: series
/// with its labels → value.
async fn plugin_counters(base: &str) -> BTreeMap<String, f64> {
    metrics_text(base)
        .await
        .lines()
        .filter(|l| {
            (l.starts_with("hub_plugin_") && !l.contains("_duration_seconds"))
                || l.starts_with("hub_store_wal_")
        })
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// What the plugins did between two [`plugin_counters`]: their errors by
/// kind, and for each plugin called its time per call and how much of it
/// was spent outside the sandbox's phases (instantiation, guest code,
/// teardown): waiting for the channel's time share or for a slot, and the
/// checks of the outcome. As `plugin errors meanwhile: redact busy 12;
/// redact 7696 calls, 92 µs each, 18 µs outside the sandbox`.
fn plugins_meanwhile(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> String {
    let delta = |series: &str| {
        after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0)
    };
    let mut errors = Vec::new();
    let mut calls = Vec::new();
    for series in after.keys() {
        if let Some(rest) = series.strip_prefix("hub_plugin_errors_total{plugin=\"")
            && let Some((plugin, rest)) = rest.split_once("\",kind=\"")
            && let Some(kind) = rest.strip_suffix("\"}")
            && delta(series) > 0.0
        {
            errors.push(format!("{plugin} {kind} {}", delta(series)));
        }
        if let Some(labels) = series.strip_prefix("hub_plugin_calls_total")
            && delta(series) > 0.0
        {
            let n = delta(series);
            let per_call = |name: &str| delta(&format!("{name}{labels}")) / n * 1e6;
            let phases = per_call("hub_plugin_instantiate_seconds_total")
                + per_call("hub_plugin_guest_seconds_total")
                + per_call("hub_plugin_teardown_seconds_total");
            let whole = per_call("hub_plugin_call_seconds_total");
            let plugin = labels
                .trim_start_matches("{plugin=\"")
                .trim_end_matches("\"}");
            calls.push(format!(
                "{plugin} {n} calls, {whole:.0} µs each, {:.0} µs outside the sandbox",
                whole - phases
            ));
        }
    }
    let mut text = format!(
        "plugin errors meanwhile: {}",
        if errors.is_empty() {
            "none".to_owned()
        } else {
            errors.join(", ")
        }
    );
    for c in calls {
        text += "; ";
        text += &c;
    }
    // With `full`, every acknowledgement waits for a WAL sync (the disk's
    // part), and every write while a WAL restart holds the writer.
    for (family, what, doing) in [
        ("hub_store_wal_sync", "WAL syncs", ""),
        (
            "hub_store_wal_restart",
            "WAL restarts",
            "holding the writer ",
        ),
    ] {
        let n = delta(&format!("{family}s_total"));
        if n > 0.0 {
            let mean = delta(&format!("{family}_seconds_total")) / n * 1e3;
            let longest = after
                .get(&format!("{family}_seconds_max"))
                .copied()
                .unwrap_or(0.0)
                * 1e3;
            text += &format!(
                "; {what} {n}, {doing}{mean:.1} ms each (longest since start {longest:.1} ms)"
            );
        }
    }
    text
}

/// The hub configuration of a setup on `storage` (a database URL).
fn config_text(storage: &str, listen: &str, setup: Setup, plugins: &Path) -> String {
    let mut text = format!("[server]\nlisten = \"{listen}\"\n[storage]\nurl = \"{storage}\"\n");
    if storage.starts_with("sqlite:") {
        text += &format!("durability = \"{}\"\n", setup.durability);
    } else {
        // The scale model's advice (docs/operations.md): the instances'
        // lanes together near the server's cores, and here the server
        // shares two cores with the hubs and the load. One lane measured
        // 1.03-1.04x of the default two with one instance, 1.08-1.13x with
        // two (2026-12-04).
        text += &format!("write_lanes = {}\n", env_or("BENCH_PG_LANES", 1));
    }
    text += &format!("[admin]\ntoken = \"{ADMIN}\"\n");
    // `kv`: what faq-bot and spam-guard need with their default config.
    for name in setup.idle_plugins {
        text += &format!(
            "[[plugins]]\nname = \"idle-{name}\"\npath = \"{}\"\nkv = true\n",
            plugins.join(format!("{name}.wasm")).display()
        );
    }
    // The load comes from one address at many times a real channel's rate.
    text += "[limits]\nchannel_per_second = 0\nchannel_source_per_second = 0\n";
    if setup.redact {
        text += &format!(
            "[[plugins]]\nname = \"redact\"\npath = \"{}\"\n\
             [[routes]]\nevents = [\"channel.customer_message\"]\nplugins = [\"redact\"]\n\
             on_error = \"reject\"\n",
            plugins.join("redact.wasm").display()
        );
    }
    text
}

/// A `hub serve` child process; `path` and `token` are its channel's
/// endpoint path and agent token once provisioned.
struct ServedHub {
    child: Child,
    addr: SocketAddr,
    base: String,
    path: String,
    token: String,
}

/// The `hub` binary the served runs start, and whether it is this build's:
/// `BENCH_HUB` names another. `cargo bench` builds its own with the
/// dev-dependencies' features in it, which measured slower than `cargo
/// build --release -p hub --bin hub` of the same source (docs/performance.md,
/// "Two builds side by side"): point `BENCH_HUB` at that build to measure what operators run.
fn served_binary() -> (PathBuf, bool) {
    match std::env::var_os("BENCH_HUB") {
        Some(path) => (PathBuf::from(path), false),
        None => (PathBuf::from(env!("CARGO_BIN_EXE_hub")), true),
    }
}

impl ServedHub {
    /// Starts `hub serve` with `dir/<name>.toml` on `storage`, its log in
    /// `dir/<name>.log`, and waits until it answers.
    async fn start(
        dir: &Path,
        name: &str,
        storage: &str,
        setup: Setup,
        plugins: &Path,
    ) -> ServedHub {
        let (binary, _) = served_binary();
        ServedHub::start_binary(&binary, dir, name, storage, setup, plugins).await
    }

    /// [`ServedHub::start`] with another `hub` binary.
    async fn start_binary(
        binary: &Path,
        dir: &Path,
        name: &str,
        storage: &str,
        setup: Setup,
        plugins: &Path,
    ) -> ServedHub {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            config_text(storage, &addr.to_string(), setup, plugins),
        )
        .expect("write config");
        let log: PathBuf = dir.join(format!("{name}.log"));
        let mut child = Command::new(binary)
            .args(["--config", &path.display().to_string(), "serve"])
            // What `hub serve` logs with the default `hub.toml` (`info`).
            .env(
                "RUST_LOG",
                std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("hub log file"))
            .spawn()
            .expect("start hub serve");
        let base = format!("http://{addr}");
        let http = reqwest::Client::new();
        let started = Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "hub serve did not start ({}):\n{}",
                    exited.map_or("no answer in 30 s".to_owned(), |s| s.to_string()),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ServedHub {
            child,
            addr,
            base,
            path: String::new(),
            token: String::new(),
        }
    }

    /// Creates the agent and the channel through this hub.
    async fn provision(&mut self, integrator: SocketAddr) {
        (self.path, self.token) = provision(&self.base, integrator).await;
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The hello-world baseline in a process of its own, printed: what a
/// served hub is compared with.
async fn hello_process_baseline(conns: usize, duration: Duration) -> Run {
    let (mut hello_child, hello) = spawn_hello();
    let hello_body = |_: usize| Bytes::from_static(b"{}");
    let clocks = Some(cpu_clocks(hello_child.id()));
    let base = load(hello, "/", conns, duration, &hello_body, None)
        .await
        .with_cpu(clocks);
    base.print("hello-world (bare hyper)", None);
    let _ = hello_child.kill();
    let _ = hello_child.wait();
    base
}

/// Re-runs this benchmark binary as a hello-world server process.
fn spawn_hello() -> (Child, SocketAddr) {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().expect("bench binary"))
        .env("BENCH_SERVE_HELLO", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the hello-world process");
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let addr = line.trim().parse().expect("hello-world address");
    (child, addr)
}

/// The hello-world process: prints its address, serves until killed.
async fn hello_process() {
    let (addr, _) = serve_hello().await;
    println!("{addr}");
    std::future::pending::<()>().await;
}

struct Run {
    count: usize,
    errors: usize,
    /// The errors by HTTP status (0: no answer).
    refused: BTreeMap<u16, usize>,
    elapsed: Duration,
    latencies: Vec<Duration>,
    /// CPU per request, when the server is a process of its own.
    cpu: Option<Cpu>,
}

/// Microseconds of CPU per request: the server process's, and this
/// process's (the load generator's, its other work idle meanwhile).
#[derive(Clone, Copy)]
struct Cpu {
    server: f64,
    generator: f64,
}

impl Cpu {
    /// The load generator's cost and the server's together: when the cores
    /// are what bounds both runs, rates are inversely proportional to it.
    fn total(self) -> f64 {
        self.server + self.generator
    }
}

impl Run {
    fn rps(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[i]
    }
    /// Runs that went on at the same time, as one: their requests together
    /// over the longest of their durations.
    fn merge(runs: Vec<Run>) -> Run {
        let mut latencies: Vec<Duration> = runs
            .iter()
            .flat_map(|r| r.latencies.iter().copied())
            .collect();
        latencies.sort();
        let mut refused = BTreeMap::new();
        for (status, n) in runs.iter().flat_map(|r| &r.refused) {
            *refused.entry(*status).or_default() += n;
        }
        Run {
            cpu: None,
            count: latencies.len(),
            errors: runs.iter().map(|r| r.errors).sum(),
            refused,
            elapsed: runs.iter().map(|r| r.elapsed).max().unwrap_or_default(),
            latencies,
        }
    }
    /// One line; with `base`, the throughput as a share of it.
    fn print(&self, name: &str, base: Option<&Run>) {
        println!("{}", self.line(name, base));
        if let Some(cpu) = self.cpu {
            println!("{}", cpu_line(cpu, base.and_then(|b| b.cpu)));
        }
    }

    /// The run with the CPU its server (`clocks.0`) and this process spent,
    /// if measured.
    fn with_cpu(mut self, clocks: Option<(CpuClock, CpuClock)>) -> Run {
        let Some((server, generator)) = clocks else {
            return self;
        };
        self.cpu = server
            .per_item_us(self.count)
            .zip(generator.per_item_us(self.count))
            .map(|(server, generator)| Cpu { server, generator });
        self
    }
    fn line(&self, name: &str, base: Option<&Run>) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let share = base
            .map(|b| format!("  = {:.1} % of hello-world", 100.0 * self.rps() / b.rps()))
            .unwrap_or_default();
        format!(
            "{name:<34} {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  p999 {:>6.2} ms  ({} ok, {} errors){share}",
            self.rps(),
            ms(self.pct(0.50)),
            ms(self.pct(0.99)),
            ms(self.pct(0.999)),
            self.count,
            self.errors
        )
    }
}

/// Clocks for a run against the server process `pid`.
fn cpu_clocks(pid: u32) -> (CpuClock, CpuClock) {
    (CpuClock::start(pid), CpuClock::own())
}

/// A served run's CPU per request; against the hello-world's, what a
/// server could spend per request at 25 % of its rate (the target), if the
/// cores bound both runs: rates go as the inverse of the load generator's
/// and the server's CPU per request together.
fn cpu_line(cpu: Cpu, base: Option<Cpu>) -> String {
    let mut line = format!(
        "    CPU per request: server {:.1} µs, load generator {:.1} µs",
        cpu.server, cpu.generator
    );
    if let Some(base) = base {
        line += &format!(
            "; at 25 % of hello-world's rate a server may spend {:.1} µs",
            4.0 * base.total() - cpu.generator
        );
    }
    line
}

/// A hello-world server: the ceiling for any HTTP service on this machine.
/// Returns its address and a count of requests served.
async fn serve_hello() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = Arc::new(AtomicUsize::new(0));
    let counter = served.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let counter = counter.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        counter.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"{\"result\":\"ok\"}",
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, served)
}

/// Keeps `conns` keep-alive connections busy with POSTs for `duration`:
/// closed loop, or with `rate`, requests started at that total rate (each
/// latency counted from when its request was due, so a stall is not hidden).
async fn load(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    duration: Duration,
    body: &(dyn Fn(usize) -> Bytes + Sync),
    rate: Option<f64>,
) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    load_counted(addr, path, conns, duration, body, rate, next).await
}

/// [`load`] taking request `i`'s body from `next`, a count it may share
/// with loads of other hubs.
async fn load_counted(
    addr: SocketAddr,
    path: &str,
    conns: usize,
    duration: Duration,
    body: &(dyn Fn(usize) -> Bytes + Sync),
    rate: Option<f64>,
    next: Arc<AtomicUsize>,
) -> Run {
    let bodies: Arc<Vec<Bytes>> = Arc::new((0..4096).map(body).collect());
    let start = Instant::now();
    let deadline = start + duration;
    // Paced: each connection sends every `interval`, the connections offset.
    let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r.max(1.0)));
    let mut tasks = Vec::new();
    for c in 0..conns {
        let path = path.to_owned();
        let next = next.clone();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let _ = stream.set_nodelay(true);
            let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let mut lat = Vec::new();
            let mut refused = BTreeMap::<u16, usize>::new();
            let mut due = start
                + interval
                    .map(|i| i.mul_f64(c as f64 / conns as f64))
                    .unwrap_or_default();
            while Instant::now() < deadline {
                if interval.is_some() {
                    tokio::time::sleep_until(due.into()).await;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let req = http::Request::post(path.as_str())
                    .header("host", addr.to_string())
                    .header("content-type", "application/json; charset=utf-8")
                    .body(Full::new(bodies[i % bodies.len()].clone()))
                    .expect("request");
                let t = if interval.is_some() {
                    due
                } else {
                    Instant::now()
                };
                match send.send_request(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        let _ = resp.into_body().collect().await;
                        if status.is_success() {
                            lat.push(t.elapsed());
                        } else {
                            *refused.entry(status.as_u16()).or_default() += 1;
                        }
                    }
                    Err(_) => {
                        *refused.entry(0).or_default() += 1;
                        break;
                    }
                }
                if let Some(interval) = interval {
                    due += interval;
                }
            }
            (lat, refused)
        }));
    }
    let mut latencies = Vec::new();
    let mut refused = BTreeMap::new();
    for t in tasks {
        let (l, r) = t.await.expect("load task");
        latencies.extend(l);
        for (status, n) in r {
            *refused.entry(status).or_default() += n;
        }
    }
    let elapsed = start.elapsed();
    latencies.sort();
    Run {
        count: latencies.len(),
        errors: refused.values().sum(),
        refused,
        elapsed,
        latencies,
        cpu: None,
    }
}

/// An in-process hub of `setup` with a channel and an agent.
async fn start_hub(
    dir: &Path,
    integrator: SocketAddr,
    setup: Setup,
    plugins: &Path,
) -> (hub::app::Running, String, String) {
    let path = dir.join("hub.toml");
    let storage = format!("sqlite://{}", dir.join("bench.db").display());
    std::fs::write(&path, config_text(&storage, "127.0.0.1:0", setup, plugins))
        .expect("write config");
    let config = hub::config::Config::load_with(&path, &hub::config::Env::empty()).expect("config");
    let running = hub::app::start(config).await.expect("start hub");
    let (path, token) = provision(running.base_url(), integrator).await;
    (running, path, token)
}

/// Creates the agent and the channel; their endpoint path and agent token.
async fn provision(base: &str, integrator: SocketAddr) -> (String, String) {
    let http = reqwest::Client::new();
    let agent: Value = http
        .post(format!("{base}/admin/v1/agents"))
        .bearer_auth(ADMIN)
        .json(&json!({ "name": "Bench", "email": "bench@example.com" }))
        .send()
        .await
        .expect("create agent")
        .json()
        .await
        .expect("agent json");
    let hook = format!("http://{integrator}/hook");
    let path = create_channel(base, ADMIN, "bench", &hook, &["bench@example.com"]).await;
    let token = agent["token"].as_str().expect("token").to_owned();
    (path, token)
}

/// What an agent-message run delivered.
struct Delivered {
    /// Replies the hub accepted and the integrator received.
    delivered: usize,
    /// Replies the hub refused or that failed.
    failed: usize,
    /// Until the last reply was accepted (the rest is the outbox draining).
    accepted_in: Duration,
    elapsed: Duration,
}

impl Delivered {
    fn rate(&self) -> f64 {
        self.delivered as f64 / self.elapsed.as_secs_f64()
    }
    /// The black-box line; with `base` and `sqlite` (deliveries/s), the
    /// ratios to them.
    fn print(&self, base: Option<&Run>, sqlite: Option<f64>) {
        let mut line = format!(
            "  agent messages end to end: {:.0} deliveries/s ({} replies",
            self.rate(),
            self.delivered
        );
        if self.failed > 0 {
            line += &format!(", {} failed", self.failed);
        }
        line += &format!(
            ", all accepted after {:.2} s of {:.2} s)",
            self.accepted_in.as_secs_f64(),
            self.elapsed.as_secs_f64()
        );
        if let Some(base) = base {
            line += &format!(
                "  = {:.1} % of hello-world",
                100.0 * self.rate() / base.rps()
            );
        }
        if let Some(sqlite) = sqlite {
            line += &format!(", {:.2}× SQLite", self.rate() / sqlite);
        }
        println!("{line}");
    }
}

/// Sends `n` agent replies spread over the open chats, the connections
/// spread over `bases` (hubs on one database), and waits until every reply
/// the hubs accepted is delivered.
/// One connection of [`deliveries`]: replies `next` of `n` round `ids`
/// until they run out; how many were accepted. The same bare keep-alive
/// HTTP/1.1 client as the ingress load ([`load_counted`]): the load
/// generator shares the hub's two cores, and a client that parses a URL and
/// looks up a pool per request took cores the hub would have used. A
/// connection the hub closes is made again.
async fn reply_loop(base: &str, token: &str, ids: &[i64], next: &AtomicUsize, n: usize) -> usize {
    let authority = base.trim_start_matches("http://");
    let authorization = format!("Bearer {token}");
    let body = Bytes::from_static(br#"{"type":"text","text":"Premium is 10 a month."}"#);
    let mut accepted = 0;
    let mut broken = 0;
    while broken < 3 {
        let Ok(stream) = TcpStream::connect(authority).await else {
            broken += 1;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok((mut send, conn)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            broken += 1;
            continue;
        };
        tokio::spawn(conn);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return accepted;
            }
            let chat = ids[i % ids.len()];
            let req = http::Request::post(format!("/agent/v1/chats/{chat}/messages"))
                .header("host", authority)
                .header("authorization", authorization.as_str())
                .header("content-type", "application/json")
                .body(Full::new(body.clone()))
                .expect("request");
            match send.send_request(req).await {
                Ok(resp) => {
                    let status = resp.status();
                    let _ = resp.into_body().collect().await;
                    if status.is_success() {
                        accepted += 1;
                    }
                    broken = 0;
                }
                Err(_) => {
                    broken += 1;
                    break;
                }
            }
        }
    }
    accepted
}

async fn deliveries(
    bases: &[String],
    token: &str,
    n: usize,
    conns: usize,
    received: &AtomicUsize,
) -> Delivered {
    let http = reqwest::Client::new();
    let chats: Value = http
        .get(format!("{}/agent/v1/chats", bases[0]))
        .bearer_auth(token)
        .send()
        .await
        .expect("list chats")
        .json()
        .await
        .expect("chats json");
    let ids: Vec<i64> = chats["chats"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["id"].as_i64()).collect())
        .unwrap_or_default();
    assert!(!ids.is_empty(), "the ingress run opened no chats");
    let ids = Arc::new(ids);
    let next = Arc::new(AtomicUsize::new(0));
    let before = received.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let (base, token, ids, next) = (
            bases[c % bases.len()].clone(),
            token.to_owned(),
            ids.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            reply_loop(&base, &token, &ids, &next, n).await
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.unwrap_or(0);
    }
    let accepted_in = start.elapsed();
    // A reply accepted is delivered; a minute without progress is a hang.
    let mut last = (received.load(Ordering::Relaxed), Instant::now());
    while received.load(Ordering::Relaxed) < before + accepted {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = received.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            eprintln!(
                "deliveries: {} of {accepted} arrived, none for 60 s",
                now - before
            );
            break;
        }
    }
    let elapsed = start.elapsed();
    Delivered {
        delivered: (received.load(Ordering::Relaxed) - before).min(accepted),
        failed: n - accepted,
        accepted_in,
        elapsed,
    }
}
