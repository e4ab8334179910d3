//! Hostile plugins under load: a busy loop, a memory bomb and a trapping
//! plugin on one channel while another channel gets paced ordinary traffic.
//! Its p99 is printed beside the baseline; nothing may be lost and
//! `/healthz` must answer throughout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::Mode;
use crate::outcome::Outcome;
use crate::served::{ADMIN, Channel, HealthWatch, Hub, Options};

const AGENT: &str = "ann@battery.test";

/// The fault plugin, built by scripts/build-plugins.sh (as the test command does first).
fn fault_wasm() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the hub crate lives in the repository")?
        .to_owned();
    let wasm = root.join("target/plugins/wasm32-wasip2/release/fault.wasm");
    let built = Command::new(root.join("scripts/build-plugins.sh"))
        .current_dir(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if built || wasm.exists() {
        Ok(wasm)
    } else {
        Err("scripts/build-plugins.sh failed and there is no fault.wasm".to_owned())
    }
}

fn wiring(wasm: &Path) -> String {
    let plugin = |name: &str, limits: &str, fault: &str| {
        format!(
            "[[plugins]]\nname = \"{name}\"\npath = \"{}\"\n{limits}\n[plugins.config]\nfault = \"{fault}\"\n\n",
            wasm.display()
        )
    };
    plugin("looping", "timeout_ms = 500", "loop")
        + &plugin("bomb", "memory_mb = 64", "memory")
        + &plugin("trapping", "", "trap")
        + "[[routes]]\nevents = [\"channel.customer_message\"]\nchannels = [\"hostile\"]\n\
           plugins = [\"looping\", \"bomb\", \"trapping\"]\non_error = \"skip\"\n"
}

/// Latencies of one phase of paced ordinary traffic.
struct Phase {
    p50: f64,
    p99: f64,
    acked: Vec<String>,
    failed: usize,
}

/// `rate` ordinary messages a second for `secs`, each timed from when it was due.
async fn ordinary(hub: &Hub, channel: &Channel, tag: &str, rate: u64, secs: u64) -> Phase {
    let started = Instant::now();
    let total = rate * secs;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let mut tasks = Vec::new();
    for i in 0..total {
        let due = started + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let (http, url) = (hub.http.clone(), channel.endpoint_url.clone());
        let text = format!("{tag} m{i}");
        tasks.push(tokio::spawn(async move {
            let body = json!({ "sender": { "id": format!("pf-o{}", i % 20), "name": format!("pf-o{}", i % 20) },
                               "message": { "type": "text", "text": text } });
            let ok = http
                .post(url)
                .header("content-type", "application/json; charset=utf-8")
                .body(body.to_string())
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            (ok, text, due.elapsed())
        }));
    }
    let mut latencies = Vec::new();
    let mut acked = Vec::new();
    let mut failed = 0;
    for t in tasks {
        match t.await {
            Ok((true, text, took)) => {
                latencies.push(took);
                acked.push(text);
            }
            _ => failed += 1,
        }
    }
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Phase {
        p50: at(0.5),
        p99: at(0.99),
        acked,
        failed,
    }
}

pub async fn plugin_faults(mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let wasm = fault_wasm()?;
    let dir = o.dir()?;
    let hub = Hub::start(
        &dir,
        &Options {
            runtime: "max_memory_mb = 256".to_owned(),
            extra: wiring(&wasm),
            ..Options::default()
        },
    )
    .await?;
    o.watch_log(hub.log_path());
    let token = hub.create_agent("Ann", AGENT).await?;
    let hostile = hub
        .create_channel("hostile", "http://127.0.0.1:9/h", &[AGENT])
        .await?;
    let plain = hub
        .create_channel("ordinary", "http://127.0.0.1:9/o", &[AGENT])
        .await?;
    let (rate, secs) = (mode.pick(50, 100), mode.pick(3, 10));
    let health = HealthWatch::start(&hub);
    // Warm up first (connections, the chats' first messages), so the
    // baseline measures the steady state as the fault phase does.
    ordinary(&hub, &plain, "pf-warm", rate, 1).await;
    let baseline = ordinary(&hub, &plain, "pf-base", rate, secs).await;

    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..4)
        .map(|s| {
            let (http, url, stop) = (hub.http.clone(), hostile.endpoint_url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut fates = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let text = format!("pf-h{s} n{n}");
                    let body = json!({ "sender": { "id": format!("pf-h{s}"), "name": format!("pf-h{s}") },
                                       "message": { "type": "text", "text": text } });
                    let status = http
                        .post(&url)
                        .header("content-type", "application/json; charset=utf-8")
                        .body(body.to_string())
                        .send()
                        .await
                        .map_or(0, |r| r.status().as_u16());
                    fates.push((text, status));
                }
                fates
            })
        })
        .collect();
    let during = ordinary(&hub, &plain, "pf-fault", rate, secs).await;
    stop.store(true, Ordering::Relaxed);
    let mut hostile_fates = Vec::new();
    for s in senders {
        hostile_fates.extend(s.await.unwrap_or_default());
    }
    let (polls, health_failed, health_slowest) = health.finish().await;

    let texts = hub.stored_texts(&token).await?;
    let lost: Vec<&String> = baseline
        .acked
        .iter()
        .chain(&during.acked)
        .chain(
            hostile_fates
                .iter()
                .filter(|(_, s)| *s == 200)
                .map(|(t, _)| t),
        )
        .filter(|t| !texts.contains_key(*t))
        .collect();
    let mut statuses = BTreeMap::<u16, usize>::new();
    for (_, s) in &hostile_fates {
        *statuses.entry(*s).or_default() += 1;
    }
    let metrics = hub
        .http
        .get(format!("{}/metrics", hub.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .map_err(|e| format!("metrics: {e}"))?
        .text()
        .await
        .unwrap_or_default();
    let mut kinds = Vec::new();
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("hub_plugin_errors_total{plugin=\"")
            && let Some((labels, value)) = rest.split_once("} ")
            && value != "0"
        {
            kinds.push(format!(
                "{}:{value}",
                labels.replace("\",kind=\"", "/").trim_end_matches('"')
            ));
        }
    }
    let ratio = during.p99 / baseline.p99.max(0.001);
    o.fig("rate", format!("{rate}/s"));
    o.fig("baseline_p50_ms", format!("{:.1}", baseline.p50));
    o.fig("baseline_p99_ms", format!("{:.1}", baseline.p99));
    o.fig("fault_p50_ms", format!("{:.1}", during.p50));
    o.fig("fault_p99_ms", format!("{:.1}", during.p99));
    o.fig("p99_ratio", format!("{ratio:.2}"));
    o.fig(
        "hostile",
        statuses
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    o.fig("plugin_errors", kinds.join(","));
    o.fig("healthz_polls", polls);
    o.fig("healthz_slowest_ms", health_slowest);
    o.fig("lost", lost.len());
    o.fig("peak_rss_mb", hub.memory_kib("VmHWM") / 1024);
    o.check(baseline.failed + during.failed == 0, || {
        format!(
            "{} ordinary messages were refused",
            baseline.failed + during.failed
        )
    });
    o.check(lost.is_empty(), || {
        format!("{} acknowledged messages are not stored", lost.len())
    });
    o.check(health_failed == 0, || {
        format!("/healthz failed {health_failed} times")
    });
    o.check(!hostile_fates.is_empty(), || {
        "no hostile message was answered".to_owned()
    });
    Ok(())
}
