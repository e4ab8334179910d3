//! The channel's inbound side: endpoint URLs, the status endpoint, and every
//! rule for customer messages.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{Integrator, TestHub};

#[tokio::test]
async fn a_customer_message_opens_a_chat_the_agent_sees() {
    let hub = TestHub::start().await;
    let integrator = Integrator::start().await;
    let agent = hub.create_agent("Ann", "ann@example.com").await;
    let ch = hub
        .create_channel("web", &integrator.url, false, &["ann@example.com"])
        .await;
    let mut stream = agent.stream().await;
    hub.say(&ch, json!(42), "hello").await;
    let opened = stream.expect("chat.opened", Duration::from_secs(5)).await;
    let chats = agent.chats().await;
    assert_eq!(chats.len(), 1);
    assert_eq!(opened["chat_id"], chats[0]["id"]);
    assert_eq!(chats[0]["client_name"], "Anonymous");
    hub.shutdown().await;
}
