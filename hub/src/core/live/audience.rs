//! Which other instances have a live stream open. Updates that only show
//! something (a message, a delivery) are relayed to the others only while one
//! of them has a stream: every relayed update is a `NOTIFY` the server
//! commits one at a time across the whole database and that every instance
//! parses, so instances relaying to listeners nobody watches through paid a
//! quarter of their throughput for nothing (measured with two instances:
//! 1.25× ingress, 1.18× deliveries without it).
//!
//! The protocol, over the same notices as the updates:
//! - each instance says whether it watches (`Audience`) when that changes,
//!   in answer to a newcomer's hello, and every [`RENEW`]; a peer not heard
//!   for [`EXPIRE`] is forgotten (it stopped or lost its database);
//! - an instance that hears that a peer began to watch sets its own
//!   "watched" flag first and then answers `Relaying`;
//! - the first stream of an instance opens only once every peer it knows
//!   has answered (or after [`ACK_WAIT`]). So the stream's promise holds
//!   across instances: an update a peer published before it answered was
//!   committed before the stream opened, and one published after it
//!   answered is relayed;
//! - an instance that starts relays every update until it has heard from as
//!   many peers as the instances' table showed beating (at most for
//!   [`STARTUP`]): before that it does not know who watches.
//!
//! An instance whose last stream closed says so after [`IDLE`], so a
//! console that reconnects does not make everyone answer again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};

use super::Notice;

/// How often an instance repeats whether it watches.
pub(super) const RENEW: Duration = Duration::from_secs(5);
/// A peer silent this long is gone.
const EXPIRE: Duration = Duration::from_secs(15);
/// The longest a new instance relays everything.
const STARTUP: Duration = Duration::from_secs(3);
/// How long an instance without streams still counts as watching.
const IDLE: Duration = Duration::from_secs(10);
/// The longest a first stream waits for its peers' answers.
const ACK_WAIT: Duration = Duration::from_secs(1);
/// … when no peer is known yet but the heartbeat says one runs (a stream
/// opened moments after its instance started, before the hello's answers).
const ANY_WAIT: Duration = Duration::from_millis(250);

pub(super) struct Audience {
    origin: Arc<str>,
    relay: mpsc::Sender<Notice>,
    /// Whether some other instance watches (or this one is starting).
    watched: AtomicBool,
    state: Mutex<State>,
    answered: Notify,
}

struct State {
    peers: HashMap<String, Peer>,
    /// Whether this instance told the others it watches.
    announced: bool,
    /// Counts this instance's announcements, so that an answer to an old
    /// one is not taken for the current one.
    round: u64,
    /// Peers whose answer to `round` has not come.
    awaited: HashSet<String>,
    /// Whether some answer is awaited though no peer was known.
    any_awaited: bool,
    started: Instant,
    /// The peers the instances' table showed at the start (None: unknown).
    expected: Option<usize>,
    idle_since: Option<Instant>,
    renewed: Instant,
}

struct Peer {
    watching: bool,
    heard: Instant,
    /// The round of the peer's announcement this instance answered.
    answered: Option<u64>,
}

impl Peer {
    fn new(now: Instant) -> Peer {
        Peer {
            watching: false,
            heard: now,
            answered: None,
        }
    }
}

impl Audience {
    pub(super) fn new(
        origin: Arc<str>,
        relay: mpsc::Sender<Notice>,
        expected: Option<usize>,
        now: Instant,
    ) -> Audience {
        Audience {
            origin,
            relay,
            watched: AtomicBool::new(expected != Some(0)),
            state: Mutex::new(State {
                peers: HashMap::new(),
                announced: false,
                round: 0,
                awaited: HashSet::new(),
                any_awaited: false,
                started: now,
                expected,
                idle_since: None,
                renewed: now,
            }),
            answered: Notify::new(),
        }
    }

    /// Whether updates that only show something go to the other instances.
    pub(super) fn watched(&self) -> bool {
        self.watched.load(Ordering::Relaxed)
    }

