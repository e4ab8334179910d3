//! A plugin's time share: how much call time the events of one channel may
//! take of a plugin per second, so that a flood of short, heavy calls on one
//! channel cannot take the cores every other channel needs.
//!
//! Why per channel: the same plugin often runs on every channel (`redact`);
//! a flood on one of them must slow that channel's calls, not the others'.
//! A call is charged what it holds of the hub from when it has an instance
//! slot until it is done: the time it ran (its polls, timed by
//! `threads::Metered`: CPU time on the plugin threads), the time it waited
//! for what it asked for (a host call's query, timer or request, holding
//! its slot and memory), and the work on the request thread before and
//! after. Not the time it waited for a core, for a thread or for the trip
//! to and from the plugin threads, nor the hub's own pauses (a long call's
//! turn, the tick between its slices): those grow with the whole hub's
//! load, and charging them capped a channel at half the hub's capacity
//! (the paced run of the channel benchmark refused messages as `busy`).
//! Whether a channel's calls are heavy is judged by the time they ran alone,
//! each call counting at most [`MAX_SAMPLE_SECS`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much call time a channel may spend at once before it waits: a
/// quarter of a second's share, so a burst of ordinary calls never waits.
const BURST_SECS: f64 = 0.25;

/// A channel whose calls of this plugin run this long on average has its
/// calls started on the plugin threads: they are heavy, and a request
/// thread is better spent on requests. Ordinary calls take tens of µs.
const HEAVY_CALL_SECS: f64 = 200e-6;

/// Weight of the latest call in the running average of call times.
const AVERAGE_WEIGHT: f64 = 0.125;

/// The most one call counts in the average: twice the heavy mark. On a
/// request thread a poll is timed on the wall clock, and one the kernel
/// preempted (milliseconds, on a loaded machine) must not on its own send
/// a light channel's calls to the plugin threads, where they wait behind
/// everyone at a lower priority; it takes five heavy calls in a row, and a
/// channel whose calls are all heavy is found within six.
const MAX_SAMPLE_SECS: f64 = 2.0 * HEAVY_CALL_SECS;

/// Past this many channels the idle buckets are swept before a new one is
/// added (channels are few; this only bounds a mistake).
const SWEEP_AT: usize = 4096;

pub struct TimeShare {
    /// Seconds of call time per second of wall clock.
    per_sec: f64,
    burst: f64,
    buckets: Mutex<HashMap<Option<i64>, Bucket>>,
}

struct Bucket {
    /// Seconds of call time that may still be spent; below zero after a long
    /// call, and then the channel's next call waits until it is back at zero.
    credit: f64,
    at: Instant,
    /// Running average of how long this channel's calls ran, in seconds.
    average: f64,
}

/// What a channel's next call must do before it starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    /// Zero while the channel is within its share.
    pub wait: Duration,
    /// The channel's calls are heavy: start this one on the plugin threads.
    pub heavy: bool,
}

impl TimeShare {
    /// `per_sec`: seconds of call time per second (1.0 is one core's worth).
    pub fn new(per_sec: f64) -> TimeShare {
        TimeShare {
            per_sec,
            burst: per_sec * BURST_SECS,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// How long a call for `channel` must wait before it may start, and
    /// where it should run.
    pub fn admit(&self, channel: Option<i64>) -> Admission {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = buckets.get_mut(&channel) else {
            return Admission {
                wait: Duration::ZERO,
                heavy: false,
            };
        };
        self.refill(bucket, now);
        let wait = if bucket.credit >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.credit / self.per_sec)
        };
        Admission {
            wait,
            heavy: bucket.average >= HEAVY_CALL_SECS,
        }
    }

    /// Charges a call that took `took` (and ran for `ran` of it) to
    /// `channel`, and counts `ran` in the channel's average.
    pub fn call_ended(&self, channel: Option<i64>, took: Duration, ran: Duration) {
        self.charge(channel, took, Some(ran));
    }

    /// Charges `took` of work a call caused after it ended (giving its
    /// memory back) to `channel`.
    pub fn spend(&self, channel: Option<i64>, took: Duration) {
        self.charge(channel, took, None);
    }

