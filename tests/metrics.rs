//! `/metrics` as an operator reads it while real traffic flows: requests by
//! edge and status, events by verdict (a plugin drops one), an agent reply
//! delivered, one dead-lettered after its attempts against a 500 integrator,
//! the outbox while it waits, webhook replies applied and ignored, an open
//! agent stream, the pool and the process. The hub is a `hub serve` child:
//! its counters are per process, and in-process hubs of other tests would
//! add to them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{
    ADMIN_TOKEN, HubOptions, HubProcess, Integrator, Reply, TestAgent, TestChannel, admin_create,
    eventually, plugin_toml, route_toml, serve, write_config,
};

/// The longest a state may take to appear. Generous: a loaded CI machine
/// runs this beside the rest of the suite, and a state that holds is seen
/// at the next scrape anyway.
const WAIT: Duration = Duration::from_secs(60);

/// One scrape: the text, and `name{labels}` → value.
struct Scrape {
    text: String,
    values: HashMap<String, f64>,
}

impl Scrape {
    async fn of(base: &str) -> Scrape {
        let resp = reqwest::Client::new()
            .get(format!("{base}/metrics"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("metrics request");
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.expect("metrics body");
        let values = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect();
        Scrape { text, values }
    }

    /// A sample's value. A sample the scrape lacks fails the test: a check
    /// of a metric that does not exist must not pass.
    fn get(&self, sample: &str) -> f64 {
        self.find(sample)
            .unwrap_or_else(|| panic!("no sample `{sample}` in the scrape:\n{}", self.text))
    }

    /// A sample's value, or `None` while it is absent: the counters that
    /// show only once they count, read while waiting for them.
    fn find(&self, sample: &str) -> Option<f64> {
        self.values.get(sample).copied()
    }

    /// Samples of `family` by their labels (`{attempt="1"}` → value).
    fn family(&self, family: &str) -> BTreeMap<String, f64> {
        self.values
            .iter()
            .filter_map(|(k, v)| {
                let labels = k.strip_prefix(family)?;
                labels.starts_with('{').then(|| (labels.to_owned(), *v))
            })
            .collect()
    }

    /// What differs from `want` (sample, value), or `None` when all match.
    fn differences(&self, want: &[(&str, f64)]) -> Option<String> {
        let wrong: Vec<String> = want
            .iter()
            .filter(|(sample, value)| self.find(sample) != Some(*value))
            .map(|(sample, value)| match self.find(sample) {
                Some(got) => format!("{sample} is {got}, not {value}"),
                None => format!("{sample} is missing (want {value})"),
            })
            .collect();
        (!wrong.is_empty()).then(|| wrong.join("; "))
    }
}

/// Scrapes until `pending` finds nothing left to wait for, and answers that
/// scrape. Counters and gauges move a moment after what the test saw (the
/// deliverer counts a row once it hears its batch committed; the outbox
/// gauge reads the database), so a check waits for the state it expects.
/// After [`WAIT`] the test fails with what was still missing and the last
/// scrape.
async fn settle(base: &str, what: &str, pending: impl Fn(&Scrape) -> Option<String>) -> Scrape {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = Scrape::of(base).await;
        let Some(why) = pending(&m) else {
            return m;
        };
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {why}\n{}",
            m.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Scrapes until every sample of `want` has its value.
async fn settle_at(base: &str, what: &str, want: &[(&str, f64)]) -> Scrape {
    settle(base, what, |m| m.differences(want)).await
}

/// A webhook receiver that answers the first `chat_accepted` with data for
/// the agent, the second with a refusal, everything else with ok; it keeps
/// each request's `X-Hub-Attempt`.
#[derive(Clone, Default)]
struct Receiver {
    attempts: Arc<Mutex<Vec<String>>>,
    accepted: Arc<AtomicUsize>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let url = format!("http://{}/hooks", listener.local_addr().expect("addr"));
        let this = receiver.clone();
        serve(listener, move |req| {
            let this = this.clone();
            async move {
                let attempt = req
                    .headers()
                    .get("x-hub-attempt")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let body = req.into_body().collect().await.expect("body").to_bytes();
                let event: Value = serde_json::from_slice(&body).unwrap_or_default();
                let answer = if event["event_name"] == "chat_accepted" {
                    match this.accepted.fetch_add(1, Ordering::SeqCst) {
                        0 => json!({ "result": "ok", "enable_assign": true,
                                     "crm_link": "https://crm.example.com/clients/1" }),
                        _ => json!({ "result": "error", "message": "unknown client" }),
                    }
                } else {
                    json!({ "result": "ok" })
                };
                this.attempts.lock().expect("attempts").push(attempt);
                http::Response::new(Full::new(Bytes::from(answer.to_string())))
            }
        });
        (receiver, url)
    }

    fn attempts(&self) -> Vec<String> {
        self.attempts.lock().expect("attempts").clone()
    }
}

async fn customer(ch: &TestChannel, id: i64, text: &str) {
    let resp = reqwest::Client::new()
        .post(&ch.endpoint_url)
        .json(&json!({ "sender": { "id": id }, "message": { "type": "text", "text": text } }))
        .send()
        .await
        .expect("customer request");
    assert_eq!(resp.status(), 200, "customer message");
}

/// The id of the chat that is not among `known`.
async fn new_chat(agent: &TestAgent, known: &[i64]) -> i64 {
    eventually(WAIT, "a new chat", || async {
        agent
            .chats()
            .await
            .iter()
            .filter_map(|c| c["id"].as_i64())
            .find(|id| !known.contains(id))
    })
    .await
}

#[tokio::test]
async fn metrics_follow_requests_events_deliveries_replies_and_streams() {
    let good = Integrator::start().await;
    let bad = Integrator::start().await;
    // Slow enough that the failing row is seen waiting in the outbox.
    bad.set_default(Reply::json(500, "down").delayed(Duration::from_millis(200)));
    let (receiver, receiver_url) = Receiver::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = HubOptions {
        attempts: 3,
        retry_interval_ms: 500,
        attempt_timeout_ms: 2000,
        extra_toml: plugin_toml(
            "spam-guard",
            "spam_guard",
            "",
            "patterns = [\"casino\"]\nmax_messages = 0",
        ) + &route_toml("\"channel.customer_message\"", "\"spam-guard\"", "skip"),
        ..HubOptions::default()
    };
    let config = write_config(dir.path(), &opts, "127.0.0.1:0");
    let hub = tokio::task::spawn_blocking(move || HubProcess::spawn(&config))
        .await
        .expect("hub process");
    let base = hub.base.clone();

    // Before any traffic: the process, the pool, an empty outbox.
    let m = Scrape::of(&base).await;
    for (family, kind) in [
        ("hub_up", "gauge"),
        ("hub_build_info", "gauge"),
        ("hub_start_time_seconds", "gauge"),
        ("hub_uptime_seconds", "gauge"),
        ("hub_http_requests_total", "counter"),
        ("hub_http_request_duration_seconds", "histogram"),
        ("hub_events_total", "counter"),
        ("hub_deliveries_total", "counter"),
        ("hub_delivery_attempts_total", "counter"),
        ("hub_dead_letters_total", "counter"),
        ("hub_dead_letters", "gauge"),
        ("hub_outbox_pending", "gauge"),
        ("hub_outbox_oldest_pending_seconds", "gauge"),
        ("hub_webhook_replies_total", "counter"),
        ("hub_db_connections", "gauge"),
        ("hub_live_streams", "gauge"),
        ("hub_store_wal_restarts_total", "counter"),
        ("hub_store_wal_restart_seconds_total", "counter"),
        ("hub_store_wal_restart_seconds_max", "gauge"),
        ("hub_store_wal_syncs_total", "counter"),
        ("hub_store_wal_sync_seconds_total", "counter"),
        ("hub_store_wal_sync_seconds_max", "gauge"),
    ] {
        assert!(
            m.text.contains(&format!("# HELP {family} ")),
            "{family} has no HELP:\n{}",
            m.text
        );
        assert!(
            m.text.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} is not a {kind}"
        );
    }
    assert_eq!(m.get("hub_up"), 1.0);
    let version = format!(
        "hub_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(m.get(&version), 1.0);
    assert!(m.get("hub_start_time_seconds") > 1.6e9);
    assert!(m.get("hub_uptime_seconds") >= 0.0);
    // One reading of the pool: in use and idle add up to what is open.
    let max = m.get("hub_db_connections{state=\"max\"}");
    assert!(max >= 1.0);
    assert!(
        m.get("hub_db_connections{state=\"in_use\"}") + m.get("hub_db_connections{state=\"idle\"}")
            <= max
    );
    // The hub's own policies show at zero, so an alert has a series to watch.
    assert_eq!(m.get(PENDING), 0.0);
    assert_eq!(m.get(OLDEST), 0.0);
    assert_eq!(m.get("hub_dead_letters"), 0.0);
    assert_eq!(m.get("hub_dead_letters_total"), 0.0);
    assert_eq!(m.get(AGENT_STREAMS), 0.0);
    assert_eq!(m.get(WIDGET_STREAMS), 0.0);
    assert_eq!(m.get(APPLIED), 0.0);
    assert_eq!(m.get(IGNORED), 0.0);
    // Deliveries and attempts show once they count.
    assert_eq!(m.family("hub_deliveries_total"), BTreeMap::new());
    assert_eq!(m.family("hub_delivery_attempts_total"), BTreeMap::new());

    // Setup through the admin API: one agent, two channels.
    let v = admin_create(
        &base,
        "agents",
        json!({ "name": "Ann", "email": "ann@example.com" }),
    )
    .await;
    let ann = TestAgent {
        id: v["id"].as_i64().expect("agent id"),
        token: v["token"].as_str().expect("token").to_owned(),
        base: base.clone(),
        http: reqwest::Client::new(),
    };
    let web = TestChannel::from_view(
        admin_create(
            &base,
            "channels",
            json!({ "name": "web", "customer_endpoint": good.url,
                    "agents": ["ann@example.com"], "webhook_url": receiver_url }),
        )
        .await,
    );
    let down = TestChannel::from_view(
        admin_create(
            &base,
            "channels",
            json!({ "name": "down", "customer_endpoint": bad.url,
                    "agents": ["ann@example.com"] }),
        )
        .await,
    );

    // An agent stream counts while it is open.
    let stream = ann.stream().await;
    settle_at(
        &base,
        "the open stream to be counted",
        &[(AGENT_STREAMS, 1.0), (WIDGET_STREAMS, 0.0)],
    )
    .await;
    drop(stream);
    settle_at(
        &base,
        "the closed stream to be uncounted",
        &[(AGENT_STREAMS, 0.0)],
    )
    .await;

    // Customers write; spam-guard drops one message (still a 200).
    customer(&web, 1, "hello").await;
    let first = new_chat(&ann, &[]).await;
    customer(&web, 2, "hi there").await;
    let second = new_chat(&ann, &[first]).await;
    customer(&web, 1, "visit my casino").await;
    customer(&down, 3, "anyone?").await;
    let third = new_chat(&ann, &[first, second]).await;

    // The first chat's reply is shown to the agent, the second's refused.
    let (status, _) = ann
        .send(
            Method::POST,
            &format!("/agent/v1/chats/{first}/accept"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    settle_at(
        &base,
        "an applied webhook reply",
        &[(APPLIED, 1.0), (IGNORED, 0.0)],
    )
    .await;
    let (status, _) = ann
        .send(
            Method::POST,
            &format!("/agent/v1/chats/{second}/accept"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    settle_at(
        &base,
        "an ignored webhook reply",
        &[(APPLIED, 1.0), (IGNORED, 1.0)],
    )
    .await;
    ann.reply(first, "How can I help?").await;
    good.wait_for(1, WAIT).await;

    // The reply to the failing integrator waits in the outbox (for three
    // attempts 200 ms each, 500 ms apart), then dies.
    ann.reply(third, "Hello?").await;
    settle(
        &base,
        "the failing reply waiting in the outbox",
        |m| match (m.find(PENDING), m.find(OLDEST)) {
            (Some(pending), Some(age)) if pending == 1.0 && age > 0.0 => None,
            (pending, age) => Some(format!("pending {pending:?}, oldest {age:?} s")),
        },
    )
    .await;
    settle_at(
        &base,
        "a dead letter, stored and counted",
        &[
            ("hub_dead_letters", 1.0),
            ("hub_dead_letters_total", 1.0),
            (PENDING, 0.0),
            (OLDEST, 0.0),
            (
                "hub_deliveries_total{kind=\"channel\",result=\"delivered\"}",
                1.0,
            ),
            // Attempts 1 and 2 are retried, the third fails.
            (
                "hub_deliveries_total{kind=\"channel\",result=\"retry\"}",
                2.0,
            ),
            (
                "hub_deliveries_total{kind=\"channel\",result=\"failed\"}",
                1.0,
            ),
        ],
    )
    .await;
    assert_eq!(bad.requests().len(), 3);

    // Requests by edge and status: four customer posts (the dropped one
    // too), three creations, two replies, an unknown path. Events by
    // verdict: spam-guard passed three messages and dropped one.
    let resp = reqwest::get(format!("{base}/no/such/path/here"))
        .await
        .expect("request");
    assert_eq!(resp.status(), 404);
    let m = settle_at(
        &base,
        "requests and events counted",
        &[
            (
                "hub_http_requests_total{edge=\"channel\",status=\"200\"}",
                4.0,
            ),
            (
                "hub_http_request_duration_seconds_count{edge=\"channel\"}",
                4.0,
            ),
            (
                "hub_http_request_duration_seconds_bucket{edge=\"channel\",le=\"+Inf\"}",
                4.0,
            ),
            (
                "hub_http_requests_total{edge=\"admin\",status=\"201\"}",
                3.0,
            ),
            (
                "hub_http_requests_total{edge=\"other\",status=\"404\"}",
                1.0,
            ),
            (
                "hub_http_requests_total{edge=\"agent\",status=\"201\"}",
                2.0,
            ),
            (
                "hub_events_total{kind=\"channel.customer_message\",verdict=\"passed\"}",
                3.0,
            ),
            (
                "hub_events_total{kind=\"channel.customer_message\",verdict=\"dropped\"}",
                1.0,
            ),
            (
                "hub_events_total{kind=\"channel.agent_message\",verdict=\"passed\"}",
                2.0,
            ),
        ],
    )
    .await;
    assert!(m.get("hub_http_requests_total{edge=\"metrics\",status=\"200\"}") >= 3.0);

    // Every request a receiver got is an attempt counted under its number,
    // and every webhook (both chat_accepted among them) was delivered at its
    // first attempt.
    let m = settle(&base, "attempts to match what receivers got", |m| {
        let mut got: BTreeMap<String, f64> = BTreeMap::new();
        let headers = good
            .requests()
            .into_iter()
            .chain(bad.requests())
            .filter_map(|r| r.header("x-hub-attempt").map(str::to_owned))
            .chain(receiver.attempts());
        for attempt in headers {
            *got.entry(format!("{{attempt=\"{attempt}\"}}")).or_default() += 1.0;
        }
        let webhooks = receiver.attempts().len() as f64;
        let counted = m.family("hub_delivery_attempts_total");
        let delivered = m.find("hub_deliveries_total{kind=\"webhook\",result=\"delivered\"}");
        (counted != got || delivered != Some(webhooks) || webhooks < 2.0).then(|| {
            format!(
                "attempts counted {counted:?}, received {got:?}; \
                 webhooks delivered {delivered:?} of {webhooks} received"
            )
        })
    })
    .await;
    assert_eq!(m.get("hub_delivery_attempts_total{attempt=\"3\"}"), 1.0);
}

const PENDING: &str = "hub_outbox_pending{policy=\"channel\"}";
const OLDEST: &str = "hub_outbox_oldest_pending_seconds{policy=\"channel\"}";
const AGENT_STREAMS: &str = "hub_live_streams{kind=\"agent\"}";
const WIDGET_STREAMS: &str = "hub_live_streams{kind=\"widget\"}";
const APPLIED: &str = "hub_webhook_replies_total{result=\"applied\"}";
const IGNORED: &str = "hub_webhook_replies_total{result=\"ignored\"}";
