//! Hostile clients against a real hub: the connection cap, request heads and
//! bodies past their limits, deeply nested JSON, the rate limits of the
//! unauthenticated endpoints and of failed credentials. Each is answered
//! with its status (a 4xx, 503 at the connection cap) in the interface's
//! error body, and what was accepted is stored. Malformed HTTP is written on
//! raw TCP connections, as an attacker would.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{ADMIN_TOKEN, HubOptions, Integrator, TestAgent, TestChannel, TestHub};

/// The agent every test hub has, assigned to its channels.
const AGENT: &str = "ann@example.com";
/// A bot's token in the path of its URLs.
const BOT_TOKEN: &str = "hostile-bot-token-0001";
/// A generous bound for what must happen at once: a hang fails the test
/// instead of stalling the suite.
const HANG: Duration = Duration::from_secs(60);

fn host(hub: &TestHub) -> &str {
    hub.base.trim_start_matches("http://")
}

/// The path of a URL of the hub.
fn path_of<'a>(hub: &TestHub, url: &'a str) -> &'a str {
    url.strip_prefix(&hub.base).expect("a URL of the hub")
}

async fn connect(hub: &TestHub) -> TcpStream {
    TcpStream::connect(host(hub)).await.expect("connect")
}

/// Everything the server sends until it closes (or resets) the connection.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let read = tokio::time::timeout(HANG, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    String::from_utf8_lossy(&out).into_owned()
}

/// One response on a connection that stays open: its head and a
/// `Content-Length` body.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let read = tokio::time::timeout(HANG, async {
        loop {
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if out.len() >= end + 4 + length {
                    return text;
                }
            }
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return text,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.expect("a response in time")
}

/// Writes `request` on a new connection (the server may close before it
/// has all of it) and reads until the connection closes.
async fn raw(hub: &TestHub, request: &[u8]) -> String {
    let mut stream = connect(hub).await;
    let _ = stream.write_all(request).await;
    read_to_close(&mut stream).await
}

/// A header of the raw answer, by lowercase name.
fn header<'a>(answer: &'a str, name: &str) -> Option<&'a str> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn body_of(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// A hub with an agent and a channel `web`, with `edit` applied to its configuration.
async fn desk(edit: impl FnOnce(&mut hub::config::Config)) -> (TestHub, TestAgent, TestChannel) {
    let hub = TestHub::start_with_config(HubOptions::default(), edit).await;
    let agent = hub.create_agent("Ann", AGENT).await;
    let ch = hub
        .create_channel("web", "http://127.0.0.1:9/nowhere", false, &[AGENT])
        .await;
    (hub, agent, ch)
}

fn message(sender: &str, text: &str) -> Value {
    json!({ "sender": { "id": sender }, "message": { "type": "text", "text": text } })
}

/// Posts a customer message as if from `source` (the hub trusts the
/// loopback proxy's `X-Forwarded-For` in these tests).
async fn post_from(hub: &TestHub, url: &str, source: &str, body: &Value) -> reqwest::Response {
    hub.http
        .post(url)
        .header("x-forwarded-for", source)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("request")
}

/// The texts of the stored messages of the chat with customer `sender`.
async fn stored(agent: &TestAgent, sender: &str) -> Vec<String> {
    let (status, v) = agent.get("/agent/v1/chats?state=all").await;
    assert_eq!(status, 200, "{v}");
    let mut texts = Vec::new();
    for chat in v["chats"].as_array().cloned().unwrap_or_default() {
        let view = agent.chat(chat["id"].as_i64().expect("chat id")).await;
        if view["client"]["external_id"] != json!(sender) {
            continue;
        }
        for m in view["messages"].as_array().cloned().unwrap_or_default() {
            if let Some(t) = m["body"]["text"].as_str() {
                texts.push(t.to_owned());
            }
        }
    }
    texts
}

/// Asserts a 429 with a `Retry-After` of whole seconds; the body.
async fn assert_too_many(label: &str, resp: reqwest::Response) -> String {
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = resp.text().await.unwrap_or_default();
    assert_eq!(status, 429, "{label}: {body}");
    assert!(
        retry.is_some_and(|s| s >= 1),
        "{label}: Retry-After {retry:?}"
    );
    body
}

