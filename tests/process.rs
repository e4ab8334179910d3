//! The real `hub` binary: a crash and a SIGTERM in the middle of deliveries,
//! the `check`, `channel` and `agent` commands, and the `HUB_*` environment overrides.
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{
    HubOptions, HubProcess, Integrator, Reply, TestAgent, TestChannel, admin_create, eventually,
    write_config,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
const AGENT_EMAIL: &str = "ann@example.com";

/// The `hub` binary without the developer's own `HUB_*` variables; a test sets the ones it means.
fn hub_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hub"));
    for var in hub::config::ENV_OVERRIDES {
        command.env_remove(var);
    }
    command
}

/// Runs `hub --config <config> <args…>` to its end, with extra environment.
fn hub_cli(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    hub_command()
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run hub")
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON a successful command printed.
fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "hub failed: {}", stderr_of(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// A fresh directory with a `hub.toml` listening on a free port.
fn setup(opts: &HubOptions) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), opts, "127.0.0.1:0");
    (dir, config)
}

/// `hub serve` on `config`, once it listens.
async fn serve(config: &Path) -> HubProcess {
    let config = config.to_owned();
    tokio::task::spawn_blocking(move || HubProcess::spawn(&config))
        .await
        .expect("spawn hub")
}

/// Waits for the process to exit on its own.
async fn exit_of(p: &mut HubProcess, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = p.child.try_wait().expect("wait for hub") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "hub still running after {timeout:?}:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn agent_at(base: &str, token: &str) -> TestAgent {
    TestAgent {
        id: 0,
        token: token.to_owned(),
        base: base.to_owned(),
        http: reqwest::Client::new(),
    }
}

/// An agent and a channel to `endpoint` made through the hub's admin API, and a
/// chat opened by customer 7; returns the agent, the chat id and the channel.
async fn open_chat(base: &str, endpoint: &str) -> (TestAgent, i64, TestChannel) {
    let agent = admin_create(
        base,
        "agents",
        json!({ "name": "Ann", "email": AGENT_EMAIL }),
    )
    .await;
    let ch = admin_create(
        base,
        "channels",
        json!({ "name": "shop", "customer_endpoint": endpoint, "agents": [AGENT_EMAIL] }),
    )
    .await;
    let str_of = |k: &str| ch[k].as_str().expect("channel field").to_owned();
    let ch = TestChannel {
        public_id: str_of("public_id"),
        endpoint_url: str_of("endpoint_url"),
        status_url: str_of("status_url"),
        raw: ch,
    };
    say(&ch.endpoint_url, "hello").await;
    let agent = agent_at(base, agent["token"].as_str().expect("token"));
    let chats = agent.chats().await;
    assert_eq!(chats.len(), 1, "{chats:?}");
    (agent, chats[0]["id"].as_i64().expect("chat id"), ch)
}

/// Customer 7 writes `text` to the channel endpoint at `url`.
async fn say(url: &str, text: &str) {
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json; charset=utf-8")
        .body(
            json!({ "sender": { "id": 7 }, "message": { "type": "text", "text": text } })
                .to_string(),
        )
        .send()
        .await
        .expect("customer request");
    assert_eq!(resp.status(), 200);
}

