//! The deliverer: claims due outbox rows, makes the HTTP attempt, and applies
//! the row's retry policy. What a final result means to the rest of the hub is
//! the [`Finisher`]'s business.

pub(crate) mod heartbeat;
mod policy;
pub(crate) mod prune;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ::http::{HeaderName, HeaderValue};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

pub use policy::Policies;

use crate::clock::Clock;
use crate::obs::{self, DeliveryResult};
use crate::outbound::signing::{self, Secret};
use crate::outbound::{
    AnswerRule, Attempt, DeliveryId, ExchangeError, HttpSender, Request, RetryPolicy,
};
use crate::pipeline::wiring::WiringHandle;
use crate::store::{Claimed, Retry, RowKind, Store, StoreError};

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// Delivered; `answer` is the receiver's body, or the reply of a plugin
    /// that answered in the receiver's place.
    Delivered { answer: Option<String> },
    /// Not delivered and not tried again; the reason is what the agent reads.
    Failed(String),
    /// Never sent, and rightly so: a plugin dropped it, or nobody receives it.
    NotSent(String),
}

/// What a staged row's plugins decided, before its first attempt.
#[derive(Debug)]
pub enum Staged {
    /// Send it; the plugins may have changed the body (already stored).
    Send { body: String },
    /// Done without an attempt.
    Done(Final),
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the rest of the hub does around a delivery: routes a staged row
/// through its plugins, and records a final result.
pub trait Finisher: Send + Sync + 'static {
    fn stage<'a>(&'a self, row: &'a Claimed) -> BoxFuture<'a, Result<Staged, StoreError>>;

    /// Records `result`; whether the deliverer should look for due rows
    /// (the next row of `row`'s order key may have become its head).
    fn finish<'a>(
        &'a self,
        row: &'a Claimed,
        result: &'a Final,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Answers a row that goes to a plugin of the hub instead of over HTTP
    /// (a plugin bot); the result is final.
    fn answer_locally<'a>(&'a self, row: &'a Claimed) -> BoxFuture<'a, Result<Final, StoreError>>;

    /// Headers a row's request needs besides its destination's (a bot
    /// provider's bearer token); an error counts as a failed attempt, and
    /// ends the row when it is final (a token URL the policy refuses).
    fn request_headers<'a>(
        &'a self,
        row: &'a Claimed,
    ) -> BoxFuture<'a, Result<Vec<(::http::HeaderName, ::http::HeaderValue)>, ExchangeError>>;
}

/// Wakes the deliverer when something was queued.
#[derive(Clone, Default)]
pub struct Kick(Arc<Notify>);

impl Kick {
    pub fn kick(&self) {
        self.0.notify_one();
    }
}

pub struct Deliverer {
    store: Store,
    sender: HttpSender,
    policies: Policies,
    wiring: WiringHandle,
    finisher: Arc<dyn Finisher>,
    kick: Kick,
    /// Decides when rows are due and stamps attempts.
    clock: Clock,
}

const BATCH: i64 = 64;
/// Longest sleep between looks at the outbox when nothing kicks the
/// deliverer: also how late a lease that ran out (its instance died) is seen.
const IDLE_POLL: Duration = Duration::from_millis(1000);

impl Deliverer {
    pub fn new(
        store: Store,
        sender: HttpSender,
        policies: Policies,
        wiring: WiringHandle,
        finisher: Arc<dyn Finisher>,
        kick: Kick,
        clock: Clock,
    ) -> Arc<Deliverer> {
        Arc::new(Deliverer {
            store,
            sender,
            policies,
            wiring,
            finisher,
            kick,
            clock,
        })
    }