#[tokio::test]
async fn past_the_connection_cap_a_new_connection_gets_503_and_a_freed_slot_serves_again() {
    let hub = TestHub::start_with_config(HubOptions::default(), |c| {
        c.server.max_connections = 2;
    })
    .await;
    let healthz = b"GET /healthz HTTP/1.1\r\nhost: hub\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = connect(&hub).await;
        s.write_all(healthz).await.expect("write");
        // Answered: the connection holds one of the two slots, kept alive.
        let answer = read_response(&mut s).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(s);
    }
    let refused = raw(&hub, healthz).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert_eq!(header(&refused, "retry-after"), Some("1"), "{refused}");
    assert_eq!(header(&refused, "connection"), Some("close"), "{refused}");
    assert!(
        body_of(&refused).contains("too many connections"),
        "{refused}"
    );
    // The held connections were not disturbed.
    held[0].write_all(healthz).await.expect("write");
    let again = read_response(&mut held[0]).await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    // A client that leaves frees its slot for the next one.
    drop(held.pop());
    let served = crate::support::eventually(HANG, "a freed slot", || async {
        let answer = raw(
            &hub,
            b"GET /healthz HTTP/1.1\r\nhost: hub\r\nconnection: close\r\n\r\n",
        )
        .await;
        answer.starts_with("HTTP/1.1 200").then_some(answer)
    })
    .await;
    assert!(served.ends_with("ok"), "{served}");
}

