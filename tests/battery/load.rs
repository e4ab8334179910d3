//! Steady load on a served hub: customers posting messages to a channel
//! endpoint and an agent answering their chats, each request written down
//! with when it started and ended and what it got, so a test can tell what
//! was acknowledged and when.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinHandle;

use crate::receivers::Receipt;

/// One request of the load.
#[derive(Clone)]
pub struct Sent {
    /// The customer message's text, or the reply's uid once it has one.
    pub key: String,
    pub started: Instant,
    pub ended: Instant,
    /// The answer's status; `None` when none came (refused, reset, cut off).
    pub status: Option<u16>,
}

impl Sent {
    pub fn acked(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

#[derive(Default)]
pub struct Ledger {
    pub customer: Vec<Sent>,
    pub replies: Vec<Sent>,
}

pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
    pub ledger: Arc<Mutex<Ledger>>,
}

/// Where the load goes.
#[derive(Clone)]
pub struct Target {
    pub base: String,
    pub endpoint_url: String,
    pub token: String,
    /// Prefix of every text, so tests sharing a hub tell theirs apart.
    pub tag: String,
}

impl Load {
    /// `customers` senders (one customer, so one chat, each) and `repliers`
    /// agent tasks answering those chats, each in a closed loop.
    pub fn start(target: Target, customers: usize, repliers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let mut tasks = Vec::new();
        for c in 0..customers {
            tasks.push(tokio::spawn(customer(
                target.clone(),
                c,
                stop.clone(),
                ledger.clone(),
            )));
        }
        for r in 0..repliers {
            tasks.push(tokio::spawn(replier(
                target.clone(),
                r,
                stop.clone(),
                ledger.clone(),
            )));
        }
        Load {
            stop,
            tasks,
            ledger,
        }
    }

    /// Stops every sender and waits for the requests under way.
    pub async fn stop(self) -> Ledger {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.ledger
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }
}

/// A pause after a failed request, so a dead hub is not spun against.
const BACKOFF: Duration = Duration::from_millis(20);

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("an HTTP client")
}

async fn customer(target: Target, c: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let http = http();
    let sender = format!("{}-c{c}", target.tag);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let text = format!("{sender} n{n}");
        let body = json!({ "sender": { "id": sender, "name": sender },
                           "message": { "type": "text", "text": text } });
        let started = Instant::now();
        let status = http
            .post(&target.endpoint_url)
            .header("content-type", "application/json; charset=utf-8")
            .body(body.to_string())
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16());
        let ended = Instant::now();
        if let Ok(mut l) = ledger.lock() {
            l.customer.push(Sent {
                key: text,
                started,
                ended,
                status,
            });
        }
        if status != Some(200) {
            tokio::time::sleep(BACKOFF).await;
        }
    }
}

async fn replier(target: Target, r: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let http = http();
    let mut chats: Vec<i64> = Vec::new();
    let mut listed = Instant::now() - Duration::from_secs(60);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if chats.is_empty() || listed.elapsed() > Duration::from_secs(1) {
            let answer = http
                .get(format!("{}/agent/v1/chats", target.base))
                .bearer_auth(&target.token)
                .send()
                .await;
            let listing = match answer {
                Ok(resp) if resp.status() == 200 => resp.json::<serde_json::Value>().await.ok(),
                _ => None,
            };
            if let Some(v) = listing {
                let prefix = format!("{}-c", target.tag);
                chats = v["chats"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| {
                        c["client_name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with(&prefix))
                    })
                    .filter_map(|c| c["id"].as_i64())
                    .collect();
                listed = Instant::now();
            }
            if chats.is_empty() {
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        }
        n += 1;
        let chat = chats[(n as usize + r) % chats.len()];
        let text = format!("{}-r{r} n{n}", target.tag);
        let started = Instant::now();
        let answer = http
            .post(format!("{}/agent/v1/chats/{chat}/messages", target.base))
            .bearer_auth(&target.token)
            .json(&json!({ "type": "text", "text": text }))
            .send()
            .await;
        let (status, uid) = match answer {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let v: serde_json::Value = resp.json().await.unwrap_or_default();
                (
                    Some(status),
                    v["message"]["uid"].as_str().map(str::to_owned),
                )
            }
            Err(_) => (None, None),
        };
        let ended = Instant::now();
        if let Ok(mut l) = ledger.lock() {
            l.replies.push(Sent {
                key: uid.unwrap_or(text),
                started,
                ended,
                status,
            });
        }
        if status != Some(201) {
            tokio::time::sleep(BACKOFF).await;
        }
    }
}

