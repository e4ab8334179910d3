//! Containment benchmark: each hostile plugin of issue 13 runs on one channel
//! of a real `hub serve` while another channel gets ordinary traffic, paced
//! (each latency counted from when the message was due). Prints, per
//! plugin: what became of the hostile events, the error kinds counted, the
//! ordinary channel's p50/p99 and rate before and during, the slowest
//! `/healthz`, the hub's peak RSS, the database's growth and the log bytes.
//!
//! `cargo bench -p hub --bench containment`; BENCH_SECS (default 3) per
//! phase, BENCH_RATE (default 200) ordinary messages/s, BENCH_HOSTILE (default
//! 8) concurrent hostile senders, BENCH_ONLY=<scenario> for one of them,
//! BENCH_LIMITS=off|default|both (default both): whether the hostile
//! channel's flood meets the hub's defaults (the `[limits]` rate per channel
//! and the plugin's `time_share` per channel) or neither; with both, each
//! scenario runs once each way, side by side. BENCH_SHARE=<seconds> sets
//! the plugin's `time_share` of the protected runs (default: the hub's).
//! BENCH_FAULT=python runs the same hostile modes built from Python
//! (`tests/plugins/fault-py`, built by `scripts/polyglot.sh`).
//! BENCH_SHADOW=1 runs each hostile plugin as the hostile channel's
//! **shadow** (`shadow = ["hostile"]` beside a no-op live plugin) instead of
//! in its chain: its work is then off the request's path and nothing it
//! does takes effect, and the ordinary channel must not notice it either.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

mod common;

use common::{create_channel, env_or, guard_backtraces, memory_kib, plugins_dir, polyglot_dir};

/// The hostile plugin's file: the Rust fault plugin, or its Python twin.
fn fault_wasm() -> (std::path::PathBuf, &'static str) {
    match std::env::var("BENCH_FAULT").as_deref() {
        Ok("python") => (polyglot_dir(), "fault_py.wasm"),
        _ => (plugins_dir(), "fault.wasm"),
    }
}

const ADMIN: &str = "bench-admin-token-0123456789";

/// A hostile plugin: the fault plugin's mode, its config and its limits.
struct Scenario {
    name: &'static str,
    config: &'static str,
    limits: &'static str,
}

const SCENARIOS: [Scenario; 12] = [
    // The control: the same flood of requests through a plugin that does nothing.
    Scenario {
        name: "no-op (control)",
        config: "fault = \"none\"",
        limits: "",
    },
    Scenario {
        name: "busy loop",
        config: "fault = \"loop\"",
        limits: "timeout_ms = 1000",
    },
    Scenario {
        name: "sleep",
        config: "fault = \"sleep\"",
        limits: "",
    },
    Scenario {
        name: "memory bomb",
        config: "fault = \"memory\"",
        limits: "memory_mb = 512",
    },
    Scenario {
        name: "deep recursion",
        config: "fault = \"recursion\"",
        limits: "",
    },
    Scenario {
        name: "panic",
        config: "fault = \"trap\"",
        limits: "",
    },
    Scenario {
        name: "huge output",
        config: "fault = \"huge_output\"\nsize_bytes = 52428800",
        limits: "memory_mb = 256",
    },
    Scenario {
        name: "huge log",
        config: "fault = \"log_flood\"\ncount = 990",
        limits: "",
    },
    Scenario {
        name: "stdout flood",
        config: "fault = \"stdout_flood\"\ncount = 1000",
        limits: "",
    },
    Scenario {
        name: "kv flood",
        config: "fault = \"kv_flood\"\ncount = 990\nsize_bytes = 65536",
        limits: "kv = true",
    },
    Scenario {
        name: "forward flood",
        config: "fault = \"forward_flood\"\ndestination = \"sink\"\ncount = 990",
        limits: "destinations = [\"sink\"]",
    },
    Scenario {
        name: "error with secrets",
        config: "fault = \"error\"\nmessage = \"secret=hunter2\\nFAKE LOG LINE\"",
        limits: "",
    },
];

