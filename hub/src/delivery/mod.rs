//! The deliverer: claims due outbox rows, makes the HTTP attempt, and applies
//! the row's retry policy. What a final result means to the rest of the hub is
//! the [`Finisher`]'s business.

mod http;
mod policy;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

pub use http::{Attempt, HttpSender, TlsSetupError};
pub use policy::{POLICY_CHANNEL, POLICY_TYPING, Policies, RetryPolicy};

use crate::clock::now_ms;
use crate::destinations::POLICY_PREFIX;
use crate::store::{Claimed, Store, StoreError};
use crate::wiring::WiringHandle;

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    Delivered,
    /// Not delivered and not tried again; the reason is what the agent reads.
    Failed(String),
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Records a final result: marks the outbox row and updates whatever it was for.
pub trait Finisher: Send + Sync + 'static {
    fn finish<'a>(
        &'a self,
        row: &'a Claimed,
        result: &'a Final,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
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
}

const BATCH: i64 = 64;
/// Longest sleep between looks at the outbox when nothing kicks the deliverer.
const IDLE_POLL: Duration = Duration::from_millis(1000);

impl Deliverer {
    pub fn new(
        store: Store,
        sender: HttpSender,
        policies: Policies,
        wiring: WiringHandle,
        finisher: Arc<dyn Finisher>,
        kick: Kick,
    ) -> Arc<Deliverer> {
        Arc::new(Deliverer {
            store,
            sender,
            policies,
            wiring,
            finisher,
            kick,
        })
    }

    /// Runs until `shutdown` turns true, then waits up to `grace` for attempts in
    /// flight; attempts cut off are released for the next start.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>, grace: Duration) {
        let mut inflight: JoinSet<()> = JoinSet::new();
        let mut rows: HashMap<tokio::task::Id, String> = HashMap::new();
        loop {
            if *shutdown.borrow() {
                break;
            }
            // Destinations may change on reload, so the lease covers today's longest timeout.
            let longest = self
                .wiring
                .current()
                .destinations
                .longest_timeout()
                .unwrap_or_default()
                .max(self.policies.longest_timeout());
            let lease_ms = millis(longest).saturating_add(5_000);
            match self.store.claim_due(now_ms(), lease_ms, BATCH).await {
                Ok(claimed) => {
                    for row in claimed {
                        let id = row.id.clone();
                        let this = self.clone();
                        let handle = inflight.spawn(async move { this.attempt(row).await });
                        rows.insert(handle.id(), id);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot claim deliveries");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            let wait = match self.store.next_due_at().await {
                Ok(Some(at)) => {
                    Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0).max(5))
                        .min(IDLE_POLL)
                }
                Ok(None) => IDLE_POLL,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the outbox");
                    IDLE_POLL
                }
            };
            tokio::select! {
                _ = self.kick.0.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => {}
                Some(done) = inflight.join_next_with_id(), if !inflight.is_empty() => {
                    rows.remove(&task_id(&done));
                }
            }
            while let Some(done) = inflight.try_join_next_with_id() {
                rows.remove(&task_id(&done));
            }
        }
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

    async fn attempt(&self, row: Claimed) {
        let span = tracing::info_span!(
            "delivery",
            id = %row.id,
            event = %row.event_id,
            kind = %row.kind,
            chat = row.chat_id
        );
        async {
            if let Err(e) = self.attempt_inner(&row).await {
                tracing::error!(error = %e, "delivery bookkeeping failed; the row will be retried");
            }
            self.kick.kick();
        }
        .instrument(span)
        .await
    }

    async fn attempt_inner(&self, row: &Claimed) -> Result<(), StoreError> {
        let wiring = self.wiring.current();
        let (policy, headers) = if row.policy.starts_with(POLICY_PREFIX) {
            match wiring.destinations.of_policy(&row.policy) {
                Some(d) => (d.policy, d.headers.as_slice()),
                None => {
                    let reason = format!(
                        "`{}` is no longer a configured destination",
                        &row.policy[POLICY_PREFIX.len()..]
                    );
                    tracing::warn!(%reason, "delivery failed for good");
                    return self.finisher.finish(row, &Final::Failed(reason)).await;
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
            return self.finisher.finish(row, &Final::Failed(reason)).await;
        }
        let started = now_ms();
        let attempt_no = row.attempts + 1;
        let outcome = self
            .sender
            .send(row, attempt_no, policy.timeout, headers)
            .await;
        match outcome {
            Attempt::Delivered => {
                tracing::info!(attempt = attempt_no, "delivered");
                self.finisher.finish(row, &Final::Delivered).await
            }
            Attempt::Rejected(reason) => {
                tracing::warn!(attempt = attempt_no, %reason, "rejected by the receiver");
                self.finisher.finish(row, &Final::Failed(reason)).await
            }
            Attempt::Transient(reason) if attempt_no >= max && row.message_id.is_none() => {
                // No message waits for this result (typing): waiting for the
                // give-up time would only hold up the rest of the chat's queue.
                tracing::warn!(attempt = attempt_no, %reason, "delivery failed for good");
                self.finisher.finish(row, &Final::Failed(reason)).await
            }
            Attempt::Transient(reason) => {
                let give_up_at = row
                    .give_up_at
                    .unwrap_or_else(|| started.saturating_add(millis(policy.give_up_after())));
                let next_at = if attempt_no < max {
                    started.saturating_add(millis(policy.wait_after(attempt_no)))
                } else {
                    give_up_at.max(now_ms())
                };
                tracing::info!(attempt = attempt_no, %reason, next_at, "attempt failed; will retry");
                self.store
                    .reschedule_delivery(&row.id, attempt_no, next_at, give_up_at, &reason)
                    .await
            }
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

fn task_id(done: &Result<(tokio::task::Id, ()), tokio::task::JoinError>) -> tokio::task::Id {
    match done {
        Ok((id, ())) => *id,
        Err(e) => e.id(),
    }
}
