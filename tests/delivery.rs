//! End-to-end delivery of agent messages to the integrator's endpoint: the wire
//! format, what each kind of answer leads to, retries and their timing, per-chat
//! order, the event log, and channels declared in `hub.toml`.
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::{
    ADMIN_TOKEN, EARLY_WINDOW, HubOptions, Integrator, Recorded, Reply, Sse, TestAgent,
    TestChannel, TestHub, eventually, move_clock_to,
};
use hub::clock::ManualClock;
use hub::event::Direction;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);
const AGENT_NAME: &str = "Ann";
const AGENT_EMAIL: &str = "ann@example.com";
const AGENT_PHOTO: &str = "https://img.example.com/ann.png";
const JSON_UTF8: &str = "application/json; charset=utf-8";

/// A hub, an integrator endpoint, an agent with a photo and one channel to the endpoint.
struct Desk {
    hub: TestHub,
    integrator: Integrator,
    agent: TestAgent,
    ch: TestChannel,
}

impl Desk {
    async fn open() -> Desk {
        Desk::open_with(HubOptions::default(), false).await
    }

    /// A desk whose hub runs on `clock`, which also stamps what the integrator gets.
    async fn open_on(clock: &ManualClock) -> Desk {
        let opts = HubOptions {
            clock: Some(clock.clone()),
            ..HubOptions::default()
        };
        let desk = Desk::open_with(opts, false).await;
        desk.integrator.on_clock(clock);
        desk
    }

    async fn open_with(opts: HubOptions, chunked: bool) -> Desk {
        let integrator = Integrator::start().await;
        let hub = TestHub::start_with(opts).await;
        let ch = hub
            .create_channel("shop", &integrator.url, chunked, &[AGENT_EMAIL])
            .await;
        Desk {
            agent: agent_with_photo(&hub).await,
            hub,
            integrator,
            ch,
        }
    }

    /// Customer `id` writes on `ch`; returns the id of the chat that opened.
    async fn chat_on(&self, ch: &TestChannel, id: Value) -> i64 {
        let before = chat_ids(&self.agent).await;
        self.hub.say(ch, id, "hello").await;
        chat_ids(&self.agent)
            .await
            .into_iter()
            .find(|c| !before.contains(c))
            .expect("the customer's message opened a chat")
    }

    async fn chat(&self, id: Value) -> i64 {
        self.chat_on(&self.ch, id).await
    }

    /// Posts a message body of any type as the agent and returns the stored message.
    async fn send(&self, chat_id: i64, body: Value) -> Value {
        let (status, v) = self
            .agent
            .post(&format!("/agent/v1/chats/{chat_id}/messages"), body)
            .await;
        assert_eq!(status, 201, "agent message refused: {v}");
        v["message"].clone()
    }

    /// The agent's message as the chat view shows it once it is no longer pending.
    async fn settled(&self, chat_id: i64, sent: &Value) -> Value {
        let agent = &self.agent;
        let uid = &sent["uid"];
        eventually(
            WAIT,
            "a final delivery state in the chat view",
            || async move {
                let m = messages(&agent.chat(chat_id).await)
                    .into_iter()
                    .find(|m| m["uid"] == *uid)?;
                (m["delivery"] != "pending").then_some(m)
            },
        )
        .await
    }

    async fn stop(self) {
        self.hub.shutdown().await;
    }
}

/// Creates the desk's agent with a photo (the harness's helper sets none).
async fn agent_with_photo(hub: &TestHub) -> TestAgent {
    let resp = hub
        .admin_post(
            "/admin/v1/agents",
            json!({ "name": AGENT_NAME, "email": AGENT_EMAIL, "photo": AGENT_PHOTO }),
        )
        .await;
    assert_eq!(resp.status(), 201, "agent creation");
    let v: Value = resp.json().await.expect("agent json");
    TestAgent {
        id: v["id"].as_i64().expect("agent id"),
        token: v["token"].as_str().expect("agent token").to_owned(),
        base: hub.base.clone(),
        http: hub.http.clone(),
    }
}

async fn chat_ids(agent: &TestAgent) -> Vec<i64> {
    agent
        .chats()
        .await
        .iter()
        .map(|c| c["id"].as_i64().expect("chat id"))
        .collect()
}

fn messages(view: &Value) -> Vec<Value> {
    view["messages"].as_array().cloned().unwrap_or_default()
}

