//! Crash safety under load: `kill -9` at random moments with restarts on
//! the same database, and a SIGTERM drain. What was acknowledged must be
//! stored, what was accepted must reach the integrator.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::Mode;
use crate::load::{Delivered, Load, Stored, Target, await_delivery, compare_stored, some};
use crate::outcome::Outcome;
use crate::receivers::Recorder;
use crate::served::{Hub, Options, integrity};
use crate::wire;

const AGENT: &str = "ann@battery.test";

/// A small, reproducible source of random moments (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn between(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        Duration::from_millis(low_ms + r % (high_ms - low_ms).max(1))
    }
}

/// The spec's delivery policy (3 attempts, 3 s apart): a reply cut off by
/// a crash must go out again at once on restart, not after a retry wait.
fn spec_delivery() -> Options {
    Options {
        attempts: 3,
        retry_interval_ms: 3000,
        attempt_timeout_ms: 3000,
        ..Options::default()
    }
}

pub async fn kill9_series(mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let kills = mode.pick(3, 20);
    let dir = o.dir()?;
    let rec = Recorder::start().await?;
    let mut hub = Hub::start(&dir, &spec_delivery()).await?;
    o.watch_log(hub.log_path());
    let (token, _, load) = steady_load(&hub, &rec, "k9").await?;
    let mut rng = Rng::new(mode.seed);
    // (killed at, restarted at): a restarted hub may deliver before its
    // first `/healthz` answer, so delays count from the restart itself.
    let mut crashes: Vec<(Instant, Instant)> = Vec::new();
    let mut slowest_start = Duration::ZERO;
    for _ in 0..kills {
        tokio::time::sleep(rng.between(300, 1500)).await;
        let killed = Instant::now();
        hub.kill9();
        // Load keeps coming while the hub is down: refused connections.
        tokio::time::sleep(rng.between(0, 200)).await;
        let restarting = Instant::now();
        hub.restart().await?;
        slowest_start = slowest_start.max(restarting.elapsed());
        crashes.push((killed, restarting));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ledger = load.stop().await;
    o.fig("kills", kills);

    let delivered = await_delivery(&ledger, || rec.receipts(), Duration::from_secs(30)).await;
    let texts = hub.stored_texts(&token).await?;
    let stored = compare_stored(&ledger, &texts);
    let unanswered = ledger
        .customer
        .iter()
        .filter(|s| s.status.is_none())
        .count();
    let refused_5xx = ledger
        .customer
        .iter()
        .filter(|s| s.status.is_some_and(|c| c >= 500))
        .count();

    // The delay, after each restart, until the replies the crash left
    // undelivered reached the integrator.
    let receipts = rec.receipts();
    let mut arrivals: HashMap<&str, Vec<Instant>> = HashMap::new();
    for r in &receipts {
        arrivals
            .entry(r.message_id.as_str())
            .or_default()
            .push(r.at);
    }
    let mut pending_at_kills = 0;
    let mut max_redelivery = Duration::ZERO;
    for (killed, restarted) in &crashes {
        for reply in ledger
            .replies
            .iter()
            .filter(|s| s.acked() && s.ended < *killed)
        {
            let got = arrivals
                .get(reply.key.as_str())
                .cloned()
                .unwrap_or_default();
            if got.iter().any(|t| t < killed) {
                continue;
            }
            pending_at_kills += 1;
            if let Some(first) = got.iter().filter(|t| *t >= restarted).min() {
                max_redelivery = max_redelivery.max(first.duration_since(*restarted));
            }
        }
    }

    o.fig("acked", stored.acked);
    o.fig("stored", stored.stored);
    o.fig("unacked_stored", stored.unacked_stored);
    o.fig("unanswered", unanswered);
    o.fig("answered_5xx", refused_5xx);
    o.fig("replies_accepted", delivered.accepted);
    o.fig("delivered", delivered.delivered);
    o.fig("duplicates", delivered.duplicates);
    o.fig("pending_at_kills", pending_at_kills);
    o.fig("max_redelivery_ms", max_redelivery.as_millis());
    o.fig(
        "max_attempt",
        receipts.iter().map(|r| r.attempt).max().unwrap_or(0),
    );
    o.fig("slowest_restart_ms", slowest_start.as_millis());

    o.check(stored.acked > 0 && delivered.accepted > 0, || {
        "the load got nothing acknowledged".to_owned()
    });
    o.check(stored.doubled == 0, || {
        format!("{} customer messages are stored twice", stored.doubled)
    });
    nothing_lost(o, &stored, &delivered);

    // The database as the last crash leaves it.
    hub.kill9();
    let integrity = integrity(&hub.db);
    o.fig("integrity", &integrity);
    o.check(integrity == "ok", || {
        format!("PRAGMA integrity_check: {integrity}")
    });
    Ok(())
}

pub async fn sigterm_drain(mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let grace = 3000;
    let dir = o.dir()?;
    let rec = Recorder::start().await?;
    let mut hub = Hub::start(
        &dir,
        &Options {
            shutdown_grace_ms: grace,
            ..spec_delivery()
        },
    )
    .await?;
    o.watch_log(hub.log_path());
    let (token, endpoint_url, load) = steady_load(&hub, &rec, "td").await?;
    tokio::time::sleep(Duration::from_millis(mode.pick(1500, 6000))).await;
    // A slow integrator now, so deliveries are in flight when the signal comes.
    let slow = Duration::from_millis(300);
    rec.set_delay(slow);
    tokio::time::sleep(slow / 2).await;
    let term = Instant::now();
    hub.sigterm()?;
    // A new client after the signal: refused, or answered without a 2xx.
    let (addr, path) = (hub.addr, wire::path_of(&endpoint_url));
    let probe = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = br#"{"sender":{"id":"td-probe"},"message":{"type":"text","text":"td-probe"}}"#;
        match wire::exchange(
            addr,
            &wire::post_sized(&path, "", body),
            1,
            Duration::from_secs(5),
        )
        .await
        {
            Err(_) => "refused".to_owned(),
            Ok(x) => x.summary(),
        }
    });
    let exit = hub.wait_exit(Duration::from_millis(grace + 10_000)).await;
    let drain = term.elapsed();
    let probe = probe.await.unwrap_or_else(|_| "lost".to_owned());
    rec.set_delay(Duration::ZERO);
    let ledger = load.stop().await;
    // Deliveries the integrator was still answering when the signal came:
    // the drain should wait for them.
    let spanning: Vec<_> = rec
        .receipts()
        .into_iter()
        .filter(|r| r.at < term && r.answered > term)
        .collect();
    let outlived = spanning
        .iter()
        .filter(|r| r.answered > term + drain)
        .count();

    let all = || ledger.customer.iter().chain(ledger.replies.iter());
    let in_flight: Vec<_> = all()
        .filter(|s| s.started < term && s.ended > term)
        .collect();
    let in_flight_answered = in_flight.iter().filter(|s| s.status.is_some()).count();
    let late = term + Duration::from_millis(300);
    let acked_after_term = all().filter(|s| s.started > late && s.acked()).count();

    o.fig(
        "exit",
        exit.map_or("none".to_owned(), |s| {
            s.code().map_or(s.to_string(), |c| c.to_string())
        }),
    );
    o.fig("drain_ms", drain.as_millis());
    o.fig("grace_ms", grace);
    o.fig("in_flight", in_flight.len());
    o.fig("in_flight_answered", in_flight_answered);
    o.fig("deliveries_in_flight", spanning.len());
    o.fig("deliveries_cut_off", outlived);
    o.fig("new_client_after_term", &probe);
    o.fig("acked_after_term", acked_after_term);
    o.check(exit.is_some_and(|s| s.code() == Some(0)), || {
        format!("hub serve did not exit 0 after SIGTERM: {exit:?}")
    });
    o.check(drain <= Duration::from_millis(grace + 2000), || {
        format!(
            "the drain took {} ms, past the {grace} ms grace",
            drain.as_millis()
        )
    });
    o.check(outlived == 0, || {
        format!("the hub exited while {outlived} deliveries were still in flight")
    });
    o.check(
        !probe.starts_with('2') && acked_after_term == 0,
        || format!("intake went on after SIGTERM: a new client got {probe}, {acked_after_term} requests were acknowledged"),
    );
    if hub.running() {
        hub.kill9();
    }

    // Nothing acknowledged is lost: count after a restart.
    hub.restart().await?;
    let delivered = await_delivery(&ledger, || rec.receipts(), Duration::from_secs(30)).await;
    let stored = compare_stored(&ledger, &hub.stored_texts(&token).await?);
    o.fig("acked", stored.acked);
    o.fig("stored", stored.stored);
    o.fig("replies_accepted", delivered.accepted);
    o.fig("delivered", delivered.delivered);
    o.fig("duplicates", delivered.duplicates);
    nothing_lost(o, &stored, &delivered);
    Ok(())
}