    /// Called as a stream opens, before it reads where it begins: tells
    /// the others this instance watches, if it had not, and returns once
    /// they relay to it. `others_alive`: whether the heartbeat last saw
    /// another instance.
    pub(super) async fn watching(&self, others_alive: bool) {
        let started = tokio::time::Instant::now();
        let wait = {
            let mut st = self.lock();
            st.idle_since = None;
            if !st.announced {
                st.announced = true;
                st.round += 1;
                st.awaited = st.peers.keys().cloned().collect();
                // Some peer's hello answer may still be on its way.
                st.any_awaited =
                    st.awaited.is_empty() && others_alive && st.starting(Instant::now());
                self.send(Notice::Audience {
                    origin: self.origin.to_string(),
                    watching: true,
                    round: st.round,
                });
            }
            if st.awaited.is_empty() {
                ANY_WAIT
            } else {
                ACK_WAIT
            }
        };
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if self.lock().all_answered() {
                return;
            }
            if tokio::time::timeout_at(started + wait, answered)
                .await
                .is_err()
            {
                let mut st = self.lock();
                if !st.all_answered() {
                    tracing::warn!(
                        peers = ?st.awaited,
                        "other instances did not answer in time that they relay updates here; \
                         a stream opened now may miss what they publish in the next moments"
                    );
                    st.awaited.clear();
                    st.any_awaited = false;
                }
                return;
            }
        }
    }

    /// What another instance said (its own notices come back to each
    /// instance; they change nothing).
    pub(super) fn heard(&self, notice: &Notice, now: Instant) {
        match notice {
            Notice::Hello { origin } if **origin != *self.origin => {
                let mut st = self.lock();
                st.peers
                    .entry(origin.clone())
                    .or_insert_with(|| Peer::new(now))
                    .heard = now;
                let (watching, round) = (st.announced, st.round);
                drop(st);
                self.send(Notice::Audience {
                    origin: self.origin.to_string(),
                    watching,
                    round,
                });
            }
            Notice::Audience {
                origin,
                watching,
                round,
            } if **origin != *self.origin => {
                let mut st = self.lock();
                let peer = st
                    .peers
                    .entry(origin.clone())
                    .or_insert_with(|| Peer::new(now));
                peer.heard = now;
                peer.watching = *watching;
                let answer = *watching && peer.answered != Some(*round);
                if answer {
                    peer.answered = Some(*round);
                }
                // The flag before the answer: whatever this instance
                // publishes once the peer has the answer is relayed.
                self.judge(&st, now);
                drop(st);
                if answer {
                    self.send(Notice::Relaying {
                        origin: self.origin.to_string(),
                        to: origin.clone(),
                        round: *round,
                    });
                }
            }
            Notice::Relaying { origin, to, round } if **to == *self.origin => {
                let mut st = self.lock();
                st.peers
                    .entry(origin.clone())
                    .or_insert_with(|| Peer::new(now))
                    .heard = now;
                if *round == st.round {
                    st.awaited.remove(origin);
                    st.any_awaited = false;
                    if st.all_answered() {
                        self.answered.notify_waiters();
                    }
                }
            }
            _ => {}
        }
    }

    /// Once a second: forgets silent peers, says "not watching" after
    /// [`IDLE`] without streams, repeats this instance's state every
    /// [`RENEW`]. `streams`: the streams open here now.
    pub(super) fn tend(&self, streams: usize, now: Instant) {
        let mut st = self.lock();
        st.peers
            .retain(|_, p| now.saturating_duration_since(p.heard) < EXPIRE);
        let State { peers, awaited, .. } = &mut *st;
        awaited.retain(|origin| peers.contains_key(origin));
        if st.all_answered() {
            self.answered.notify_waiters();
        }
        let mut say = now.saturating_duration_since(st.renewed) >= RENEW;
        if streams == 0 {
            let since = *st.idle_since.get_or_insert(now);
            if st.announced && now.saturating_duration_since(since) >= IDLE {
                st.announced = false;
                say = true;
            }
        } else {
            st.idle_since = None;
        }
        if say {
            st.renewed = now;
            self.send(Notice::Audience {
                origin: self.origin.to_string(),
                watching: st.announced,
                round: st.round,
            });
        }
        self.judge(&st, now);
    }

    fn judge(&self, st: &State, now: Instant) {
        let watched = st.starting(now) || st.peers.values().any(|p| p.watching);
        self.watched.store(watched, Ordering::Relaxed);
    }

    fn send(&self, notice: Notice) {
        if self.relay.try_send(notice).is_err() {
            tracing::warn!("live relay is behind; other instances miss whether this one watches");
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under the lock can leave the state half changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Whether this instance has not heard yet from every peer the
    /// instances' table showed at its start.
    fn starting(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.started) < STARTUP
            && self.expected.is_none_or(|n| self.peers.len() < n)
    }

    fn all_answered(&self) -> bool {
        self.awaited.is_empty() && !self.any_awaited
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audience(origin: &str, now: Instant) -> (Arc<Audience>, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(64);
        (Arc::new(Audience::new(origin.into(), tx, None, now)), rx)
    }

    fn sent(rx: &mut mpsc::Receiver<Notice>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|n| match n {
                Notice::Audience {
                    origin,
                    watching,
                    round,
                } => format!("{origin} watching={watching} round={round}"),
                Notice::Relaying { origin, to, round } => {
                    format!("{origin} relays to {to} round={round}")
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn audience_of(origin: &str, watching: bool, round: u64) -> Notice {
        Notice::Audience {
            origin: origin.into(),
            watching,
            round,
        }
    }

    #[tokio::test]
    async fn updates_go_to_others_only_while_one_of_them_watches() {
        let t0 = Instant::now();
        let (a, mut out) = audience("a", t0);
        assert!(a.watched(), "a new instance relays everything at first");
        let later = t0 + STARTUP;
        a.heard(&Notice::Hello { origin: "b".into() }, later);
        assert_eq!(sent(&mut out), ["a watching=false round=0"]);
        a.tend(0, later);
        assert!(!a.watched(), "b has no stream open");

        a.heard(&audience_of("b", true, 1), later);
        assert!(a.watched(), "b opened a stream");
        assert_eq!(sent(&mut out), ["a relays to b round=1"]);
        a.heard(&audience_of("b", true, 1), later + RENEW);
        assert!(sent(&mut out).is_empty(), "a repeat is not answered again");
        a.heard(&audience_of("b", false, 1), later + RENEW);
        assert!(!a.watched(), "b's streams closed");
        a.heard(&audience_of("b", true, 2), later + RENEW);
        assert_eq!(sent(&mut out), ["a relays to b round=2"]);

        a.tend(0, later + RENEW + EXPIRE);
        assert!(!a.watched(), "b went silent and is forgotten");
    }

    #[test]
    fn a_starting_instance_relays_everything_until_it_heard_the_peers_the_table_showed() {
        let t0 = Instant::now();
        let (tx, _rx) = mpsc::channel(64);
        let alone = Audience::new("a".into(), tx.clone(), Some(0), t0);
        assert!(!alone.watched(), "nobody else beat: nothing to relay");

        let beside = Audience::new("b".into(), tx.clone(), Some(2), t0);
        assert!(beside.watched());
        beside.heard(&audience_of("p", false, 0), t0);
        assert!(beside.watched(), "one of two peers said it does not watch");
        beside.heard(&audience_of("q", false, 0), t0);
        assert!(!beside.watched(), "both did");

        let unsure = Audience::new("c".into(), tx, None, t0);
        unsure.heard(&audience_of("p", false, 0), t0);
        assert!(
            unsure.watched(),
            "the table could not be read: the whole start"
        );
        unsure.tend(0, t0 + STARTUP);
        assert!(!unsure.watched());
    }

    #[tokio::test]
    async fn a_first_stream_opens_once_every_known_peer_relays_to_it() {
        let t0 = Instant::now();
        let (a, mut out) = audience("a", t0);
        a.heard(&Notice::Hello { origin: "b".into() }, t0);
        a.heard(&audience_of("c", false, 0), t0);
        sent(&mut out);

        let opening = tokio::spawn({
            let a = a.clone();
            async move { a.watching(true).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(sent(&mut out), ["a watching=true round=1"]);
        let answer = |from: &str, round| Notice::Relaying {
            origin: from.into(),
            to: "a".into(),
            round,
        };
        a.heard(&answer("b", 1), t0);
        a.heard(&answer("c", 0), t0);
        tokio::task::yield_now().await;
        assert!(
            !opening.is_finished(),
            "c's answer to an old round is not one"
        );
        a.heard(&answer("c", 1), t0);
        tokio::time::timeout(Duration::from_millis(500), opening)
            .await
            .expect("open once both answered")
            .expect("task");

        // Watching already: the next stream opens at once, nothing sent.
        tokio::time::timeout(Duration::from_millis(100), a.watching(true))
            .await
            .expect("at once");
        assert!(sent(&mut out).is_empty());

        // Without streams for a while, it says so; a later stream asks again.
        a.tend(0, t0);
        a.tend(0, t0 + IDLE);
        assert_eq!(sent(&mut out), ["a watching=false round=1"]);
        a.heard(&answer("b", 2), t0 + IDLE);
        let opening = tokio::spawn({
            let a = a.clone();
            async move { a.watching(true).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(sent(&mut out), ["a watching=true round=2"]);
        a.heard(&answer("b", 2), t0 + IDLE);
        a.tend(1, t0 + IDLE + EXPIRE);
        tokio::time::timeout(Duration::from_millis(500), opening)
            .await
            .expect("c went silent: not waited for")
            .expect("task");
    }

    /// Completes at its first poll, without waiting for anything.
    async fn at_once(f: impl Future<Output = ()>) -> bool {
        tokio::time::timeout(Duration::ZERO, f).await.is_ok()
    }

    #[tokio::test]
    async fn a_peer_that_does_not_answer_holds_a_stream_up_for_a_second_at_most() {
        let t0 = Instant::now();
        let (a, _out) = audience("a", t0);
        a.heard(&Notice::Hello { origin: "b".into() }, t0);
        let began = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), a.watching(true))
            .await
            .expect("given up on b");
        assert!(began.elapsed() >= ACK_WAIT, "waited for b's answer");
        assert!(at_once(a.watching(true)).await, "not waited for again");

        let (lone, _out) = audience("lone", t0);
        assert!(
            at_once(lone.watching(false)).await,
            "no peer known and none running: nothing to wait for"
        );
        let (tx, _rx) = mpsc::channel(64);
        let alone = Audience::new("alone".into(), tx, Some(0), t0);
        assert!(
            at_once(alone.watching(true)).await,
            "alone at the start, and nobody said hello since"
        );
        // No peer known yet, but the heartbeat saw one: a short wait.
        let (new, _out) = audience("new", t0);
        let began = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), new.watching(true))
            .await
            .expect("given up");
        assert!(began.elapsed() >= ANY_WAIT);
        assert!(at_once(new.watching(true)).await);
    }
}