/// The next `message.delivery` event about the stored message `sent`.
async fn delivery_event(stream: &mut Sse, sent: &Value, timeout: Duration) -> Value {
    loop {
        let ev = stream.expect("message.delivery", timeout).await;
        if ev["data"]["message_id"] == sent["id"] {
            return ev["data"].clone();
        }
    }
}

/// `message.id` of each request the integrator received, in arrival order.
fn labels(requests: &[Recorded]) -> Vec<Value> {
    requests
        .iter()
        .map(|r| r.json()["message"]["id"].clone())
        .collect()
}

fn attempt_numbers(requests: &[Recorded]) -> Vec<&str> {
    requests
        .iter()
        .map(|r| r.header("x-hub-attempt").unwrap_or_default())
        .collect()
}

/// Asserts every request carries one and the same non-empty delivery id.
fn one_delivery_id(requests: &[Recorded]) -> String {
    let id = requests[0]
        .header("x-hub-delivery")
        .expect("x-hub-delivery header")
        .to_owned();
    assert!(!id.is_empty());
    for r in requests {
        assert_eq!(
            r.header("x-hub-delivery"),
            Some(id.as_str()),
            "delivery id changed"
        );
    }
    id
}

/// An address nothing listens on (bound, then released).
async fn closed_port() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    listener.local_addr().expect("addr")
}

