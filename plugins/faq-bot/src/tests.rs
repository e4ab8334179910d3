//! Unit tests of the bot's conversation rules against a fake host.

use super::*;
use plugin_api::sdk::{Action, Direction, Level};
use plugin_api::testing::{FakeHost, event};
use serde_json::{Value, json};

/// `event.at` of the test events, in the seconds the answers carry.
const AT_SECS: i64 = 1_700_000_000;
const MENU: [&str; 3] = ["Prices", "Opening hours", "Shipping"];

fn config() -> Value {
    json!({
        "greeting": "Hi, I am the shop bot.",
        "menu": MENU,
        "menu_title": "Pick a topic",
        "answers": {
            "price": "From 10 EUR.",
            "price list": "The list is at example.com/prices.",
            "hours": "9 to 5.",
            "ship": "We ship in 2 days.",
            "post": "By post or courier.",
        },
    })
}

/// A `bot.client_message` for chat 1, as the hub hands it over.
fn client_message(text: &str) -> Event {
    let mut e = event(
        "bot.client_message",
        json!({
            "id": "9661ab9c-48b0-11ed-a3d6-859398ff9bd9", "event": "CLIENT_MESSAGE",
            "site_id": "1", "client_id": "12", "chat_id": "1", "agents_online": true,
            "sender": {"id": 12, "name": "John", "has_contacts": false},
            "message": {"type": "TEXT", "text": text, "timestamp": 1665415879},
            "channel": {"id": "abc", "type": "custom"},
        }),
    );
    e.direction = Direction::Outbound;
    e
}

fn run(host: &mut FakeHost, text: &str) -> Outcome {
    FaqBot::handle(&client_message(text), host).unwrap()
}

/// A host whose chat 1 was greeted and has `misses` misses.
fn greeted(misses: u64) -> FakeHost {
    FakeHost::new(config()).with_kv(
        "chat:1",
        &json!({"greeted": true, "misses": misses}).to_string(),
    )
}

fn text(t: &str) -> Value {
    json!({"event":"BOT_MESSAGE","message":{"type":"TEXT","text":t,"timestamp":AT_SECS}})
}

fn invite() -> Outcome {
    Outcome::reply(json!({"event":"INVITE_AGENT"}))
}

fn state(host: &FakeHost) -> Value {
    serde_json::from_str(&host.kv()["chat:1"]).unwrap()
}

#[test]
fn first_message_gets_the_greeting_with_the_menu() {
    let mut host = FakeHost::new(config());
    assert_eq!(
        run(&mut host, "hello"),
        Outcome::reply(json!({"event":"BOT_MESSAGE","message":{
            "type":"BUTTONS","title":"Hi, I am the shop bot.",
            "text":"Hi, I am the shop bot.",
            "buttons":[{"text":"Prices","id":"1"},{"text":"Opening hours","id":"2"},
                       {"text":"Shipping","id":"3"}],
            "timestamp":AT_SECS}}))
    );
    assert_eq!(state(&host), json!({"greeted":true,"misses":0}));
    // Greeted once: the next message is answered, not greeted again.
    assert_eq!(
        run(&mut host, "what are your hours?"),
        Outcome::reply(text("9 to 5."))
    );
}

#[test]
fn first_message_with_a_question_gets_greeting_then_answer() {
    let mut host = FakeHost::new(config());
    let Action::Reply(Value::Array(answers)) = run(&mut host, "Hours?").action else {
        panic!("expected two answers")
    };
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["message"]["type"], "BUTTONS");
    assert_eq!(answers[1], text("9 to 5."));
}

#[test]
fn greeting_is_text_without_a_menu_and_has_a_default() {
    let mut host = FakeHost::new(json!({}));
    assert_eq!(
        run(&mut host, "hello"),
        Outcome::reply(text("Hello! How can I help?"))
    );
}

#[test]
fn keywords_ignore_case_and_the_longest_wins() {
    let mut host = greeted(0);
    assert_eq!(
        run(&mut host, "what's the PRICE?"),
        Outcome::reply(text("From 10 EUR."))
    );
    assert_eq!(
        run(&mut host, "send me the Price List"),
        Outcome::reply(text("The list is at example.com/prices."))
    );
    // `post` and `ship` are equally long: the alphabetically first wins.
    assert_eq!(
        run(&mut host, "do you ship by post?"),
        Outcome::reply(text("By post or courier."))
    );
    assert!(host.logs().is_empty(), "{:?}", host.logs());
}

#[test]
fn a_button_click_is_answered_like_typed_text() {
    let mut host = greeted(0);
    let mut click = client_message("Opening hours");
    click.payload_mut()["message"]["button_id"] = json!("2");
    assert_eq!(
        FaqBot::handle(&click, &mut host).unwrap(),
        Outcome::reply(text("9 to 5."))
    );
}

#[test]
fn first_miss_offers_the_menu_and_the_second_invites_an_agent() {
    let mut host = greeted(0);
    assert_eq!(
        run(&mut host, "blue widgets?"),
        Outcome::reply(bot_buttons(
            "Pick a topic",
            "Pick a topic",
            &MENU,
            AT_SECS * 1000
        ))
    );
    assert_eq!(state(&host), json!({"greeted":true,"misses":1}));
    assert_eq!(run(&mut host, "red ones?"), invite());
    assert_eq!(state(&host), json!({"greeted":true,"misses":0}));
    // After the hand-over the count starts afresh.
    assert_eq!(reply_type(run(&mut host, "hm")), "BUTTONS");
}