#[tokio::test]
async fn request_heads_past_the_size_or_header_count_limit_get_431() {
    let hub = TestHub::start().await;
    let request = |headers: &str| {
        format!("GET /healthz HTTP/1.1\r\nhost: hub\r\nconnection: close\r\n{headers}\r\n")
    };
    let big = format!("x-big: {}\r\n", "a".repeat(40 * 1024));
    let answer = raw(&hub, request(&big).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "40 KiB head: {answer}");
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let answer = raw(&hub, request(&many).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "150 headers: {answer}");
    // Within the defaults (32 KiB, 100 headers) all is well.
    let fine = format!(
        "x-big: {}\r\n{}",
        "a".repeat(20 * 1024),
        (0..90)
            .map(|i| format!("x-h{i}: v\r\n"))
            .collect::<String>()
    );
    let answer = raw(&hub, request(&fine).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let strict = TestHub::start_with_config(HubOptions::default(), |c| {
        c.server.max_header_bytes = 4096;
        c.server.max_headers = 20;
    })
    .await;
    let big = format!("x-big: {}\r\n", "a".repeat(5000));
    let answer = raw(&strict, request(&big).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "5000 bytes: {answer}");
    let many: String = (0..30).map(|i| format!("x-h{i}: v\r\n")).collect();
    let answer = raw(&strict, request(&many).as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "30 headers: {answer}");
    let answer = raw(&strict, request("x-small: 1\r\n").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Every edge that reads a body: (label, method, path, headers).
async fn edges(
    hub: &TestHub,
    agent: &TestAgent,
    ch: &TestChannel,
) -> Vec<(&'static str, &'static str, String, String)> {
    let (bot, _provider) = bot_of(hub).await;
    let webhooks = bot["webhooks_url"].as_str().expect("webhooks_url");
    let json = "content-type: application/json\r\n";
    vec![
        (
            "channel",
            "POST",
            path_of(hub, &ch.endpoint_url).to_owned(),
            json.to_owned(),
        ),
        (
            "agent",
            "PUT",
            "/agent/v1/status".to_owned(),
            format!("{json}authorization: Bearer {}\r\n", agent.token),
        ),
        (
            "admin",
            "POST",
            "/admin/v1/channels".to_owned(),
            format!("{json}authorization: Bearer {ADMIN_TOKEN}\r\n"),
        ),
        (
            "bots",
            "POST",
            path_of(hub, webhooks).to_owned(),
            json.to_owned(),
        ),
        (
            "widget",
            "POST",
            format!("/widget/v1/{}/offline-messages", ch.public_id),
            json.to_owned(),
        ),
        (
            "console",
            "POST",
            "/console/v1/session".to_owned(),
            json.to_owned(),
        ),
    ]
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_on_every_edge_even_endless_chunked_ones() {
    let (hub, agent, ch) = desk(|_| {}).await;
    for (label, method, path, headers) in edges(&hub, &agent, &ch).await {
        // Declared too large: refused before it is read.
        let mut stream = connect(&hub).await;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: hub\r\n{headers}content-length: {}\r\n\r\n",
            10 * 1024 * 1024
        );
        stream.write_all(head.as_bytes()).await.expect("write");
        let _ = stream.write_all(&[b' '; 64 * 1024]).await;
        let answer = read_to_close(&mut stream).await;
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "{label}, Content-Length: {answer}"
        );

        // Chunked and never ending: refused once the limit is passed, and
        // the connection closes though the client keeps sending.
        let stream = connect(&hub).await;
        let (mut reader, mut writer) = stream.into_split();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: hub\r\n{headers}transfer-encoding: chunked\r\n\r\n"
        );
        let sender = tokio::spawn(async move {
            writer.write_all(head.as_bytes()).await?;
            let chunk = format!("1000\r\n{}\r\n", " ".repeat(0x1000));
            loop {
                writer.write_all(chunk.as_bytes()).await?;
            }
            #[allow(unreachable_code)]
            Ok::<_, std::io::Error>(())
        });
        let mut out = Vec::new();
        let read = tokio::time::timeout(HANG, reader.read_to_end(&mut out)).await;
        sender.abort();
        let answer = String::from_utf8_lossy(&out);
        assert!(read.is_ok(), "{label}: an endless body hung the connection");
        assert!(
            answer.starts_with("HTTP/1.1 413"),
            "{label}, chunked: {answer}"
        );
        assert!(
            answer.contains("65536"),
            "{label}: the answer names the limit: {answer}"
        );
    }
    // Nothing of it was stored, and the hub serves on.
    let (status, _) = hub.customer(&ch, message("c1", "still here")).await;
    assert_eq!(status, 200);
    assert_eq!(stored(&agent, "c1").await, ["still here"]);
}

#[tokio::test]
async fn json_nested_too_deep_is_a_400_in_each_interfaces_error_body() {
    let (hub, agent, ch) = desk(|_| {}).await;
    let deep = |levels: usize| {
        format!(
            r#"{{"sender":{{"id":"c1"}},"message":{{"type":"text","text":"hi"}},"x":{}{}}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    };
    let edges = edges(&hub, &agent, &ch).await;
    for levels in [70, 200, 20_000] {
        for (label, method, path, headers) in &edges {
            let body = deep(levels);
            let request = format!(
                "{method} {path} HTTP/1.1\r\nhost: hub\r\nconnection: close\r\n{headers}\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            let answer = raw(&hub, request.as_bytes()).await;
            assert!(
                answer.starts_with("HTTP/1.1 400"),
                "{label}, {levels}: {answer}"
            );
            let body = body_of(&answer);
            assert!(
                body.contains("nested deeper than 64 levels"),
                "{label}, {levels}: {body}"
            );
            match *label {
                "channel" => assert_eq!(
                    header(&answer, "content-type"),
                    Some("text/plain; charset=utf-8")
                ),
                "widget" => {
                    let v: Value = serde_json::from_str(body).expect("JSON");
                    assert_eq!(v["result"], "fail", "{body}");
                }
                _ => {
                    let v: Value = serde_json::from_str(body).expect("JSON");
                    assert_eq!(v["error"]["code"], "invalid_request", "{label}: {body}");
                }
            }
        }
    }
    // Nested within the limit, a customer message is taken.
    let (status, body) = hub
        .customer(&ch, serde_json::from_str(&deep(40)).expect("valid JSON"))
        .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_channel_is_limited_per_source_and_in_all_and_refusals_are_not_stored() {
    let (hub, agent, ch) = desk(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1".parse().expect("ip")];
        // Next to no refill: the bursts are the budget.
        c.limits.channel_source_per_second = 0.001;
        c.limits.channel_source_burst = 3;
        c.limits.channel_per_second = 0.001;
        c.limits.channel_burst = 5;
    })
    .await;
    let other = hub
        .create_channel("other", "http://127.0.0.1:9/nowhere", false, &[AGENT])
        .await;
    let url = &ch.endpoint_url;
    for n in 0..3 {
        let resp = post_from(&hub, url, "203.0.113.1", &message("a", &format!("a{n}"))).await;
        assert_eq!(resp.status(), 200, "a{n}");
    }
    let body = assert_too_many(
        "a's fourth",
        post_from(&hub, url, "203.0.113.1", &message("a", "a3")).await,
    )
    .await;
    assert!(body.contains("slow down"), "{body}");
    // The status endpoint of the channel counts too.
    let resp = hub
        .http
        .get(&ch.status_url)
        .header("x-forwarded-for", "203.0.113.1")
        .send()
        .await
        .expect("status");
    assert_too_many("a's status", resp).await;
    // Another source has its own budget, until the channel's is spent.
    for n in 0..2 {
        let resp = post_from(&hub, url, "198.51.100.2", &message("b", &format!("b{n}"))).await;
        assert_eq!(resp.status(), 200, "b{n}");
    }
    assert_too_many(
        "the channel's sixth",
        post_from(&hub, url, "198.51.100.3", &message("c", "c0")).await,
    )
    .await;
    // Another channel is not affected.
    let resp = post_from(
        &hub,
        &other.endpoint_url,
        "203.0.113.1",
        &message("d", "d0"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    // What got 200 is stored, what got 429 is not.
    assert_eq!(stored(&agent, "a").await, ["a0", "a1", "a2"]);
    assert_eq!(stored(&agent, "b").await, ["b0", "b1"]);
    assert!(stored(&agent, "c").await.is_empty());
}

#[tokio::test]
async fn the_default_limits_let_an_integrators_burst_through() {
    let (hub, agent, ch) = desk(|_| {}).await;
    const MESSAGES: usize = 300;
    let gate = tokio::sync::Semaphore::new(16);
    let sends = (0..MESSAGES).map(|n| {
        let (gate, hub, ch) = (&gate, &hub, &ch);
        async move {
            let _turn = gate.acquire().await.expect("semaphore");
            hub.customer(ch, message("busy", &format!("m{n}"))).await.0
        }
    });
    let statuses = futures_util::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(stored(&agent, "busy").await.len(), MESSAGES);
}

#[tokio::test]
async fn a_bot_provider_is_limited_per_bot_and_source() {
    let hub = TestHub::start_with_config(HubOptions::default(), |c| {
        c.server.trusted_proxies = vec!["127.0.0.1".parse().expect("ip")];
        c.limits.bot_source_per_second = 0.001;
        c.limits.bot_source_burst = 2;
        c.limits.bot_per_second = 0.001;
        c.limits.bot_burst = 3;
    })
    .await;
    let provider = Integrator::start().await;
    let mut urls = Vec::new();
    for name in ["One", "Two"] {
        let (status, bot) = hub
            .admin(
                Method::POST,
                "/admin/v1/bots",
                Some(
                    json!({ "name": name, "endpoint": provider.url, "token": BOT_TOKEN,
                             "channels": [] }),
                ),
            )
            .await;
        assert_eq!(status, 201, "{bot}");
        urls.push(bot["webhooks_url"].as_str().expect("url").to_owned());
    }
    // An event for no chat: 400, yet it passed the limits.
    let event = json!({ "event": "BOT_MESSAGE", "chat_id": "999",
                        "message": { "type": "TEXT", "text": "hi" } });
    for _ in 0..2 {
        let resp = post_from(&hub, &urls[0], "203.0.113.1", &event).await;
        assert_eq!(resp.status(), 400);
    }
    let body = assert_too_many(
        "the source's third",
        post_from(&hub, &urls[0], "203.0.113.1", &event).await,
    )
    .await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["error"]["code"], "rate_limited", "{body}");
    let resp = post_from(&hub, &urls[0], "198.51.100.2", &event).await;
    assert_eq!(resp.status(), 400, "another source");
    assert_too_many(
        "the bot's fourth",
        post_from(&hub, &urls[0], "198.51.100.3", &event).await,
    )
    .await;
    let resp = post_from(&hub, &urls[1], "203.0.113.1", &event).await;
    assert_eq!(resp.status(), 400, "another bot");
}

#[tokio::test]
async fn a_source_that_fails_its_credentials_too_often_waits_even_with_the_right_one() {
    let (hub, agent, ch) = desk(|c| {
        c.server.trusted_proxies = vec!["127.0.0.1".parse().expect("ip")];
        c.limits.auth_failures = 3;
        c.limits.auth_failure_window_secs = 600;
    })
    .await;
    let api = |source: &'static str, path: &'static str, token: String| {
        hub.http
            .get(hub.url(path))
            .header("x-forwarded-for", source)
            .bearer_auth(token)
            .send()
    };
    // Admin and agent tokens count together, per source address.
    for token in ["wrong-admin-token-0000000000", "wrong-agent-token"] {
        let resp = api("203.0.113.1", "/admin/v1/channels", token.to_owned()).await;
        assert_eq!(resp.expect("request").status(), 401);
    }
    let resp = api("203.0.113.1", "/agent/v1/me", "wrong".to_owned()).await;
    assert_eq!(resp.expect("request").status(), 401);
    let blocked = api("203.0.113.1", "/admin/v1/channels", ADMIN_TOKEN.to_owned()).await;
    let body = assert_too_many("the right admin token", blocked.expect("request")).await;
    let v: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["error"]["code"], "rate_limited", "{body}");
    let blocked = api("203.0.113.1", "/agent/v1/me", agent.token.clone()).await;
    assert_too_many("the right agent token", blocked.expect("request")).await;
    let other = api("198.51.100.2", "/admin/v1/channels", ADMIN_TOKEN.to_owned()).await;
    assert_eq!(other.expect("request").status(), 200, "another source");
    // The channel's own door: wrong random strings in the path.
    let wrong = ch.endpoint_url.replace(
        path_of(&hub, &ch.endpoint_url)
            .split('/')
            .nth(1)
            .expect("secret"),
        "not-the-secret",
    );
    for n in 0..3 {
        let resp = post_from(&hub, &wrong, "203.0.113.9", &message("g", &format!("g{n}"))).await;
        assert_eq!(resp.status(), 404);
    }
    let body = assert_too_many(
        "the right channel address",
        post_from(
            &hub,
            &ch.endpoint_url,
            "203.0.113.9",
            &message("g", "right"),
        )
        .await,
    )
    .await;
    assert!(
        !body.starts_with('{'),
        "the channel answers in text: {body}"
    );
    let resp = post_from(
        &hub,
        &ch.endpoint_url,
        "198.51.100.2",
        &message("h", "fine"),
    )
    .await;
    assert_eq!(resp.status(), 200, "another source");
    // A bot's token, counted per bot and source.
    let (bot, _provider) = bot_of(&hub).await;
    let right = bot["webhooks_url"].as_str().expect("url").to_owned();
    let wrong = right.replace(BOT_TOKEN, "guessed-token");
    for _ in 0..3 {
        let resp = post_from(&hub, &wrong, "203.0.113.5", &json!({})).await;
        assert_eq!(resp.status(), 401);
    }
    assert_too_many(
        "the right bot token",
        post_from(&hub, &right, "203.0.113.5", &json!({})).await,
    )
    .await;
    let resp = post_from(&hub, &right, "198.51.100.2", &json!({})).await;
    assert_eq!(resp.status(), 400, "another source reaches the bot");
    assert!(stored(&agent, "g").await.is_empty());
}

/// A bot (on no channel) with `BOT_TOKEN`, and the provider it would post to.
async fn bot_of(hub: &TestHub) -> (Value, Integrator) {
    let provider = Integrator::start().await;
    let (status, bot) = hub
        .admin(
            Method::POST,
            "/admin/v1/bots",
            Some(
                json!({ "name": "Assistant", "endpoint": provider.url, "token": BOT_TOKEN,
                         "channels": [] }),
            ),
        )
        .await;
    assert_eq!(status, 201, "{bot}");
    (bot, provider)
}
