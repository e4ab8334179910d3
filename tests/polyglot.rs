//! Plugins in Python and TypeScript: one table of events and expected
//! outcomes (`tests/fixtures/spam-guard-table.json`) run through the hub's
//! pipeline against the Rust, Python and TypeScript builds of spam-guard;
//! and `hub plugin new --lang python|typescript` makes a project that builds
//! with `./build.sh` and passes `hub plugin test` as it is.

use std::path::{Path, PathBuf};

use hub::config::Config;
use hub::core::provisioning::{ChannelSpec, create_channel};
use hub::event::{Direction, Event, EventKind};
use hub::outbound::HttpSender;
use hub::pipeline::wiring::{Wiring, WiringHandle};
use hub::pipeline::{Pipeline, Verdict, record_effects};
use hub::runtime::Runtime;
use hub::store::Store;
use serde_json::{Value, json};

use crate::authoring::{hub_in, json_out, stderr_of};
use crate::support::{plugin_wasm, polyglot_wasm, repo_root, skip_on_postgres};

/// What one build made of one step of the table, in the table's terms.
fn observed(verdict: &Verdict, forwards: &[hub::runtime::Forward], event_id: &str) -> Value {
    let forwards: Vec<Value> = forwards
        .iter()
        .map(|f| {
            let mut payload = f.payload.clone();
            // The event's id is the one thing each run makes anew.
            if let Some(id) = payload.as_object_mut().and_then(|p| p.remove("event_id")) {
                assert_eq!(id, event_id, "the forward names another event");
            }
            json!({ "destination": f.destination.name, "payload": payload })
        })
        .collect();
    let mut out = match verdict {
        Verdict::Continue => json!({ "outcome": "continue" }),
        // The hub prefixes the plugin's reason with the plugin's name.
        Verdict::Drop(reason) => {
            let reason = reason.strip_prefix("spam-guard: ").unwrap_or(reason);
            json!({ "outcome": "drop", "reason": reason })
        }
        Verdict::Reply(reply) => json!({ "outcome": "reply", "reply": reply }),
        Verdict::Reject(error) => json!({ "outcome": "reject", "error": error }),
    };
    if !forwards.is_empty() {
        out["forwards"] = Value::Array(forwards);
    }
    out
}

/// A store with channel 1 `web`, and a pipeline whose one route runs the
/// plugin in `wasm` (granted KV and the destination `audit`) on `channel.*`.
struct Loaded {
    _tmp: tempfile::TempDir,
    store: Store,
    runtime: Runtime,
    pipeline: Pipeline,
}

async fn load(wasm: &Path, limits: &str, config: &Value) -> Loaded {
    let tmp = tempfile::tempdir().expect("temp dir");
    let store = Store::open(
        &format!("sqlite://{}", tmp.path().join("hub.db").display()),
        hub::store::Durability::Normal,
    )
    .await
    .expect("store");
    create_channel(
        &store,
        &ChannelSpec {
            name: "web".into(),
            customer_endpoint: "http://127.0.0.1:9/hub".into(),
            ..ChannelSpec::default()
        },
        false,
        &hub::outbound::Policy::default(),
    )
    .await
    .expect("channel");
    let config_table: toml::Table =
        serde_json::from_value(config.clone()).expect("the config is a table");
    let toml_text = format!(
        "[[destinations]]\nname = \"audit\"\nurl = \"http://127.0.0.1:9/audit\"\n\n\
         [[plugins]]\nname = \"spam-guard\"\npath = \"{}\"\nkv = true\ndestinations = [\"audit\"]\n\
         {limits}\n[plugins.config]\n{}\n\
         [[routes]]\nevents = [\"channel.*\"]\nplugins = [\"spam-guard\"]\non_error = \"skip\"\n",
        wasm.display(),
        toml::to_string(&config_table).expect("config as TOML")
    );
    let config = Config::parse(&toml_text, &tmp.path().join("hub.toml")).expect("config");
    // Compiled components are kept across runs: the Python build takes long to compile.
    let runtime = Runtime::new(repo_root().join("target/polyglot/test-cache"), 4).expect("runtime");
    let sender = HttpSender::new().expect("http client");
    let (wiring, _) = Wiring::load(&config, &runtime, &store, &sender).expect("plugin loads");
    let pipeline = Pipeline::new(WiringHandle::new(wiring), store.clone());
    Loaded {
        _tmp: tmp,
        store,
        runtime,
        pipeline,
    }
}