/// `message.type` of a single `BOT_MESSAGE` reply.
fn reply_type(outcome: Outcome) -> String {
    match outcome.action {
        Action::Reply(v) => v["message"]["type"].as_str().unwrap_or("").to_owned(),
        other => panic!("not a reply: {other:?}"),
    }
}

#[test]
fn an_answer_resets_the_misses() {
    let mut host = greeted(1);
    assert_eq!(
        run(&mut host, "price?"),
        Outcome::reply(text("From 10 EUR."))
    );
    assert_eq!(state(&host), json!({"greeted":true,"misses":0}));
    assert_eq!(reply_type(run(&mut host, "hm")), "BUTTONS");
}

#[test]
fn asking_for_a_human_invites_an_agent() {
    for ask in [
        "Can I talk to a PERSON?",
        "agent please",
        "Your agents, now!",
    ] {
        let mut host = greeted(0);
        assert_eq!(run(&mut host, ask), invite(), "{ask}");
    }
    // Even before the greeting, and even when a keyword matches too.
    let mut host = FakeHost::new(config());
    assert_eq!(run(&mut host, "a person about the price"), invite());
    assert_eq!(state(&host), json!({"greeted":true,"misses":0}));
}

#[test]
fn it_needs_kv_whatever_its_config() {
    for c in [json!({}), config()] {
        let needs = FaqBot::needs(&Config::new(c).unwrap()).unwrap();
        assert_eq!(needs, Needs::none().kv());
    }
}

#[test]
fn when_kv_fails_the_bot_still_answers() {
    let mut host = FakeHost::new(config()).without_kv();
    assert_eq!(run(&mut host, "hours?"), Outcome::reply(text("9 to 5.")));
    // Misses are not counted: every miss gets the menu, never an agent.
    for _ in 0..3 {
        assert_eq!(reply_type(run(&mut host, "hm")), "BUTTONS");
    }
    assert_eq!(run(&mut host, "agent"), invite());
    assert!(
        host.logs()
            .iter()
            .all(|(l, m)| *l == Level::Warn && m.contains("kv"))
    );
}

#[test]
fn unreadable_state_starts_over() {
    let mut host = FakeHost::new(config()).with_kv("chat:1", "{not json");
    assert_eq!(reply_type(run(&mut host, "hm")), "BUTTONS");
    assert_eq!(state(&host), json!({"greeted":true,"misses":0}));
    assert_eq!(host.logs().len(), 1);
}

#[test]
fn unchanged_state_is_not_written_again() {
    let stored = r#"{"misses":0,"greeted":true}"#;
    let mut host = FakeHost::new(config()).with_kv("chat:1", stored);
    run(&mut host, "price?");
    assert_eq!(host.kv()["chat:1"], stored);
}

#[test]
fn other_kinds_pass() {
    let mut host = FakeHost::new(config());
    for kind in [
        "channel.customer_message",
        "bot.agent_joined",
        "webhook.chat_accepted",
    ] {
        let mut e = client_message("agent");
        e.kind = kind.to_owned();
        assert!(FaqBot::handle(&e, &mut host).unwrap().is_pass(), "{kind}");
    }
    assert!(host.kv().is_empty());
}

#[test]
fn a_payload_that_is_no_client_message_fails_the_call() {
    let mut host = FakeHost::new(config());
    let e = event("bot.client_message", json!({"message": "hi"}));
    let err = FaqBot::handle(&e, &mut host).unwrap_err();
    assert!(err.contains("bot.client_message"), "{err}");
}

fn config_error(patch: Value) -> String {
    let mut c = config();
    if let (Some(c), Some(patch)) = (c.as_object_mut(), patch.as_object()) {
        c.extend(patch.clone());
    }
    let err = FaqBot::validate_config(&Config::new(c.clone()).unwrap()).unwrap_err();
    // A call with the bad config fails the same way.
    let call = FaqBot::handle(&client_message("hi"), &mut FakeHost::new(c)).unwrap_err();
    assert_eq!(err, call);
    err
}

#[test]
fn config_errors_name_the_key() {
    assert!(FaqBot::validate_config(&Config::new(config()).unwrap()).is_ok());
    assert!(FaqBot::validate_config(&Config::default()).is_ok());
    for (patch, expected) in [
        (
            json!({"menu": ["a", "b", "c", "d"]}),
            "config: menu has 4 topics; at most 3 fit as buttons",
        ),
        (
            json!({"menu": ["a", " "]}),
            "config: menu[1] must not be empty",
        ),
        (
            json!({"menu": [1]}),
            "config: menu must be a string or an array of strings",
        ),
        (
            json!({"answers": {"": "x"}}),
            "config: answers has an empty keyword",
        ),
        (
            json!({"answers": {"price": ""}}),
            "config: answers.\"price\" must be a non-empty string",
        ),
        (
            json!({"answers": {"Price": "a", "price": "b"}}),
            "config: answers has the keyword \"price\" twice (keywords ignore case)",
        ),
        (
            json!({"answers": ["price"]}),
            "config: answers must be a table of keyword = \"answer\"",
        ),
        (
            json!({"greeting": ""}),
            "config: greeting must not be empty",
        ),
        (
            json!({"menu_title": 3}),
            "config: menu_title must be a string",
        ),
    ] {
        assert_eq!(config_error(patch.clone()), expected, "{patch}");
    }
}
