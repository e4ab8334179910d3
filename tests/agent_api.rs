//! The agent API: tokens, who sees which chats, accept/close/reply rules, and
//! the live event stream.

use std::time::Duration;

use crate::support::{ADMIN_TOKEN, Integrator, Sse, TestAgent, TestChannel, TestHub};
use reqwest::Method;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(5);

/// A hub where Ann and Bob work on channel `web` and Carl on channel `shop`;
/// agent replies go to a loopback integrator.
struct Office {
    hub: TestHub,
    integrator: Integrator,
    ann: TestAgent,
    bob: TestAgent,
    carl: TestAgent,
    web: TestChannel,
    shop: TestChannel,
}

impl Office {
    async fn open() -> Office {
        let hub = TestHub::start().await;
        let integrator = Integrator::start().await;
        let ann = hub.create_agent("Ann", "ann@example.com").await;
        let bob = hub.create_agent("Bob", "bob@example.com").await;
        let carl = hub.create_agent("Carl", "carl@example.com").await;
        let web = hub
            .create_channel(
                "web",
                &integrator.url,
                false,
                &["ann@example.com", "bob@example.com"],
            )
            .await;
        let shop = hub
            .create_channel("shop", &integrator.url, false, &["carl@example.com"])
            .await;
        Office {
            hub,
            integrator,
            ann,
            bob,
            carl,
            web,
            shop,
        }
    }

    /// Customer `sender` writes on `ch`; returns the chat as `agent` (who works
    /// on `ch`) finds it: the newest one.
    async fn chat_from(&self, ch: &TestChannel, agent: &TestAgent, sender: i64) -> i64 {
        self.hub.say(ch, json!(sender), "hello").await;
        agent
            .chats()
            .await
            .iter()
            .filter_map(|c| c["id"].as_i64())
            .max()
            .expect("the customer's chat")
    }

    /// A chat on `web` from customer 1.
    async fn web_chat(&self) -> i64 {
        self.chat_from(&self.web, &self.ann, 1).await
    }
}

/// `POST /agent/v1/chats/{id}/{action}` (accept, close or messages).
async fn act(
    agent: &TestAgent,
    chat: impl std::fmt::Display,
    action: &str,
    body: Value,
) -> (u16, Value) {
    agent
        .post(&format!("/agent/v1/chats/{chat}/{action}"), body)
        .await
}

/// Accepts or closes a chat, which must succeed; returns the chat.
async fn done(agent: &TestAgent, chat: i64, action: &str) -> Value {
    let (status, v) = act(agent, chat, action, json!({})).await;
    assert_eq!(status, 200, "{action} chat {chat}: {v}");
    v
}

fn text(t: &str) -> Value {
    json!({ "type": "text", "text": t })
}

