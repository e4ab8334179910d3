//! Plugin benchmark: the cost of the plugin chain per event with 0, 1 and 3
//! plugins on the path, each call in a fresh store, through the same
//! `Pipeline::run` every event crosses. Prints p50/p99 per event, the cost per
//! plugin, and events/s with all cores busy.
//! Then the same calls with the caches cold: in a served hub the HTTP path
//! and SQLite run between two calls and evict what a call touched, so a call
//! there costs about what the cold figure says, not the warm one.
//! Run: `cargo bench -p hub --bench plugins`. Environment: BENCH_EVENTS
//! (default 20000 per run), BENCH_TASKS (default 2, concurrent runs),
//! BENCH_SLOTS (default 64, the runtime's pooled instances), BENCH_COLD_KB
//! (default 4096, memory written between two events of the cold runs; 0
//! skips them), BENCH_PLUGINS_DIR (`redact.wasm` and `fault.wasm` built
//! another way, instead of building the repository's).
//! Last, spam-guard in Rust, Python and TypeScript side by side: component
//! size, first compile, µs per call with a fresh instance, page faults per
//! call and memory per loaded plugin. BENCH_ONLY=languages runs only that;
//! BENCH_POLYGLOT_DIR names prebuilt `spam_guard_py.wasm`/`spam_guard_ts.wasm`;
//! BENCH_LANGUAGES (e.g. `python,typescript`) runs only those builds.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hub::config::Config;
use hub::core::provisioning::{ChannelSpec, create_channel};
use hub::event::{Direction, Event, EventKind};
use hub::outbound::HttpSender;
use hub::pipeline::wiring::{Wiring, WiringHandle};
use hub::pipeline::{Pipeline, Verdict};
use hub::runtime::Runtime;
use hub::store::Store;
use serde_json::json;

mod common;

use common::{
    CpuClock, env_or, guard_backtraces, memory_kib, minor_faults, plugins_dir, polyglot_dir,
};

/// One plugin of a chain: its name, the `.wasm` it loads and its config table.
type Link<'a> = (&'a str, &'a str, &'a str);

const NOOP: Link<'static> = ("noop", "fault", "fault = \"none\"");
const REDACT: Link<'static> = ("redact", "redact", "");

/// What every run loads its chain with.
struct Setup {
    plugins: std::path::PathBuf,
    tmp: tempfile::TempDir,
    runtime: Runtime,
    store: Store,
    sender: HttpSender,
}