    /// Runs until `shutdown` turns true, then waits up to `grace` for attempts in
    /// flight; attempts cut off are released for the next start.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>, grace: Duration) {
        let mut inflight: JoinSet<()> = JoinSet::new();
        let mut rows: HashMap<tokio::task::Id, String> = HashMap::new();
        let handoff = self.store.handoff();
        // Look at the outbox first: rows may be due from before the start.
        let mut look = true;
        let mut wake_at = self.clock.now_ms();
        loop {
            if *shutdown.borrow() {
                break;
            }
            // The configuration refuses a lease that does not outlast every
            // attempt's timeout (a reload too), so a live attempt keeps its row.
            let lease_ms = millis(self.policies.lease);
            // Rows queued from now on are leased to this deliverer as they
            // are written; those handed over already go first.
            handoff.open(lease_ms);
            for row in handoff.take() {
                self.spawn_attempt(row, &mut inflight, &mut rows);
            }
            if look {
                wake_at = self.claim(lease_ms, &mut inflight, &mut rows).await;
            }
            tokio::select! {
                _ = self.kick.0.notified() => look = true,
                _ = self.clock.sleep_until_ms(wake_at) => look = true,
                _ = handoff.ready() => look = false,
                changed = shutdown.changed() => {
                    // Its sender gone, nobody can stop this loop by it:
                    // stop now rather than spin on the closed channel.
                    if changed.is_err() {
                        break;
                    }
                    look = false;
                }
                Some(done) = inflight.join_next_with_id(), if !inflight.is_empty() => {
                    rows.remove(&task_id(&done));
                    look = false;
                }
            }
            while let Some(done) = inflight.try_join_next_with_id() {
                rows.remove(&task_id(&done));
            }
            settle_finishing(&mut inflight, &mut rows).await;
        }
        // Rows handed over and never started: their leases go back, as
        // those of attempts the grace cuts off.
        for row in handoff.close() {
            if let Err(e) = self.store.release_lease(&row.id).await {
                tracing::warn!(delivery = %row.id, error = %e, "cannot release a lease");
            }
        }
        // In real time: the grace is the operator's wait for a stop, and a
        // test's held clock must not hold up its hub's shutdown.
        let drained = tokio::time::timeout(grace, async {
            while let Some(done) = inflight.join_next_with_id().await {
                rows.remove(&task_id(&done));
            }
        })
        .await;
        if drained.is_err() {
            inflight.abort_all();
            for id in rows.values() {
                if let Err(e) = self.store.release_lease(id).await {
                    tracing::warn!(delivery = %id, error = %e, "cannot release a lease");
                }
            }
            tracing::warn!(
                cut_off = rows.len(),
                "shutdown grace ran out with deliveries in flight"
            );
        }
    }

    /// Claims due rows and starts their attempts; when to look again (at
    /// once after a full batch: it may have left more behind).
    async fn claim(
        self: &Arc<Self>,
        lease_ms: i64,
        inflight: &mut JoinSet<()>,
        rows: &mut HashMap<tokio::task::Id, String>,
    ) -> i64 {
        let claimed_at = self.clock.now_ms();
        let mut full = false;
        let mut next_due = None;
        match self
            .store
            .claim_and_next_due(claimed_at, lease_ms, BATCH)
            .await
        {
            Ok((claimed, next)) => {
                full = claimed.len() >= BATCH as usize;
                next_due = next;
                for row in claimed {
                    self.spawn_attempt(row, inflight, rows);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot claim deliveries");
                self.clock.sleep(Duration::from_millis(500)).await;
            }
        }
        // Worked out from `claimed_at`, so a clock that moved on meanwhile
        // wakes the deliverer at once.
        if full {
            return claimed_at;
        }
        let idle = claimed_at.saturating_add(millis(IDLE_POLL));
        // Always after `claimed_at`: this cannot spin. After a failed
        // claim, the idle poll.
        next_due.map_or(idle, |at| at.min(idle))
    }

    fn spawn_attempt(
        self: &Arc<Self>,
        row: Claimed,
        inflight: &mut JoinSet<()>,
        rows: &mut HashMap<tokio::task::Id, String>,
    ) {
        let id = row.id.clone();
        let this = self.clone();
        let handle = inflight.spawn(async move { this.attempt(row).await });
        rows.insert(handle.id(), id);
    }

    async fn attempt(&self, row: Claimed) {
        let span = tracing::info_span!(
            "delivery",
            id = %row.id,
            event = %row.event_id,
            kind = %row.kind,
            channel = row.channel_id,
            chat = row.chat_id
        );
        async {
            let look = match self.attempt_inner(&row).await {
                Ok(look) => look,
                Err(e) => {
                    tracing::error!(error = %e, "delivery bookkeeping failed; the row will be retried");
                    true
                }
            };
            // A claim only when this result may have let another row go:
            // the rows queued meanwhile were handed over or kicked for.
            if look {
                self.kick.kick();
            }
        }
        .instrument(span)
        .await
    }

    /// Whether the deliverer should look for due rows afterwards.
    async fn attempt_inner(&self, row: &Claimed) -> Result<bool, StoreError> {
        let staged;
        let row = if row.staged {
            match self.finisher.stage(row).await? {
                Staged::Done(result) => {
                    tracing::info!(?result, "settled by plugins");
                    return self.settle(row, &result, result_of(&result)).await;
                }
                Staged::Send { body } => {
                    staged = Claimed {
                        body,
                        staged: false,
                        ..row.clone()
                    };
                    &staged
                }
            }
        } else {
            row
        };
        if row.target_url.is_empty() {
            let result = Final::NotSent("no receiver is configured".to_owned());
            return self.settle(row, &result, DeliveryResult::NotSent).await;
        }
        if row.plugin_bot().is_some() {
            let result = self.finisher.answer_locally(row).await?;
            let tried = Claimed {
                attempts: row.attempts + 1,
                ..row.clone()
            };
            obs::attempt(tried.attempts);
            return self.settle(&tried, &result, result_of(&result)).await;
        }
        let wiring = self.wiring.current();
        let (policy, headers) = if let Some(name) = row.destination() {
            match wiring.destinations.get(name) {
                Some(d) => (d.policy, d.headers.as_slice()),
                None => {
                    let reason = format!("`{name}` is no longer a configured destination");
                    tracing::warn!(%reason, "delivery failed for good");
                    return self
                        .settle(row, &Final::Failed(reason), DeliveryResult::Failed)
                        .await;
                }
            }
        } else {
            (self.policies.get(&row.policy), &[][..])
        };
        let max = i64::from(policy.attempts);
        if row.attempts >= max {
            // Out of attempts and the give-up time has come.
            let reason = row
                .last_error
                .clone()
                .unwrap_or_else(|| "not delivered".to_owned());
            tracing::warn!(attempts = row.attempts, %reason, "delivery failed for good");
            return self
                .settle(row, &Final::Failed(reason), DeliveryResult::Failed)
                .await;
        }
        let started = self.clock.now_ms();
        let attempt_no = row.attempts + 1;
        let outcome = self
            .send_attempt(row, &policy, headers, attempt_no, started)
            .await;
        obs::attempt(attempt_no);
        self.record_attempt(row, &policy, attempt_no, started, outcome)
            .await
    }

    /// Makes attempt `attempt_no` of `row`: its headers (the destination's,
    /// the signature, a bot provider's token) and the request.
    async fn send_attempt(
        &self,
        row: &Claimed,
        policy: &RetryPolicy,
        headers: &[(HeaderName, HeaderValue)],
        attempt_no: i64,
        started: i64,
    ) -> Attempt {
        let mut headers = headers.to_vec();
        if let Some(secret) = &row.secret {
            headers.extend(signature_headers(secret, row, started / 1000));
        }
        let extra = match row.row_kind() {
            RowKind::Bot => self.finisher.request_headers(row).await,
            _ => Ok(Vec::new()),
        };
        match extra {
            Ok(extra) => {
                headers.extend(extra);
                let request = Request {
                    url: &row.target_url,
                    body: row.body.clone().into(),
                    chunked: row.chunked,
                    headers: &headers,
                    delivery: Some(DeliveryId {
                        id: &row.id,
                        attempt: attempt_no,
                    }),
                    timeout: policy.timeout,
                };
                self.sender.send(request, answer_rule(row)).await
            }
            Err(failure) => failure.into_attempt(),
        }
    }

    /// What an attempt came to: a final result is settled, a transient
    /// failure rescheduled (or, out of attempts, failed).
    async fn record_attempt(
        &self,
        row: &Claimed,
        policy: &RetryPolicy,
        attempt_no: i64,
        started: i64,
        outcome: Attempt,
    ) -> Result<bool, StoreError> {
        let max = i64::from(policy.attempts);
        // A final result counts the attempt that ended it.
        let tried = Claimed {
            attempts: attempt_no,
            ..row.clone()
        };
        match outcome {
            Attempt::Delivered(answer) => {
                // One line per message at `info` would be most of the log on
                // a busy hub; the admin API lists deliveries and /metrics
                // counts them. Retries and failures stay at info and warn.
                tracing::debug!(attempt = attempt_no, "delivered");
                let answer = Some(String::from_utf8_lossy(&answer).into_owned());
                let result = Final::Delivered { answer };
                self.settle(&tried, &result, DeliveryResult::Delivered)
                    .await
            }
            Attempt::Rejected(reason) => {
                tracing::warn!(attempt = attempt_no, %reason, "rejected by the receiver");
                self.settle(&tried, &Final::Failed(reason), DeliveryResult::Rejected)
                    .await
            }
            Attempt::Transient(reason)
                if attempt_no >= max
                    && row.message_id.is_none()
                    && row.row_kind() != RowKind::Bot =>
            {
                // No message waits for this result (typing): waiting for the
                // give-up time would only hold up the rest of the chat's queue.
                tracing::warn!(attempt = attempt_no, %reason, "delivery failed for good");
                self.settle(&tried, &Final::Failed(reason), DeliveryResult::Failed)
                    .await
            }
            Attempt::Transient(reason) => {
                // Counted from the first attempt as recorded, so a restart
                // neither extends nor shortens the schedule.
                let first = row.first_attempt_at.unwrap_or(started);
                let give_up_at = row
                    .give_up_at
                    .unwrap_or_else(|| first.saturating_add(millis(policy.give_up_after())));
                let next_at = if attempt_no < max {
                    started.saturating_add(millis(policy.wait_after(attempt_no)))
                } else {
                    give_up_at.max(self.clock.now_ms())
                };
                let retry = Retry {
                    next_at,
                    give_up_at,
                    hold_until: first.saturating_add(millis(policy.hold_after())),
                };
                tracing::info!(attempt = attempt_no, %reason, next_at, "attempt failed; will retry");
                self.store
                    .reschedule_delivery(&row.id, attempt_no, retry, &reason)
                    .await?;
                // After its last attempt a row only waits for its give-up
                // time: the failure is counted then, not a retry now.
                if attempt_no < max {
                    obs::delivery(metric_kind(row), DeliveryResult::Retry);
                }
                // The deliverer's next look must know the new due time.
                Ok(true)
            }
        }
    }

    /// Records a final result; counted once the bookkeeping succeeded, since
    /// a row whose bookkeeping failed is claimed and settled again.
    async fn settle(
        &self,
        row: &Claimed,
        result: &Final,
        counted: DeliveryResult,
    ) -> Result<bool, StoreError> {
        let look = self.finisher.finish(row, result).await?;
        obs::delivery(metric_kind(row), counted);
        Ok(look)
    }
}

