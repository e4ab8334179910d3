//! Unit tests of the spam guard's rules against a fake host.

use super::*;
use plugin_api::sdk::Action;
use plugin_api::testing::{FakeHost, customer_text, event};
use serde_json::json;

fn message_at(sender: &str, text: &str, at: i64) -> Event {
    let mut e = customer_text(sender, text);
    e.at = at;
    e
}

#[test]
fn other_kinds_pass() {
    let mut host = FakeHost::new(json!({"patterns": ["buy"], "max_messages": 1}));
    let e = event(
        "channel.agent_message",
        json!({"sender":{"name":"A"},"recipient":{"id":1},"message":{"type":"text","text":"buy"}}),
    );
    assert!(SpamGuard::handle(&e, &mut host).unwrap().is_pass());
    assert!(host.kv().is_empty());
}

#[test]
fn patterns_match_case_insensitively() {
    let mut host = FakeHost::new(json!({"patterns": ["Cheap PILLS", "casino"]}));
    let out = SpamGuard::handle(&customer_text("1", "get cheap pills now"), &mut host).unwrap();
    assert_eq!(out, Outcome::drop("spam pattern \"Cheap PILLS\""));
    let out = SpamGuard::handle(&customer_text("1", "hello there"), &mut host).unwrap();
    assert!(out.is_pass());
}

#[test]
fn rate_limit_uses_a_fixed_window_per_client() {
    let mut host = FakeHost::new(json!({"max_messages": 2, "window_secs": 10}));
    let mut run = |sender: &str, at: i64| {
        SpamGuard::handle(&message_at(sender, "hi", at), &mut host).unwrap()
    };
    assert!(run("7", 0).is_pass());
    assert!(run("7", 5_000).is_pass());
    assert_eq!(
        run("7", 9_999),
        Outcome::drop("rate limit: more than 2 messages in 10 s")
    );
    // Another client has a window of its own.
    assert!(run("8", 9_999).is_pass());
    // The window has run out.
    assert!(run("7", 10_000).is_pass());
    let stored = host.kv().get("rate:1:7").map(String::as_str);
    let expected = Window {
        start: 10_000,
        count: 1,
    };
    assert_eq!(Window::parse(stored), Some(expected));
}

#[test]
fn default_limit_is_twenty_a_minute() {
    let mut host = FakeHost::new(json!({}));
    for n in 0..20 {
        let out = SpamGuard::handle(&message_at("7", "hi", n), &mut host).unwrap();
        assert!(out.is_pass(), "message {n}");
    }
    let out = SpamGuard::handle(&message_at("7", "hi", 59_999), &mut host).unwrap();
    assert_eq!(
        out,
        Outcome::drop("rate limit: more than 20 messages in 60 s")
    );
}

#[test]
fn numeric_and_text_ids_share_a_window() {
    let mut host = FakeHost::new(json!({"max_messages": 1}));
    let mut numeric = customer_text("1", "hi");
    numeric.payload_mut()["sender"]["id"] = json!(42);
    assert!(SpamGuard::handle(&numeric, &mut host).unwrap().is_pass());
    let out = SpamGuard::handle(&customer_text("42", "hi"), &mut host).unwrap();
    assert!(matches!(out.action, Action::Drop(_)));
}

#[test]
fn the_rate_limit_needs_kv_and_forward_to_its_destination() {
    let needs = |c: serde_json::Value| SpamGuard::needs(&Config::new(c).unwrap()).unwrap();
    // The limit is on by default.
    assert_eq!(needs(json!({})), Needs::none().kv());
    assert_eq!(
        needs(json!({"patterns": ["spam"], "max_messages": 0})),
        Needs::none()
    );
    assert_eq!(
        needs(json!({"max_messages": 0, "forward_to": "audit"})),
        Needs::none().destination("audit")
    );
}

#[test]
fn a_failing_kv_means_no_rate_limit() {
    let mut host = FakeHost::new(json!({"max_messages": 1})).without_kv();
    for _ in 0..3 {
        assert!(
            SpamGuard::handle(&customer_text("7", "hi"), &mut host)
                .unwrap()
                .is_pass()
        );
    }
    assert_eq!(host.logs().len(), 3);
    assert_eq!(host.logs()[0].0, Level::Warn);
}

#[test]
fn zero_max_messages_turns_the_limit_off() {
    let mut host = FakeHost::new(json!({"max_messages": 0}));
    assert!(
        SpamGuard::handle(&customer_text("7", "hi"), &mut host)
            .unwrap()
            .is_pass()
    );
    assert!(host.kv().is_empty());
}

#[test]
fn corrupt_window_starts_afresh() {
    let mut host = FakeHost::new(json!({"max_messages": 1})).with_kv("rate:1:7", "garbage");
    assert!(
        SpamGuard::handle(&customer_text("7", "hi"), &mut host)
            .unwrap()
            .is_pass()
    );
}

#[test]
fn drops_are_forwarded_when_asked() {
    let mut host = FakeHost::new(json!({"patterns": ["spam"], "forward_to": "audit"}));
    let out = SpamGuard::handle(&customer_text("7", "SPAM!"), &mut host).unwrap();
    assert_eq!(out.forwards.len(), 1);
    assert_eq!(out.forwards[0].destination, "audit");
    assert_eq!(
        out.forwards[0].payload,
        json!({"event_id":"test-event","kind":"channel.customer_message","channel":"test",
               "chat_id":1,"reason":"spam pattern \"spam\"","sender_id":"7"})
    );
    let out = SpamGuard::handle(&customer_text("7", "fine"), &mut host).unwrap();
    assert!(out.forwards.is_empty());
}

#[test]
fn bad_config_is_an_error() {
    for config in [
        json!({"patterns": 5}),
        json!({"max_messages": -1}),
        json!({"window_secs": 0}),
        json!({"forward_to": 1}),
    ] {
        let mut host = FakeHost::new(config.clone());
        let err = SpamGuard::handle(&customer_text("7", "hi"), &mut host).unwrap_err();
        assert!(err.starts_with("config: "), "{config}: {err}");
    }
}
