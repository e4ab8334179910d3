//! Instances on one PostgreSQL database: each beats in `instances` every
//! `[delivery] heartbeat_ms`, and takes over the leases of any other whose
//! heartbeat stopped `takeover_ms` ago, so a crashed instance's deliveries
//! wait seconds, not `lease_ms`. (A restarted instance takes back its own
//! leases at start: `Store::register_instance`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Kick;
use crate::clock::Clock;
use crate::store::Store;
use crate::store::instances::Beat;

/// How often to beat and how long a silent instance is given.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat {
    pub every: Duration,
    pub takeover: Duration,
}

/// Beats until `shutdown` (`Running::shutdown` then forgets this instance,
/// once the deliverer has given its leases back).
/// `others` is set at each beat to whether another instance beat within
/// the takeover window (the live relay sends only then).
pub async fn run(
    store: Store,
    kick: Kick,
    beat: Heartbeat,
    others: Arc<AtomicBool>,
    clock: Clock,
    mut shutdown: watch::Receiver<bool>,
) {
    // Only an instance whose own heartbeats have gone through for a whole
    // takeover window judges others: after a database outage every
    // heartbeat is old, and the first instance back must not take the
    // others' leases before they had a chance to beat again.
    let mut beating_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = clock.sleep(beat.every) => {}
            _ = shutdown.changed() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        match store.heartbeat(clock.now_ms()).await {
            Ok(Beat::Alive) => {
                beating_since.get_or_insert_with(|| clock.now());
            }
            Ok(Beat::Reclaimed) => {
                tracing::warn!(
                    instance = %store.identity().id,
                    "this instance was taken for dead (or another process uses its \
                     `[server] instance_id`); deliveries it held may be sent twice"
                );
                beating_since = Some(clock.now());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record this instance's heartbeat");
                beating_since = None;
                continue;
            }
        }
        let window = i64::try_from(beat.takeover.as_millis()).unwrap_or(i64::MAX);
        match store
            .others_alive(clock.now_ms().saturating_sub(window))
            .await
        {
            Ok(alive) => others.store(alive > 0, Ordering::Relaxed),
            Err(e) => tracing::warn!(error = %e, "cannot read the other instances"),
        }
        if beating_since
            .is_some_and(|since| clock.now().saturating_duration_since(since) >= beat.takeover)
        {
            take_over(&store, &kick, beat.takeover, clock.now_ms()).await;
        }
    }
}

async fn take_over(store: &Store, kick: &Kick, takeover: Duration, now_ms: i64) {
    let window = i64::try_from(takeover.as_millis()).unwrap_or(i64::MAX);
    match store.take_over_dead(now_ms.saturating_sub(window)).await {
        Ok(taken) => {
            for t in &taken {
                tracing::info!(
                    instance = %t.instance,
                    deliveries = t.deliveries,
                    "took over the deliveries of an instance whose heartbeat stopped"
                );
            }
            if taken.iter().any(|t| t.deliveries > 0) {
                kick.kick();
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot take over dead instances' deliveries"),
    }
}
