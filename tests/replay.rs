//! Trying a plugin on real traffic before it acts: what each live plugin did
//! is recorded with the event (`hub events show`), `hub plugin replay` runs
//! a candidate on the event log without changing the database, and a
//! route's shadow plugins run beside live traffic without any effect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{
    HubOptions, Integrator, TestChannel, TestHub, eventually, on_postgres, plugin_toml, route_toml,
    storage_url,
};

const CUSTOMER: &str = "\"channel.customer_message\"";

/// `hub <args…>` with the test's config, off the async runtime.
async fn hub_cli(dir: &Path, args: &[&str]) -> Output {
    let dir = dir.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hub"));
        for var in hub::config::ENV_OVERRIDES {
            command.env_remove(var);
        }
        command
            .current_dir(&dir)
            .arg("--config")
            .arg(dir.join("hub.toml"))
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run hub")
    })
    .await
    .expect("the hub command's thread")
}

/// `hub plugin replay <args…> --json`, successful: its summary.
async fn replay_json(dir: &Path, args: &[&str]) -> Value {
    let mut all = vec!["plugin", "replay"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = hub_cli(dir, &all).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON summary")
}

/// Stops the hub but keeps it: its directory (and database) must outlive it.
async fn stop_keeping_files(hub: &mut TestHub) {
    if let Some(running) = hub.running.take() {
        running.shutdown().await;
    }
}

/// A word of letters only for `i`: redact's card and phone patterns never
/// see a digit in these messages.
fn letters(mut i: usize) -> String {
    let mut s = String::new();
    loop {
        s.push(char::from(b'a' + u8::try_from(i % 26).unwrap_or(0)));
        i /= 26;
        if i == 0 {
            return s;
        }
    }
}

/// The text of message `i`: every 13th carries an e-mail address.
fn message_text(i: usize) -> String {
    if i % 13 == 5 {
        format!("please write to {}@example.org today", letters(i))
    } else {
        format!("hello there order {} is late", letters(i))
    }
}

/// Every table's content, hashed: on SQLite through a read-only
/// connection, on PostgreSQL as each table's rows as text, in order.
async fn table_checksums(url: &str) -> BTreeMap<String, String> {
    use sqlx::{Connection, Row};
    let mut out = BTreeMap::new();
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=ro"))
            .await
            .expect("open read-only");
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                .fetch_all(&mut conn)
                .await
                .expect("tables");
        for t in tables {
            let columns: Vec<String> = sqlx::query(&format!("PRAGMA table_info(\"{t}\")"))
                .fetch_all(&mut conn)
                .await
                .expect("columns")
                .iter()
                .map(|r| r.get::<String, _>("name"))
                .collect();
            let row = columns
                .iter()
                .map(|c| format!("quote(\"{c}\")"))
                .collect::<Vec<_>>()
                .join(" || ',' || ");
            let rows: Vec<String> =
                sqlx::query_scalar(&format!("SELECT {row} FROM \"{t}\" ORDER BY 1"))
                    .fetch_all(&mut conn)
                    .await
                    .expect("rows");
            out.insert(t, hex::encode(Sha256::digest(rows.join("\n"))));
        }
        conn.close().await.expect("close");
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = 'public' ORDER BY 1",
        )
        .fetch_all(&mut conn)
        .await
        .expect("tables");
        for t in tables {
            let sum: Option<String> = sqlx::query_scalar(&format!(
                "SELECT md5(string_agg(x::text, E'\\n' ORDER BY x::text)) FROM \"{t}\" x"
            ))
            .fetch_one(&mut conn)
            .await
            .expect("checksum");
            out.insert(t, sum.unwrap_or_default());
        }
        conn.close().await.expect("close");
    }
    out
}

/// Sends the texts from a few customers, some at once, and returns each answer.
async fn send_all(hub: &TestHub, ch: &TestChannel, texts: &[String]) -> Vec<(u16, String)> {
    let mut answers = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(8) {
        let sends = chunk.iter().enumerate().map(|(k, text)| {
            hub.customer(
                ch,
                json!({ "sender": { "id": format!("c{k}") },
                        "message": { "type": "text", "text": text } }),
            )
        });
        answers.extend(futures_util::future::join_all(sends).await);
    }
    answers
}

