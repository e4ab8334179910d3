//! The plugin author's path through the real `hub` binary: `hub plugin new`
//! makes a crate that tests, builds and runs as it is; `hub plugin test`
//! grants only what it is told to and stubs `send`; real events captured with
//! `hub events show --as-event` are test input; `hub plugin kv` shows a
//! plugin's data.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::support::{
    HubOptions, Integrator, TestHub, plugin_toml, plugin_wasm, repo_root, route_toml, write_config,
};

/// `hub <args…>` in `dir`, without the developer's own `HUB_*` variables.
pub(crate) fn hub_in(dir: &Path, args: &[&str]) -> Output {
    hub_command(Command::new(env!("CARGO_BIN_EXE_hub")), dir, args)
        .output()
        .expect("run hub")
}

/// `command` (the hub, or a shell that starts it) set up as [`hub_in`] runs it.
fn hub_command(mut command: Command, dir: &Path, args: &[&str]) -> Command {
    for var in hub::config::ENV_OVERRIDES {
        command.env_remove(var);
    }
    command.current_dir(dir).args(args).env("RUST_LOG", "warn");
    command
}

/// As [`hub_in`], off the async runtime, so loopback servers of the test keep answering.
async fn hub_async(dir: &Path, args: &[&str]) -> Output {
    let dir = dir.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        hub_in(&dir, &args)
    })
    .await
    .expect("hub command")
}

pub(crate) fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "hub failed: {}", stderr_of(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stdout_of(o)))
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn run_cargo(dir: &Path, args: &[&str]) {
    let out = Command::new(cargo())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?} failed:\n{}\n{}",
        stdout_of(&out),
        stderr_of(&out)
    );
}

/// Slow (about a minute cold: the crate and plugin-api compile natively and
/// for wasm32-wasip2), but part of the normal suite: it is the promise that a
/// new plugin works without edits. The shared target directory keeps later
/// runs incremental.
#[test]
fn slow_a_new_plugin_crate_tests_builds_and_passes_plugin_test() {
    let work = tempfile::tempdir().expect("temp dir");
    let made = hub_in(work.path(), &["plugin", "new", "word-filter"]);
    assert!(made.status.success(), "{}", stderr_of(&made));
    let crate_dir = work.path().join("word-filter");
    let said = stdout_of(&made);
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        ".cargo/config.toml",
        "events/customer_message.json",
        "events/agent_message.json",
        "events/customer_typing.json",
        "hub.toml.fragment",
        "README.md",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing");
        assert!(said.contains(file), "{file} not listed in:\n{said}");
    }
    for next in [
        "cargo test",
        "cargo build --release --target wasm32-wasip2",
        "hub plugin test target/wasm32-wasip2/release/word_filter.wasm events/customer_message.json",
    ] {
        assert!(said.contains(next), "`{next}` not suggested in:\n{said}");
    }
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).expect("Cargo.toml");
    let plugin_api = repo_root()
        .join("plugin-api")
        .canonicalize()
        .expect("plugin-api");
    assert!(
        manifest.contains(&format!("path = \"{}\"", plugin_api.display())),
        "{manifest}"
    );

    // Refusals: a directory that is not empty, and names that are not plugin names.
    let again = hub_in(work.path(), &["plugin", "new", "word-filter"]);
    assert!(!again.status.success());
    assert!(
        stderr_of(&again).contains("not empty"),
        "{}",
        stderr_of(&again)
    );
    for bad in ["no/slash", "1st", "sp ace"] {
        let o = hub_in(work.path(), &["plugin", "new", bad]);
        assert!(!o.status.success(), "`{bad}` was accepted");
        assert!(
            stderr_of(&o).contains("not a plugin name"),
            "{}",
            stderr_of(&o)
        );
    }
    assert_eq!(listing(work.path()), ["word-filter"]);

    let target = repo_root().join("target/scaffold-test");
    let target = target.to_str().expect("utf-8 path");
    let manifest = crate_dir.join("Cargo.toml");
    let manifest = manifest.to_str().expect("utf-8 path");
    run_cargo(
        work.path(),
        &["test", "--manifest-path", manifest, "--target-dir", target],
    );
    // From inside the crate, so that its .cargo/config.toml applies.
    run_cargo(
        &crate_dir,
        &[
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
            target,
        ],
    );
    let wasm = Path::new(target).join("wasm32-wasip2/release/word_filter.wasm");
    let wasm = wasm.to_str().expect("utf-8 path");

    let before = listing(&crate_dir);
    let tried = hub_in(
        &crate_dir,
        &["plugin", "test", wasm, "events/customer_message.json"],
    );
    let outcome = json_out(&tried);
    assert_eq!(outcome["outcome"], "continue", "{outcome}");
    assert_eq!(outcome["changed"], false, "{outcome}");
    for other in ["events/agent_message.json", "events/customer_typing.json"] {
        let o = json_out(&hub_in(&crate_dir, &["plugin", "test", wasm, other]));
        assert_eq!(o["outcome"], "continue", "{other}: {o}");
    }
    // No hub.toml here: neither the scratch database nor the compiled plugin stays behind.
    assert_eq!(listing(&crate_dir), before);
}