/// Runs every step of `table` through a pipeline whose one route runs the
/// plugin in `wasm`; the outcome of each step, and the plugin's KV after.
async fn run_table(wasm: &Path, table: &Value) -> (Vec<Value>, Value) {
    let Loaded {
        _tmp,
        store,
        pipeline,
        ..
    } = load(wasm, "timeout_ms = 5000", &table["config"]).await;
    let mut outcomes = Vec::new();
    for step in table["steps"].as_array().expect("steps") {
        let kind = step["kind"].as_str().expect("kind").to_owned();
        let direction = if kind.starts_with("channel.agent_") {
            Direction::Out
        } else {
            Direction::In
        };
        let mut event =
            Event::new(EventKind::from(kind), direction, step["payload"].clone()).on_channel(1);
        event.at = step["at"].as_i64().expect("at");
        let routed = pipeline.run(event).await;
        outcomes.push(observed(
            &routed.verdict,
            &routed.forwards,
            &routed.event.id.to_string(),
        ));
        // As the hub does with the event's change: KV writes and forwards
        // are kept whatever the verdict, so the next step sees them.
        let mut w = store.begin_write().await.expect("write");
        record_effects(
            &mut w.tx,
            &routed.event,
            &routed.forwards,
            &routed.kv_writes,
            routed.event.at,
        )
        .await
        .expect("effects");
        w.commit().await.expect("commit");
    }
    let mut kv = serde_json::Map::new();
    for key in table["kv_after"].as_object().expect("kv_after").keys() {
        let stored = store.kv_get("spam-guard", key).await.expect("kv");
        let value = stored.map_or(Value::Null, |s| {
            serde_json::from_str(&s).expect("a window is JSON")
        });
        kv.insert(key.clone(), value);
    }
    store.close().await;
    (outcomes, Value::Object(kv))
}

#[tokio::test]
async fn slow_spam_guard_behaves_alike_in_rust_python_and_typescript() {
    if skip_on_postgres("the plugins' behaviour does not depend on the database") {
        return;
    }
    let table: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures/spam-guard-table.json"))
            .expect("table"),
    )
    .expect("the table is JSON");
    let builds: [(&str, PathBuf); 3] = [
        ("Rust", plugin_wasm("spam_guard")),
        ("Python", polyglot_wasm("spam_guard_py")),
        ("TypeScript", polyglot_wasm("spam_guard_ts")),
    ];
    let steps = table["steps"].as_array().expect("steps");
    for (language, wasm) in &builds {
        let (outcomes, kv) = run_table(wasm, &table).await;
        for (step, got) in steps.iter().zip(&outcomes) {
            assert_eq!(
                got,
                &step["expect"],
                "{language}: step \"{}\"",
                step["what"].as_str().unwrap_or_default()
            );
        }
        assert_eq!(kv, table["kv_after"], "{language}: the rate windows in KV");
    }
}

