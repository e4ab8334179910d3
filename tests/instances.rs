//! Several hub instances on one PostgreSQL database (only when the suite
//! runs on PostgreSQL): an agent streaming from one instance sees what
//! happens on another, and the status endpoint answers the same everywhere.

use std::time::Duration;

use serde_json::json;

use crate::support::{
    HubOptions, Integrator, TestAgent, TestHub, eventually, skip_without_postgres, storage_url,
};

const WAIT: Duration = Duration::from_secs(10);

/// A second instance on the database of `first`.
async fn beside(first: &TestHub) -> TestHub {
    let url = storage_url(first.dir.path());
    let mut second =
        TestHub::start_with_config(HubOptions::default(), move |c| c.storage.url = url).await;
    // The database outlives whichever instance ends first.
    second.databases.extend(first.databases.iter().cloned());
    second
}

/// The same agent, talking to another instance.
fn via(agent: &TestAgent, hub: &TestHub) -> TestAgent {
    TestAgent {
        base: hub.base.clone(),
        ..agent.clone()
    }
}

#[tokio::test]
async fn an_agent_on_one_instance_sees_a_message_posted_to_another_and_its_delivery() {
    if skip_without_postgres("several instances need PostgreSQL (scripts/with-postgres.sh)") {
        return;
    }
    let integrator = Integrator::start().await;
    let a = TestHub::start().await;
    let b = beside(&a).await;
    let ann = a.create_agent("Ann", "ann@example.com").await;
    let ch = a
        .create_channel("web", &integrator.url, false, &["ann@example.com"])
        .await;
    let mut stream = ann.stream().await;

    // The channel made through A takes messages at B at once.
    let on_b = ch.via(&a.base, &b.base);
    b.say(&on_b, json!("c-1"), "posted to B").await;
    let data = stream.expect("chat.message", WAIT).await;
    assert_eq!(
        data["data"]["message"]["body"]["text"], "posted to B",
        "{data}"
    );
    let chat = data["chat_id"].as_i64().expect("chat id");

    // A reply sent through B is delivered by whichever instance claims it;
    // A's stream hears the result either way.
    let reply = via(&ann, &b).reply(chat, "answered via B").await;
    let delivery = stream.expect("message.delivery", WAIT).await;
    assert_eq!(delivery["data"]["message_id"], reply["id"], "{delivery}");
    assert_eq!(delivery["data"]["state"], "delivered");
    assert_eq!(
        integrator.wait_for(1, WAIT).await.len(),
        1,
        "delivered once"
    );

    // Availability is the database's: B answers what Ann set through A.
    let status = || async {
        reqwest::get(&on_b.status_url)
            .await
            .expect("status")
            .text()
            .await
            .expect("status body")
    };
    assert_eq!(status().await.trim(), "0");
    ann.set_online(true).await;
    eventually(
        Duration::from_secs(5),
        "B to say an agent is online",
        || async { (status().await.trim() == "1").then_some(()) },
    )
    .await;
    b.shutdown().await;
    a.shutdown().await;
}

/// How long a claimed delivery is held in the kill test.
const LEASE_MS: u64 = 2_500;