/// A final result as `/metrics` counts it (where no receiver's refusal is involved).
fn result_of(result: &Final) -> DeliveryResult {
    match result {
        Final::Delivered { .. } => DeliveryResult::Delivered,
        Final::Failed(_) => DeliveryResult::Failed,
        Final::NotSent(_) => DeliveryResult::NotSent,
    }
}

fn metric_kind(row: &Claimed) -> obs::DeliveryKind {
    match row.row_kind() {
        RowKind::ChannelMessage => obs::DeliveryKind::Channel,
        RowKind::EventWebhook => obs::DeliveryKind::Webhook,
        RowKind::CrmWebhook => obs::DeliveryKind::Crm,
        RowKind::Forward => obs::DeliveryKind::Forward,
        RowKind::Bot => obs::DeliveryKind::Bot,
    }
}

/// How the receiver's answer to `row` is read: event and CRM webhooks take
/// any 2xx; everything else (channel messages, forwards) the channel spec's rule.
fn answer_rule(row: &Claimed) -> AnswerRule {
    match row.row_kind() {
        RowKind::EventWebhook | RowKind::CrmWebhook => AnswerRule::Webhook,
        RowKind::Bot => AnswerRule::Bot,
        // A destination is an integrator-like receiver: an error body refuses.
        RowKind::ChannelMessage | RowKind::Forward => AnswerRule::Channel,
    }
}

