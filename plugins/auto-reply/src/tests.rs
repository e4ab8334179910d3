//! Unit tests of the auto-reply rules against a fake host.

use super::*;
use plugin_api::testing::{FakeHost, customer_text, event};
use serde_json::{Value, json};

fn offline(mut e: Event) -> Event {
    *e.context_mut() = json!({"agents_online": 0});
    e
}

fn at(mut e: Event, ms: i64) -> Event {
    e.at = ms;
    e
}

fn reply(text: &str, name: Option<&str>) -> Outcome {
    Outcome::reply(channel_reply_text(text, name))
}

fn config() -> Value {
    json!({
        "keywords": [{"match": ["price", "cost"], "reply": "From 10 EUR."}],
        "away_message": "We are away, back soon.",
        "away_every_secs": 60,
    })
}

#[test]
fn keyword_replies_signed_by_default_name() {
    let mut host = FakeHost::new(config());
    let out = AutoReply::handle(&customer_text("1", "What's the PRICE?"), &mut host).unwrap();
    assert_eq!(out, reply("From 10 EUR.", Some("Auto-reply")));
}

#[test]
fn sender_name_can_change_or_go() {
    let mut c = config();
    c["sender_name"] = json!("Shop bot");
    let out =
        AutoReply::handle(&customer_text("1", "cost?"), &mut FakeHost::new(c.clone())).unwrap();
    assert_eq!(out, reply("From 10 EUR.", Some("Shop bot")));
    c["sender_name"] = json!("");
    let out = AutoReply::handle(&customer_text("1", "cost?"), &mut FakeHost::new(c)).unwrap();
    assert_eq!(out, reply("From 10 EUR.", None));
}

#[test]
fn passes_without_match_while_agents_are_online() {
    let mut host = FakeHost::new(config());
    assert!(
        AutoReply::handle(&customer_text("1", "hello"), &mut host)
            .unwrap()
            .is_pass()
    );
    assert!(host.kv().is_empty());
}

#[test]
fn away_message_once_per_chat_and_period() {
    let mut host = FakeHost::new(config());
    let away = reply("We are away, back soon.", Some("Auto-reply"));
    let mut run = |ms: i64| {
        AutoReply::handle(&at(offline(customer_text("1", "hello")), ms), &mut host).unwrap()
    };
    assert_eq!(run(1_000), away);
    assert!(run(30_000).is_pass());
    assert!(run(60_999).is_pass());
    assert_eq!(run(61_000), away);
    assert_eq!(host.kv()["away:1:1"], "61000");
}

#[test]
fn keywords_win_over_the_away_message() {
    let mut host = FakeHost::new(config());
    let out = AutoReply::handle(&offline(customer_text("1", "cost?")), &mut host).unwrap();
    assert_eq!(out, reply("From 10 EUR.", Some("Auto-reply")));
}

#[test]
fn away_message_is_tracked_per_client_whether_or_not_the_chat_is_known() {
    let mut host = FakeHost::new(config());
    let mut first = offline(customer_text("c-5", "hello"));
    first.chat_id = None;
    assert!(!AutoReply::handle(&first, &mut host).unwrap().is_pass());
    assert!(host.kv().contains_key("away:1:c-5"));
    let mut later = offline(customer_text("c-5", "still there?"));
    later.chat_id = Some(9);
    assert!(AutoReply::handle(&later, &mut host).unwrap().is_pass());
    // Another client of the same channel gets its own.
    let other = offline(customer_text("c-6", "hello"));
    assert!(!AutoReply::handle(&other, &mut host).unwrap().is_pass());
}

#[test]
fn away_message_without_sender_is_tracked_per_chat() {
    let mut host = FakeHost::new(config());
    let e = offline(event(
        "channel.customer_message",
        json!({"message":{"type":"text","text":"hello"}}),
    ));
    assert!(!AutoReply::handle(&e, &mut host).unwrap().is_pass());
    assert!(host.kv().contains_key("away:chat:1"));
    assert!(AutoReply::handle(&e, &mut host).unwrap().is_pass());
}

#[test]
fn only_the_away_message_needs_kv() {
    let needs = |c: Value| AutoReply::needs(&Config::new(c).unwrap()).unwrap();
    assert_eq!(needs(config()), Needs::none().kv());
    assert_eq!(
        needs(json!({"keywords": [{"match": "price", "reply": "From 10 EUR."}]})),
        Needs::none()
    );
}

#[test]
fn away_message_when_kv_fails_is_sent_every_time() {
    let mut host = FakeHost::new(config()).without_kv();
    for _ in 0..2 {
        let out = AutoReply::handle(&offline(customer_text("1", "hello")), &mut host).unwrap();
        assert!(!out.is_pass());
    }
    assert_eq!(host.logs()[0].0, Level::Warn);
}

#[test]
fn unknown_agent_count_sends_no_away_message() {
    let mut e = customer_text("1", "hello");
    *e.context_mut() = json!({});
    assert!(
        AutoReply::handle(&e, &mut FakeHost::new(config()))
            .unwrap()
            .is_pass()
    );
}

#[test]
fn media_messages_can_get_the_away_message() {
    let photo = offline(event(
        "channel.customer_message",
        json!({"sender":{"id":1},"message":{"type":"photo","file":"https://x/a.png",
               "file_name":"a.png","file_size":1}}),
    ));
    assert!(
        !AutoReply::handle(&photo, &mut FakeHost::new(config()))
            .unwrap()
            .is_pass()
    );
}

#[test]
fn other_kinds_pass() {
    let e = offline(event(
        "channel.agent_message",
        json!({"sender":{"name":"A"},"recipient":{"id":1},"message":{"type":"text","text":"price"}}),
    ));
    assert!(
        AutoReply::handle(&e, &mut FakeHost::new(config()))
            .unwrap()
            .is_pass()
    );
}

#[test]
fn bad_config_is_an_error() {
    for c in [
        json!({"keywords": "price"}),
        json!({"away_every_secs": "1h"}),
        json!({"sender_name": 1}),
    ] {
        assert!(AutoReply::handle(&customer_text("1", "hi"), &mut FakeHost::new(c)).is_err());
    }
}