fn main() {
    guard_backtraces();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let secs = Duration::from_secs(env_or("BENCH_SECS", 3));
    let rate = env_or("BENCH_RATE", 200);
    let hostile = env_or("BENCH_HOSTILE", 8) as usize;
    let only = std::env::var("BENCH_ONLY").ok();
    let limits: &[bool] = match std::env::var("BENCH_LIMITS").as_deref() {
        Ok("off") => &[false],
        Ok("default") => &[true],
        _ => &[false, true],
    };
    let (fault_dir, fault) = fault_wasm();
    let wasm = fault_dir.join(fault);
    println!(
        "containment benchmark ({fault}): hostile plugin on one channel ({hostile} senders at once), \
         {rate} ordinary messages/s on another, {} s per phase, `hub serve` release build",
        secs.as_secs()
    );
    let runs = SCENARIOS
        .iter()
        .filter(|s| only.as_deref().is_none_or(|o| o == s.name))
        .flat_map(|s| limits.iter().map(move |l| (s, *l)));
    for (s, rate_limited) in runs {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut hub = Served::start(dir.path(), s, &wasm, rate_limited).await;
        let before_db = db_bytes(dir.path());
        let baseline = ordinary(&hub, rate, secs).await;
        let log_before = log_bytes(dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let senders: Vec<_> = (0..hostile)
            .map(|i| {
                tokio::spawn(hostile_sender(
                    hub.base.clone(),
                    hub.hostile.clone(),
                    i,
                    stop.clone(),
                ))
            })
            .collect();
        let during = ordinary(&hub, rate, secs).await;
        stop.store(true, Ordering::Relaxed);
        let mut fates = std::collections::BTreeMap::<u16, usize>::new();
        for t in senders {
            for code in t.await.unwrap_or_default() {
                *fates.entry(code).or_default() += 1;
            }
        }
        let kinds = error_kinds(&hub.base).await;
        let peak = memory_kib(hub.child.id(), "VmHWM");
        let growth = db_bytes(dir.path()).saturating_sub(before_db);
        let logged = log_bytes(dir.path()).saturating_sub(log_before);
        let leaked = std::fs::read_to_string(dir.path().join("hub.log"))
            .is_ok_and(|l| l.lines().any(|line| line.starts_with("FAKE LOG LINE")));
        hub.stop();
        println!(
            "\n{} ({}): hostile events {:?} (status: count); errors {kinds}",
            s.name,
            if rate_limited {
                "defaults"
            } else {
                "no rate limit, no time share"
            },
            fates
        );
        println!(
            "  ordinary channel  before: p50 {:6.2} ms  p99 {:6.2} ms  {:5.0} msg/s ({} failed) | during: p50 {:6.2} ms  p99 {:6.2} ms  {:5.0} msg/s ({} failed)  p99 ratio {:.2}",
            baseline.p50,
            baseline.p99,
            baseline.rate,
            baseline.failed,
            during.p50,
            during.p99,
            during.rate,
            during.failed,
            during.p99 / baseline.p99.max(0.001)
        );
        println!(
            "  /healthz slowest {:.1} ms before, {:.1} ms during; peak RSS {:.1} MB; database +{:.1} MB; log +{:.1} KB{}",
            baseline.health_ms,
            during.health_ms,
            peak as f64 / 1024.0,
            growth as f64 / 1e6,
            logged as f64 / 1e3,
            if leaked {
                "; A FORGED LOG LINE WAS WRITTEN"
            } else {
                ""
            }
        );
    }
}

/// A `hub serve` child with channels `hostile` (the plugin's route) and `ordinary`.
struct Served {
    child: Child,
    base: String,
    hostile: String,
    ordinary: String,
}

impl Served {
    async fn start(dir: &Path, s: &Scenario, wasm: &Path, rate_limited: bool) -> Served {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let base = format!("http://127.0.0.1:{port}");
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n[storage]\nurl = \"sqlite://{}\"\n\
             [admin]\ntoken = \"{ADMIN}\"\n[runtime]\nmax_memory_mb = 256\n\n\
             {}\
             [[destinations]]\nname = \"sink\"\nurl = \"http://127.0.0.1:9/sink\"\n\n\
             [[plugins]]\nname = \"hostile\"\npath = \"{}\"\n{}\n[plugins.config]\n{}\n\n\
             [[routes]]\nevents = [\"channel.customer_message\"]\nchannels = [\"hostile\"]\n\
             on_error = \"skip\"\n{}",
            dir.join("hub.db").display(),
            if rate_limited {
                ""
            } else {
                "[limits]\nchannel_per_second = 0\nchannel_source_per_second = 0\n\n"
            },
            wasm.display(),
            if rate_limited {
                // BENCH_SHARE tries another `time_share` than the default.
                match std::env::var("BENCH_SHARE") {
                    Ok(share) => format!("{}\ntime_share = {share}", s.limits),
                    Err(_) => s.limits.to_owned(),
                }
            } else {
                format!("{}\ntime_share = 1000", s.limits)
            },
            s.config,
            if std::env::var("BENCH_SHADOW").is_ok_and(|v| v == "1") {
                format!(
                    "plugins = [\"live\"]\nshadow = [\"hostile\"]\n\n\
                     [[plugins]]\nname = \"live\"\npath = \"{}\"\n",
                    plugins_dir().join("fault.wasm").display()
                )
            } else {
                "plugins = [\"hostile\"]\n".to_owned()
            }
        );
        let path = dir.join("hub.toml");
        std::fs::write(&path, config).expect("write config");
        let log = std::fs::File::create(dir.join("hub.log")).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_hub"))
            .args(["--config", &path.display().to_string(), "serve"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start hub serve");
        let http = reqwest::Client::new();
        let started = Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "hub serve did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let hook = "http://127.0.0.1:9/hook";
        let hostile = create_channel(&base, ADMIN, "hostile", hook, &[]).await;
        let ordinary = create_channel(&base, ADMIN, "ordinary", hook, &[]).await;
        Served {
            child,
            base,
            hostile,
            ordinary,
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Posts hostile messages in a closed loop until told to stop; their statuses.
async fn hostile_sender(base: String, path: String, i: usize, stop: Arc<AtomicBool>) -> Vec<u16> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut codes = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let body = json!({"sender": {"id": 10_000 + i}, "message": {"type": "text", "text": format!("h{n}")}});
        let code = match http.post(format!("{base}{path}")).json(&body).send().await {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        };
        codes.push(code);
    }
    codes
}

struct Phase {
    p50: f64,
    p99: f64,
    rate: f64,
    failed: usize,
    health_ms: f64,
}

/// Ordinary messages at `rate`/s for `secs`, and `/healthz` every 20 ms beside them.
async fn ordinary(hub: &Served, rate: u64, secs: Duration) -> Phase {
    let http = reqwest::Client::new();
    let started = Instant::now();
    let total = (rate as f64 * secs.as_secs_f64()) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let mut tasks = Vec::with_capacity(total);
    for i in 0..total {
        let due = started + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let (http, url) = (http.clone(), format!("{}{}", hub.base, hub.ordinary));
        tasks.push(tokio::spawn(async move {
            let body = json!({"sender": {"id": i % 50}, "message": {"type": "text", "text": format!("m{i}")}});
            let ok = http
                .post(url)
                .json(&body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            (ok, due.elapsed())
        }));
    }
    let health = {
        let http = http.clone();
        let url = format!("{}/healthz", hub.base);
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let end = Instant::now() + Duration::from_millis(500);
            while Instant::now() < end {
                let t = Instant::now();
                let _ = http.get(&url).send().await;
                worst = worst.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            worst
        })
    };
    let mut latencies = Vec::with_capacity(total);
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok((true, took)) => latencies.push(took),
            _ => failed += 1,
        }
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Phase {
        p50: at(0.5),
        p99: at(0.99),
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        failed,
        health_ms: health.await.map_or(0.0, |d| d.as_secs_f64() * 1e3),
    }
}

/// The hostile plugin's error kinds that were counted, from `/metrics`.
async fn error_kinds(base: &str) -> String {
    let text = reqwest::Client::new()
        .get(format!("{base}/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    let mut kinds = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("hub_plugin_errors_total{plugin=\"hostile\",kind=\"")
            && let Some((kind, value)) = rest.split_once("\"} ")
            && value != "0"
        {
            kinds.push(format!("{kind} {value}"));
        }
        if let Some(value) =
            line.strip_prefix("hub_plugin_quota_refusals_total{plugin=\"hostile\"} ")
            && value != "0"
        {
            kinds.push(format!("kv quota refusals {value}"));
        }
        if let Some(value) = line.strip_prefix("hub_plugin_logs_dropped_total{plugin=\"hostile\"} ")
            && value != "0"
        {
            kinds.push(format!("log messages dropped {value}"));
        }
    }
    if kinds.is_empty() {
        "none".to_owned()
    } else {
        kinds.join(", ")
    }
}

fn db_bytes(dir: &Path) -> u64 {
    ["hub.db", "hub.db-wal"]
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len()))
        .sum()
}

fn log_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("hub.log")).map_or(0, |m| m.len())
}