/// `./build.sh [test]` of a scaffolded project, with the tools cached under
/// the repository's `target/polyglot` (shared with `scripts/polyglot.sh`).
fn build_sh(dir: &Path, args: &[&str]) {
    let tools = repo_root().join("target/polyglot");
    let out = std::process::Command::new("./build.sh")
        .args(args)
        .current_dir(dir)
        .env("HUB_PLUGIN_TOOLS", &tools)
        .env("npm_config_cache", tools.join("npm-cache"))
        .output()
        .expect("run build.sh");
    assert!(
        out.status.success(),
        "./build.sh {args:?} failed in {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The promise of `hub plugin new --lang python|typescript`: the project's
/// unit tests pass, `./build.sh` makes NAME.wasm and `hub plugin test` runs
/// it without edits; before the build, `hub plugin test` and `hub check` say
/// which toolchain step is missing.
fn a_new_project_builds_and_passes_plugin_test(lang: &str, language: &str) {
    let work = tempfile::tempdir().expect("temp dir");
    let made = hub_in(work.path(), &["plugin", "new", "greet", "--lang", lang]);
    assert!(made.status.success(), "{}", stderr_of(&made));
    let dir = work.path().join("greet");
    assert!(
        String::from_utf8_lossy(&made.stdout).contains("./build.sh"),
        "the next steps are not shown"
    );

    let early = hub_in(
        &dir,
        &["plugin", "test", "greet.wasm", "--event", "event.json"],
    );
    assert!(!early.status.success(), "a missing component was tried");
    let said = stderr_of(&early);
    assert!(
        said.contains(&format!("is a {language} plugin project"))
            && said.contains("`./build.sh` has not been run"),
        "{said}"
    );
    std::fs::copy(dir.join("hub.toml.fragment"), dir.join("hub.toml")).expect("hub.toml");
    let check = hub_in(&dir, &["check"]);
    assert!(
        !check.status.success(),
        "hub check passed without the component"
    );
    assert!(
        stderr_of(&check).contains("`./build.sh` has not been run"),
        "{}",
        stderr_of(&check)
    );

    build_sh(&dir, &["test"]);
    build_sh(&dir, &[]);
    let tried = json_out(&hub_in(
        &dir,
        &["plugin", "test", "greet.wasm", "--event", "event.json"],
    ));
    assert_eq!(tried["outcome"], "continue", "{tried}");
    assert_eq!(tried["changed"], false, "{tried}");
    let typing = json_out(&hub_in(
        &dir,
        &[
            "plugin",
            "test",
            "greet.wasm",
            "--event",
            "events/customer_typing.json",
        ],
    ));
    assert_eq!(typing["outcome"], "continue", "{typing}");
    let checked = hub_in(&dir, &["check"]);
    assert!(checked.status.success(), "{}", stderr_of(&checked));
}

#[test]
fn slow_a_new_python_project_builds_and_passes_plugin_test() {
    if skip_on_postgres("scaffolds do not depend on the database") {
        return;
    }
    a_new_project_builds_and_passes_plugin_test("python", "Python");
}

#[test]
fn slow_a_new_typescript_project_builds_and_passes_plugin_test() {
    if skip_on_postgres("scaffolds do not depend on the database") {
        return;
    }
    a_new_project_builds_and_passes_plugin_test("typescript", "TypeScript");
}

/// The payload type of each event kind that has one, as docs/plugins.md
/// lists them; the SDKs' payload types are generated from this schema.
fn payload_schema() -> Value {
    use plugin_api::schemars::{self, generate::SchemaSettings};
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut kinds = serde_json::Map::new();
    let root =
        |kinds: &mut serde_json::Map<String, Value>, names: &[&str], schema: schemars::Schema| {
            for name in names {
                kinds.insert((*name).to_owned(), schema.clone().to_value());
            }
        };
    use plugin_api::{bot, channel, crm, webhook, widget};
    root(
        &mut kinds,
        &["channel.customer_message", "channel.customer_typing"],
        generator.subschema_for::<channel::CustomerMessage>(),
    );
    root(
        &mut kinds,
        &["channel.agent_message", "channel.agent_typing"],
        generator.subschema_for::<channel::AgentMessage>(),
    );
    root(
        &mut kinds,
        &["widget.offline_message"],
        generator.subschema_for::<widget::OfflineMessageEvent>(),
    );
    root(
        &mut kinds,
        &["webhook.*"],
        generator.subschema_for::<webhook::WebhookEvent>(),
    );
    root(
        &mut kinds,
        &["crm.*"],
        generator.subschema_for::<crm::CrmWebhook>(),
    );
    root(
        &mut kinds,
        &["bot.*"],
        generator.subschema_for::<bot::BotEvent>(),
    );
    let defs: serde_json::Map<String, Value> = generator.take_definitions(true);
    json!({
        "about": "The payload of each event kind as the hub hands it to plugins, generated \
                  from plugin-api's types by tests/polyglot.rs; sdk/gen_payloads.py writes \
                  the Python and TypeScript SDKs' payload types from it.",
        "kinds": kinds,
        "$defs": defs,
    })
}

/// The payload types cannot drift: the Rust types' schema must be the one
/// checked in (`UPDATE_SDK_SCHEMA=1` rewrites it), and the Python and
/// TypeScript types must be what `sdk/gen_payloads.py` makes of it.
#[test]
fn sdk_payload_types_follow_the_rust_types() {
    let file = repo_root().join("sdk/payloads.schema.json");
    let schema = serde_json::to_string_pretty(&payload_schema()).expect("schema") + "\n";
    if std::env::var_os("UPDATE_SDK_SCHEMA").is_some() {
        std::fs::write(&file, &schema).expect("write the schema");
    }
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        checked_in == schema,
        "a payload type of plugin-api changed, and sdk/payloads.schema.json did not: run \
         `UPDATE_SDK_SCHEMA=1 cargo test -p hub --test e2e polyglot::sdk_payload` and \
         `python3 sdk/gen_payloads.py`, and check the Python and TypeScript SDKs' docs"
    );
    let generated = std::process::Command::new("python3")
        .arg(repo_root().join("sdk/gen_payloads.py"))
        .arg("--check")
        .output()
        .expect("run python3 sdk/gen_payloads.py");
    assert!(
        generated.status.success(),
        "{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );
}

/// The containment bench's hostile modes, built from Python
/// (`tests/plugins/fault-py`): each is held to its limit and fails only its
/// own call, which the route skips; the next call of the plugin works.
#[tokio::test]
async fn slow_a_hostile_python_plugin_is_held_to_the_same_bounds() {
    if skip_on_postgres("the plugins' behaviour does not depend on the database") {
        return;
    }
    let wasm = polyglot_wasm("fault_py");
    let cases = [
        ("loop", "timeout_ms = 300", "timeout"),
        ("memory", "memory_mb = 48\ntimeout_ms = 5000", "failed"),
        ("trap", "timeout_ms = 5000", "failed"),
        ("error", "timeout_ms = 5000", "failed"),
        (
            "huge_output",
            "max_output_bytes = 65536\ntimeout_ms = 5000",
            "output_too_large",
        ),
        ("log_flood", "timeout_ms = 5000", ""),
    ];
    for (fault, limits, kind) in cases {
        let loaded = load(&wasm, limits, &json!({ "fault": fault, "count": 990 })).await;
        let customer = || {
            Event::new(
                EventKind::CUSTOMER_MESSAGE,
                Direction::In,
                json!({"sender": {"id": 7}, "message": {"type": "text", "text": "hi"}}),
            )
            .on_channel(1)
        };
        let routed = loaded.pipeline.run(customer()).await;
        assert!(
            matches!(routed.verdict, Verdict::Continue),
            "{fault}: {:?}",
            routed.verdict
        );
        let snapshot = loaded.runtime.counters().snapshot();
        let counted = snapshot.get("spam-guard").expect("counters");
        let errors: Vec<&str> = counted
            .errors
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, _)| *k)
            .collect();
        let expected: Vec<&str> = if kind.is_empty() { vec![] } else { vec![kind] };
        assert_eq!(errors, expected, "{fault}: the error counted");
        loaded.store.close().await;
    }
}