/// Every acknowledged message stored, every accepted reply delivered, each
/// under one delivery id.
fn nothing_lost(o: &mut Outcome, stored: &Stored, delivered: &Delivered) {
    o.check(stored.missing.is_empty(), || {
        format!(
            "{} acknowledged customer messages are not stored: {}",
            stored.missing.len(),
            some(&stored.missing)
        )
    });
    o.check(delivered.missing.is_empty(), || {
        format!(
            "{} accepted replies never reached the integrator: {}",
            delivered.missing.len(),
            some(&delivered.missing)
        )
    });
    o.check(delivered.id_changed.is_empty(), || {
        format!(
            "replies delivered under two delivery ids: {}",
            some(&delivered.id_changed)
        )
    });
}

/// Ann, a channel whose replies go to `rec`, and a steady load on it: four
/// customers writing and two repliers answering, tagged `tag`. Returns Ann's
/// token, the channel's endpoint and the load.
async fn steady_load(
    hub: &Hub,
    rec: &Recorder,
    tag: &str,
) -> Result<(String, String, Load), String> {
    let token = hub.create_agent("Ann", AGENT).await?;
    let channel = hub
        .create_channel("load", &format!("{}/replies", rec.url), &[AGENT])
        .await?;
    let load = Load::start(
        Target {
            base: hub.base.clone(),
            endpoint_url: channel.endpoint_url.clone(),
            token: token.clone(),
            tag: tag.to_owned(),
        },
        4,
        2,
    );
    Ok((token, channel.endpoint_url, load))
}