/// How the acknowledged customer messages fared in storage.
pub struct Stored {
    pub acked: usize,
    pub stored: usize,
    /// Acknowledged and not stored: lost.
    pub missing: Vec<String>,
    /// Stored more than once.
    pub doubled: usize,
    /// Stored without a 2xx (cut off after the commit): allowed.
    pub unacked_stored: usize,
}

pub fn compare_stored(ledger: &Ledger, texts: &HashMap<String, usize>) -> Stored {
    let acked: Vec<&Sent> = ledger.customer.iter().filter(|s| s.acked()).collect();
    let missing: Vec<String> = acked
        .iter()
        .filter(|s| !texts.contains_key(&s.key))
        .map(|s| s.key.clone())
        .collect();
    let ours: HashSet<&str> = ledger.customer.iter().map(|s| s.key.as_str()).collect();
    let unacked_stored = ledger
        .customer
        .iter()
        .filter(|s| !s.acked() && texts.contains_key(&s.key))
        .count();
    Stored {
        acked: acked.len(),
        stored: acked.len() - missing.len(),
        missing,
        doubled: texts
            .iter()
            .filter(|(t, n)| **n > 1 && ours.contains(t.as_str()))
            .count(),
        unacked_stored,
    }
}

/// How the accepted agent replies fared at the integrator.
pub struct Delivered {
    pub accepted: usize,
    pub delivered: usize,
    /// Accepted and never received.
    pub missing: Vec<String>,
    /// Receipts beyond the first of each reply.
    pub duplicates: usize,
    /// Replies received under more than one delivery id.
    pub id_changed: Vec<String>,
}

pub fn compare_delivered(ledger: &Ledger, receipts: &[Receipt]) -> Delivered {
    let mut by_message: HashMap<&str, Vec<&Receipt>> = HashMap::new();
    for r in receipts {
        by_message.entry(r.message_id.as_str()).or_default().push(r);
    }
    let accepted: Vec<&Sent> = ledger.replies.iter().filter(|s| s.acked()).collect();
    let missing: Vec<String> = accepted
        .iter()
        .filter(|s| !by_message.contains_key(s.key.as_str()))
        .map(|s| s.key.clone())
        .collect();
    let id_changed = by_message
        .iter()
        .filter(|(_, rs)| rs.iter().any(|r| r.delivery != rs[0].delivery))
        .map(|(id, _)| (*id).to_owned())
        .collect();
    Delivered {
        accepted: accepted.len(),
        delivered: accepted.len() - missing.len(),
        missing,
        duplicates: receipts.len() - by_message.len(),
        id_changed,
    }
}

/// Waits until every accepted reply has reached the integrator, or `timeout`.
pub async fn await_delivery(
    ledger: &Ledger,
    receipts: impl Fn() -> Vec<Receipt>,
    timeout: Duration,
) -> Delivered {
    let deadline = Instant::now() + timeout;
    loop {
        let d = compare_delivered(ledger, &receipts());
        if d.missing.is_empty() || Instant::now() > deadline {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three examples of a list, for a failure line.
pub fn some(list: &[String]) -> String {
    let mut shown: Vec<&str> = list.iter().take(3).map(String::as_str).collect();
    if list.len() > 3 {
        shown.push("…");
    }
    shown.join(", ")
}