    fn charge(&self, channel: Option<i64>, took: Duration, ran: Option<Duration>) {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= SWEEP_AT && !buckets.contains_key(&channel) {
            let full = self.burst;
            let per_sec = self.per_sec;
            buckets
                .retain(|_, b| b.credit + now.duration_since(b.at).as_secs_f64() * per_sec < full);
        }
        let took = took.as_secs_f64();
        let bucket = buckets.entry(channel).or_insert(Bucket {
            credit: self.burst,
            at: now,
            average: 0.0,
        });
        self.refill(bucket, now);
        bucket.credit -= took;
        if let Some(ran) = ran {
            let sample = ran.as_secs_f64().min(MAX_SAMPLE_SECS);
            bucket.average += (sample - bucket.average) * AVERAGE_WEIGHT;
        }
    }

    fn refill(&self, bucket: &mut Bucket, now: Instant) {
        let earned = now.duration_since(bucket.at).as_secs_f64() * self.per_sec;
        bucket.credit = (bucket.credit + earned).min(self.burst);
        bucket.at = now;
    }

    pub fn per_sec(&self) -> f64 {
        self.per_sec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_over_its_share_waits_and_the_others_do_not() {
        let share = TimeShare::new(0.5);
        let flooded = Some(1);
        // Within the burst (0.125 s at half a core): no wait.
        share.spend(flooded, Duration::from_millis(100));
        assert_eq!(share.admit(flooded).wait, Duration::ZERO);
        // A long call puts the channel in debt: 0.125 - 0.1 - 0.225 = -0.2 s,
        // earned back at 0.5 s per second: about 0.4 s.
        share.spend(flooded, Duration::from_millis(225));
        let wait = share.admit(flooded).wait;
        assert!(
            wait > Duration::from_millis(350) && wait <= Duration::from_millis(400),
            "{wait:?}"
        );
        assert_eq!(share.admit(Some(2)).wait, Duration::ZERO, "another channel");
        assert_eq!(
            share.admit(None).wait,
            Duration::ZERO,
            "events of no channel"
        );
    }

    #[test]
    fn ordinary_calls_never_wait() {
        let share = TimeShare::new(1.0);
        for _ in 0..10_000 {
            // 10 000 calls of 20 µs in a burst: 0.2 s, within 0.25 s.
            share.call_ended(
                Some(1),
                Duration::from_micros(20),
                Duration::from_micros(20),
            );
            assert_eq!(
                share.admit(Some(1)),
                Admission {
                    wait: Duration::ZERO,
                    heavy: false
                }
            );
        }
    }

    #[test]
    fn a_channel_of_heavy_calls_is_told_so_and_becomes_light_again() {
        let share = TimeShare::new(1.0);
        let (heavy, light) = (Some(1), Some(2));
        for _ in 0..6 {
            share.call_ended(heavy, Duration::from_millis(2), Duration::from_millis(2));
            share.call_ended(light, Duration::from_micros(20), Duration::from_micros(20));
        }
        assert!(share.admit(heavy).heavy);
        assert!(!share.admit(light).heavy);
        // One slow call among light ones does not make a channel heavy.
        share.call_ended(light, Duration::from_millis(1), Duration::from_millis(1));
        assert!(!share.admit(light).heavy);
        // Light calls bring the heavy channel's average down.
        for _ in 0..40 {
            share.call_ended(heavy, Duration::from_micros(20), Duration::from_micros(20));
        }
        assert!(!share.admit(heavy).heavy);
        // Light calls that waited long (for a thread, for the database) are
        // charged their wait but stay light.
        for _ in 0..40 {
            share.call_ended(light, Duration::from_millis(5), Duration::from_micros(20));
        }
        assert!(!share.admit(light).heavy);
        // Work after a call is charged but is not a call.
        share.spend(light, Duration::from_millis(50));
        assert!(!share.admit(light).heavy);
    }

    #[test]
    fn a_light_channel_whose_polls_were_preempted_stays_light() {
        // A request thread's poll is timed on the wall clock: on a loaded
        // machine the kernel now and then preempts one for a few ms.
        let share = TimeShare::new(1.0);
        let light = Some(1);
        for round in 0..100 {
            for _ in 0..50 {
                share.call_ended(light, Duration::from_micros(30), Duration::from_micros(30));
            }
            // Up to four preempted calls in a row.
            for _ in 0..=(round % 4) {
                share.call_ended(light, Duration::from_millis(6), Duration::from_millis(6));
                assert!(!share.admit(light).heavy, "round {round}");
            }
        }
    }
}