/// A request with `token` (if any) and a raw body; answers status and JSON.
async fn raw(
    hub: &TestHub,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut req = hub.http.request(method, hub.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if !body.is_empty() {
        req = req
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn assert_error(label: &str, (status, v): &(u16, Value), expected: u16) {
    assert_eq!(*status, expected, "{label}: {v}");
    assert!(
        v["error"]["code"].as_str().is_some_and(|c| !c.is_empty()),
        "{label}: no JSON error code in {v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{label}: no JSON error message in {v}"
    );
}

/// Messages of a chat as `agent` sees them.
async fn messages(agent: &TestAgent, chat: i64) -> Vec<Value> {
    agent.chat(chat).await["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Reads the stream until every event in `names` for `chat` arrived; returns
/// their data in the order of `names`.
async fn events(sse: &mut Sse, chat: i64, names: &[&str]) -> Vec<Value> {
    let mut found: Vec<Option<Value>> = vec![None; names.len()];
    while found.iter().any(Option::is_none) {
        let (name, data) = sse
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("stream ended waiting for {names:?}: got {found:?}"));
        if data["chat_id"] != chat {
            continue;
        }
        if let Some(i) = names.iter().position(|n| *n == name)
            && found[i].is_none()
        {
            found[i] = Some(data);
        }
    }
    found.into_iter().flatten().collect()
}

#[tokio::test]
async fn the_agent_api_needs_a_valid_token() {
    let office = Office::open().await;
    let hub = &office.hub;
    let forged = format!("{}x", office.ann.token);
    for token in [
        None,
        Some("hub_agent_0000"),
        Some(forged.as_str()),
        Some(ADMIN_TOKEN),
    ] {
        for (method, path, body) in [
            (Method::GET, "/agent/v1/chats", ""),
            (Method::GET, "/agent/v1/me", ""),
            (Method::GET, "/agent/v1/stream", ""),
            (Method::PUT, "/agent/v1/status", r#"{"online":true}"#),
        ] {
            let answer = raw(hub, method, path, token, body).await;
            assert_error(&format!("{path} with {token:?}"), &answer, 401);
        }
    }
    // The refused status change did not take effect.
    let status = answer_text(hub, &office.web.status_url).await;
    assert_eq!(status, "0");
    let (code, me) = office.ann.get("/agent/v1/me").await;
    assert_eq!(code, 200);
    assert_eq!(me["email"], "ann@example.com");
    assert_eq!(me["online"], false);
    office.hub.shutdown().await;
}

async fn answer_text(hub: &TestHub, url: &str) -> String {
    let resp = hub.http.get(url).send().await.expect("request");
    assert_eq!(resp.status(), 200);
    resp.text().await.expect("body")
}

#[tokio::test]
async fn the_agent_token_is_shown_only_at_creation() {
    let hub = TestHub::start().await;
    let created = raw(
        &hub,
        Method::POST,
        "/admin/v1/agents",
        Some(ADMIN_TOKEN),
        r#"{"name":"Dana","email":"dana@example.com"}"#,
    )
    .await;
    assert_eq!(created.0, 201, "{}", created.1);
    let token = created.1["token"].as_str().expect("token").to_owned();
    assert!(token.len() >= 32, "token `{token}` is short");

    let (status, me) = raw(&hub, Method::GET, "/agent/v1/me", Some(&token), "").await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["email"], "dana@example.com");

    let resp = hub
        .http
        .get(hub.url("/admin/v1/agents"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("list agents");
    assert_eq!(resp.status(), 200);
    let listing = resp.text().await.expect("agent list");
    assert!(!listing.contains(&token), "the token is listed: {listing}");
    assert!(
        !listing.contains("token"),
        "a token field is listed: {listing}"
    );
    let listed: Value = serde_json::from_str(&listing).expect("agent list JSON");
    assert_eq!(listed["agents"][0]["email"], "dana@example.com");
    assert_eq!(listed["agents"].as_array().map(Vec::len), Some(1));
    hub.shutdown().await;
}

#[tokio::test]
async fn a_second_agent_with_the_same_email_is_refused() {
    let hub = TestHub::start().await;
    let first = hub.create_agent("Ann", "ann@example.com").await;
    for email in ["ann@example.com", "ANN@Example.com"] {
        let body = json!({ "name": "Other Ann", "email": email }).to_string();
        let answer = raw(
            &hub,
            Method::POST,
            "/admin/v1/agents",
            Some(ADMIN_TOKEN),
            &body,
        )
        .await;
        assert_error(email, &answer, 409);
        assert!(answer.1.get("token").is_none(), "{}", answer.1);
    }
    // The first agent keeps working under its name.
    let (status, me) = first.get("/agent/v1/me").await;
    assert_eq!(status, 200);
    assert_eq!(me["name"], "Ann");
    hub.shutdown().await;
}

#[tokio::test]
async fn agents_see_only_chats_of_their_channels() {
    let office = Office::open().await;
    let web = office.web_chat().await;
    let shop = office.chat_from(&office.shop, &office.carl, 2).await;
    let ids = |chats: Vec<Value>| -> Vec<Value> { chats.iter().map(|c| c["id"].clone()).collect() };
    assert_eq!(ids(office.ann.chats().await), vec![json!(web)]);
    assert_eq!(ids(office.bob.chats().await), vec![json!(web)]);
    assert_eq!(ids(office.carl.chats().await), vec![json!(shop)]);

    for (agent, foreign) in [(&office.carl, web), (&office.ann, shop)] {
        let answer = agent.get(&format!("/agent/v1/chats/{foreign}")).await;
        assert_error("foreign chat view", &answer, 404);
        for (action, body) in [
            ("accept", json!({})),
            ("close", json!({})),
            ("messages", text("not mine")),
            ("messages", json!({ "type": "typein" })),
        ] {
            let answer = act(agent, foreign, action, body).await;
            assert_error(&format!("foreign {action}"), &answer, 404);
        }
    }
    // The foreign attempts changed nothing.
    for (agent, chat) in [(&office.ann, web), (&office.carl, shop)] {
        let view = agent.chat(chat).await;
        assert_eq!(view["chat"]["state"], "open");
        assert_eq!(view["messages"].as_array().map(Vec::len), Some(1));
    }
    office.hub.shutdown().await;
}

/// Agents' requests that arrive together find their chats in one lookup:
/// each still gets its own chat, and no agent a chat of another's channel.
#[tokio::test]
async fn requests_at_once_find_each_its_own_chat_and_never_a_foreign_one() {
    let office = Office::open().await;
    let web = office.web_chat().await;
    let shop = office.chat_from(&office.shop, &office.carl, 2).await;
    let mut asked = Vec::new();
    for round in 0..8 {
        for (agent, chat, mine) in [
            (&office.ann, web, true),
            (&office.carl, web, false),
            (&office.ann, shop, false),
            (&office.carl, shop, true),
            (&office.bob, 999_999, false),
        ] {
            asked.push(async move {
                let answer = act(agent, chat, "messages", text(&format!("round {round}"))).await;
                (agent.id, chat, mine, answer)
            });
        }
    }
    for (agent, chat, mine, answer) in futures_util::future::join_all(asked).await {
        if mine {
            assert_eq!(answer.0, 201, "{agent} in chat {chat}: {}", answer.1);
        } else {
            assert_error(&format!("{agent} in chat {chat}"), &answer, 404);
        }
    }
    // Each chat holds its first message and its agent's eight replies.
    for (agent, chat) in [(&office.ann, web), (&office.carl, shop)] {
        let view = agent.chat(chat).await;
        assert_eq!(view["messages"].as_array().map(Vec::len), Some(9), "{view}");
    }
    office.hub.shutdown().await;
}

#[tokio::test]
async fn malformed_or_unknown_chat_ids_answer_404() {
    let office = Office::open().await;
    let web = office.web_chat().await;
    for id in ["abc", "1.0", "-", &format!("{web}x"), "999999"] {
        let answer = office.ann.get(&format!("/agent/v1/chats/{id}")).await;
        assert_error(&format!("view {id}"), &answer, 404);
        for action in ["accept", "close", "messages"] {
            let answer = act(&office.ann, id, action, text("hi")).await;
            assert_error(&format!("{action} {id}"), &answer, 404);
        }
    }
    office.hub.shutdown().await;
}

#[tokio::test]
async fn accepting_gives_the_chat_to_one_agent() {
    let office = Office::open().await;
    let chat = office.web_chat().await;
    let accepted = done(&office.ann, chat, "accept").await;
    assert_eq!(accepted["state"], "accepted");
    assert_eq!(accepted["agent_id"], office.ann.id);
    let view = office.bob.chat(chat).await;
    assert_eq!(view["chat"]["state"], "accepted");
    assert_eq!(view["chat"]["agent_id"], office.ann.id);

    for (action, body) in [
        ("accept", json!({})),
        ("messages", text("let me take this")),
        ("close", json!({})),
    ] {
        let answer = act(&office.bob, chat, action, body).await;
        assert_error(&format!("Bob {action}"), &answer, 409);
    }
    // Accepting twice is harmless for the owner.
    let again = done(&office.ann, chat, "accept").await;
    assert_eq!(again["agent_id"], office.ann.id);
    let view = office.ann.chat(chat).await;
    assert_eq!(view["chat"]["state"], "accepted");
    assert_eq!(view["chat"]["agent_id"], office.ann.id);
    assert_eq!(view["messages"].as_array().map(Vec::len), Some(1));
    office.hub.shutdown().await;
}

#[tokio::test]
async fn a_closed_chat_takes_no_more_actions() {
    let office = Office::open().await;
    let chat = office.web_chat().await;
    done(&office.ann, chat, "accept").await;
    let closed = done(&office.ann, chat, "close").await;
    assert_eq!(closed["state"], "closed");

    for (agent, action, body) in [
        (&office.ann, "messages", text("one more thing")),
        (&office.ann, "accept", json!({})),
        (&office.bob, "accept", json!({})),
        (&office.bob, "messages", text("hi")),
    ] {
        let answer = act(agent, chat, action, body).await;
        assert_error(&format!("{action} on a closed chat"), &answer, 409);
    }
    assert!(
        office.ann.chats().await.is_empty(),
        "closed chat still listed"
    );
    let (status, all) = office.ann.get("/agent/v1/chats?state=all").await;
    assert_eq!(status, 200);
    assert_eq!(all["chats"][0]["id"], chat);
    assert_eq!(all["chats"][0]["state"], "closed");
    assert_eq!(messages(&office.ann, chat).await.len(), 1);
    office.hub.shutdown().await;
}

#[tokio::test]
async fn replying_to_an_open_chat_accepts_it() {
    let office = Office::open().await;
    let chat = office.web_chat().await;
    office.ann.reply(chat, "Hi, how can I help?").await;
    let view = office.bob.chat(chat).await;
    assert_eq!(view["chat"]["state"], "accepted");
    assert_eq!(view["chat"]["agent_id"], office.ann.id);
    let answer = act(&office.bob, chat, "messages", text("me too")).await;
    assert_error("Bob replies", &answer, 409);
    office.hub.shutdown().await;
}

#[tokio::test]
async fn invalid_agent_messages_are_refused_and_not_sent() {
    let office = Office::open().await;
    let chat = office.web_chat().await;
    let path = format!("/agent/v1/chats/{chat}/messages");
    let bad = [
        json!({ "text": "no type" }).to_string(),
        json!({ "type": "text" }).to_string(),
        json!({ "type": "text", "text": "" }).to_string(),
        json!({ "type": "gif", "file": "https://x.example/a.gif" }).to_string(),
        json!({ "type": "photo", "file": "ftp://x.example/a.png", "file_name": "a.png",
                "file_size": 10 })
        .to_string(),
        json!({ "type": "video", "file": "https://x.example/a.mp4", "file_name": "a.mp4" })
            .to_string(),
        json!({ "type": "document", "file": "https://x.example/a.pdf", "file_name": "a.pdf",
                "file_size": -5 })
        .to_string(),
        json!({ "type": "location", "latitude": 10 }).to_string(),
        json!([text("hi")]).to_string(),
        "{\"type\":\"text\",".to_owned(),
    ];
    for body in bad {
        let answer = raw(
            &office.hub,
            Method::POST,
            &path,
            Some(&office.ann.token),
            &body,
        )
        .await;
        assert_error(&body, &answer, 400);
    }
    let view = office.ann.chat(chat).await;
    assert_eq!(
        view["chat"]["state"], "open",
        "a refused message accepted the chat"
    );
    assert_eq!(view["messages"].as_array().map(Vec::len), Some(1));

    // The first thing the integrator gets is the valid reply sent afterwards.
    office.ann.reply(chat, "valid").await;
    let got = office.integrator.wait_for(1, WAIT).await;
    assert_eq!(got[0].json()["message"]["text"], "valid");
    office.hub.shutdown().await;
}

#[tokio::test]
async fn a_reply_is_stored_pending_and_typing_is_not_stored() {
    let office = Office::open().await;
    let chat = office.web_chat().await;
    let reply = office.ann.reply(chat, "Hello from Ann").await;
    assert_eq!(reply["delivery"], "pending");
    assert_eq!(reply["author"], "agent");
    assert_eq!(reply["agent_id"], office.ann.id);
    assert_eq!(reply["body"]["type"], "text");
    assert_eq!(reply["body"]["text"], "Hello from Ann");

    let photo = json!({ "type": "photo", "file": "https://files.example.com/a.png",
                        "file_name": "a.png", "file_size": 10 });
    let (status, v) = act(&office.ann, chat, "messages", photo).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["message"]["body"]["file_name"], "a.png");

    for typing in ["typein", "typeout"] {
        let (status, v) = act(&office.ann, chat, "messages", json!({ "type": typing })).await;
        assert_eq!(status, 202, "{typing}: {v}");
    }
    let stored: Vec<Value> = messages(&office.ann, chat)
        .await
        .iter()
        .map(|m| m["body"]["type"].clone())
        .collect();
    assert_eq!(stored, vec![json!("text"), json!("text"), json!("photo")]);
    office.hub.shutdown().await;
}

#[tokio::test]
async fn the_stream_follows_a_chat_through_its_life() {
    let office = Office::open().await;
    let mut ann = office.ann.stream().await;
    let chat = office.web_chat().await;

    let got = events(&mut ann, chat, &["chat.opened", "chat.message"]).await;
    assert_eq!(got[0]["channel_id"], office.web.raw["id"]);
    assert_eq!(got[0]["data"]["chat"]["state"], "open");
    assert_eq!(got[0]["data"]["client"]["external_id"], 1);
    assert_eq!(got[1]["data"]["message"]["author"], "client");
    assert_eq!(got[1]["data"]["message"]["body"]["text"], "hello");

    done(&office.ann, chat, "accept").await;
    let got = events(&mut ann, chat, &["chat.accepted"]).await;
    assert_eq!(got[0]["data"]["agent_id"], office.ann.id);
    assert_eq!(got[0]["data"]["chat"]["state"], "accepted");

    let reply = office.ann.reply(chat, "On it").await;
    let got = events(&mut ann, chat, &["chat.message", "message.delivery"]).await;
    assert_eq!(got[0]["data"]["message"]["id"], reply["id"]);
    assert_eq!(got[0]["data"]["message"]["author"], "agent");
    assert_eq!(got[1]["data"]["message_id"], reply["id"]);
    assert_eq!(got[1]["data"]["state"], "delivered");
    assert_eq!(
        messages(&office.ann, chat).await[1]["delivery"],
        "delivered"
    );

    done(&office.ann, chat, "close").await;
    let got = events(&mut ann, chat, &["chat.closed"]).await;
    assert_eq!(got[0]["data"]["chat"]["state"], "closed");
    office.hub.shutdown().await;
}

#[tokio::test]
async fn the_stream_carries_only_the_agents_channels() {
    let office = Office::open().await;
    let mut ann = office.ann.stream().await;
    let mut carl = office.carl.stream().await;
    let web = office.web_chat().await;
    done(&office.ann, web, "accept").await;
    let reply = office.ann.reply(web, "hi").await;
    done(&office.ann, web, "close").await;
    let got = events(
        &mut ann,
        web,
        &[
            "chat.opened",
            "chat.accepted",
            "message.delivery",
            "chat.closed",
        ],
    )
    .await;
    assert_eq!(got[2]["data"]["message_id"], reply["id"]);

    // Everything about `web` was published before this chat on `shop`: Carl's
    // stream must show the `shop` chat with nothing about `web` before it.
    office
        .hub
        .say(&office.shop, json!(9), "shop question")
        .await;
    loop {
        let (name, data) = carl.next(WAIT).await.expect("Carl's own chat event");
        assert_ne!(
            data["chat_id"], web,
            "Carl got `{name}` about a web chat: {data}"
        );
        assert_eq!(data["channel_id"], office.shop.raw["id"], "{name}: {data}");
        if name == "chat.opened" {
            break;
        }
    }
    office.hub.shutdown().await;
}

#[tokio::test]
async fn a_status_change_needs_a_valid_json_body() {
    let office = Office::open().await;
    for body in [
        "{online",
        "",
        "{}",
        r#"{"online":"yes"}"#,
        r#"{"online":1}"#,
    ] {
        let answer = raw(
            &office.hub,
            Method::PUT,
            "/agent/v1/status",
            Some(&office.ann.token),
            body,
        )
        .await;
        assert_error(&format!("status body {body:?}"), &answer, 400);
    }
    assert_eq!(answer_text(&office.hub, &office.web.status_url).await, "0");
    office.ann.set_online(true).await;
    assert_eq!(answer_text(&office.hub, &office.web.status_url).await, "1");
    office.hub.shutdown().await;
}

#[tokio::test]
async fn two_agents_taking_a_chat_at_once_do_not_both_win() {
    let office = Office::open().await;
    for sender in 1..=10 {
        let chat = office.chat_from(&office.web, &office.ann, sender).await;
        // Bob accepts the first chats and replies to the others.
        let (bob_action, bob_body, bob_ok) = if sender <= 5 {
            ("accept", json!({}), 200)
        } else {
            ("messages", text("mine"), 201)
        };
        let (ann, bob) = tokio::join!(
            act(&office.ann, chat, "accept", json!({})),
            act(&office.bob, chat, bob_action, bob_body),
        );
        let winner = match (ann.0, bob.0) {
            (200, 409) => office.ann.id,
            (409, code) if code == bob_ok => office.bob.id,
            _ => panic!("chat {chat}: both or neither won: ann {ann:?}, bob {bob:?}"),
        };
        let view = office.ann.chat(chat).await;
        assert_eq!(view["chat"]["agent_id"], winner, "chat {chat}");
        let replies = view["messages"].as_array().map_or(0, |m| m.len()) - 1;
        let bob_replied = usize::from(winner == office.bob.id && sender > 5);
        assert_eq!(
            replies, bob_replied,
            "chat {chat}: a refused reply was stored"
        );
    }
    office.hub.shutdown().await;
}

#[tokio::test]
async fn replies_from_two_agents_at_once_go_out_only_for_the_one_who_took_the_chat() {
    let office = Office::open().await;
    for sender in 1..=5 {
        let chat = office.chat_from(&office.web, &office.ann, sender).await;
        let before = office.integrator.requests().len();
        // Six replies at once: they reach the writer together, mostly in one batch.
        let replies = [
            &office.ann,
            &office.bob,
            &office.ann,
            &office.bob,
            &office.ann,
            &office.bob,
        ]
        .into_iter()
        .enumerate()
        .map(|(i, agent)| async move {
            let (status, _) = act(agent, chat, "messages", text(&format!("reply {i}"))).await;
            (agent.id, i, status)
        });
        let answers = futures_util::future::join_all(replies).await;
        let winner = office.ann.chat(chat).await["chat"]["agent_id"]
            .as_i64()
            .expect("an open chat replied to is accepted");
        for (agent, i, status) in &answers {
            let expected = if *agent == winner { 201 } else { 409 };
            assert_eq!(
                *status, expected,
                "chat {chat}, reply {i} by agent {agent}: {answers:?}"
            );
        }
        let sent: Vec<String> = office
            .integrator
            .wait_for(before + 3, WAIT)
            .await
            .iter()
            .skip(before)
            .filter_map(|r| r.json()["message"]["text"].as_str().map(str::to_owned))
            .collect();
        let mut expected: Vec<String> = answers
            .iter()
            .filter(|(agent, _, _)| *agent == winner)
            .map(|(_, i, _)| format!("reply {i}"))
            .collect();
        let mut got = sent.clone();
        got.sort();
        expected.sort();
        assert_eq!(got, expected, "chat {chat}: what the integrator received");
        let stored = messages(&office.ann, chat).await;
        assert_eq!(
            stored.len(),
            4,
            "chat {chat}: the customer's message and three replies"
        );
    }
    office.hub.shutdown().await;
}

#[tokio::test]
async fn the_hub_serves_its_openapi_document() {
    let hub = TestHub::start().await;
    let resp = hub
        .http
        .get(hub.url("/openapi.json"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let doc: Value = resp.json().await.expect("JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    for path in [
        "/agent/v1/chats/{id}",
        "/admin/v1/deliveries",
        "/agent/v1/crm/deals",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is not documented");
    }
    hub.shutdown().await;
}

#[tokio::test]
async fn duplicate_json_keys_are_refused_with_400() {
    let office = Office::open().await;
    let chat = office.chat_from(&office.web, &office.ann, 1).await;
    done(&office.ann, chat, "accept").await;
    let path = format!("/agent/v1/chats/{chat}/messages");
    let answer = raw(
        &office.hub,
        Method::POST,
        &path,
        Some(&office.ann.token),
        r#"{"type":"text","text":"first","text":"second"}"#,
    )
    .await;
    assert_error("duplicate text", &answer, 400);
    assert_eq!(answer.1["error"]["code"], "invalid_request");
    assert!(
        answer.1["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"duplicate key "text""#)),
        "{}",
        answer.1
    );
    // Only the customer's greeting; nothing reached the integrator.
    assert_eq!(messages(&office.ann, chat).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(office.integrator.requests().is_empty(), "a reply was sent");

    let answer = raw(
        &office.hub,
        Method::PUT,
        "/agent/v1/status",
        Some(&office.ann.token),
        r#"{"online":true,"online":false}"#,
    )
    .await;
    assert_error("duplicate online", &answer, 400);

    // The CRM API and the widget refuse them too, each in its own dialect.
    let answer = raw(
        &office.hub,
        Method::POST,
        "/agent/v1/crm/tags",
        Some(&office.ann.token),
        r#"{"title":"vip","title":"VIP"}"#,
    )
    .await;
    assert_error("duplicate CRM title", &answer, 400);
    let (_, tags) = office.ann.get("/agent/v1/crm/tags").await;
    assert!(
        !tags.to_string().contains("vip") && !tags.to_string().contains("VIP"),
        "a tag was created: {tags}"
    );
    let (status, answer) = raw(
        &office.hub,
        Method::POST,
        &format!("/widget/v1/{}/offline-messages", office.web.public_id),
        None,
        r#"{"email":"eve@example.com","message":"a","message":"b"}"#,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["result"], "fail", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|m| m.contains(r#"duplicate key "message""#)),
        "{answer}"
    );
    let (_, listed) = office.ann.get("/agent/v1/chats?state=all").await;
    assert_eq!(
        listed["chats"].as_array().map(Vec::len),
        Some(1),
        "an offline chat was opened: {listed}"
    );
    office.hub.shutdown().await;
}