impl Setup {
    /// A pipeline whose one route runs `chain` on customer messages.
    fn pipeline(&self, chain: &[Link<'_>]) -> Arc<Pipeline> {
        let file = self.tmp.path().join("hub.toml");
        let config = Config::parse(&wiring_toml(&self.plugins, chain), &file).expect("config");
        let (wiring, _) =
            Wiring::load(&config, &self.runtime, &self.store, &self.sender).expect("plugins load");
        Arc::new(Pipeline::new(WiringHandle::new(wiring), self.store.clone()))
    }
}

/// A configuration whose one route runs `chain` on customer messages.
fn wiring_toml(dir: &Path, chain: &[Link<'_>]) -> String {
    let mut text = String::new();
    for (name, wasm, config) in chain {
        text += &format!(
            "[[plugins]]\nname = \"{name}\"\npath = \"{}\"\n[plugins.config]\n{config}\n\n",
            dir.join(format!("{wasm}.wasm")).display()
        );
    }
    if !chain.is_empty() {
        let names: Vec<String> = chain.iter().map(|(n, _, _)| format!("\"{n}\"")).collect();
        text += &format!(
            "[[routes]]\nevents = [\"channel.customer_message\"]\nplugins = [{}]\n",
            names.join(", ")
        );
    }
    text
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_sec: f64,
}

/// Runs `events` events one after the other (their latencies), then spread
/// over `tasks` concurrent tasks (events/s; none when `tasks` is 0). With
/// `cold` bytes, each sequential event is preceded by writing that much
/// memory, outside the timed part.
async fn measure(pipeline: Arc<Pipeline>, events: usize, tasks: usize, cold: usize) -> Figures {
    let event = || {
        Event::new(
            EventKind::CUSTOMER_MESSAGE,
            Direction::In,
            json!({ "sender": { "id": 42, "name": "Bench" },
                    "message": { "type": "text",
                                 "text": "My card is 4111 1111 1111 1111, mail me at bob@example.com" } }),
        )
        .on_channel(1)
    };
    // Warm-up: instance slots, caches, the channel name.
    for _ in 0..200 {
        pipeline.run(event()).await;
    }
    let mut latencies = Vec::with_capacity(events);
    let mut scratch = vec![0u8; cold];
    for i in 0..events {
        // One write per cache line evicts what the last call left behind.
        for line in scratch.chunks_mut(64) {
            line[0] = line[0].wrapping_add(i as u8);
        }
        std::hint::black_box(&scratch);
        let started = Instant::now();
        let routed = pipeline.run(event()).await;
        latencies.push(started.elapsed());
        assert!(
            matches!(routed.verdict, Verdict::Continue),
            "{:?}",
            routed.verdict
        );
    }
    latencies.sort();
    let started = Instant::now();
    let mut joins = Vec::new();
    for _ in 0..tasks {
        let pipeline = pipeline.clone();
        joins.push(tokio::spawn(async move {
            for _ in 0..events / tasks {
                pipeline.run(event()).await;
            }
        }));
    }
    for j in joins {
        j.await.expect("bench task");
    }
    let per_sec = match tasks {
        0 => 0.0,
        _ => (events / tasks * tasks) as f64 / started.elapsed().as_secs_f64(),
    };
    Figures {
        p50: latencies[latencies.len() / 2],
        p99: latencies[latencies.len() * 99 / 100],
        per_sec,
    }
}

fn main() {
    guard_backtraces();
    tokio::runtime::Runtime::new()
        .expect("tokio runtime")
        .block_on(bench());
}

async fn bench() {
    let events = env_or("BENCH_EVENTS", 20_000) as usize;
    let tasks = env_or("BENCH_TASKS", 2).max(1) as usize;
    let cold_kb = env_or("BENCH_COLD_KB", 4096) as usize;
    let plugins = plugins_dir();
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = Store::open(
        &format!("sqlite://{}", tmp.path().join("bench.db").display()),
        hub::store::Durability::Normal,
    )
    .await
    .expect("store");
    create_channel(
        &store,
        &ChannelSpec {
            name: "bench".into(),
            customer_endpoint: "http://127.0.0.1:9/hub".into(),
            chunked: false,
            ..ChannelSpec::default()
        },
        false,
        &hub::outbound::Policy::default(),
    )
    .await
    .expect("channel");
    let slots = env_or("BENCH_SLOTS", 64) as u32;
    let runtime = Runtime::new(tmp.path().join("cache"), slots).expect("runtime");
    let sender = HttpSender::new().expect("http client");
    let setup = Setup {
        plugins,
        tmp,
        runtime,
        store,
        sender,
    };

    if std::env::var("BENCH_ONLY").as_deref() == Ok("languages") {
        languages(&setup, events, slots).await;
        setup.store.close().await;
        return;
    }
    let (noop, redact) = (NOOP, REDACT);
    let runs: [(&str, Vec<Link<'_>>); 5] = [
        ("0 plugins", vec![]),
        ("1 plugin (no-op)", vec![noop]),
        (
            "3 plugins (no-op)",
            vec![
                noop,
                ("noop2", "fault", "fault = \"none\""),
                ("noop3", "fault", "fault = \"none\""),
            ],
        ),
        ("1 plugin (redact)", vec![redact]),
        (
            "3 plugins (redact x3)",
            vec![redact, ("redact2", "redact", ""), ("redact3", "redact", "")],
        ),
    ];
    println!(
        "plugin benchmark: {events} events per run, sequential latency then {tasks} concurrent tasks; \
         a fresh wasmtime store per plugin call"
    );
    println!(
        "{:<24} {:>10} {:>10} {:>12} {:>14}",
        "chain", "p50 µs", "p99 µs", "events/s", "vs 0 plugins"
    );
    let mut baseline: Option<Figures> = None;
    let mut p50s = Vec::new();
    for (label, chain) in runs {
        let pipeline = setup.pipeline(&chain);
        let before = setup.runtime.counters().snapshot();
        let f = measure(pipeline, events, tasks, 0).await;
        let after = setup.runtime.counters().snapshot();
        let change = baseline
            .as_ref()
            .map(|b| format!("{:+.1} %", 100.0 * (f.per_sec / b.per_sec - 1.0)))
            .unwrap_or_else(|| "-".into());
        println!(
            "{label:<24} {:>10.1} {:>10.1} {:>12.0} {change:>14}",
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            f.per_sec
        );
        for (name, _, _) in &chain {
            if let (Some(a), b) = (after.get(*name), before.get(*name)) {
                let since = |f: fn(&hub::runtime::Snapshot) -> u64| {
                    f(a).saturating_sub(b.map(f).unwrap_or(0))
                };
                let calls = since(|s| s.calls).max(1) as f64;
                let mean = |nanos: u64| nanos as f64 / calls / 1e3;
                println!(
                    "    {name}: mean per call {:.1} µs instantiate + {:.1} µs guest call + {:.1} µs teardown",
                    mean(since(|s| s.instantiate_nanos)),
                    mean(since(|s| s.guest_nanos)),
                    mean(since(|s| s.teardown_nanos)),
                );
            }
        }
        p50s.push(f.p50.as_secs_f64() * 1e6);
        if baseline.is_none() {
            baseline = Some(f);
        }
    }
    // The first plugin also pays for the context the hub gives plugins (one
    // query); the marginal cost of each further plugin is the plugin itself.
    println!(
        "per plugin, p50: no-op {:.1} µs (1→3: {:.1} µs each); redact {:.1} µs (1→3: {:.1} µs each)",
        p50s[1] - p50s[0],
        (p50s[2] - p50s[1]) / 2.0,
        p50s[3] - p50s[0],
        (p50s[4] - p50s[3]) / 2.0,
    );
    if cold_kb > 0 {
        cold(&setup, events, cold_kb << 10).await;
    }
    languages(&setup, events, slots).await;
    setup.store.close().await;
}

/// spam-guard's pattern check (the message passes, no KV) built from Rust,
/// Python and TypeScript: what each costs to ship, load and call.
async fn languages(setup: &Setup, events: usize, slots: u32) {
    let polyglot = polyglot_dir();
    let builds = [
        ("Rust", setup.plugins.join("spam_guard.wasm")),
        ("Python", polyglot.join("spam_guard_py.wasm")),
        ("TypeScript", polyglot.join("spam_guard_ts.wasm")),
    ];
    println!(
        "\nspam-guard in three languages ({events} sequential events each, patterns only, the \
         message passes; a fresh instance per call):"
    );
    println!(
        "{:<11} {:>8} {:>10} {:>8} {:>8} {:>8} {:>26} {:>11} {:>11}",
        "language",
        "size MB",
        "compile s",
        "p50 µs",
        "p99 µs",
        "CPU µs",
        "inst + guest + teardown µs",
        "faults/call",
        "RSS MiB"
    );
    let only = std::env::var("BENCH_LANGUAGES").unwrap_or_default();
    for (language, wasm) in builds {
        if !only.is_empty() && !only.split(',').any(|l| l.eq_ignore_ascii_case(language)) {
            continue;
        }
        let size = std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0);
        let rss_before = memory_kib(std::process::id(), "VmRSS");
        // A runtime of its own with an empty cache: the first compile is timed.
        let cache = setup.tmp.path().join(format!("cache-{language}"));
        let runtime = Runtime::new(cache, slots).expect("runtime");
        let toml = format!(
            "[[plugins]]\nname = \"guard\"\npath = \"{}\"\ntimeout_ms = 1000\n\
             [plugins.config]\npatterns = [\"casino\", \"cheap pills\"]\nmax_messages = 0\n\n\
             [[routes]]\nevents = [\"channel.customer_message\"]\nplugins = [\"guard\"]\n",
            wasm.display()
        );
        let file = setup.tmp.path().join("hub.toml");
        let config = Config::parse(&toml, &file).expect("config");
        let started = Instant::now();
        let (wiring, _) =
            Wiring::load(&config, &runtime, &setup.store, &setup.sender).expect("plugin loads");
        let compile = started.elapsed();
        let pipeline = Arc::new(Pipeline::new(
            WiringHandle::new(wiring),
            setup.store.clone(),
        ));
        let before = runtime.counters().snapshot();
        let faults = minor_faults();
        let cpu = CpuClock::own();
        let f = measure(pipeline.clone(), events, 0, 0).await;
        let faults = minor_faults().saturating_sub(faults);
        // Warm-up calls included: `measure` makes 200 before the timed ones.
        let calls = events + 200;
        let cpu = cpu.per_item_us(calls).unwrap_or(0.0);
        let after = runtime.counters().snapshot();
        let rss_after = memory_kib(std::process::id(), "VmRSS");
        let (a, b) = (after.get("guard"), before.get("guard"));
        let per_call = |f: fn(&hub::runtime::Snapshot) -> u64| match a {
            Some(a) => {
                let calls = a.calls.saturating_sub(b.map_or(0, |b| b.calls)).max(1) as f64;
                f(a).saturating_sub(b.map_or(0, f)) as f64 / calls / 1e3
            }
            None => 0.0,
        };
        let phases = format!(
            "{:.1} + {:.1} + {:.1}",
            per_call(|s| s.instantiate_nanos),
            per_call(|s| s.guest_nanos),
            per_call(|s| s.teardown_nanos)
        );
        println!(
            "{language:<11} {:>8.1} {:>10.2} {:>8.1} {:>8.1} {cpu:>8.1} {phases:>26} {:>11.1} {:>11.1}",
            size as f64 / 1e6,
            compile.as_secs_f64(),
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            faults as f64 / calls as f64,
            rss_after.saturating_sub(rss_before) as f64 / 1024.0,
        );
        drop(pipeline);
    }
    println!(
        "(compile: the first load, Cranelift on an empty cache; later loads read the cache. \
         CPU: the process's user + system time per call, which other load on the machine \
         does not inflate as it does p50. \
         RSS: what the process grew by loading the plugin and running its calls: code, the \
         copy-on-write image and the pages its instances keep resident between calls)"
    );
}

/// The sequential latency again with `bytes` written between two events:
/// what a call costs when the rest of a served hub ran in between.
async fn cold(setup: &Setup, events: usize, bytes: usize) {
    let runs: [(&str, Vec<Link<'_>>); 3] = [
        ("0 plugins", vec![]),
        ("1 plugin (no-op)", vec![NOOP]),
        ("1 plugin (redact)", vec![REDACT]),
    ];
    println!(
        "\ncaches cold ({} KiB written between two events, outside the timed part):",
        bytes >> 10
    );
    let mut p50s = Vec::new();
    for (label, chain) in runs {
        let f = measure(setup.pipeline(&chain), events, 0, bytes).await;
        println!(
            "{label:<24} {:>10.1} {:>10.1}",
            f.p50.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
        );
        p50s.push(f.p50.as_secs_f64() * 1e6);
    }
    println!(
        "per plugin, p50, caches cold: no-op {:.1} µs; redact {:.1} µs",
        p50s[1] - p50s[0],
        p50s[2] - p50s[0],
    );
}