/// Standard Webhooks headers for one attempt; the id is the delivery id, so
/// receivers can recognise retries.
fn signature_headers(
    secret: &str,
    row: &Claimed,
    timestamp: i64,
) -> Vec<(::http::HeaderName, ::http::HeaderValue)> {
    let Ok(secret) = Secret::parse(secret) else {
        tracing::warn!("the receiver's signing secret is malformed; sending unsigned");
        return Vec::new();
    };
    let signature = secret.sign(&row.id, timestamp, row.body.as_bytes());
    let header = |name: &'static str, value: String| {
        ::http::HeaderValue::from_str(&value)
            .ok()
            .map(|v| (::http::HeaderName::from_static(name), v))
    };
    [
        header(signing::ID_HEADER, row.id.clone()),
        header(signing::TIMESTAMP_HEADER, timestamp.to_string()),
        header(signing::SIGNATURE_HEADER, signature),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Most turns [`settle_finishing`] gives the runtime.
const SETTLE_TURNS: usize = 8;

/// Lets attempts that are finishing too (their results committed in the
/// same batch, their tasks woken but not yet run) end before the next
/// claim, while each turn of the runtime ends more of them.
///
/// Why: every claim is a write transaction, and one per attempt that ends
/// claims the next rows a few at a time. Measured with the channel bench
/// on PostgreSQL (`BENCH_AB`): 1.05× deliveries; SQLite unchanged. A turn
/// that ends nothing stops it: a lightly loaded hub pays one yield.
async fn settle_finishing(inflight: &mut JoinSet<()>, rows: &mut HashMap<tokio::task::Id, String>) {
    if inflight.is_empty() {
        return;
    }
    for _ in 0..SETTLE_TURNS {
        tokio::task::yield_now().await;
        let mut ended = false;
        while let Some(done) = inflight.try_join_next_with_id() {
            rows.remove(&task_id(&done));
            ended = true;
        }
        if !ended {
            break;
        }
    }
}

fn task_id(done: &Result<(tokio::task::Id, ()), tokio::task::JoinError>) -> tokio::task::Id {
    match done {
        Ok((id, ())) => *id,
        Err(e) => e.id(),
    }
}