/// A `hub.toml` with a destination `crm` at `url` (with a secret header) and
/// the fault plugin as `fault-guard`, granted `crm`, forwarding to it.
fn grants_setup(url: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let extra = format!(
        "[[destinations]]\nname = \"crm\"\nurl = \"{url}\"\n\
         headers = {{ Authorization = \"Bearer crm-secret\" }}\n\n{}",
        plugin_toml(
            "fault-guard",
            "fault",
            "destinations = [\"crm\"]",
            "fault = \"forward\"\ndestination = \"crm\"",
        )
    );
    let opts = HubOptions {
        extra_toml: extra,
        ..HubOptions::default()
    };
    let config = write_config(dir.path(), &opts, "127.0.0.1:0");
    let event = dir.path().join("event.json");
    std::fs::write(
        &event,
        json!({ "kind": "channel.customer_message",
                "payload": { "sender": { "id": 1 }, "message": { "type": "text", "text": "hi" } } })
        .to_string(),
    )
    .expect("write event");
    (dir, config)
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_test_grants_only_named_destinations_and_stubs_send() {
    let receiver = Integrator::start().await;
    let (dir, _config) = grants_setup(&receiver.url);
    let here = dir.path();
    let fault = plugin_wasm("fault");
    let fault = fault.to_str().expect("utf-8 path");

    // By its hub.toml name, without --grant: the forward is shown, with a note, and not a failure.
    let o = hub_async(here, &["plugin", "test", "fault-guard", "event.json"]).await;
    let out = json_out(&o);
    assert_eq!(out["outcome"], "continue", "{out}");
    assert_eq!(out["forwards"][0]["destination"], "crm", "{out}");
    assert_eq!(out["forwards"][0]["payload"]["message"]["text"], "hi");
    assert!(
        out["forwards"][0]["note"]
            .as_str()
            .is_some_and(|n| n.contains("not granted")),
        "{out}"
    );
    let err = stderr_of(&o);
    assert!(
        err.contains("plugin=fault-guard"),
        "the hub.toml name was not kept: {err}"
    );
    assert!(err.contains("unless named with --grant"), "{err}");

    // A send to a destination not granted fails as in the hub, with the way out.
    let send = r#"{"fault": "forbidden_send", "destination": "crm"}"#;
    let o = hub_async(
        here,
        &[
            "plugin",
            "test",
            fault,
            "--event",
            "event.json",
            "--plugin-config",
            send,
        ],
    )
    .await;
    assert!(!o.status.success(), "{}", stdout_of(&o));
    assert!(stderr_of(&o).contains("--grant crm"), "{}", stderr_of(&o));

    // Granted: answered 200 {} by the stand-in and printed.
    let o = hub_async(
        here,
        &[
            "plugin",
            "test",
            fault,
            "event.json",
            "--grant",
            "crm",
            "--plugin-config",
            send,
        ],
    )
    .await;
    let out = json_out(&o);
    assert_eq!(
        out["sends"],
        json!([{ "destination": "crm", "payload": {}, "stubbed": true, "status": 200, "body": "{}" }])
    );
    assert!(
        stderr_of(&o).contains("send to `crm` stubbed"),
        "{}",
        stderr_of(&o)
    );
    assert!(
        receiver.requests().is_empty(),
        "a stubbed send reached the receiver"
    );

    // --live-send: the real destination, with its headers, exactly once.
    let o = hub_async(
        here,
        &[
            "plugin",
            "test",
            fault,
            "event.json",
            "--grant",
            "crm",
            "--live-send",
            "--plugin-config",
            send,
        ],
    )
    .await;
    let out = json_out(&o);
    assert_eq!(out["sends"][0]["stubbed"], false, "{out}");
    assert_eq!(out["sends"][0]["body"], r#"{"result":"ok"}"#, "{out}");
    let got = receiver.requests();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].header("authorization"), Some("Bearer crm-secret"));

    // Without any hub.toml, --grant gives a stand-in, and the folder stays empty.
    let bare = tempfile::tempdir().expect("temp dir");
    std::fs::copy(here.join("event.json"), bare.path().join("event.json")).expect("copy event");
    let o = hub_async(
        bare.path(),
        &[
            "plugin",
            "test",
            fault,
            "event.json",
            "--grant",
            "crm",
            "--plugin-config",
            send,
        ],
    )
    .await;
    assert_eq!(json_out(&o)["sends"][0]["stubbed"], true);
    assert_eq!(listing(bare.path()), ["event.json"]);
    assert_eq!(
        receiver.requests().len(),
        1,
        "a send without hub.toml went out"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_logged_event_is_test_input_and_plugin_kv_lists_a_plugins_keys() {
    let extra = plugin_toml(
        "counter",
        "fault",
        "kv = true",
        "fault = \"kv_flood\"\ncount = 2\nsize_bytes = 3",
    ) + &route_toml("\"channel.customer_message\"", "\"counter\"", "skip");
    let hub = TestHub::start_with(HubOptions {
        extra_toml: extra,
        ..HubOptions::default()
    })
    .await;
    let ch = hub
        .create_channel("shop", "http://127.0.0.1:9/unused", false, &[])
        .await;
    hub.say(&ch, json!(7), "where is my order?").await;
    let logged = hub
        .store()
        .events_of_kind("channel.customer_message", 1)
        .await
        .expect("events");
    let id = logged[0].id.to_string();
    let TestHub { running, dir, .. } = hub;
    running.expect("running").shutdown().await;
    let here = dir.path();

    let row = json_out(&hub_async(here, &["events", "show", &id]).await);
    assert_eq!(row["id"], id.as_str());
    assert_eq!(row["payload"]["message"]["text"], "where is my order?");

    let as_event = hub_async(here, &["events", "show", &id, "--as-event"]).await;
    let file = json_out(&as_event);
    assert_eq!(file["kind"], "channel.customer_message", "{file}");
    assert_eq!(file["channel"], "shop", "{file}");
    assert!(file.get("id").is_none(), "{file}");
    // What plugins are told besides the payload, as it is now: nobody online.
    assert_eq!(file["context"], json!({ "agents_online": 0 }), "{file}");
    assert!(
        stderr_of(&as_event).contains("context.agents_online"),
        "{}",
        stderr_of(&as_event)
    );
    std::fs::write(here.join("captured.json"), &as_event.stdout).expect("write event");
    let tried = json_out(&hub_async(here, &["plugin", "test", "counter", "captured.json"]).await);
    assert_eq!(tried["outcome"], "continue", "{tried}");
    assert_eq!(
        tried["kv_writes"].as_object().map(|w| w.len()),
        Some(2),
        "{tried}"
    );

    let missing = hub_async(here, &["events", "show", "no-such-event"]).await;
    assert!(!missing.status.success());
    assert!(
        stderr_of(&missing).contains("no-such-event"),
        "{}",
        stderr_of(&missing)
    );

    let lines = stdout_of(&hub_async(here, &["plugin", "kv", "counter", "--json"]).await);
    let entries: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let keys: Vec<&str> = entries.iter().filter_map(|e| e["key"].as_str()).collect();
    assert_eq!(keys, [format!("{id}-0"), format!("{id}-1")], "{lines}");
    assert!(entries.iter().all(|e| e["value"] == "vvv"), "{lines}");
    let table = stdout_of(&hub_async(here, &["plugin", "kv", "counter"]).await);
    assert!(table.contains(&format!("{id}-0\tvvv")), "{table}");
}

/// What a long-running `hub` child wrote so far, stdout and stderr together.
fn collect(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::Read;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let pipes: Vec<Box<dyn Read + Send>> = vec![
        Box::new(child.stdout.take().expect("stdout")),
        Box::new(child.stderr.take().expect("stderr")),
    ];
    for mut pipe in pipes {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .expect("output")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn plugin_test_watch_runs_again_when_the_event_or_the_sources_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    let here = dir.path();
    // A crate whose sources do not compile: a change to them must rebuild,
    // say that the build failed, and keep watching.
    std::fs::write(
        here.join("Cargo.toml"),
        "[package]\nname = \"watched\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[lib]\ncrate-type = [\"cdylib\"]\n",
    )
    .expect("Cargo.toml");
    std::fs::create_dir(here.join("src")).expect("src");
    std::fs::write(here.join("src/lib.rs"), "pub fn f() {}\n").expect("lib.rs");
    let event = |text: &str| {
        json!({ "kind": "channel.customer_message",
                "payload": { "sender": { "id": 1 }, "message": { "type": "text", "text": text } } })
        .to_string()
    };
    std::fs::write(
        here.join("event.json"),
        event("first write to bob@example.com"),
    )
    .expect("event");
    let wasm = plugin_wasm("redact");
    let mut command = Command::new(env!("CARGO_BIN_EXE_hub"));
    for var in hub::config::ENV_OVERRIDES {
        command.env_remove(var);
    }
    let mut child = command
        .current_dir(here)
        .arg("plugin")
        .arg("test")
        .arg(&wasm)
        .args(["event.json", "--watch"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn hub plugin test --watch");
    let seen = collect(&mut child);
    let wait = std::time::Duration::from_secs(60);
    let output = || seen.lock().expect("output").clone();
    crate::support::eventually(wait, "the first run", || async {
        let out = output();
        (out.contains("first write to") && out.contains("watching")).then_some(())
    })
    .await;
    assert!(!output().contains("bob@example.com"), "{}", output());

    std::fs::write(here.join("event.json"), event("second call +49 30 1234567")).expect("event");
    crate::support::eventually(wait, "the run after the event changed", || async {
        output().contains("second call").then_some(())
    })
    .await;
    assert!(!output().contains("1234567"), "{}", output());

    std::fs::write(here.join("src/lib.rs"), "pub fn f( {}\n").expect("lib.rs");
    crate::support::eventually(wait, "the rebuild that fails", || async {
        let out = output();
        (out.contains("change in the sources") && out.contains("the build failed")).then_some(())
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
}

/// Where the address space is limited (`ulimit -v`), plugin memories cannot
/// reserve 4 GiB each: the hub says so, reserves only what a plugin may use,
/// and plugins run the same.
#[test]
fn plugins_run_where_the_address_space_is_limited() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("event.json"),
        json!({ "kind": "channel.customer_message",
                "payload": { "sender": { "id": 1 },
                             "message": { "type": "text", "text": "card 4111 1111 1111 1111" } } })
        .to_string(),
    )
    .expect("write event");
    let redact = plugin_wasm("redact");
    let redact = redact.to_str().expect("utf-8 path");
    // `hub plugin test` has 4 call slots: ~32 GiB of address space with
    // guard regions, ~4 GiB without; 16 GiB allows only the second.
    let mut shell = Command::new("sh");
    shell.args([
        "-c",
        "ulimit -v 16777216 && exec \"$0\" \"$@\"",
        env!("CARGO_BIN_EXE_hub"),
    ]);
    let limited = hub_command(shell, dir.path(), &["plugin", "test", redact, "event.json"])
        .output()
        .expect("run hub under ulimit -v");
    let out = json_out(&limited);
    assert_eq!(out["outcome"], "continue", "{out}");
    assert_eq!(out["payload"]["message"]["text"], "card [card]", "{out}");
    assert!(
        stderr_of(&limited).contains("cannot reserve 4 GiB of address space"),
        "the fallback is logged: {}",
        stderr_of(&limited)
    );

    // Without the limit, the same call and no such warning.
    let free = hub_in(dir.path(), &["plugin", "test", redact, "event.json"]);
    assert_eq!(json_out(&free)["payload"], out["payload"]);
    assert!(
        !stderr_of(&free).contains("cannot reserve"),
        "{}",
        stderr_of(&free)
    );
}
