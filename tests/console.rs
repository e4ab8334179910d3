//! The console's sign-in and sessions over HTTP: passwords set by the admin
//! API, the session cookie authenticating the agent and admin APIs, CSRF on
//! every state-changing request, sign-out and expiry, and the limit on failed
//! sign-ins. (The page itself is tested in a browser: tests/browser/console*.)

use std::time::Duration;

use hub::clock::ManualClock;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{HubOptions, TestHub, eventually};

const PASSWORD: &str = "correct horse battery";

/// A console client that keeps its session cookie, as a browser does.
#[derive(Clone)]
struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: Option<String>,
    csrf: Option<String>,
}

impl Browser {
    fn new(hub: &TestHub) -> Browser {
        Browser {
            http: reqwest::Client::new(),
            base: hub.base.clone(),
            cookie: None,
            csrf: None,
        }
    }

    /// Posts the sign-in form; a session cookie in the answer replaces the
    /// one kept (an emptied one clears it).
    async fn sign_in(&mut self, email: &str, password: &str) -> reqwest::Response {
        let resp = self
            .request(Method::POST, "/console/v1/session")
            .json(&json!({ "email": email, "password": password }))
            .send()
            .await
            .expect("sign-in request");
        self.keep_cookie(&resp);
        resp
    }

    fn keep_cookie(&mut self, resp: &reqwest::Response) {
        if let Some(set) = resp
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
        {
            let pair = set.split(';').next().unwrap_or_default();
            self.cookie = pair
                .strip_prefix("hub_session=")
                .filter(|v| !v.is_empty())
                .map(|v| format!("hub_session={v}"));
        }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(c) = &self.cookie {
            req = req.header("Cookie", c);
        }
        req
    }

    /// Signs in and keeps the CSRF token; the answer's JSON.
    async fn signed_in(&mut self, email: &str, password: &str) -> Value {
        let resp = self.sign_in(email, password).await;
        assert_eq!(resp.status(), 200, "sign-in refused");
        let v: Value = resp.json().await.expect("session json");
        self.csrf = Some(v["csrf_token"].as_str().expect("csrf token").to_owned());
        v
    }