/// A hub with `wiring` in its hub.toml and a channel `shop` (its
/// integrator is kept with it, so agent replies have somewhere to go).
async fn shop(wiring: String) -> (TestHub, TestChannel, Integrator) {
    shop_with(wiring, |_| {}).await
}

/// As [`shop`], with the loaded configuration edited first.
async fn shop_with(
    wiring: String,
    edit: impl FnOnce(&mut hub::config::Config),
) -> (TestHub, TestChannel, Integrator) {
    let integrator = Integrator::start().await;
    let opts = HubOptions {
        extra_toml: wiring,
        ..HubOptions::default()
    };
    let hub = TestHub::start_with_config(opts, edit).await;
    let ch = hub
        .create_channel("shop", &integrator.url, false, &[])
        .await;
    (hub, ch, integrator)
}

/// `GET /admin/v1/plugins/{name}/shadow`: the status and the report.
async fn shadow_report(hub: &TestHub, name: &str) -> (u16, Value) {
    let path = format!("/admin/v1/plugins/{name}/shadow");
    hub.admin(reqwest::Method::GET, &path, None).await
}

/// The customer message logged last.
async fn newest_message(hub: &TestHub) -> hub::event::Event {
    let mut newest = hub
        .store()
        .events_of_kind("channel.customer_message", 1)
        .await
        .expect("events");
    newest.pop().expect("a logged customer message")
}

/// Waits until the outcome of the event `id` is recorded (the recorder
/// writes in order, so every earlier one is too).
async fn outcomes_recorded(hub: &TestHub, id: &str) -> Vec<hub::store::outcomes::OutcomeRow> {
    eventually(Duration::from_secs(30), "outcomes recorded", || async {
        let rows = hub.store().outcomes_of(id).await.expect("outcomes");
        (!rows.is_empty()).then_some(rows)
    })
    .await
}