/// The delivery state of the message `uid` in the chat view.
async fn delivery_of(agent: &TestAgent, chat_id: i64, uid: &Value) -> Value {
    agent.chat(chat_id).await["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["uid"] == *uid))
        .map(|m| m["delivery"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_in_the_middle_of_retries_resends_the_same_delivery() {
    let (_dir, config) = setup(&HubOptions {
        attempts: 3,
        retry_interval_ms: 1000,
        attempt_timeout_ms: 1000,
        // On PostgreSQL a row the dead process held waits out its lease
        // (longer than the 10 s webhook timeout, shorter than WAIT).
        lease_ms: 11_000,
        ..HubOptions::default()
    });
    let integrator = Integrator::start().await;
    integrator.set_default(Reply::json(500, "down"));
    let mut first = serve(&config).await;
    let (agent, chat_id, _ch) = open_chat(&first.base, &integrator.url).await;
    let sent = agent.reply(chat_id, "survive this").await;
    let attempt1 = integrator.wait_for(1, WAIT).await.remove(0);
    first.kill();

    integrator.set_default(Reply::ok());
    let seen = integrator.requests().len();
    let second = serve(&config).await;
    let agent = TestAgent {
        base: second.base.clone(),
        ..agent
    };
    let resent = integrator.wait_for(seen + 1, WAIT).await.remove(seen);
    assert!(
        attempt1.header("x-hub-delivery").is_some()
            && resent.header("x-hub-delivery") == attempt1.header("x-hub-delivery"),
        "the delivery id changed across the crash: {:?} then {:?}",
        attempt1.header("x-hub-delivery"),
        resent.header("x-hub-delivery")
    );
    assert_eq!(resent.json()["message"]["id"], sent["uid"]);
    assert_eq!(resent.body, attempt1.body);
    let agent_ref = &agent;
    let uid = &sent["uid"];
    eventually(WAIT, "delivered after the restart", || async move {
        (delivery_of(agent_ref, chat_id, uid).await == "delivered").then_some(())
    })
    .await;
    // Nothing is sent again once it was delivered.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        integrator.requests().len(),
        seen + 1,
        "sent again after success"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_delivery_in_flight_finish() {
    let grace_ms = 5000;
    let (_dir, config) = setup(&HubOptions {
        attempt_timeout_ms: 4000,
        shutdown_grace_ms: grace_ms,
        ..HubOptions::default()
    });
    let integrator = Integrator::start().await;
    integrator.script([Reply::ok().delayed(Duration::from_millis(1500))]);
    let mut hub = serve(&config).await;
    let (agent, chat_id, _ch) = open_chat(&hub.base, &integrator.url).await;
    let sent = agent.reply(chat_id, "before the stop").await;
    integrator.wait_for(1, WAIT).await;

    let stop = Instant::now();
    hub.terminate();
    let status = exit_of(&mut hub, Duration::from_millis(grace_ms + 5000)).await;
    let took = stop.elapsed();
    assert!(status.success(), "exit {status:?}:\n{}", hub.log());
    assert!(
        took >= Duration::from_millis(1000),
        "exited {took:?} after SIGTERM, before the integrator answered"
    );
    assert!(
        took <= Duration::from_millis(grace_ms + 1000),
        "exit took {took:?}"
    );
    assert!(!hub.log().contains("grace ran out"), "{}", hub.log());

    // The answer was recorded: after a restart the message is delivered and not re-sent.
    let again = serve(&config).await;
    let agent = TestAgent {
        base: again.base.clone(),
        ..agent
    };
    assert_eq!(
        delivery_of(&agent, chat_id, &sent["uid"]).await,
        "delivered"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(integrator.requests().len(), 1, "re-sent after the restart");
}

#[tokio::test(flavor = "multi_thread")]
async fn hub_check_names_every_problem_and_the_file() {
    let (dir, good) = setup(&HubOptions::default());
    let o = hub_cli(&good, &["check"], &[]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ok"));

    let unknown = dir.path().join("bad.toml");
    std::fs::write(&unknown, "[server]\nlisen = \"127.0.0.1:8080\"\n").expect("write");
    let o = hub_cli(&unknown, &["check"], &[]);
    assert!(!o.status.success(), "an unknown key passed");
    let err = stderr_of(&o);
    assert!(err.contains("lisen"), "{err}");
    assert!(err.contains(&unknown.display().to_string()), "{err}");

    let two = dir.path().join("two.toml");
    std::fs::write(
        &two,
        "[[channels]]\nname = \"shop\"\ncustomer_endpoint = \"ftp://files.example.com\"\n\
         agents = [\"ann.example.com\"]\n",
    )
    .expect("write");
    let o = hub_cli(&two, &["check"], &[]);
    assert!(!o.status.success(), "two problems passed");
    let err = stderr_of(&o);
    for needle in [
        "channels[0].customer_endpoint",
        "ftp://files.example.com",
        "channels[0].agents[0]",
        "ann.example.com",
        two.display().to_string().as_str(),
    ] {
        assert!(err.contains(needle), "`{needle}` missing from:\n{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn channels_and_agents_made_on_the_command_line_work() {
    let (_dir, config) = setup(&HubOptions::default());
    let created = json_out(&hub_cli(
        &config,
        &[
            "channel",
            "create",
            "--name",
            "shop",
            "--endpoint",
            "https://integrator.example.com/hub",
            "--agent",
            AGENT_EMAIL,
            "--chunked",
            "--json",
        ],
        &[],
    ));
    assert_eq!(created["name"], "shop");
    assert_eq!(
        created["customer_endpoint"],
        "https://integrator.example.com/hub"
    );
    assert_eq!(created["chunked"], true);
    assert_eq!(created["agents"], json!([AGENT_EMAIL]));
    let public_id = created["public_id"].as_str().expect("public_id");
    let endpoint_url = created["endpoint_url"].as_str().expect("endpoint_url");
    assert!(endpoint_url.starts_with("http://"), "{endpoint_url}");
    assert!(
        endpoint_url.ends_with(&format!("/{public_id}")),
        "{endpoint_url}"
    );
    assert_eq!(created["status_url"], format!("{endpoint_url}/status"));

    let listed = json_out(&hub_cli(&config, &["channel", "list", "--json"], &[]));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["public_id"], public_id);
    assert_eq!(listed[0]["endpoint_url"], endpoint_url);

    let agent = json_out(&hub_cli(
        &config,
        &[
            "agent",
            "create",
            "--name",
            "Ann",
            "--email",
            AGENT_EMAIL,
            "--json",
        ],
        &[],
    ));
    assert_eq!(agent["email"], AGENT_EMAIL);
    let token = agent["token"].as_str().expect("token");
    assert!(token.len() >= 16, "{token}");
    let agents = json_out(&hub_cli(&config, &["agent", "list", "--json"], &[]));
    assert_eq!(agents[0]["email"], AGENT_EMAIL);
    assert!(
        agents[0].get("token").is_none(),
        "the token was shown again"
    );

    let o = hub_cli(
        &config,
        &[
            "channel",
            "create",
            "--name",
            "files",
            "--endpoint",
            "ftp://files.example.com",
        ],
        &[],
    );
    assert!(!o.status.success(), "a non-http endpoint was accepted");
    let err = stderr_of(&o);
    assert!(
        err.contains("ftp://files.example.com") && err.contains("http"),
        "{err}"
    );
    let listed = json_out(&hub_cli(&config, &["channel", "list", "--json"], &[]));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");

    // The served hub knows both: customer messages reach the CLI-made agent.
    let hub = serve(&config).await;
    let path_at = endpoint_url
        .get("http://".len()..)
        .and_then(|rest| rest.find('/'))
        .map(|i| i + "http://".len())
        .expect("a path in the endpoint URL");
    say(
        &format!("{}{}", hub.base, &endpoint_url[path_at..]),
        "via the CLI channel",
    )
    .await;
    let agent = agent_at(&hub.base, token);
    let chats = agent.chats().await;
    assert_eq!(chats.len(), 1, "{chats:?}");
    assert_eq!(chats[0]["channel"], "shop");
}

/// `hub serve` with `HUB_*` variables set; ready once `/healthz` answers at `listen`.
async fn serve_with_env(config: &Path, listen: &str, env: &[(&str, &str)]) -> HubProcess {
    let log = std::fs::File::create(config.with_file_name("serve.log")).expect("log file");
    let child = hub_command()
        .args(["serve", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn hub");
    let base = format!("http://{listen}");
    let http = reqwest::Client::new();
    let health = format!("{base}/healthz");
    eventually(WAIT, "hub serve at the HUB_LISTEN address", || {
        let req = http.get(&health).send();
        async move { req.await.ok().filter(|r| r.status() == 200).map(|_| ()) }
    })
    .await;
    HubProcess {
        child,
        base,
        stderr: Arc::new(Mutex::new(Vec::new())),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn environment_overrides_are_honoured_by_serve() {
    let (dir, config) = setup(&HubOptions::default());
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .to_string();
    let other_db = dir.path().join("other.db");
    let other_url = format!("sqlite://{}", other_db.display());
    let env = [
        ("HUB_LISTEN", listen.as_str()),
        ("HUB_DATABASE_URL", other_url.as_str()),
    ];
    let mut hub = serve_with_env(&config, &listen, &env).await;
    let ch = admin_create(
        &hub.base,
        "channels",
        json!({ "name": "env-shop", "customer_endpoint": "https://integrator.example.com/hub" }),
    )
    .await;
    let endpoint_url = ch["endpoint_url"].as_str().unwrap_or_default();
    assert!(
        endpoint_url.starts_with(&format!("http://{listen}/")),
        "{endpoint_url}"
    );
    hub.kill();

    assert!(other_db.exists(), "HUB_DATABASE_URL was not used");
    let names = |o: &Output| -> Vec<Value> {
        json_out(o)
            .as_array()
            .map(|a| a.iter().map(|c| c["name"].clone()).collect())
            .unwrap_or_default()
    };
    let in_file_db = names(&hub_cli(&config, &["channel", "list", "--json"], &[]));
    assert!(
        in_file_db.is_empty(),
        "the channel went to the file's database: {in_file_db:?}"
    );
    let in_env_db = names(&hub_cli(
        &config,
        &["channel", "list", "--json"],
        &[("HUB_DATABASE_URL", other_url.as_str())],
    ));
    assert_eq!(in_env_db, vec![json!("env-shop")]);
}

/// A config with the redact plugin wired on customer messages.
fn redact_options() -> HubOptions {
    HubOptions {
        extra_toml: crate::support::plugin_toml("redact", "redact", "", "")
            + &crate::support::route_toml("\"channel.customer_message\"", "\"redact\"", "skip"),
        ..HubOptions::default()
    }
}

#[tokio::test]
async fn hub_check_loads_every_plugin_and_names_the_broken_ones() {
    let (dir, config) = setup(&redact_options());
    let ok = hub_cli(&config, &["check"], &[]);
    assert!(ok.status.success(), "{}", stderr_of(&ok));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("ok (1 plugins)"));

    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm not really").expect("write junk");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!(
            "{text}\n[[plugins]]\nname = \"junk\"\npath = \"junk.wasm\"\n\n\
             [[plugins]]\nname = \"gone\"\npath = \"gone.wasm\"\n"
        ),
    )
    .expect("write config");
    let bad = hub_cli(&config, &["check"], &[]);
    assert!(!bad.status.success());
    let err = stderr_of(&bad);
    assert!(
        err.contains("plugin `junk`") && err.contains("not a usable component"),
        "{err}"
    );
    assert!(
        err.contains("plugin `gone`") && err.contains("gone.wasm"),
        "{err}"
    );
}

#[tokio::test]
async fn hub_check_refuses_a_plugin_not_granted_what_it_needs_naming_the_grant_and_the_line() {
    // faq-bot without `kv = true` would answer, but never greet and never
    // hand a chat over; redact needs nothing.
    let opts = HubOptions {
        extra_toml: crate::support::plugin_toml("redact", "redact", "", "")
            + &crate::support::plugin_toml("faq-bot", "faq_bot", "kv = false", ""),
        ..HubOptions::default()
    };
    let (_dir, config) = setup(&opts);
    let o = hub_cli(&config, &["check"], &[]);
    assert!(!o.status.success(), "hub check passed faq-bot without kv");
    let text = std::fs::read_to_string(&config).expect("config");
    let kv_line = text
        .lines()
        .position(|l| l == "kv = false")
        .expect("the kv line")
        + 1;
    let err = stderr_of(&o);
    let expected = format!(
        "{}: plugins[1].kv: plugin `faq-bot` needs key-value storage, which its entry does not \
         grant: set `kv = true` (line {kv_line})",
        config.display()
    );
    assert!(err.contains(&expected), "{expected}\nis not in\n{err}");
    assert!(!err.contains("redact"), "redact needs nothing: {err}");

    // `hub plugin test` runs the plugin anyway, and tells the author.
    let event = config.with_file_name("event.json");
    std::fs::write(
        &event,
        json!({ "kind": "channel.customer_message",
                "payload": { "sender": { "id": 1 },
                             "message": { "type": "text", "text": "hello" } } })
        .to_string(),
    )
    .expect("write event");
    let event = event.to_str().expect("utf-8 path");
    let o = hub_cli(
        &config,
        &["plugin", "test", "faq-bot", "--event", event],
        &[],
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let notes = stderr_of(&o);
    for needle in [
        "note: the plugin needs key-value storage, which this run does not grant",
        "note: `hub check` refuses hub.toml: plugins[1].kv: plugin `faq-bot` needs key-value storage",
    ] {
        assert!(notes.contains(needle), "`{needle}` missing from:\n{notes}");
    }

    std::fs::write(&config, text.replace("kv = false", "kv = true")).expect("write config");
    let o = hub_cli(&config, &["check"], &[]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("ok (2 plugins)"));
}

#[tokio::test]
async fn hub_plugin_test_runs_one_plugin_on_a_recorded_event() {
    let (dir, config) = setup(&redact_options());
    let event = dir.path().join("event.json");
    std::fs::write(
        &event,
        json!({ "kind": "channel.customer_message",
                "payload": { "sender": { "id": 1 },
                             "message": { "type": "text", "text": "write to bob@example.com" } } })
        .to_string(),
    )
    .expect("write event");
    let event = event.to_str().expect("utf-8 path");

    let by_name = json_out(&hub_cli(
        &config,
        &["plugin", "test", "redact", "--event", event],
        &[],
    ));
    assert_eq!(by_name["outcome"], "continue");
    assert_eq!(by_name["changed"], true);
    assert_eq!(by_name["payload"]["message"]["text"], "write to [email]");

    let fault = crate::support::plugin_wasm("fault");
    let fault = fault.to_str().expect("utf-8 path");
    let by_path = json_out(&hub_cli(
        &config,
        &[
            "plugin",
            "test",
            fault,
            "--event",
            event,
            "--plugin-config",
            r#"{"fault": "drop", "reason": "not today"}"#,
        ],
        &[],
    ));
    assert_eq!(by_path["outcome"], "drop");
    assert_eq!(by_path["reason"], "not today");

    let trapped = hub_cli(
        &config,
        &[
            "plugin",
            "test",
            fault,
            "--event",
            event,
            "--plugin-config",
            r#"{"fault": "trap"}"#,
        ],
        &[],
    );
    assert!(!trapped.status.success());
    assert!(
        stderr_of(&trapped).contains("(trap)"),
        "{}",
        stderr_of(&trapped)
    );
}

#[tokio::test]
async fn sighup_reloads_plugins_without_a_restart() {
    let integrator = Integrator::start().await;
    let (_dir, config) = setup(&HubOptions::default());
    let hub = serve(&config).await;
    let (agent, chat, ch) = open_chat(&hub.base, &integrator.url).await;

    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, format!("{text}\n{}", redact_options().extra_toml))
        .expect("write config");
    let status = Command::new("kill")
        .args(["-HUP", &hub.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    eventually(WAIT, "the reload", || async {
        hub.log().contains("reloaded").then_some(())
    })
    .await;
    say(&ch.endpoint_url, "mail bob@example.com").await;
    let view = agent.chat(chat).await;
    assert_eq!(
        view["messages"][1]["body"]["text"], "mail [email]",
        "{view}"
    );
    assert!(hub.log().contains("plugins loaded"), "{}", hub.log());
}

#[tokio::test]
async fn the_default_hub_toml_is_valid_and_wires_the_redact_plugin() {
    // Builds the example plugins where the default configuration expects them.
    crate::support::plugin_wasm("redact");
    let config = crate::support::repo_root().join("hub.toml");
    let out = hub_cli(&config, &["check"], &[]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 plugins)"));
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_mid_attempt_the_restarted_hub_retries_at_once_with_the_next_attempt_number() {
    if crate::support::skip_on_postgres(
        "other instances may hold live leases there, so a restarted instance waits out its \
         dead self's lease (instances:: tests the take-over)",
    ) {
        return;
    }
    // A slow integrator keeps the first attempt in flight when the hub dies;
    // its lease (`[delivery] lease_ms`, 30 s) must not hold the chat: a single
    // instance on SQLite gives every lease back at start.
    let (_dir, config) = setup(&HubOptions {
        attempts: 3,
        retry_interval_ms: 5000,
        attempt_timeout_ms: 5000,
        ..HubOptions::default()
    });
    let integrator = Integrator::start().await;
    integrator.set_default(Reply::ok().delayed(Duration::from_secs(30)));
    let mut first = serve(&config).await;
    let (agent, chat_id, _ch) = open_chat(&first.base, &integrator.url).await;
    let sent = agent.reply(chat_id, "in flight when the hub dies").await;
    let attempt1 = integrator.wait_for(1, WAIT).await.remove(0);
    assert_eq!(attempt1.header("x-hub-attempt"), Some("1"));
    first.kill();

    integrator.set_default(Reply::ok());
    let second = serve(&config).await;
    let restarted = Instant::now();
    let resent = integrator.wait_for(2, WAIT).await.remove(1);
    let waited = restarted.elapsed();
    assert!(
        waited < Duration::from_secs(8),
        "the chat waited {waited:?} for a dead process's lease"
    );
    assert_eq!(
        resent.header("x-hub-delivery"),
        attempt1.header("x-hub-delivery")
    );
    assert_eq!(
        resent.header("x-hub-attempt"),
        Some("2"),
        "the attempt cut off by the crash counts"
    );
    let agent = TestAgent {
        base: second.base.clone(),
        ..agent
    };
    let agent_ref = &agent;
    let uid = &sent["uid"];
    eventually(WAIT, "delivered after the restart", || async move {
        (delivery_of(agent_ref, chat_id, uid).await == "delivered").then_some(())
    })
    .await;
}

/// The short mode of `cargo bench -p hub --bench containment`: each hostile
/// plugin on one channel of a real `hub serve` beside ordinary traffic on
/// another. Asserted here is what cannot flake (every ordinary message
/// stored, `/healthz` answering, the failure counted by kind, the log
/// bounded and unforgeable); the latency ratios are the benchmark's figures.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_plugins_on_a_served_hub_leave_the_other_channel_whole() {
    let scenarios = [
        ("fault = \"loop\"", "", "timeout"),
        (
            "fault = \"log_flood\"\ncount = 400",
            "max_host_calls = 1000",
            "",
        ),
        (
            "fault = \"error\"\nmessage = \"secret=hunter2\\nFAKE hub line\"",
            "",
            "failed",
        ),
        (
            "fault = \"kv_flood\"\ncount = 200\nsize_bytes = 1024",
            "kv = true\nkv_max_bytes = 65536",
            "",
        ),
    ];
    for (config_table, limits, kind) in scenarios {
        let wiring = format!(
            "[[plugins]]\nname = \"hostile\"\npath = \"{}\"\n{limits}\n[plugins.config]\n{config_table}\n\n\
             [[routes]]\nevents = [\"channel.customer_message\"]\nchannels = [\"hostile\"]\n\
             plugins = [\"hostile\"]\non_error = \"skip\"\n",
            crate::support::plugin_wasm("fault").display()
        );
        let (_dir, config) = setup(&HubOptions {
            extra_toml: wiring,
            ..HubOptions::default()
        });
        let hub = serve(&config).await;
        let base = hub.base.clone();
        let ann = admin_create(
            &base,
            "agents",
            json!({ "name": "Ann", "email": AGENT_EMAIL }),
        )
        .await;
        let mut endpoints = Vec::new();
        for name in ["hostile", "ordinary"] {
            let ch = admin_create(
                &base,
                "channels",
                json!({ "name": name, "customer_endpoint": "http://127.0.0.1:9/hook", "agents": [AGENT_EMAIL] }),
            )
            .await;
            endpoints.push(ch["endpoint_url"].as_str().expect("endpoint").to_owned());
        }
        let http = reqwest::Client::new();
        let post = |url: String, sender: u64, text: String| {
            let http = http.clone();
            async move {
                http.post(url)
                    .json(&json!({ "sender": { "id": sender }, "message": { "type": "text", "text": text } }))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16())
            }
        };
        let hostile = futures_util::future::join_all(
            (0..4).map(|i| post(endpoints[0].clone(), 100 + i, format!("h{i}"))),
        );
        let ordinary = async {
            let mut codes = Vec::new();
            for i in 0..20 {
                codes.push(post(endpoints[1].clone(), 7, format!("m{i}")).await);
                let health = http.get(format!("{base}/healthz")).send().await;
                assert!(
                    health.is_ok_and(|r| r.status() == 200),
                    "{config_table}: /healthz"
                );
            }
            codes
        };
        let (hostile, ordinary) = tokio::join!(hostile, ordinary);
        assert!(
            hostile.iter().all(|c| *c == 200),
            "{config_table}: {hostile:?}"
        );
        assert!(
            ordinary.iter().all(|c| *c == 200),
            "{config_table}: {ordinary:?}"
        );
        let agent = agent_at(&base, ann["token"].as_str().expect("token"));
        let mut ordinary_texts = 0;
        for chat in agent.chats().await {
            let id = chat["id"].as_i64().expect("chat id");
            ordinary_texts += agent.chat(id).await["messages"].as_array().map_or(0, |m| {
                m.iter()
                    .filter(|m| {
                        m["body"]["text"]
                            .as_str()
                            .is_some_and(|t| t.starts_with('m'))
                    })
                    .count()
            });
        }
        assert_eq!(
            ordinary_texts, 20,
            "{config_table}: every ordinary message is stored"
        );
        let metrics = http
            .get(format!("{base}/metrics"))
            .bearer_auth(crate::support::ADMIN_TOKEN)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        if !kind.is_empty() {
            let counted = format!("hub_plugin_errors_total{{plugin=\"hostile\",kind=\"{kind}\"}} ");
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with(&counted) && !l.ends_with(" 0")),
                "{config_table}: counted as {kind}"
            );
        }
        if config_table.contains("kv_flood") {
            assert!(
                metrics.lines().any(|l| l
                    .starts_with("hub_plugin_quota_refusals_total{plugin=\"hostile\"}")
                    && !l.ends_with(" 0")),
                "{config_table}: writes past kv_max_bytes refused"
            );
        }
        let log = hub.log();
        assert!(
            !log.lines().any(|l| l.starts_with("FAKE")),
            "{config_table}: a plugin forged a log line"
        );
        assert!(!log.contains("hunter2\n"), "{config_table}");
        assert!(
            log.len() < 512 * 1024,
            "{config_table}: {} bytes of log",
            log.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn widgets_and_bots_made_on_the_command_line_show_what_to_embed_and_where_providers_post() {
    let (_dir, config) = setup(&HubOptions::default());
    let widget = json_out(&hub_cli(
        &config,
        &[
            "channel",
            "create",
            "--type",
            "widget",
            "--name",
            "site",
            "--widget-id",
            "site-widget-1",
            "--color",
            "#6d4c41",
            "--agent",
            AGENT_EMAIL,
            "--json",
        ],
        &[],
    ));
    assert_eq!(widget["type"], "widget", "{widget}");
    assert_eq!(widget["widget"]["widget_id"], "site-widget-1");
    assert_eq!(widget["widget"]["color"], "#6d4c41");
    let embed = widget["widget"]["embed"].as_str().expect("embed");
    assert!(
        embed.starts_with("<script src=\"//") && embed.contains("/widget/site-widget-1"),
        "{embed}"
    );
    let o = hub_cli(
        &config,
        &["channel", "create", "--type", "kiosk", "--name", "k"],
        &[],
    );
    assert!(!o.status.success(), "an unknown channel type was accepted");
    assert!(stderr_of(&o).contains("kiosk"), "{}", stderr_of(&o));

    let bot = json_out(&hub_cli(
        &config,
        &[
            "bot",
            "create",
            "--name",
            "Assistant",
            "--endpoint",
            "https://bots.example.com/hub",
            "--token",
            "tok-1",
            "--channel",
            "site",
            "--json",
        ],
        &[],
    ));
    let provider_id = bot["provider_id"].as_str().expect("provider_id");
    assert!(provider_id.len() >= 12, "{provider_id}");
    for (key, door) in [("webhooks_url", "webhooks"), ("providers_url", "providers")] {
        assert!(
            bot[key]
                .as_str()
                .is_some_and(|u| u.ends_with(&format!("/{door}/{provider_id}/tok-1"))),
            "{bot}"
        );
    }
    // A plugin bot takes no provider requests: no URLs to show.
    let text = hub_cli(
        &config,
        &["bot", "create", "--name", "Help", "--plugin", "faq-bot"],
        &[],
    );
    assert!(text.status.success(), "{}", stderr_of(&text));
    let listed = json_out(&hub_cli(&config, &["bot", "list", "--json"], &[]));
    let names: Vec<&str> = listed
        .as_array()
        .expect("bots")
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(names, ["Assistant", "Help"]);
    assert_eq!(listed[0]["channels"], json!(["site"]));
    assert!(listed[0].get("token").is_none(), "the token is not shown");
    let deleted = hub_cli(&config, &["bot", "delete", "Help"], &[]);
    assert!(deleted.status.success(), "{}", stderr_of(&deleted));
    let listed = json_out(&hub_cli(&config, &["bot", "list", "--json"], &[]));
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
}

/// Runs `hub --config <config> <args…>` with `input` on its standard input.
fn hub_cli_stdin(config: &Path, args: &[&str], input: &str) -> Output {
    use std::io::Write as _;
    let mut child = hub_command()
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hub");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("hub output")
}

/// The status of a console sign-in.
async fn console_sign_in(base: &str, email: &str, password: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/console/v1/session"))
        .json(&json!({ "email": email, "password": password }))
        .send()
        .await
        .expect("sign-in");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn console_passwords_set_on_the_command_line_sign_agents_in() {
    let (_dir, config) = setup(&HubOptions::default());
    // Only the first line is the password; what follows is ignored.
    let created = json_out(&hub_cli_stdin(
        &config,
        &[
            "agent",
            "create",
            "--name",
            "Ann",
            "--email",
            AGENT_EMAIL,
            "--password-stdin",
            "--admin",
            "--json",
        ],
        "first secret line\nsecond line\n",
    ));
    assert_eq!(created["admin"], true, "{created}");
    let o = hub_cli_stdin(
        &config,
        &[
            "agent",
            "create",
            "--name",
            "Bo",
            "--email",
            "bo@example.com",
            "--password-stdin",
        ],
        "short\n",
    );
    assert!(!o.status.success(), "a short password was accepted");
    assert!(stderr_of(&o).contains("at least 8"), "{}", stderr_of(&o));
    let o = hub_cli_stdin(
        &config,
        &[
            "agent",
            "set-password",
            "--email",
            "nobody@example.com",
            "--password-stdin",
        ],
        "long enough\n",
    );
    assert!(!o.status.success());
    assert!(
        stderr_of(&o).contains("nobody@example.com"),
        "{}",
        stderr_of(&o)
    );

    let hub = serve(&config).await;
    let (status, v) = console_sign_in(&hub.base, AGENT_EMAIL, "first secret line").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["agent"]["admin"], true);
    assert_eq!(
        console_sign_in(&hub.base, AGENT_EMAIL, "second line")
            .await
            .0,
        401
    );

    let o = hub_cli_stdin(
        &config,
        &[
            "agent",
            "set-password",
            "--email",
            "ANN@example.com",
            "--password-stdin",
        ],
        "a brand new one\r\n",
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert_eq!(
        console_sign_in(&hub.base, AGENT_EMAIL, "first secret line")
            .await
            .0,
        401
    );
    assert_eq!(
        console_sign_in(&hub.base, AGENT_EMAIL, "a brand new one")
            .await
            .0,
        200
    );
    let o = hub_cli_stdin(
        &config,
        &["agent", "set-password", "--email", AGENT_EMAIL],
        "",
    );
    assert!(!o.status.success(), "set-password without --password-stdin");
}

#[tokio::test(flavor = "multi_thread")]
async fn hub_check_with_an_unreachable_postgresql_names_the_database_host_and_port() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A port nobody listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    for (url, password) in [
        (format!("postgres://hub@127.0.0.1:{port}/hubdb"), None),
        (
            format!("postgres://hub:s3cret@127.0.0.1:{port}/hubdb"),
            Some("s3cret"),
        ),
    ] {
        let config = dir.path().join("hub.toml");
        std::fs::write(&config, format!("[storage]\nurl = \"{url}\"\n")).expect("write");
        let started = Instant::now();
        let o = hub_cli(&config, &["check"], &[]);
        let took = started.elapsed();
        let err = stderr_of(&o);
        assert!(!o.status.success(), "a refused database passed: {err}");
        assert!(took < Duration::from_secs(120), "took {took:?}");
        for needle in [
            "storage.url",
            "hubdb",
            "127.0.0.1",
            port.to_string().as_str(),
        ] {
            assert!(err.contains(needle), "`{needle}` missing from:\n{err}");
        }
        if let Some(password) = password {
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(!err.contains(password), "the password is shown:\n{err}");
            assert!(!out.contains(password), "the password is shown:\n{out}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line_with_the_event_channel_and_chat() {
    let integrator = Integrator::start().await;
    // A delivered message is logged at `debug`: the filter docs/operations.md
    // gives for seeing each one.
    let (_dir, config) = setup(&HubOptions {
        extra_toml: "[log]\nformat = \"json\"\nlevel = \"info,hub::delivery=debug\"\n".into(),
        ..HubOptions::default()
    });
    let mut hub = serve(&config).await;
    let (agent, chat_id, _ch) = open_chat(&hub.base, &integrator.url).await;
    agent.reply(chat_id, "hi\nthere").await;
    integrator.wait_for(1, WAIT).await;
    let delivered = eventually(WAIT, "the delivery's log line", || {
        let log = hub.log();
        async move {
            log.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|r| r["fields"]["message"] == "delivered")
        }
    })
    .await;
    hub.kill();
    for line in hub.log().lines() {
        let record: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(
            record["level"].is_string() && record["timestamp"].is_string(),
            "{line}"
        );
    }
    let span = &delivered["span"];
    assert_eq!(span["name"], "delivery", "{delivered}");
    assert_eq!(span["chat"], chat_id, "{delivered}");
    assert!(span["channel"].as_i64().is_some(), "{delivered}");
    assert!(
        span["event"].as_str().is_some_and(|e| !e.is_empty()),
        "{delivered}"
    );
}

#[tokio::test]
async fn an_invalid_log_level_is_refused_naming_the_key() {
    let (_dir, config) = setup(&HubOptions {
        extra_toml: "[log]\nlevel = \"info,,=x\"\n".into(),
        ..HubOptions::default()
    });
    let o = hub_cli(&config, &["check"], &[]);
    assert!(!o.status.success(), "{}", stderr_of(&o));
    assert!(
        stderr_of(&o).contains("hub.toml: log.level: `info,,=x` is not a log filter"),
        "{}",
        stderr_of(&o)
    );
}
