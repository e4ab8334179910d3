//! Several hub instances on one PostgreSQL database (only when the suite
//! runs on PostgreSQL): an agent streaming from one instance sees what
//! happens on another, and the status endpoint answers the same everywhere.

use std::time::Duration;

use serde_json::json;

use crate::support::{
    HubOptions, Integrator, TestAgent, TestHub, eventually, on_postgres, storage_url,
};

const WAIT: Duration = Duration::from_secs(10);

/// A second instance on the database of `first`.
async fn beside(first: &TestHub) -> TestHub {
    let url = storage_url(first.dir.path());
    TestHub::start_with_config(HubOptions::default(), move |c| c.storage.url = url).await
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
    if !on_postgres() {
        eprintln!("skipped: several instances need PostgreSQL (scripts/with-postgres.sh)");
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
    let on_b = crate::support::TestChannel {
        endpoint_url: ch.endpoint_url.replace(&a.base, &b.base),
        status_url: ch.status_url.replace(&a.base, &b.base),
        ..ch.clone()
    };
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