    /// A request with the cookie; with the CSRF header when `csrf`.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        csrf: bool,
    ) -> (u16, Value) {
        let mut req = self.request(method, path);
        if csrf && let Some(t) = &self.csrf {
            req = req.header("X-CSRF-Token", t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("console request");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

async fn agent_with_password(hub: &TestHub, email: &str, admin: bool) -> i64 {
    let (status, v) = hub
        .admin(
            Method::POST,
            "/admin/v1/agents",
            Some(json!({ "name": "Ann", "email": email, "admin": admin })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_i64().expect("agent id");
    let (status, v) = hub
        .admin(
            Method::PUT,
            &format!("/admin/v1/agents/{id}/password"),
            Some(json!({ "password": PASSWORD })),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["id"], id);
    id
}

#[tokio::test]
async fn a_signed_in_agent_uses_the_agent_api_with_the_cookie_and_state_changes_need_the_csrf_token()
 {
    let hub = TestHub::start().await;
    agent_with_password(&hub, "ann@example.com", false).await;
    let mut browser = Browser::new(&hub);

    let resp = browser.sign_in("Ann@Example.com", PASSWORD).await;
    assert_eq!(resp.status(), 200);
    let cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_owned();
    assert!(cookie.starts_with("hub_session="), "{cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attr), "cookie lacks {attr}: {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "Secure over plain http: {cookie}"
    );
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["agent"]["email"], "ann@example.com");
    assert_eq!(v["agent"]["admin"], false);
    let csrf = v["csrf_token"].as_str().expect("csrf").to_owned();
    browser.csrf = Some(csrf.clone());

    // Reading needs only the cookie; the page resumes its session with it.
    let (status, me) = browser.call(Method::GET, "/agent/v1/me", None, false).await;
    assert_eq!((status, &me["email"]), (200, &json!("ann@example.com")));
    let (status, resumed) = browser
        .call(Method::GET, "/console/v1/session", None, false)
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        resumed["csrf_token"],
        csrf.as_str(),
        "one token for the whole session"
    );

    // A change without the token is refused and changes nothing.
    let (status, v) = browser
        .call(
            Method::PUT,
            "/agent/v1/status",
            Some(json!({ "online": true })),
            false,
        )
        .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "forbidden");
    let (_, me) = browser.call(Method::GET, "/agent/v1/me", None, false).await;
    assert_eq!(me["online"], false, "the refused change happened");
    // A wrong token is as good as none.
    let wrong = Browser {
        csrf: Some("0".repeat(csrf.len())),
        ..browser.clone()
    };
    let (status, _) = wrong
        .call(
            Method::PUT,
            "/agent/v1/status",
            Some(json!({ "online": true })),
            true,
        )
        .await;
    assert_eq!(status, 403);

    let (status, v) = browser
        .call(
            Method::PUT,
            "/agent/v1/status",
            Some(json!({ "online": true })),
            true,
        )
        .await;
    assert_eq!((status, &v["online"]), (200, &json!(true)), "{v}");

    // Not an admin: the admin API is closed to this session.
    let (status, v) = browser
        .call(Method::GET, "/admin/v1/channels", None, false)
        .await;
    assert_eq!(status, 403, "{v}");

    // Signing out needs the token too, and ends the session for good.
    let (status, _) = browser
        .call(Method::DELETE, "/console/v1/session", None, false)
        .await;
    assert_eq!(status, 403);
    let (status, _) = browser
        .call(Method::DELETE, "/console/v1/session", None, true)
        .await;
    assert_eq!(status, 200);
    let (status, v) = browser.call(Method::GET, "/agent/v1/me", None, false).await;
    assert_eq!(status, 401, "{v}");
    let (status, _) = browser
        .call(Method::GET, "/console/v1/session", None, false)
        .await;
    assert_eq!(status, 401);
    hub.shutdown().await;
}

#[tokio::test]
async fn the_session_cookie_opens_the_live_stream() {
    let hub = TestHub::start().await;
    agent_with_password(&hub, "ann@example.com", false).await;
    let ch = hub
        .create_channel(
            "shop",
            "http://127.0.0.1:9/never",
            false,
            &["ann@example.com"],
        )
        .await;
    let mut browser = Browser::new(&hub);
    browser.signed_in("ann@example.com", PASSWORD).await;
    let resp = browser
        .request(Method::GET, "/agent/v1/stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    hub.say(&ch, json!("c-1"), "hello from the shop").await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("hello from the shop") {
        let next = futures_util::StreamExt::next(&mut body);
        match tokio::time::timeout_at(deadline, next).await {
            Ok(Some(Ok(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("no message on the stream ({other:?}); got: {seen}"),
        }
    }
    assert!(seen.contains("event: chat.message"), "{seen}");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_wrong_password_is_refused_and_too_many_failures_lock_the_account_even_for_the_right_one()
{
    let clock = ManualClock::new();
    let opts = HubOptions {
        clock: Some(clock.clone()),
        ..HubOptions::default()
    };
    let hub = TestHub::start_with_config(opts, |c| {
        c.console.max_failed_sign_ins = 5;
        c.console.sign_in_lock_secs = 60;
    })
    .await;
    agent_with_password(&hub, "ann@example.com", false).await;
    let mut browser = Browser::new(&hub);

    for attempt in 1..=5 {
        let resp = browser.sign_in("ann@example.com", "wrong password").await;
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        if attempt < 5 {
            assert_eq!(status, 401, "attempt {attempt}: {v}");
            assert_eq!(v["error"]["message"], "wrong e-mail or password");
        } else {
            // The failure that reaches the limit already says so.
            assert_eq!(status, 429, "attempt {attempt}: {v}");
        }
    }
    let resp = browser.sign_in("ann@example.com", PASSWORD).await;
    assert_eq!(resp.status(), 429, "the right password got through a lock");
    let retry: u64 = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert_eq!(retry, 60, "Retry-After");
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "rate_limited");

    // An unknown e-mail counts like a wrong password and says nothing more.
    let resp = browser.sign_in("nobody@example.com", "whatever!").await;
    assert_eq!(resp.status(), 429, "the address is locked too");

    // The lock holds for its whole minute, and no longer.
    clock.advance(Duration::from_millis(59_999));
    let resp = browser.sign_in("nobody@example.com", "whatever!").await;
    assert_eq!(resp.status(), 429, "unlocked before the lock ran out");
    clock.advance(Duration::from_millis(1));
    let resp = browser.sign_in("nobody@example.com", "whatever!").await;
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["message"], "wrong e-mail or password");
    browser.signed_in("ann@example.com", PASSWORD).await;
    hub.shutdown().await;
}

#[tokio::test]
async fn failures_from_one_address_lock_it_for_every_account_at_the_default_limit() {
    let hub = TestHub::start().await;
    agent_with_password(&hub, "ann@example.com", false).await;
    let mut browser = Browser::new(&hub);
    // 30 failures spread over 30 accounts that may not even exist: the
    // address (loopback is not exempt) is locked, for Ann as well.
    for i in 0..30 {
        let resp = browser
            .sign_in(&format!("guess{i}@example.com"), "nope nope")
            .await;
        assert!(
            matches!(resp.status().as_u16(), 401 | 429),
            "{}",
            resp.status()
        );
    }
    let resp = browser.sign_in("ann@example.com", PASSWORD).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().contains_key("retry-after"));
    hub.shutdown().await;
}

#[tokio::test]
async fn an_admin_agent_uses_the_admin_api_with_its_session() {
    let hub = TestHub::start().await;
    agent_with_password(&hub, "boss@example.com", true).await;
    let bob = hub.create_agent("Bob", "bob@example.com").await;
    let mut browser = Browser::new(&hub);
    let v = browser.signed_in("boss@example.com", PASSWORD).await;
    assert_eq!(v["agent"]["admin"], true);

    let (status, v) = browser
        .call(Method::GET, "/admin/v1/agents", None, false)
        .await;
    assert_eq!(status, 200, "{v}");
    let shop = json!({ "name": "shop", "customer_endpoint": "http://127.0.0.1:9/x" });
    let (status, _) = browser
        .call(
            Method::POST,
            "/admin/v1/channels",
            Some(shop.clone()),
            false,
        )
        .await;
    assert_eq!(status, 403, "an admin change without the CSRF token");
    let (status, ch) = browser
        .call(Method::POST, "/admin/v1/channels", Some(shop), true)
        .await;
    assert_eq!(status, 201, "{ch}");

    // Assigning agents to a channel after the fact.
    let id = ch["id"].as_i64().expect("channel id");
    let (status, v) = browser
        .call(
            Method::PUT,
            &format!("/admin/v1/channels/{id}/agents"),
            Some(json!({ "agents": ["Bob@example.com"] })),
            true,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["agents"], json!(["bob@example.com"]));
    let (status, _) = browser
        .call(
            Method::PUT,
            &format!("/admin/v1/channels/{id}/agents"),
            Some(json!({ "agents": ["not-an-address"] })),
            true,
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = browser
        .call(
            Method::PUT,
            "/admin/v1/channels/999999/agents",
            Some(json!({ "agents": [] })),
            true,
        )
        .await;
    assert_eq!(status, 404);
    let channel = crate::support::TestChannel::from_view(ch.clone());
    hub.say(&channel, json!("c-9"), "for bob").await;
    eventually(Duration::from_secs(10), "Bob to see the chat", || async {
        (!bob.chats().await.is_empty()).then_some(())
    })
    .await;
    hub.shutdown().await;
}

#[tokio::test]
async fn passwords_are_checked_when_set_and_a_new_one_ends_the_sessions() {
    let hub = TestHub::start().await;
    let id = agent_with_password(&hub, "ann@example.com", false).await;
    let mut browser = Browser::new(&hub);
    browser.signed_in("ann@example.com", PASSWORD).await;

    let (status, v) = hub
        .admin(
            Method::PUT,
            &format!("/admin/v1/agents/{id}/password"),
            Some(json!({ "password": "short" })),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("at least 8"),
        "{v}"
    );
    let (status, _) = hub
        .admin(
            Method::PUT,
            "/admin/v1/agents/424242/password",
            Some(json!({ "password": "long enough" })),
        )
        .await;
    assert_eq!(status, 404);
    let (status, _) = browser.call(Method::GET, "/agent/v1/me", None, false).await;
    assert_eq!(status, 200, "a refused change ended the session");

    let (status, _) = hub
        .admin(
            Method::PUT,
            &format!("/admin/v1/agents/{id}/password"),
            Some(json!({ "password": "a new long one" })),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = browser.call(Method::GET, "/agent/v1/me", None, false).await;
    assert_eq!(status, 401, "the old session outlived the new password");
    assert_eq!(
        browser.sign_in("ann@example.com", PASSWORD).await.status(),
        401
    );
    browser.signed_in("ann@example.com", "a new long one").await;

    // An agent without a password signs in with nothing.
    hub.create_agent("Tok", "tok@example.com").await;
    assert_eq!(browser.sign_in("tok@example.com", "").await.status(), 401);
    hub.shutdown().await;
}

#[tokio::test]
async fn an_expired_session_is_refused() {
    let hub = TestHub::start().await;
    let id = agent_with_password(&hub, "ann@example.com", false).await;
    let now = hub::clock::now_ms();
    let cookie = "f".repeat(64);
    hub.store()
        .insert_session(
            &hub::ids::token_hash(&cookie),
            id,
            "csrf",
            now - 10_000,
            now - 1,
        )
        .await
        .expect("session stored");
    let resp = reqwest::Client::new()
        .get(hub.url("/agent/v1/me"))
        .header("Cookie", format!("hub_session={cookie}"))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 401);
    let v: Value = resp.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("sign in again"),
        "{v}"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn the_console_page_is_served_with_a_strict_content_security_policy() {
    let hub = TestHub::start().await;
    let resp = reqwest::get(hub.url("/console")).await.expect("console");
    assert_eq!(resp.status(), 200);
    let csp = resp
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let html = resp.text().await.expect("html");
    assert!(
        html.contains("console.js"),
        "the page does not load its script"
    );
    for asset in ["console.js", "console.css", "console-admin.js"] {
        let r = reqwest::get(hub.url(&format!("/console/{asset}")))
            .await
            .expect("asset");
        assert_eq!(r.status(), 200, "{asset}");
    }
    // A sign-in posted by a form (not JSON) is refused: another site's page
    // cannot sign a visitor in.
    let r = reqwest::Client::new()
        .post(hub.url("/console/v1/session"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body("email=a%40b.c&password=x")
        .send()
        .await
        .expect("form post");
    assert_eq!(r.status(), 415);
    hub.shutdown().await;
}

#[tokio::test]
async fn behind_an_https_proxy_the_cookie_is_secure() {
    let hub = TestHub::start_with_config(HubOptions::default(), |c| {
        c.server.trusted_proxies = vec!["127.0.0.1".parse().expect("address")];
    })
    .await;
    agent_with_password(&hub, "ann@example.com", false).await;
    let sign_in = |proto: &'static str| {
        reqwest::Client::new()
            .post(hub.url("/console/v1/session"))
            .header("X-Forwarded-Proto", proto)
            .json(&json!({ "email": "ann@example.com", "password": PASSWORD }))
            .send()
    };
    let cookie = |resp: &reqwest::Response| {
        resp.headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let resp = sign_in("https").await.expect("sign-in");
    assert_eq!(resp.status(), 200);
    assert!(cookie(&resp).ends_with("; Secure"), "{}", cookie(&resp));
    let resp = sign_in("http").await.expect("sign-in");
    assert!(!cookie(&resp).contains("Secure"), "{}", cookie(&resp));
    hub.shutdown().await;
}

#[tokio::test]
async fn the_chat_view_names_each_agent_and_shows_the_clients_attributes() {
    let hub = TestHub::start().await;
    let ann = hub.create_agent("Ann", "ann@example.com").await;
    let ch = hub
        .create_channel(
            "shop",
            "http://127.0.0.1:9/never",
            false,
            &["ann@example.com"],
        )
        .await;
    hub.say(&ch, json!("c-1"), "hello").await;
    let chat = ann.chats().await[0]["id"].as_i64().expect("chat id");
    let view = ann.chat(chat).await;
    assert_eq!(view["attributes"], json!({}), "no attributes yet: {view}");
    ann.reply(chat, "hi, Ann here").await;
    let (status, _) = ann
        .send(
            Method::PUT,
            &format!("/agent/v1/chats/{chat}/attributes"),
            Some(json!({ "attributes": { "tier": "gold" } })),
        )
        .await;
    assert_eq!(status, 200);
    let view = ann.chat(chat).await;
    assert_eq!(view["attributes"], json!({ "tier": "gold" }));
    let mine = &view["messages"][1];
    assert_eq!(
        (&mine["author"], &mine["author_name"]),
        (&json!("agent"), &json!("Ann")),
        "{mine}"
    );
    assert!(
        view["messages"][0]["author_name"].is_null(),
        "a client message got a name"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn metrics_need_the_admin_token_or_an_admin_session_unless_made_public() {
    let hub = TestHub::start().await;
    let plain = reqwest::get(hub.url("/metrics")).await.expect("metrics");
    assert_eq!(plain.status(), 401);
    let with_token = reqwest::Client::new()
        .get(hub.url("/metrics"))
        .bearer_auth(crate::support::ADMIN_TOKEN)
        .send()
        .await
        .expect("metrics");
    assert_eq!(with_token.status(), 200, "the admin token reads them");
    agent_with_password(&hub, "boss@example.com", true).await;
    let mut browser = Browser::new(&hub);
    browser.signed_in("boss@example.com", PASSWORD).await;
    let resp = browser
        .request(Method::GET, "/metrics")
        .send()
        .await
        .expect("metrics");
    assert_eq!(resp.status(), 200, "an admin agent's session reads them");
    hub.shutdown().await;

    let public = TestHub::start_with_config(HubOptions::default(), |c| {
        c.metrics.access = hub::config::MetricsAccess::Public;
    })
    .await;
    let plain = reqwest::get(public.url("/metrics")).await.expect("metrics");
    assert_eq!(plain.status(), 200);
    public.shutdown().await;
}