#[tokio::test]
async fn replay_of_a_changed_redact_reports_exactly_the_masked_messages_and_changes_nothing() {
    const N: usize = 10_000;
    // A burst of 10 000 from one address: no rate limit in the way.
    let wiring = "[limits]\nchannel_per_second = 0\nchannel_source_per_second = 0\n\n".to_owned()
        + &plugin_toml("redact", "redact", "", "emails = false")
        + &route_toml(CUSTOMER, "\"redact\"", "skip");
    let (hub, ch, _integrator) = shop(wiring).await;
    // One card number, masked live and by the candidate alike.
    hub.say(&ch, json!("card"), "my card is 4111 1111 1111 1111")
        .await;
    let texts: Vec<String> = (0..N - 1).map(message_text).collect();
    let answers = send_all(&hub, &ch, &texts).await;
    let refused: BTreeSet<&(u16, String)> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(refused.is_empty(), "every message taken: {refused:?}");

    let events = hub
        .store()
        .events_of_kind("channel.customer_message", 20_000)
        .await
        .expect("events");
    assert_eq!(events.len(), N);
    let with_email: BTreeSet<String> = events
        .iter()
        .filter(|e| {
            e.payload["message"]["text"]
                .as_str()
                .unwrap_or("")
                .contains('@')
        })
        .map(|e| e.id.to_string())
        .collect();
    assert!(with_email.len() > 700, "{}", with_email.len());
    let newest = events[0].id.to_string();
    outcomes_recorded(&hub, &newest).await;
    let card = events
        .iter()
        .find(|e| e.payload["message"]["text"] == "my card is [card]")
        .expect("the card message, masked live")
        .id
        .to_string();
    let dir = hub.dir.path().to_owned();
    let url = storage_url(&dir);
    let mut hub = hub;
    stop_keeping_files(&mut hub).await;

    // Which plugin changed this message? `hub events show` says.
    let shown = hub_cli(&dir, &["events", "show", &card]).await;
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("json");
    assert_eq!(shown["outcomes"][0]["plugin"], "redact", "{shown}");
    assert_eq!(shown["outcomes"][0]["verdict"], "changed", "{shown}");
    assert_eq!(
        shown["outcomes"][0]["payload_hash"].as_str().map(str::len),
        Some(64),
        "{shown}"
    );

    let before = table_checksums(&url).await;
    let db_file = dir.join("hub.db");
    let file_before = (!on_postgres()).then(|| std::fs::read(&db_file).expect("db file"));
    let summary = replay_json(
        &dir,
        &["redact", "--plugin-config", "{\"emails\": true}", "--diff"],
    )
    .await;
    eprintln!(
        "replay: {} events in {:.2} s, {:.0} events/s, p50 {} µs, p99 {} µs",
        summary["seen"],
        summary["seconds"].as_f64().unwrap_or(0.0),
        summary["events_per_second"].as_f64().unwrap_or(0.0),
        summary["p50_micros"],
        summary["p99_micros"]
    );
    assert_eq!(summary["seen"], N, "{summary}");
    assert_eq!(
        summary["compared_with_recorded"], N,
        "every outcome was recorded"
    );
    assert_eq!(summary["changed"], with_email.len());
    assert_eq!(summary["same"], N - with_email.len());
    assert_eq!(summary["dropped"], 0);
    assert_eq!(summary["failed"], json!({}));
    let differing: BTreeSet<String> = summary["differences"]
        .as_array()
        .expect("differences")
        .iter()
        .map(|d| d["event_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        differing, with_email,
        "exactly the events with an e-mail address"
    );
    let first = &summary["differences"][0];
    assert_eq!(first["changes"][0]["path"], "/message/text", "{first}");
    assert!(
        first["changes"][0]["candidate"]
            .as_str()
            .unwrap_or("")
            .contains("[email]"),
        "{first}"
    );

    assert_eq!(
        table_checksums(&url).await,
        before,
        "the database is unchanged"
    );
    if let Some(bytes) = file_before {
        assert!(
            std::fs::read(&db_file).expect("db file") == bytes,
            "the database file is byte for byte the same"
        );
    }

    // The text form, as an operator reads it.
    let text = hub_cli(
        &dir,
        &[
            "plugin",
            "replay",
            "redact",
            "--plugin-config",
            "emails = true",
            "--limit",
            "100",
        ],
    )
    .await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("100 events"), "{text}");
    assert!(text.contains("events/s"), "{text}");
}

/// A candidate for the head of a chain replays on the payloads as they
/// entered, when the operator keeps them: a `redact` that no longer masks
/// cards differs only there, where the recorded (masked) payload hides it.
#[tokio::test]
async fn kept_inbound_payloads_let_a_head_of_chain_candidate_replay_on_what_entered() {
    for keep in [true, false] {
        let wiring =
            plugin_toml("redact", "redact", "", "") + &route_toml(CUSTOMER, "\"redact\"", "skip");
        let (hub, ch, _integrator) = shop_with(wiring, |c| {
            c.storage.keep_inbound_hours = if keep { 1 } else { 0 };
        })
        .await;
        hub.say(&ch, json!("a"), "my card is 4111 1111 1111 1111")
            .await;
        hub.say(&ch, json!("a"), "hello").await;
        let newest = newest_message(&hub).await;
        outcomes_recorded(&hub, &newest.id.to_string()).await;
        let dir = hub.dir.path().to_owned();
        let mut hub = hub;
        stop_keeping_files(&mut hub).await;
        let summary = replay_json(&dir, &["redact", "--plugin-config", "cards = false"]).await;
        assert_eq!(summary["seen"], 2, "{summary}");
        if keep {
            assert_eq!(summary["on_inbound"], 2, "{summary}");
            assert_eq!(summary["changed"], 1, "the card stays unmasked: {summary}");
        } else {
            assert_eq!(summary["on_inbound"], 0, "{summary}");
            assert_eq!(
                summary["same"], 2,
                "the recorded payload is masked already: {summary}"
            );
        }
    }
}