#[tokio::test]
async fn when_an_instance_dies_mid_delivery_another_delivers_its_rows_after_the_lease_once_and_in_order()
 {
    if skip_without_postgres("several instances need PostgreSQL (scripts/with-postgres.sh)") {
        return;
    }
    use crate::support::{HubProcess, Reply, write_config};
    let integrator = Integrator::start().await;
    // Slow answers keep attempts in flight when the instance dies.
    integrator.set_default(Reply::ok().delayed(Duration::from_millis(400)));
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = HubOptions {
        attempt_timeout_ms: 1_000,
        lease_ms: LEASE_MS,
        extra_toml: "[webhooks]\ntimeout_ms = 1000\nsync_timeout_ms = 1000\n".to_owned(),
        ..HubOptions::default()
    };
    let config = write_config(dir.path(), &opts, "127.0.0.1:0");
    // Both instances read the same file: the same database, ports of their own.
    let spawn = |config: std::path::PathBuf| {
        tokio::task::spawn_blocking(move || HubProcess::spawn(&config))
    };
    let mut doomed = spawn(config.clone()).await.expect("first instance");
    let survivor = spawn(config.clone()).await.expect("second instance");

    let http = reqwest::Client::new();
    let admin = |base: &str, path: &str, body: serde_json::Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(crate::support::ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    let agent: serde_json::Value = admin(
        &doomed.base,
        "/admin/v1/agents",
        json!({ "name": "Ann", "email": "ann@example.com" }),
    )
    .await
    .expect("agent")
    .json()
    .await
    .expect("agent json");
    let token = agent["token"].as_str().expect("token").to_owned();
    let ch: serde_json::Value = admin(
        &doomed.base,
        "/admin/v1/channels",
        json!({ "name": "web", "customer_endpoint": integrator.url, "agents": ["ann@example.com"] }),
    )
    .await
    .expect("channel")
    .json()
    .await
    .expect("channel json");
    let endpoint = ch["endpoint_url"].as_str().expect("endpoint").to_owned();

    // Ten chats, three replies each, all sent through the instance that dies.
    const CHATS: usize = 10;
    const REPLIES: usize = 3;
    let mut chat_ids = Vec::new();
    for c in 0..CHATS {
        let resp = http
            .post(&endpoint)
            .json(&json!({ "sender": { "id": format!("c-{c}") }, "message": { "type": "text", "text": format!("hello {c}") } }))
            .send()
            .await
            .expect("customer message");
        assert_eq!(resp.status(), 200);
    }
    let ann = TestAgent {
        id: agent["id"].as_i64().expect("id"),
        token: token.clone(),
        base: doomed.base.clone(),
        http: http.clone(),
    };
    for chat in ann.chats().await {
        chat_ids.push(chat["id"].as_i64().expect("chat id"));
    }
    assert_eq!(chat_ids.len(), CHATS);
    for r in 0..REPLIES {
        for id in &chat_ids {
            ann.reply(*id, &format!("reply {r} to {id}")).await;
        }
    }
    // Some attempts are under way on the doomed instance when it dies.
    integrator.wait_for(3, WAIT).await;
    doomed.kill();

    let ann = TestAgent {
        base: survivor.base.clone(),
        ..ann
    };
    let total = CHATS * REPLIES;
    eventually(Duration::from_secs(30), "every reply delivered", || async {
        let mut delivered = 0;
        for id in &chat_ids {
            let view = ann.chat(*id).await;
            delivered += view["messages"]
                .as_array()
                .map(|m| m.iter().filter(|m| m["delivery"] == "delivered").count())
                .unwrap_or(0);
        }
        (delivered == total).then_some(())
    })
    .await;

    // Every reply reached the integrator; one received twice was cut off by
    // the kill and taken over only after its lease, never at the same time.
    let requests = integrator.requests();
    let mut first_seen: std::collections::HashMap<String, std::time::Instant> = Default::default();
    let mut order: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut duplicates = 0;
    for r in &requests {
        let id = r
            .headers
            .get("x-hub-delivery")
            .and_then(|v| v.to_str().ok())
            .expect("a delivery id")
            .to_owned();
        if let Some(first) = first_seen.get(&id) {
            duplicates += 1;
            let gap = r.at.duration_since(*first);
            assert!(
                gap >= Duration::from_millis(LEASE_MS / 2),
                "delivery {id} was sent again after {gap:?}, inside its lease"
            );
            continue;
        }
        first_seen.insert(id, r.at);
        let body = r.json();
        let to = body["recipient"]["id"].to_string();
        order.entry(to).or_default().push(
            body["message"]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    assert_eq!(
        first_seen.len(),
        total,
        "replies lost: {} of {total} arrived",
        first_seen.len()
    );
    for (to, texts) in &order {
        let numbers: Vec<_> = texts.iter().filter_map(|t| t.split(' ').nth(1)).collect();
        assert_eq!(
            numbers,
            ["0", "1", "2"],
            "replies to {to} out of order: {texts:?}"
        );
    }
    eprintln!(
        "kill -9 with deliveries in flight: {total} replies, {} requests, {duplicates} sent again after the lease",
        requests.len()
    );
    drop(survivor);
}

#[tokio::test]
async fn a_bot_created_through_one_instance_answers_chats_started_on_another() {
    if skip_without_postgres("several instances need PostgreSQL (scripts/with-postgres.sh)") {
        return;
    }
    let provider = Integrator::start().await;
    let integrator = Integrator::start().await;
    let a = TestHub::start().await;
    let b = beside(&a).await;
    a.create_agent("Ann", "ann@example.com").await;
    let ch = a
        .create_channel("web", &integrator.url, false, &["ann@example.com"])
        .await;
    // B has loaded its (empty) bot directory before the bot exists.
    let (status, bot) = a
        .admin(
            reqwest::Method::POST,
            "/admin/v1/bots",
            Some(json!({ "name": "Assistant", "endpoint": provider.url,
                         "token": "bot-token-0123456789", "channels": ["web"] })),
        )
        .await;
    assert_eq!(status, 201, "{bot}");
    let on_b = ch.via(&a.base, &b.base);
    // The announcement reaches B within moments; a customer of B's then
    // starts with the bot.
    // Only a chat that starts after B reloaded goes to the bot: each try is
    // a new customer.
    let tries = std::sync::atomic::AtomicUsize::new(0);
    eventually(
        Duration::from_secs(10),
        "the bot to hear B's customer",
        || async {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            b.say(&on_b, json!(format!("c-bot-{n}")), "hello bot").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            let seen = provider.requests().iter().any(|r| {
                r.json()["event"] == "CLIENT_MESSAGE" && r.json()["message"]["text"] == "hello bot"
            });
            seen.then_some(())
        },
    )
    .await;
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test]
async fn two_instances_started_at_the_same_moment_on_an_empty_database_both_come_up() {
    if skip_without_postgres("several instances need PostgreSQL (scripts/with-postgres.sh)") {
        return;
    }
    use crate::support::{HubProcess, write_config};
    let dir = tempfile::tempdir().expect("temp dir");
    // The database is created empty; neither instance has migrated it yet.
    let config = write_config(dir.path(), &HubOptions::default(), "127.0.0.1:0");
    let (a, b) = tokio::join!(
        tokio::task::spawn_blocking({
            let config = config.clone();
            move || HubProcess::spawn(&config)
        }),
        tokio::task::spawn_blocking({
            let config = config.clone();
            move || HubProcess::spawn(&config)
        }),
    );
    let (a, b) = (a.expect("first instance"), b.expect("second instance"));
    for hub in [&a, &b] {
        let ready = reqwest::get(format!("{}/readyz", hub.base))
            .await
            .expect("readyz");
        assert_eq!(ready.status(), 200, "{}", hub.log());
    }
    // What one instance makes, the other serves at once.
    let ch = crate::support::admin_create(
        &a.base,
        "channels",
        json!({ "name": "web", "customer_endpoint": "http://127.0.0.1:9/hub" }),
    )
    .await;
    let status = ch["status_url"]
        .as_str()
        .expect("status url")
        .replace(&a.base, &b.base);
    let answer = reqwest::get(&status).await.expect("status on B");
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn a_bot_made_on_the_command_line_reaches_a_running_instance_at_once() {
    if skip_without_postgres("the running hub hears of the change through PostgreSQL") {
        return;
    }
    let provider = Integrator::start().await;
    let integrator = Integrator::start().await;
    let hub = TestHub::start().await;
    hub.create_agent("Ann", "ann@example.com").await;
    let ch = hub
        .create_channel("web", &integrator.url, false, &["ann@example.com"])
        .await;
    let config = hub.dir.path().join("hub.toml");
    let endpoint = provider.url.clone();
    let made = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hub"));
        for var in hub::config::ENV_OVERRIDES {
            command.env_remove(var);
        }
        command
            .arg("--config")
            .arg(&config)
            .args([
                "bot",
                "create",
                "--name",
                "Assistant",
                "--endpoint",
                &endpoint,
            ])
            .args(["--token", "bot-token-0123456789", "--channel", "web"])
            .output()
            .expect("hub bot create")
    })
    .await
    .expect("command");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let tries = std::sync::atomic::AtomicUsize::new(0);
    eventually(
        Duration::from_secs(10),
        "the new bot to hear a customer",
        || async {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            hub.say(&ch, json!(format!("c-cli-{n}")), "hello bot").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            provider
                .requests()
                .iter()
                .any(|r| r.json()["event"] == "CLIENT_MESSAGE")
                .then_some(())
        },
    )
    .await;
    hub.shutdown().await;
}
