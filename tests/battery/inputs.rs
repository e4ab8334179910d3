//! Hostile clients: bodies at and past the limit, an endless chunked body,
//! deep JSON, invalid UTF-8, huge headers, request smuggling, slowloris;
//! and authentication: missing, wrong and other agents' tokens. Every
//! refusal is the right 4xx, nothing refused is stored, nothing leaks, and
//! `/healthz` answers throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Mode;
use crate::outcome::Outcome;
use crate::served::{ADMIN, HealthWatch, Hub, Options, chat_of};
use crate::wire::{self, Exchange};

const AGENT: &str = "ann@battery.test";
const MAX_BODY: usize = 16 * 1024;
const HEADER_TIMEOUT_MS: u64 = 1000;
const BODY_TIMEOUT_MS: u64 = 2000;
/// Channel requests one address may make at once in the bad-inputs hub;
/// its cases make fewer.
const RATE_BURST: usize = 40;

/// A customer message with `marker` as its text, padded with spaces to `len` bytes.
fn message(marker: &str, len: usize) -> Vec<u8> {
    let mut body =
        format!(r#"{{"sender":{{"id":"bi"}},"message":{{"type":"text","text":"{marker}"}}}}"#)
            .into_bytes();
    body.resize(len.max(body.len()), b' ');
    body
}

fn chunked(body: &[u8], chunk: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for part in body.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// One malformed or hostile request and what it must get.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    /// Acceptable first statuses.
    expect: &'static [u16],
    /// Its text, which must be stored only for a 2xx.
    marker: Option<&'static str>,
    /// The hub must close the connection after answering.
    closes: bool,
}

pub async fn bad_inputs(_mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let dir = o.dir()?;
    let hub = Hub::start(
        &dir,
        &Options {
            max_body_bytes: MAX_BODY,
            header_timeout_ms: HEADER_TIMEOUT_MS,
            body_timeout_ms: BODY_TIMEOUT_MS,
            // A small per-address budget, so a burst of one address is refused.
            limits: format!(
                "channel_per_second = 0\nchannel_source_per_second = 2\n\
                 channel_source_burst = {RATE_BURST}"
            ),
            ..Options::default()
        },
    )
    .await?;
    o.watch_log(hub.log_path());
    let token = hub.create_agent("Ann", AGENT).await?;
    let channel = hub
        .create_channel("inputs", "http://127.0.0.1:9/replies", &[AGENT])
        .await?;
    let path = wire::path_of(&channel.endpoint_url);
    let health = HealthWatch::start(&hub);

    let deep = |marker: &str| {
        let depth = 5000;
        format!(
            r#"{{"sender":{{"id":"bi"}},"message":{{"type":"text","text":"{marker}","x":{}{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        )
        .into_bytes()
    };
    let smuggled = wire::post_sized(&path, "", &message("bi-smuggled", 0));
    let smuggled_tail = wire::post_sized(&path, "", &message("bi-tail-smuggled", 0));
    let mut cl_te_body = b"0\r\n\r\n".to_vec();
    cl_te_body.extend_from_slice(&smuggled);
    let mut invalid_utf8 =
        br#"{"sender":{"id":"bi"},"message":{"type":"text","text":"bi-utf8 "#.to_vec();
    invalid_utf8.extend_from_slice(b"\xff\xfe\xc3\x28\"}}");
    let many_headers: String = (0..200).map(|i| format!("X-Many-{i}: v\r\n")).collect();
    let cases = vec![
        Case {
            name: "at_limit",
            bytes: wire::post_sized(&path, "", &message("bi-at-limit", MAX_BODY)),
            expect: &[200],
            marker: Some("bi-at-limit"),
            closes: false,
        },
        Case {
            name: "over_limit",
            bytes: wire::post_sized(&path, "", &message("bi-over-limit", MAX_BODY + 1)),
            expect: &[413],
            marker: Some("bi-over-limit"),
            closes: false,
        },
        Case {
            name: "over_limit_agent",
            bytes: wire::post_sized(
                "/agent/v1/chats/1/messages",
                &format!("Authorization: Bearer {token}\r\n"),
                &message("bi-over-agent", MAX_BODY + 1),
            ),
            expect: &[413],
            marker: None,
            closes: false,
        },
        Case {
            name: "over_limit_admin",
            bytes: wire::post_sized(
                "/admin/v1/agents",
                &format!("Authorization: Bearer {ADMIN}\r\n"),
                &message("bi-over-admin", MAX_BODY + 1),
            ),
            expect: &[413],
            marker: None,
            closes: false,
        },
        // The tail of the refused body is a whole request: it must stay body.
        Case {
            name: "over_limit_tail",
            bytes: {
                let mut body = message("bi-over-tail", MAX_BODY);
                body.extend_from_slice(&smuggled_tail);
                wire::post_sized(&path, "", &body)
            },
            expect: &[413],
            marker: Some("bi-tail-smuggled"),
            closes: false,
        },
        Case {
            name: "over_limit_chunked",
            bytes: wire::post(
                &path,
                "Transfer-Encoding: chunked\r\n",
                "",
                &chunked(&message("bi-over-chunked", MAX_BODY + 1024), 1000),
            ),
            expect: &[413],
            marker: Some("bi-over-chunked"),
            closes: false,
        },
        Case {
            name: "deep_json",
            bytes: wire::post_sized(&path, "", &deep("bi-deep")),
            expect: &[400],
            marker: Some("bi-deep"),
            closes: false,
        },
        Case {
            name: "deep_json_agent",
            bytes: wire::post_sized(
                "/agent/v1/chats/1/messages",
                &format!("Authorization: Bearer {token}\r\n"),
                &deep("bi-deep-agent"),
            ),
            expect: &[400],
            marker: Some("bi-deep-agent"),
            closes: false,
        },
        Case {
            name: "deep_json_admin",
            bytes: wire::post_sized(
                "/admin/v1/agents",
                &format!("Authorization: Bearer {ADMIN}\r\n"),
                &deep("bi-deep-admin"),
            ),
            expect: &[400],
            marker: None,
            closes: false,
        },
        Case {
            name: "invalid_utf8",
            bytes: wire::post_sized(&path, "", &invalid_utf8),
            expect: &[400],
            marker: Some("bi-utf8"),
            closes: false,
        },
        Case {
            name: "huge_header",
            bytes: wire::post_sized(
                &path,
                &format!("X-Pad: {}\r\n", "a".repeat(128 * 1024)),
                &message("bi-huge-header", 0),
            ),
            expect: &[431],
            marker: Some("bi-huge-header"),
            closes: true,
        },
        Case {
            name: "many_headers",
            bytes: wire::post_sized(&path, &many_headers, &message("bi-many-headers", 0)),
            expect: &[431],
            marker: Some("bi-many-headers"),
            closes: true,
        },
        // Framed by Transfer-Encoding the body is empty and the rest would be
        // a second request; the hub must answer once and close.
        Case {
            name: "smuggle_cl_te",
            bytes: wire::post(
                &path,
                &format!(
                    "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                    cl_te_body.len()
                ),
                "",
                &cl_te_body,
            ),
            expect: &[400],
            marker: Some("bi-smuggled"),
            closes: true,
        },
        Case {
            name: "smuggle_dup_cl",
            bytes: {
                let body = message("bi-dup-cl", 0);
                wire::post(
                    &path,
                    &format!("Content-Length: {}\r\nContent-Length: 5\r\n", body.len()),
                    "",
                    &body,
                )
            },
            expect: &[400],
            marker: Some("bi-dup-cl"),
            closes: true,
        },
        Case {
            name: "smuggle_te_x",
            bytes: {
                let body = message("bi-te-x", 0);
                wire::post(
                    &path,
                    &format!(
                        "Content-Length: {}\r\nTransfer-Encoding: xchunked\r\n",
                        body.len()
                    ),
                    "",
                    &body,
                )
            },
            expect: &[400, 501],
            marker: Some("bi-te-x"),
            closes: true,
        },
        Case {
            name: "smuggle_te_twice",
            bytes: {
                let body = chunked(&message("bi-te-twice", 0), 64);
                wire::post(
                    &path,
                    "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                    "",
                    &body,
                )
            },
            expect: &[400, 501],
            marker: Some("bi-te-twice"),
            closes: true,
        },
    ];

    let mut results = Vec::new();
    for case in &cases {
        let x = wire::exchange(hub.addr, &case.bytes, 2, Duration::from_millis(1500)).await?;
        check_case(o, case, &x);
        results.push(format!("{}:{}", case.name, x.summary()));
    }

    let endless = endless_chunked(hub.addr, &path).await?;
    results.push(format!("endless_chunked:{}", endless.0));
    o.check(endless.1, || format!("endless chunked body: {}", endless.0));

    let slow = slowloris(hub.addr, &path, false).await?;
    results.push(format!("slowloris:{}", slow.0));
    o.check(slow.1, || format!("slowloris: {}", slow.0));
    let slow = slowloris(hub.addr, &path, true).await?;
    results.push(format!("slow_body:{}", slow.0));
    o.check(slow.1, || format!("slow body: {}", slow.0));

    // A burst past the per-address rate: 429 with Retry-After, nothing of
    // those stored.
    let burst = (0..RATE_BURST * 2).map(|i| {
        let (http, url) = (hub.http.clone(), channel.endpoint_url.clone());
        async move {
            let text = format!("bi-rate n{i}");
            let answer = http
                .post(url)
                .header("content-type", "application/json; charset=utf-8")
                .body(message(&text, 0))
                .send()
                .await;
            match answer {
                Ok(r) => (
                    text,
                    r.status().as_u16(),
                    r.headers().contains_key("retry-after"),
                ),
                Err(_) => (text, 0, false),
            }
        }
    });
    let burst = futures_util::future::join_all(burst).await;
    let limited = burst.iter().filter(|(_, s, _)| *s == 429).count();
    let accepted = burst.iter().filter(|(_, s, _)| *s == 200).count();
    results.push(format!("rate_burst:200x{accepted},429x{limited}"));
    o.check(limited > 0 && accepted + limited == burst.len(), || {
        format!(
            "a burst of {} from one address: {accepted} accepted, {limited} limited",
            burst.len()
        )
    });
    o.check(
        burst.iter().all(|(_, s, retry)| *s != 429 || *retry),
        || "a 429 without Retry-After".to_owned(),
    );

    let texts = hub.stored_texts(&token).await?;
    for (text, status, _) in &burst {
        o.check((*status == 200) == texts.contains_key(text), || {
            format!(
                "{text}: answered {status}, stored {}",
                texts.contains_key(text)
            )
        });
    }
    for case in &cases {
        let Some(marker) = case.marker else { continue };
        let stored = texts.keys().any(|t| t.starts_with(marker));
        let should = case.expect.iter().all(|s| (200..300).contains(s));
        o.check(stored == should, || {
            format!(
                "{}: `{marker}` is {}stored",
                case.name,
                if stored { "" } else { "not " }
            )
        });
    }
    let (polls, failed, slowest) = health.finish().await;
    o.fig("answers", results.join(" "));
    o.fig("healthz_polls", polls);
    o.fig("healthz_failed", failed);
    o.fig("healthz_slowest_ms", slowest);
    o.check(failed == 0, || format!("/healthz failed {failed} times"));
    Ok(())
}

fn check_case(o: &mut Outcome, case: &Case, x: &Exchange) {
    let status = x.status();
    o.check(case.expect.contains(&status), || {
        format!(
            "{}: expected {:?}, got {} ({})",
            case.name,
            case.expect,
            x.summary(),
            x.answers
                .first()
                .map(|a| String::from_utf8_lossy(&a.body[..a.body.len().min(120)]).into_owned())
                .unwrap_or_default()
        )
    });
    o.check(x.answers.len() <= 1, || {
        format!("{}: {} answers to one request", case.name, x.answers.len())
    });
    if case.closes {
        o.check(x.closed, || {
            format!("{}: the connection stayed open after {status}", case.name)
        });
    }
}

/// A chunked body that never ends, written as fast as the hub reads it:
/// the hub must answer 413 (or 408) or close, and stop reading, within 10 s.
async fn endless_chunked(addr: std::net::SocketAddr, path: &str) -> Result<(String, bool), String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    let started = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    let writer = tokio::spawn(async move {
        let mut chunk = format!("{:x}\r\n", 4096).into_bytes();
        chunk.extend_from_slice(&[b' '; 4096]);
        chunk.extend_from_slice(b"\r\n");
        if write.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        // At most 256 MB, so a hub that reads forever fails instead of hanging.
        for _ in 0..65536 {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    });
    let mut answered = None;
    // After its answer the hub must stop taking the body: close, not drain forever.
    let deadline = started + Duration::from_secs(10);
    let (bytes, closed) = read_until(&mut read, deadline, |bytes| {
        if answered.is_none() && !wire::parse_answers(bytes, false).is_empty() {
            answered = Some(started.elapsed());
        }
    })
    .await;
    let elapsed = started.elapsed();
    writer.abort();
    let answers = wire::parse_answers(&bytes, closed);
    let status = answers.first().map_or(0, |a| a.status);
    let kib = sent.load(Ordering::Relaxed) / 1024;
    let summary = format!(
        "{}{}/answered@{}ms/closed@{}ms/sent{kib}KiB",
        if status == 0 {
            "none".to_owned()
        } else {
            status.to_string()
        },
        if closed { ",closed" } else { "" },
        answered.map_or("-".to_owned(), |d| d.as_millis().to_string()),
        if closed {
            elapsed.as_millis().to_string()
        } else {
            "-".to_owned()
        },
    );
    let ok = closed && (matches!(status, 413 | 408) || status == 0);
    Ok((summary, ok))
}

/// A request sent a byte every 100 ms: its head (`body` false) or, after a
/// whole head, its body. The hub must answer 408 and close at its timeout.
async fn slowloris(
    addr: std::net::SocketAddr,
    path: &str,
    body: bool,
) -> Result<(String, bool), String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let started = Instant::now();
    let (timeout, trickle) = if body {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: 200\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        (BODY_TIMEOUT_MS, vec![b' '; 200])
    } else {
        let mut trickle = format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n").into_bytes();
        trickle.extend((0..200).flat_map(|i| format!("X-Slow-{i}: v\r\n").into_bytes()));
        (HEADER_TIMEOUT_MS, trickle)
    };
    let (mut read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        for byte in trickle {
            if write.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let deadline = started + Duration::from_millis(timeout + 5000);
    let (bytes, closed) = read_until(&mut read, deadline, |_| {}).await;
    let elapsed = started.elapsed();
    writer.abort();
    let status = wire::parse_answers(&bytes, closed)
        .first()
        .map_or(0, |a| a.status);
    let summary = format!(
        "{}{}/{}ms",
        if status == 0 {
            "none".to_owned()
        } else {
            status.to_string()
        },
        if closed { ",closed" } else { "" },
        elapsed.as_millis()
    );
    let ok = status == 408 && closed && elapsed < Duration::from_millis(timeout + 1500);
    Ok((summary, ok))
}

/// A request the hub must refuse, and the statuses that refuse it.
struct Refusal<'a> {
    name: &'static str,
    method: Method,
    path: String,
    token: Option<&'a str>,
    body: Option<&'a serde_json::Value>,
    expect: &'static [u16],
}

impl<'a> Refusal<'a> {
    fn new(
        name: &'static str,
        method: Method,
        path: &str,
        token: Option<&'a str>,
        expect: &'static [u16],
    ) -> Refusal<'a> {
        Refusal {
            name,
            method,
            path: path.to_owned(),
            token,
            body: None,
            expect,
        }
    }

    fn with(mut self, body: &'a serde_json::Value) -> Refusal<'a> {
        self.body = Some(body);
        self
    }
}

pub async fn auth(_mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let dir = o.dir()?;
    let hub = Hub::start(&dir, &Options::default()).await?;
    o.watch_log(hub.log_path());
    let ann = hub.create_agent("Ann", AGENT).await?;
    let bob = hub.create_agent("Bob", "bob@battery.test").await?;
    let a = hub
        .create_channel("auth-a", "http://127.0.0.1:9/a", &[AGENT])
        .await?;
    hub.create_channel("auth-b", "http://127.0.0.1:9/b", &["bob@battery.test"])
        .await?;
    let secret = "auth-secret-customer";
    match hub.say(&a, secret, "auth-secret-text").await? {
        200 => {}
        other => return Err(format!("the customer message got {other}")),
    }
    let chat = chat_of(&hub, &ann, secret).await?;
    let chat_path = format!("/agent/v1/chats/{chat}");
    let wrong_agent = "hub_agent_0123456789abcdef0123456789abcdef";
    let wrong_admin = "battery-admin-token-0123456780";
    let reply = json!({ "type": "text", "text": "auth-secret-reply" });
    let attrs = json!({ "attributes": { "vip": true } });
    let new_agent = json!({ "name": "Eve", "email": "eve@battery.test" });
    let (by_bob, by_ann) = (Some(bob.as_str()), Some(ann.as_str()));
    let checks = [
        Refusal::new(
            "agent_no_token",
            Method::GET,
            "/agent/v1/chats",
            None,
            &[401],
        ),
        Refusal::new(
            "agent_wrong_token",
            Method::GET,
            "/agent/v1/chats",
            Some(wrong_agent),
            &[401],
        ),
        Refusal::new(
            "agent_admin_token",
            Method::GET,
            "/agent/v1/chats",
            Some(ADMIN),
            &[401],
        ),
        Refusal::new(
            "other_agent_read",
            Method::GET,
            &chat_path,
            by_bob,
            &[403, 404],
        ),
        Refusal::new(
            "other_agent_reply",
            Method::POST,
            &format!("{chat_path}/messages"),
            by_bob,
            &[403, 404],
        )
        .with(&reply),
        Refusal::new(
            "other_agent_accept",
            Method::POST,
            &format!("{chat_path}/accept"),
            by_bob,
            &[403, 404],
        ),
        Refusal::new(
            "other_agent_close",
            Method::POST,
            &format!("{chat_path}/close"),
            by_bob,
            &[403, 404],
        ),
        Refusal::new(
            "other_agent_attributes",
            Method::PUT,
            &format!("{chat_path}/attributes"),
            by_bob,
            &[403, 404],
        )
        .with(&attrs),
        Refusal::new(
            "admin_no_token",
            Method::GET,
            "/admin/v1/channels",
            None,
            &[401],
        ),
        Refusal::new(
            "admin_wrong_token",
            Method::GET,
            "/admin/v1/channels",
            Some(wrong_admin),
            &[401],
        ),
        Refusal::new(
            "admin_agent_token",
            Method::GET,
            "/admin/v1/channels",
            by_ann,
            &[401, 403],
        ),
        Refusal::new(
            "admin_agent_create",
            Method::POST,
            "/admin/v1/agents",
            by_ann,
            &[401, 403],
        )
        .with(&new_agent),
        Refusal::new(
            "admin_agent_deliveries",
            Method::GET,
            "/admin/v1/deliveries",
            by_bob,
            &[401, 403],
        ),
        Refusal::new("metrics_no_token", Method::GET, "/metrics", None, &[401]),
        Refusal::new(
            "metrics_agent_token",
            Method::GET,
            "/metrics",
            by_ann,
            &[401, 403],
        ),
    ];
    let mut answers = Vec::new();
    for Refusal {
        name,
        method,
        path,
        token,
        body,
        expect,
    } in &checks
    {
        let (status, value) = hub.call(method.clone(), path, *token, *body).await?;
        let text = value.to_string();
        answers.push(format!("{name}:{status}"));
        o.check(expect.contains(&status), || {
            format!("{name}: {method} {path} expected {expect:?}, got {status} {text}")
        });
        o.check(
            !text.contains("auth-secret") && !text.contains("endpoint_url"),
            || format!("{name}: the refusal carries data: {text}"),
        );
    }

    // Bob's list and live stream show nothing of Ann's channel.
    let bobs = hub.chats(&bob).await?;
    o.check(bobs.iter().all(|c| c["id"] != chat), || {
        "another agent's chat list shows the chat".to_owned()
    });
    let stream = hub
        .http
        .get(format!("{}/agent/v1/stream", hub.base))
        .bearer_auth(&bob)
        .send()
        .await
        .map_err(|e| format!("Bob's stream: {e}"))?;
    o.check(stream.status() == 200, || {
        format!("Bob's stream: {}", stream.status())
    });
    hub.say(&a, secret, "auth-secret-live").await?;
    let mut seen = String::new();
    let mut body = stream.bytes_stream();
    let until = Instant::now() + Duration::from_millis(1500);
    while let Ok(Some(Ok(chunk))) =
        tokio::time::timeout(until.saturating_duration_since(Instant::now()), body.next()).await
    {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    o.check(!seen.contains("auth-secret"), || {
        "another agent's stream carried the chat's messages".to_owned()
    });

    // Nothing the refused requests asked for happened.
    let messages = hub.messages(&ann, chat).await?;
    let texts: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["body"]["text"].as_str())
        .collect();
    o.check(!texts.contains(&"auth-secret-reply"), || {
        "another agent's reply was stored".to_owned()
    });
    let (_, view) = hub.call(Method::GET, &chat_path, Some(&ann), None).await?;
    o.check(view["chat"]["state"] == "open", || {
        format!("the chat changed state: {}", view["chat"]["state"])
    });
    let (_, agents) = hub.admin(Method::GET, "/admin/v1/agents", None).await?;
    o.check(!agents.to_string().contains("eve@battery.test"), || {
        "an agent token created an agent".to_owned()
    });

    // Failed credentials from one address: 429 with Retry-After once past
    // `[limits] auth_failures`, even for the right token; another address
    // (127.0.0.2) is not affected.
    let admin_url = format!("{}/admin/v1/channels", hub.base);
    let mut limited = None;
    for i in 1..=60 {
        let resp = hub
            .http
            .get(&admin_url)
            .bearer_auth(wrong_admin)
            .send()
            .await
            .map_err(|e| format!("admin request: {e}"))?;
        if resp.status() == 429 {
            limited = Some((i, resp.headers().contains_key("retry-after")));
            break;
        }
    }
    let right_here = hub
        .http
        .get(&admin_url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .map_or(0, |r| r.status().as_u16());
    let elsewhere = reqwest::Client::builder()
        .no_proxy()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .map_err(|e| format!("a client on 127.0.0.2: {e}"))?
        .get(&admin_url)
        .bearer_auth(ADMIN)
        .send()
        .await
        .map_or(0, |r| r.status().as_u16());
    o.fig(
        "auth_limit",
        format!(
            "429_after={},right_token_same_address={right_here},right_token_other_address={elsewhere}",
            limited.map_or("never".to_owned(), |(n, _)| n.to_string())
        ),
    );
    o.check(limited.is_some_and(|(_, retry)| retry), || {
        format!("wrong admin tokens were never limited with 429 + Retry-After: {limited:?}")
    });
    o.check(right_here == 429 && elsewhere == 200, || {
        format!(
            "while limited the right token got {right_here} from the same address and {elsewhere} from another"
        )
    });
    o.fig("checks", checks.len() + 6);
    o.fig("answers", answers.join(" "));
    Ok(())
}

/// What the hub sends until it closes the connection (`true`) or `deadline`
/// passes; `seen` looks at everything read so far after each read.
async fn read_until(
    read: &mut tokio::net::tcp::OwnedReadHalf,
    deadline: Instant,
    mut seen: impl FnMut(&[u8]),
) -> (Vec<u8>, bool) {
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (bytes, false);
        }
        match tokio::time::timeout(left, read.read(&mut buf)).await {
            Err(_) => return (bytes, false),
            Ok(Ok(0) | Err(_)) => return (bytes, true),
            Ok(Ok(n)) => {
                bytes.extend_from_slice(&buf[..n]);
                seen(&bytes);
            }
        }
    }
}