/// What live traffic left behind, to compare a hub with shadows with one without.
#[derive(Debug, PartialEq)]
struct Observed {
    answers: Vec<(u16, String)>,
    stored: Vec<String>,
    forwarded: Vec<Value>,
    noted: Vec<(String, String)>,
}

async fn live_traffic(shadows: bool) -> (Observed, Option<TestHub>) {
    let sink = Integrator::start().await;
    let mut wiring = format!(
        "[[destinations]]\nname = \"sink\"\nurl = \"{}\"\n\n",
        sink.url
    ) + &plugin_toml("redact", "redact", "", "emails = false")
        + &plugin_toml("noter", "fault", "kv = true", "fault = \"note_chat\"")
        + &plugin_toml(
            "fwd",
            "fault",
            "destinations = [\"sink\"]",
            "fault = \"forward\"\ndestination = \"sink\"",
        );
    let mut route = route_toml(CUSTOMER, "\"redact\", \"noter\", \"fwd\"", "reject");
    if shadows {
        wiring += &plugin_toml(
            "hostile",
            "fault",
            "kv = true\ndestinations = [\"sink\"]\nshadows = \"redact\"",
            "fault = \"everything\"\ndestination = \"sink\"",
        );
        wiring += &plugin_toml("looper", "fault", "timeout_ms = 100", "fault = \"loop\"");
        // Its traps are what is counted: a slow start on a loaded machine
        // must not turn one into a timeout.
        wiring += &plugin_toml("trapper", "fault", "timeout_ms = 2000", "fault = \"trap\"");
        route += "shadow = [\"hostile\", \"looper\", \"trapper\"]\n\n";
    }
    let (hub, ch, _integrator) = shop(wiring + &route).await;
    let texts: Vec<String> = (0..20).map(message_text).collect();
    let mut answers = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        answers.push(
            hub.customer(
                &ch,
                json!({ "sender": { "id": format!("c{}", i % 3) },
                        "message": { "type": "text", "text": text } }),
            )
            .await,
        );
    }
    // As long as the shadows' own wait below: on a loaded machine (the
    // whole suite on two cores, the looper spinning to its deadline 20
    // times) a forward's attempt can time out and be retried.
    sink.wait_for(20, Duration::from_secs(30)).await;
    if shadows {
        eventually(
            Duration::from_secs(30),
            "every shadow call done",
            || async {
                let m = hub.metrics().await;
                let done: f64 = m
                    .iter()
                    .filter(|(k, _)| k.starts_with("hub_shadow_outcomes_total{"))
                    .map(|(_, v)| v)
                    .sum();
                (done >= 60.0).then_some(())
            },
        )
        .await;
    }
    // Anything a shadow queued would have been delivered by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut stored: Vec<String> = hub
        .store()
        .events_of_kind("channel.customer_message", 100)
        .await
        .expect("events")
        .iter()
        .map(|e| {
            e.payload["message"]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    stored.sort();
    let mut forwarded: Vec<Value> = sink.requests().iter().map(|r| r.json()).collect();
    forwarded.sort_by_key(Value::to_string);
    let noted = hub
        .store()
        .kv_entries("noter")
        .await
        .expect("kv")
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    let hostile_kv = hub.store().kv_entries("hostile").await.expect("kv");
    assert!(
        hostile_kv.is_empty(),
        "a shadow's key-value writes are never applied"
    );
    let observed = Observed {
        answers,
        stored,
        forwarded,
        noted,
    };
    if shadows {
        (observed, Some(hub))
    } else {
        hub.shutdown().await;
        (observed, None)
    }
}

#[tokio::test]
async fn a_hostile_shadow_changes_nothing_of_live_traffic_and_its_differences_are_shown() {
    let (without, _) = live_traffic(false).await;
    let (with, hub) = live_traffic(true).await;
    let hub = hub.expect("the hub with shadows");
    assert_eq!(with, without, "live traffic is the same with the shadows");
    assert!(
        with.answers.iter().all(|(s, _)| *s == 200),
        "{:?}",
        with.answers
    );
    assert_eq!(
        with.forwarded.len(),
        20,
        "only live forwards (and no shadow send) arrived"
    );

    let m = hub.metrics().await;
    // `family{route="routes[0]",plugin="…",label="…"}`, 0 when absent.
    let series = |family: &str, plugin: &str, label: &str| {
        m.get(&format!(
            "{family}{{route=\"routes[0]\",plugin=\"{plugin}\",{label}}}"
        ))
        .copied()
        .unwrap_or(0.0)
    };
    let count = |plugin: &str, result: &str| {
        series(
            "hub_shadow_outcomes_total",
            plugin,
            &format!("result=\"{result}\""),
        )
    };
    let kind = |plugin: &str, kind: &str| {
        series(
            "hub_shadow_failures_total",
            plugin,
            &format!("kind=\"{kind}\""),
        )
    };
    assert_eq!(count("hostile", "dropped"), 20.0, "{m:?}");
    assert_eq!(count("looper", "failed"), 20.0, "{m:?}");
    assert_eq!(count("trapper", "failed"), 20.0, "{m:?}");
    assert_eq!(kind("trapper", "trap"), 20.0, "{m:?}");
    assert!(kind("looper", "timeout") >= 1.0, "{m:?}");
    assert_eq!(
        kind("looper", "timeout") + kind("looper", "busy"),
        20.0,
        "a looping shadow fails at its deadline (or waits its share out): {m:?}"
    );
    let live_errors: f64 = m
        .iter()
        .filter(|(k, _)| {
            k.starts_with("hub_plugin_errors_total{plugin=\"redact\"")
                || k.starts_with("hub_plugin_errors_total{plugin=\"noter\"")
                || k.starts_with("hub_plugin_errors_total{plugin=\"fwd\"")
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(live_errors, 0.0, "the live route never failed");

    let (status, report) = shadow_report(&hub, "hostile").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["counts"]["dropped"], 20, "{report}");
    let recent = report["recent"].as_array().expect("recent differences");
    assert_eq!(recent.len(), 20);
    assert_eq!(recent[0]["result"], "dropped");
    assert!(recent[0]["live"]["message"]["text"].is_string(), "{report}");
    assert!(recent[0]["shadow"]["dropped"].is_string(), "{report}");
    let (status, report) = shadow_report(&hub, "looper").await;
    assert_eq!(status, 200);
    assert_eq!(report["counts"]["failed"], 20, "{report}");
    let (status, _) = shadow_report(&hub, "redact").await;
    assert_eq!(status, 404, "redact is live, no shadow");
    hub.shutdown().await;
}

#[tokio::test]
async fn promote_makes_the_shadow_live_in_place_of_the_plugin_it_shadows() {
    let wiring = plugin_toml("redact", "redact", "", "emails = false")
        + &plugin_toml(
            "redact-v2",
            "redact",
            "shadows = \"redact\"",
            "emails = true",
        )
        + &route_toml(CUSTOMER, "\"redact\"", "skip")
        + "shadow = [\"redact-v2\"]\n";
    let (hub, ch, _integrator) = shop(wiring).await;
    hub.say(&ch, json!("a"), "mail me at someone@example.org")
        .await;
    let report = eventually(
        Duration::from_secs(10),
        "the shadow's difference",
        || async {
            let (_, r) = shadow_report(&hub, "redact-v2").await;
            (r["counts"]["changed"] == 1).then_some(r)
        },
    )
    .await;
    assert_eq!(
        report["recent"][0]["shadow"]["message"]["text"], "mail me at [email]",
        "{report}"
    );
    let dir = hub.dir.path().to_owned();
    let out = hub_cli(&dir, &["plugin", "promote", "redact-v2"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("`redact-v2` replaces `redact`"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    hub.running()
        .reload()
        .await
        .expect("reload with the edited file");
    hub.say(&ch, json!("a"), "again: someone@example.org").await;
    let newest = newest_message(&hub).await;
    assert_eq!(newest.payload["message"]["text"], "again: [email]");
    hub.shutdown().await;
}