async fn admin_channels(hub: &TestHub) -> Vec<Value> {
    let resp = hub
        .http
        .get(hub.url("/admin/v1/channels"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("admin request");
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("channels json");
    v["channels"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_reply_reaches_the_integrator_as_the_spec_draws_it() {
    let desk = Desk::open().await;
    // 42 and "42" name the same customer on one channel, so each id gets its own.
    let other = desk
        .hub
        .create_channel("app", &desk.integrator.url, false, &[AGENT_EMAIL])
        .await;
    for (ch, customer) in [(&desk.ch, json!(42)), (&other, json!("42"))] {
        let chat_id = desk.chat_on(ch, customer.clone()).await;
        let mut stream = desk.agent.stream().await;
        let seen = desk.integrator.requests().len();
        let sent = desk.agent.reply(chat_id, "Hello from support").await;
        let req = desk.integrator.wait_for(seen + 1, WAIT).await.remove(seen);

        assert_eq!(req.path, format!("/hub/{}", ch.public_id));
        assert_eq!(req.header("content-type"), Some(JSON_UTF8));
        assert!(!req.is_chunked(), "sent chunked by default");
        assert_eq!(
            req.header("content-length"),
            Some(req.body.len().to_string().as_str())
        );
        assert_eq!(
            req.json(),
            json!({
                "sender": { "name": AGENT_NAME, "photo": AGENT_PHOTO },
                "recipient": { "id": customer },
                "message": { "type": "text", "id": sent["uid"], "text": "Hello from support" },
            }),
            "recipient.id must keep the JSON type of sender.id {customer}"
        );

        let ev = delivery_event(&mut stream, &sent, WAIT).await;
        assert_eq!(ev["state"], "delivered");
        assert_eq!(ev["error"], Value::Null);
        assert_eq!(ev["delivery_id"].as_str(), req.header("x-hub-delivery"));
        let m = desk.settled(chat_id, &sent).await;
        assert_eq!(m["delivery"], "delivered");
        assert_eq!(m["delivery_error"], Value::Null);
    }
    desk.stop().await;
}

#[tokio::test]
async fn a_chunked_channel_sends_chunked_bodies() {
    let desk = Desk::open_with(HubOptions::default(), true).await;
    let chat_id = desk.chat(json!(7)).await;
    let sent = desk.agent.reply(chat_id, "in pieces").await;
    let req = desk.integrator.wait_for(1, WAIT).await.remove(0);
    assert!(req.is_chunked(), "headers: {:?}", req.headers);
    assert_eq!(req.header("content-length"), None);
    assert_eq!(req.header("content-type"), Some(JSON_UTF8));
    let body = req.json();
    assert_eq!(body["message"]["text"], "in pieces");
    assert_eq!(body["message"]["id"], sent["uid"]);
    assert_eq!(body["recipient"]["id"], 7);
    assert_eq!(desk.settled(chat_id, &sent).await["delivery"], "delivered");
    desk.stop().await;
}

#[tokio::test]
async fn media_and_location_replies_carry_their_fields() {
    let desk = Desk::open().await;
    let chat_id = desk.chat(json!(7)).await;
    let bodies = [
        json!({ "type": "photo", "file": "https://files.example.com/cat.jpg",
                "file_name": "cat.jpg", "file_size": 2048,
                "thumb": "https://files.example.com/cat-320.jpg", "text": "our cat" }),
        json!({ "type": "location", "latitude": 59.93, "longitude": -30.31,
                "title": "Office" }),
    ];
    let mut sent = Vec::new();
    for body in &bodies {
        sent.push(desk.send(chat_id, body.clone()).await);
    }
    let got = desk.integrator.wait_for(2, WAIT).await;
    for ((req, body), stored) in got.iter().zip(&bodies).zip(&sent) {
        let mut expected = body.clone();
        expected["id"] = stored["uid"].clone();
        let wire = req.json();
        assert_eq!(wire["message"], expected);
        assert_eq!(wire["recipient"], json!({ "id": 7 }));
        assert_eq!(desk.settled(chat_id, stored).await["delivery"], "delivered");
    }
    desk.stop().await;
}

#[tokio::test]
async fn agent_typing_reaches_the_integrator_and_is_not_stored() {
    let desk = Desk::open().await;
    let chat_id = desk.chat(json!("c-9")).await;
    for kind in ["typein", "typeout"] {
        let (status, v) = desk
            .agent
            .post(
                &format!("/agent/v1/chats/{chat_id}/messages"),
                json!({ "type": kind }),
            )
            .await;
        assert_eq!(status, 202, "{kind}: {v}");
    }
    let got = desk.integrator.wait_for(2, WAIT).await;
    let kinds: Vec<Value> = got.iter().map(|r| r.json()["message"].clone()).collect();
    assert_eq!(
        kinds,
        vec![json!({ "type": "typein" }), json!({ "type": "typeout" })]
    );
    for req in &got {
        assert_eq!(req.path, format!("/hub/{}", desk.ch.public_id));
        assert_eq!(req.json()["recipient"], json!({ "id": "c-9" }));
    }
    let stored = messages(&desk.agent.chat(chat_id).await);
    assert_eq!(stored.len(), 1, "typing was stored: {stored:?}");
    assert_eq!(stored[0]["author"], "client");
    desk.stop().await;
}

#[tokio::test]
async fn a_failed_typing_notification_does_not_hold_up_the_next_message() {
    let desk = Desk::open_with(
        HubOptions {
            retry_interval_ms: 3000,
            attempt_timeout_ms: 3000,
            ..HubOptions::default()
        },
        false,
    )
    .await;
    desk.integrator.script([Reply::json(500, "")]);
    let chat_id = desk.chat(json!(7)).await;
    let (status, _) = desk
        .agent
        .post(
            &format!("/agent/v1/chats/{chat_id}/messages"),
            json!({ "type": "typein" }),
        )
        .await;
    assert_eq!(status, 202);
    desk.integrator.wait_for(1, WAIT).await;
    let started = Instant::now();
    let sent = desk.agent.reply(chat_id, "right after typing").await;
    let got = desk.integrator.wait_for(2, WAIT).await;
    // Typing gets one try; its failure must not delay the chat by a retry interval.
    assert!(
        got[1].at - started < Duration::from_millis(1500),
        "the message waited {:?} behind a failed typing notification",
        got[1].at - started
    );
    assert_eq!(got[1].json()["message"]["id"], sent["uid"]);
    assert_eq!(
        labels(&got)[0],
        Value::Null,
        "the typing notification was retried"
    );
    assert_eq!(desk.settled(chat_id, &sent).await["delivery"], "delivered");
    desk.stop().await;
}

#[tokio::test]
async fn an_error_body_fails_the_delivery_at_once() {
    let clock = ManualClock::new();
    let desk = Desk::open_on(&clock).await;
    desk.integrator.set_default(Reply::json(
        200,
        r#"{"error":{"code":3,"message":"user blocked"}}"#,
    ));
    let chat_id = desk.chat(json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let sent = desk.agent.reply(chat_id, "are you there?").await;

    let ev = delivery_event(&mut stream, &sent, WAIT).await;
    assert_eq!(ev["state"], "failed");
    assert_eq!(ev["error"], "user blocked");
    let m = desk.settled(chat_id, &sent).await;
    assert_eq!(m["delivery"], "failed");
    assert_eq!(m["delivery_error"], "user blocked");
    // Well past the retry interval: still the one request.
    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(EARLY_WINDOW).await;
    assert_eq!(
        desk.integrator.requests().len(),
        1,
        "an error body was retried"
    );
    desk.stop().await;
}

#[tokio::test]
async fn a_4xx_is_final_and_its_reason_is_shown() {
    let clock = ManualClock::new();
    let desk = Desk::open_on(&clock).await;
    desk.integrator
        .script([Reply::json(400, "no such user"), Reply::json(404, "")]);
    let chat_id = desk.chat(json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let first = desk.agent.reply(chat_id, "one").await;
    let second = desk.agent.reply(chat_id, "two").await;

    let ev = delivery_event(&mut stream, &first, WAIT).await;
    assert_eq!(
        (&ev["state"], &ev["error"]),
        (&json!("failed"), &json!("no such user"))
    );
    let ev = delivery_event(&mut stream, &second, WAIT).await;
    assert_eq!(ev["state"], "failed");
    let reason = ev["error"].as_str().expect("a reason for the 404");
    assert!(reason.contains("404"), "{reason}");

    let m = desk.settled(chat_id, &first).await;
    assert_eq!(
        (&m["delivery"], &m["delivery_error"]),
        (&json!("failed"), &json!("no such user"))
    );
    let m = desk.settled(chat_id, &second).await;
    assert_eq!(
        (&m["delivery"], &m["delivery_error"]),
        (&json!("failed"), &json!(reason))
    );

    // Well past the retry interval: still the two requests.
    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(EARLY_WINDOW).await;
    let got = desk.integrator.requests();
    assert_eq!(
        labels(&got),
        vec![first["uid"].clone(), second["uid"].clone()],
        "a 4xx was retried"
    );
    desk.stop().await;
}

#[tokio::test]
async fn a_5xx_is_retried_under_the_same_delivery_id() {
    let desk = Desk::open().await;
    desk.integrator.script([Reply::json(503, "busy")]);
    let chat_id = desk.chat(json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let sent = desk.agent.reply(chat_id, "retry me").await;

    let ev = delivery_event(&mut stream, &sent, WAIT).await;
    assert_eq!(ev["state"], "delivered");
    let got = desk.integrator.requests();
    assert_eq!(got.len(), 2);
    assert_eq!(ev["delivery_id"], one_delivery_id(&got));
    assert_eq!(attempt_numbers(&got), ["1", "2"]);
    assert_eq!(
        got[0].body, got[1].body,
        "a retry must resend the same body"
    );
    assert!(
        got[1].at - got[0].at >= Duration::from_millis(200),
        "retried after {:?}, before the retry interval",
        got[1].at - got[0].at
    );
    assert_eq!(desk.settled(chat_id, &sent).await["delivery"], "delivered");
    desk.stop().await;
}

#[tokio::test]
async fn a_receiver_that_always_fails_gets_three_attempts() {
    let clock = ManualClock::new();
    let desk = Desk::open_on(&clock).await;
    desk.integrator
        .set_default(Reply::json(500, "database down"));
    let chat_id = desk.chat(json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let sent_at = clock.now_ms();
    let sent = desk.agent.reply(chat_id, "anyone?").await;

    // Attempts at 0, 300 and 600 ms; the give-up comes after the last interval.
    desk.integrator.wait_for(1, WAIT).await;
    for n in 2..=3 {
        move_clock_to(&clock, sent_at + 300 * (n - 1)).await;
        desk.integrator.wait_for(n as usize, WAIT).await;
    }
    move_clock_to(&clock, sent_at + 900).await;
    let ev = delivery_event(&mut stream, &sent, WAIT).await;
    assert_eq!(
        (&ev["state"], &ev["error"]),
        (&json!("failed"), &json!("database down"))
    );
    let m = desk.settled(chat_id, &sent).await;
    assert_eq!(
        (&m["delivery"], &m["delivery_error"]),
        (&json!("failed"), &json!("database down"))
    );
    let got = desk.integrator.requests();
    let stamps: Vec<Option<i64>> = got.iter().map(|r| r.hub_ms).collect();
    assert_eq!(
        stamps,
        [Some(sent_at), Some(sent_at + 300), Some(sent_at + 600)]
    );
    assert_eq!(attempt_numbers(&got), ["1", "2", "3"]);
    let id = one_delivery_id(&got);
    let row = desk.hub.delivery_done(&id).await;
    assert_eq!(
        row.finished_at,
        Some(sent_at + 900),
        "given up after the last interval"
    );

    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(EARLY_WINDOW).await;
    assert_eq!(desk.integrator.requests().len(), 3, "a fourth attempt");
    desk.stop().await;
}

#[tokio::test]
async fn a_timed_out_attempt_is_retried() {
    let desk = Desk::open().await;
    // Longer than attempt_timeout_ms (300).
    desk.integrator
        .script([Reply::ok().delayed(Duration::from_millis(1500))]);
    let chat_id = desk.chat(json!(7)).await;
    let first = desk.agent.reply(chat_id, "slow one").await;
    assert_eq!(desk.settled(chat_id, &first).await["delivery"], "delivered");
    let got = desk.integrator.requests();
    assert_eq!(attempt_numbers(&got), ["1", "2"]);
    one_delivery_id(&got);

    // A receiver that never answers in time: three attempts, then the timeout is the reason.
    desk.integrator
        .set_default(Reply::ok().delayed(Duration::from_millis(1500)));
    let second = desk.agent.reply(chat_id, "slower one").await;
    let m = desk.settled(chat_id, &second).await;
    assert_eq!(m["delivery"], "failed");
    let reason = m["delivery_error"].as_str().unwrap_or_default();
    assert!(reason.contains("300 ms"), "{reason}");
    let got = desk.integrator.requests();
    assert_eq!(attempt_numbers(&got[2..]), ["1", "2", "3"]);
    desk.stop().await;
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retried_then_fails() {
    let desk = Desk::open().await;
    let nowhere = format!("http://{}/hub", closed_port().await);
    let ch = desk
        .hub
        .create_channel("down", &nowhere, false, &[AGENT_EMAIL])
        .await;
    let chat_id = desk.chat_on(&ch, json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let started = Instant::now();
    let sent = desk.agent.reply(chat_id, "hello?").await;

    let ev = delivery_event(&mut stream, &sent, WAIT).await;
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "gave up after {:?}, before the retries",
        started.elapsed()
    );
    assert_eq!(ev["state"], "failed");
    let reason = ev["error"].as_str().unwrap_or_default();
    assert!(reason.contains("connect"), "{reason}");
    let m = desk.settled(chat_id, &sent).await;
    assert_eq!(
        (&m["delivery"], &m["delivery_error"]),
        (&json!("failed"), &json!(reason))
    );
    desk.stop().await;
}

#[tokio::test]
async fn an_endpoint_that_comes_up_between_attempts_gets_the_message() {
    let desk = Desk::open_with(
        HubOptions {
            retry_interval_ms: 1000,
            ..HubOptions::default()
        },
        false,
    )
    .await;
    let addr = closed_port().await;
    let ch = desk
        .hub
        .create_channel("late", &format!("http://{addr}/hub"), false, &[AGENT_EMAIL])
        .await;
    let chat_id = desk.chat_on(&ch, json!(7)).await;
    let sent = desk.agent.reply(chat_id, "wake up").await;
    // The first attempt is refused (the row waits for its retry with the
    // refusal noted: `attempts` alone also counts an attempt in flight);
    // the integrator starts before the next one.
    eventually(WAIT, "the first attempt refused", || async {
        let (status, v) = desk
            .hub
            .admin(
                reqwest::Method::GET,
                "/admin/v1/deliveries?state=pending",
                None,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        v["deliveries"]
            .as_array()?
            .iter()
            .any(|d| {
                d["chat_id"] == json!(chat_id)
                    && d["attempts"].as_i64() >= Some(1)
                    && d["last_error"].is_string()
            })
            .then_some(())
    })
    .await;
    let late = Integrator::start_on(&addr.to_string()).await;
    let req = late.wait_for(1, WAIT).await.remove(0);
    assert_ne!(req.header("x-hub-attempt"), Some("1"));
    assert_eq!(req.json()["message"]["id"], sent["uid"]);
    assert_eq!(desk.settled(chat_id, &sent).await["delivery"], "delivered");
    desk.stop().await;
}

/// The spec's own numbers: 3 attempts 3 s apart, the error reaches the agent
/// after 9 s. On a clock the test moves, so the intervals are exact and the
/// machine's load cannot stretch them.
#[tokio::test]
async fn the_spec_timing_three_seconds_apart_and_the_error_after_nine() {
    let clock = ManualClock::new();
    let desk = Desk::open_with(
        HubOptions {
            retry_interval_ms: 3000,
            attempt_timeout_ms: 3000,
            clock: Some(clock.clone()),
            ..HubOptions::default()
        },
        false,
    )
    .await;
    desk.integrator.on_clock(&clock);
    desk.integrator.set_default(Reply::json(503, ""));
    let chat_id = desk.chat(json!(7)).await;
    let mut stream = desk.agent.stream().await;
    let sent_at = clock.now_ms();
    let sent = desk.agent.reply(chat_id, "are you up?").await;

    let got = desk.integrator.wait_for(1, WAIT).await;
    assert_eq!(got[0].hub_ms, Some(sent_at), "the first attempt at once");
    for n in 2..=3 {
        move_clock_to(&clock, sent_at + 3000 * (n - 1)).await;
        let got = desk.integrator.wait_for(n as usize, WAIT).await;
        assert_eq!(
            got[n as usize - 1].hub_ms,
            Some(sent_at + 3000 * (n - 1)),
            "attempt {n} is 3 s after the one before"
        );
    }
    let reply = messages(&desk.agent.chat(chat_id).await)
        .into_iter()
        .find(|m| m["uid"] == sent["uid"])
        .expect("the reply in the chat");
    assert_eq!(reply["delivery"], "pending", "the error came before 9 s");
    move_clock_to(&clock, sent_at + 9000).await;
    let ev = delivery_event(&mut stream, &sent, WAIT).await;
    assert_eq!(ev["state"], "failed");
    assert!(
        ev["error"].as_str().is_some_and(|e| e.contains("503")),
        "{ev}"
    );
    let got = desk.integrator.requests();
    assert_eq!(attempt_numbers(&got), ["1", "2", "3"]);
    let row = desk.hub.delivery_done(&one_delivery_id(&got)).await;
    assert_eq!(
        row.finished_at,
        Some(sent_at + 9000),
        "the error 9 s after the reply"
    );
    desk.stop().await;
}

#[tokio::test]
async fn messages_of_one_chat_are_delivered_in_order() {
    let desk = Desk::open().await;
    desk.integrator
        .script([Reply::json(500, "down"), Reply::json(500, "down")]);
    let chat_id = desk.chat(json!(7)).await;
    let a = desk.agent.reply(chat_id, "A").await;
    let b = desk.agent.reply(chat_id, "B").await;

    assert_eq!(desk.settled(chat_id, &b).await["delivery"], "delivered");
    assert_eq!(desk.settled(chat_id, &a).await["delivery"], "delivered");
    let got = desk.integrator.requests();
    // B is first sent only after A's third (successful) attempt.
    assert_eq!(
        labels(&got),
        vec![
            a["uid"].clone(),
            a["uid"].clone(),
            a["uid"].clone(),
            b["uid"].clone()
        ]
    );
    assert_eq!(attempt_numbers(&got), ["1", "2", "3", "1"]);
    let texts: Vec<Value> = messages(&desk.agent.chat(chat_id).await)
        .iter()
        .filter(|m| m["author"] == "agent")
        .map(|m| m["body"]["text"].clone())
        .collect();
    assert_eq!(texts, vec![json!("A"), json!("B")]);
    desk.stop().await;
}

/// Replies queued behind a pending reply of their chat go out one by one,
/// each as soon as the one before it is delivered, with the hub's clock held
/// (no timer of the deliverer fires: only the results may set it going).
/// On PostgreSQL the first reply is handed to the deliverer as it is
/// written and the ones behind it are not; the results' statement says
/// when it made the next one the chat's head.
#[tokio::test]
async fn replies_behind_a_failed_one_follow_it_as_it_is_delivered() {
    replies_follow_the_one_before(false).await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL (scripts/with-postgres.sh)"]
async fn replies_behind_a_failed_one_follow_it_as_it_is_delivered_on_postgres() {
    replies_follow_the_one_before(true).await;
}

async fn replies_follow_the_one_before(postgres: bool) {
    if postgres {
        crate::support::require_postgres("replies handed to the deliverer");
    }
    let clock = ManualClock::new();
    let desk = Desk::open_on(&clock).await;
    desk.integrator.script([Reply::json(500, "down")]);
    let chat_id = desk.chat(json!(7)).await;
    let sent_at = clock.now_ms();
    let a = desk.agent.reply(chat_id, "A").await;
    desk.integrator.wait_for(1, WAIT).await;
    let b = desk.agent.reply(chat_id, "B").await;
    let c = desk.agent.reply(chat_id, "C").await;
    tokio::time::sleep(EARLY_WINDOW).await;
    assert_eq!(desk.integrator.requests().len(), 1, "B or C went before A");
    // A's retry falls due; B and C follow without the clock moving again.
    move_clock_to(&clock, sent_at + 300).await;
    let got = desk.integrator.wait_for(4, WAIT).await;
    assert_eq!(
        labels(&got),
        [
            a["uid"].clone(),
            a["uid"].clone(),
            b["uid"].clone(),
            c["uid"].clone()
        ]
    );
    assert_eq!(desk.settled(chat_id, &c).await["delivery"], "delivered");
    desk.stop().await;
}

#[tokio::test]
async fn a_failing_chat_does_not_hold_up_another_chat() {
    let desk = Desk::open_with(
        HubOptions {
            retry_interval_ms: 1000,
            ..HubOptions::default()
        },
        false,
    )
    .await;
    // In arrival order: chat 1's attempt 1, chat 2's message, chat 1's attempts 2 and 3.
    desk.integrator.script([
        Reply::json(500, "down"),
        Reply::ok(),
        Reply::json(500, "down"),
        Reply::json(500, "down"),
    ]);
    let stuck = desk.chat(json!(1)).await;
    let free = desk.chat(json!(2)).await;
    let mut stream = desk.agent.stream().await;
    let a = desk.agent.reply(stuck, "to the failing chat").await;
    desk.integrator.wait_for(1, WAIT).await;
    let b = desk.agent.reply(free, "to the healthy chat").await;

    let ev = delivery_event(&mut stream, &b, WAIT).await;
    assert_eq!(ev["state"], "delivered");
    let pending = messages(&desk.agent.chat(stuck).await)
        .into_iter()
        .find(|m| m["uid"] == a["uid"])
        .expect("chat 1's message");
    assert_eq!(pending["delivery"], "pending", "chat 2 waited for chat 1");

    assert_eq!(desk.settled(stuck, &a).await["delivery"], "failed");
    let recipients: Vec<Value> = desk
        .integrator
        .requests()
        .iter()
        .map(|r| r.json()["recipient"]["id"].clone())
        .collect();
    assert_eq!(recipients, vec![json!(1), json!(2), json!(1), json!(1)]);
    desk.stop().await;
}

#[tokio::test]
async fn the_event_log_holds_the_whole_exchange() {
    let desk = Desk::open().await;
    let chat_id = desk.chat(json!(42)).await;
    let sent = desk.agent.reply(chat_id, "logged").await;
    assert_eq!(desk.settled(chat_id, &sent).await["delivery"], "delivered");
    let req = desk.integrator.requests().remove(0);

    let events = desk
        .hub
        .store()
        .events_of_chat(chat_id)
        .await
        .expect("events of the chat");
    // Accepting the chat also made a chat_accepted webhook (no receiver set).
    assert!(
        events
            .iter()
            .any(|e| e.kind.as_str() == "webhook.chat_accepted" && e.direction == Direction::Out)
    );
    let events: Vec<_> = events
        .into_iter()
        .filter(|e| e.kind.as_str().starts_with("channel."))
        .collect();
    let kinds: Vec<(&str, Direction)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.direction))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("channel.customer_message", Direction::In),
            ("channel.agent_message", Direction::Out),
            ("channel.delivery_result", Direction::In),
        ]
    );
    let customer = &events[0].payload;
    assert_eq!(customer["sender"]["id"], 42);
    assert_eq!(
        customer["message"],
        json!({ "type": "text", "text": "hello" })
    );
    assert_eq!(
        events[1].payload,
        req.json(),
        "the log holds the body as sent"
    );
    let result = &events[2].payload;
    assert_eq!(result["state"], "delivered");
    assert_eq!(result["error"], Value::Null);
    assert_eq!(result["message_id"], sent["id"]);
    assert_eq!(result["delivery_id"].as_str(), req.header("x-hub-delivery"));
    assert_eq!(result["event_id"], json!(events[1].id.to_string()));
    desk.stop().await;
}

#[tokio::test]
async fn declared_channels_keep_their_address_across_restarts() {
    let integrator = Integrator::start().await;
    let opts = HubOptions {
        extra_toml: format!(
            "[[channels]]\nname = \"declared\"\ncustomer_endpoint = \"{}\"\nchunked = true\n\
             agents = [\"{AGENT_EMAIL}\"]\n",
            integrator.url
        ),
        ..HubOptions::default()
    };
    let hub = TestHub::start_with(opts).await;
    let agent = agent_with_photo(&hub).await;
    let before = admin_channels(&hub).await;
    assert_eq!(before.len(), 1, "{before:?}");
    let ch = &before[0];
    assert_eq!(ch["name"], "declared");
    assert_eq!(ch["declared"], true);
    assert_eq!(ch["chunked"], true);
    assert_eq!(ch["customer_endpoint"], integrator.url.as_str());
    assert_eq!(ch["agents"], json!([AGENT_EMAIL]));
    let old_base = hub.base.clone();
    let path = |ch: &Value, base: &str| -> String {
        let url = ch["endpoint_url"].as_str().expect("endpoint_url");
        url.strip_prefix(base)
            .unwrap_or_else(|| panic!("{url} is not under {base}"))
            .to_owned()
    };
    let old_path = path(ch, &old_base);

    let hub = hub.restart().await;
    let after = admin_channels(&hub).await;
    assert_eq!(
        after.len(),
        1,
        "the restart duplicated the channel: {after:?}"
    );
    assert_eq!(after[0]["public_id"], ch["public_id"]);
    assert_eq!(after[0]["declared"], true);
    // The port is picked anew on each start; everything after the base stays.
    assert_eq!(path(&after[0], &hub.base), old_path);

    // The integrator's old address still works, and replies go out chunked.
    let endpoint = TestChannel {
        public_id: ch["public_id"].as_str().expect("public_id").to_owned(),
        endpoint_url: format!("{}{old_path}", hub.base),
        status_url: String::new(),
        raw: after[0].clone(),
    };
    hub.say(&endpoint, json!(5), "after the restart").await;
    let agent = TestAgent {
        base: hub.base.clone(),
        ..agent
    };
    let chat_id = chat_ids(&agent).await[0];
    let sent = agent.reply(chat_id, "still here").await;
    let req = integrator.wait_for(1, WAIT).await.remove(0);
    assert!(req.is_chunked());
    assert_eq!(req.path, format!("/hub/{}", endpoint.public_id));
    assert_eq!(req.json()["message"]["id"], sent["uid"]);
    hub.shutdown().await;
}

/// An integrator that answers the first request with a status line and the
/// start of a body it never finishes (then resets the connection), and every
/// later one with `{"result":"ok"}`. Returns its URL and the requests' heads.
async fn cut_off_integrator() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/hub", listener.local_addr().expect("addr"));
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            // Read one request: headers, then Content-Length bytes.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let head_end = loop {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(head_end) = head_end else { continue };
            let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < head_end + length {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let first = {
                let mut h = seen.lock().expect("heads");
                h.push(head);
                h.len() == 1
            };
            if first {
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                    .await;
                let _ = stream.flush().await;
                // Linger 0: the close is a reset, as the fault battery saw it.
                let _ = stream.set_zero_linger();
                drop(stream);
            } else {
                let body = br#"{"result":"ok"}"#;
                let _ = stream
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = stream.write_all(body).await;
                let _ = stream.flush().await;
            }
        }
    });
    (url, heads)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_cut_off_after_its_status_line_is_retried_with_the_same_delivery_id() {
    let (url, heads) = cut_off_integrator().await;
    let hub = TestHub::start().await;
    let ch = hub
        .create_channel("shop", &url, false, &[AGENT_EMAIL])
        .await;
    let agent = agent_with_photo(&hub).await;
    hub.say(&ch, json!(7), "hello").await;
    let chat_id = chat_ids(&agent).await[0];
    let (status, sent) = agent
        .post(
            &format!("/agent/v1/chats/{chat_id}/messages"),
            json!({ "type": "text", "text": "did this arrive?" }),
        )
        .await;
    assert_eq!(status, 201, "{sent}");
    let sent = sent["message"].clone();
    let uid = &sent["uid"];
    let agent_ref = &agent;
    let state = eventually(WAIT, "a final delivery state", || async move {
        let m = agent_ref.chat(chat_id).await["messages"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["uid"] == *uid).cloned())?;
        (m["delivery"] != "pending").then_some(m["delivery"].clone())
    })
    .await;
    assert_eq!(state, "delivered");
    let heads = heads.lock().expect("heads").clone();
    assert_eq!(
        heads.len(),
        2,
        "a body that broke off is not an answer: it must be tried again"
    );
    let header = |h: &str, name: &str| {
        h.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_owned())
    };
    assert_eq!(
        header(&heads[0], "x-hub-delivery"),
        header(&heads[1], "x-hub-delivery"),
        "the retry keeps the delivery id"
    );
    assert_eq!(header(&heads[0], "x-hub-attempt").as_deref(), Some("1"));
    assert_eq!(header(&heads[1], "x-hub-attempt").as_deref(), Some("2"));
    hub.shutdown().await;
}
