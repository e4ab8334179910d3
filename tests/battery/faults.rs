//! The receiver fault matrix: one agent reply per misbehaving integrator
//! (refused, 5xx, 429, redirects, 410, a reset, a hang, a 10 MB answer).
//! Each must end delivered (a transient fault, then success) or as a dead
//! letter the admin API shows, with the hub healthy and its memory bounded.

use std::time::Duration;

use crate::Mode;
use crate::outcome::Outcome;
use crate::receivers::{Fault, FaultServer, Script};
use crate::served::{Hub, Options, chat_of};

const AGENT: &str = "ann@battery.test";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    /// Delivered by this attempt.
    Delivered(usize),
    /// A dead letter after this many attempts.
    Dead(usize),
}

struct Case {
    name: &'static str,
    faults: Vec<Fault>,
    expect: Expect,
}

const ATTEMPTS: usize = 3;
const TIMEOUT_MS: u64 = 800;
const HUGE: usize = 10 * 1024 * 1024;

fn cases() -> Vec<Case> {
    let ok = Fault::Ok;
    let status = |code| Fault::Status(code, "", "fault");
    vec![
        Case {
            name: "refused",
            faults: vec![],
            expect: Expect::Dead(ATTEMPTS),
        },
        Case {
            name: "500",
            faults: vec![status(500), ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "502",
            faults: vec![status(502), ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "503",
            faults: vec![status(503), ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "504",
            faults: vec![status(504), ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "500-always",
            faults: vec![status(500)],
            expect: Expect::Dead(ATTEMPTS),
        },
        // A 4xx is final (docs/channel.md), Retry-After or not.
        Case {
            name: "429",
            faults: vec![Fault::Status(429, "Retry-After: 1\r\n", "slow down"), ok],
            expect: Expect::Dead(1),
        },
        // Redirects are answers, never followed (to the scenario `followed`).
        Case {
            name: "301",
            faults: vec![Fault::Status(301, "Location: /followed/x\r\n", ""), ok],
            expect: Expect::Dead(1),
        },
        Case {
            name: "302",
            faults: vec![Fault::Status(302, "Location: /followed/y\r\n", ""), ok],
            expect: Expect::Dead(1),
        },
        Case {
            name: "410",
            faults: vec![status(410), ok],
            expect: Expect::Dead(1),
        },
        Case {
            name: "reset",
            faults: vec![Fault::ResetMidResponse, ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "hang",
            faults: vec![Fault::Hang(Duration::from_millis(TIMEOUT_MS + 3000)), ok],
            expect: Expect::Delivered(2),
        },
        Case {
            name: "10mb",
            faults: vec![Fault::Huge(HUGE)],
            expect: Expect::Delivered(1),
        },
    ]
}

pub async fn receiver_faults(_mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let cases = cases();
    let script: Script = cases
        .iter()
        .map(|c| (c.name.to_owned(), c.faults.clone()))
        .collect();
    let server = FaultServer::start(script).await?;
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let dir = o.dir()?;
    let hub = Hub::start(
        &dir,
        &Options {
            attempts: ATTEMPTS as u32,
            retry_interval_ms: 500,
            attempt_timeout_ms: TIMEOUT_MS,
            ..Options::default()
        },
    )
    .await?;
    o.watch_log(hub.log_path());
    let token = hub.create_agent("Ann", AGENT).await?;
    let rss_before = hub.memory_kib("VmRSS");

    // Every case at once, each on its own channel (so its own chat and order).
    let runs = cases.iter().map(|case| {
        let (hub, token, server) = (&hub, &token, &server);
        async move {
            let endpoint = if case.name == "refused" {
                format!("http://127.0.0.1:{closed_port}/refused")
            } else {
                format!("{}/{}", server.url, case.name)
            };
            let channel = hub
                .create_channel(&format!("f-{}", case.name), &endpoint, &[AGENT])
                .await?;
            let customer = format!("f-{}", case.name);
            match hub.say(&channel, &customer, "hello").await? {
                200 => {}
                other => return Err(format!("{}: the customer message got {other}", case.name)),
            }
            let chat = chat_of(hub, token, &customer).await?;
            let (status, uid) = hub
                .reply(token, chat, &format!("reply {}", case.name))
                .await?;
            let uid = uid.ok_or_else(|| format!("{}: the reply got {status}", case.name))?;
            let message = hub
                .settled(token, chat, &uid, Duration::from_secs(20))
                .await?;
            Ok::<_, String>((uid, message))
        }
    });
    let results = futures_util::future::join_all(runs).await;
    let rss_peak = hub.memory_kib("VmHWM");
    let dead = hub.dead_letters().await?;

    let mut summary = Vec::new();
    for (case, result) in cases.iter().zip(results) {
        let (uid, message) = match result {
            Ok(r) => r,
            Err(e) => {
                o.fail(e);
                continue;
            }
        };
        let state = message["delivery"].as_str().unwrap_or("?").to_owned();
        let letter = dead
            .iter()
            .find(|d| d["body"]["message"]["id"] == uid.as_str());
        let attempts = match letter {
            Some(d) => d["attempts"].as_u64().unwrap_or(0) as usize,
            None => server.hits(case.name).len(),
        };
        let got = match state.as_str() {
            "delivered" => Expect::Delivered(attempts),
            "failed" => Expect::Dead(attempts),
            _ => {
                o.fail(format!("{}: still {state} after 20 s", case.name));
                continue;
            }
        };
        summary.push(format!(
            "{}:{}@{attempts}",
            case.name,
            if state == "failed" { "dead" } else { "ok" }
        ));
        o.check(got == case.expect, || {
            format!(
                "{}: expected {:?}, got {got:?} ({})",
                case.name,
                case.expect,
                message["delivery_error"].as_str().unwrap_or_default()
            )
        });
        if state == "failed" {
            o.check(
                letter.is_some_and(|d| d["last_error"].as_str().is_some_and(|e| !e.is_empty())),
                || {
                    format!(
                        "{}: failed but not a dead letter with its reason",
                        case.name
                    )
                },
            );
        }
    }
    let followed = server.hits("followed").len();
    o.fig("outcomes", summary.join(","));
    o.fig("redirects_followed", followed);
    o.check(followed == 0, || {
        format!("{followed} redirects were followed")
    });
    let growth_mb = rss_peak.saturating_sub(rss_before) / 1024;
    o.fig("rss_before_mb", rss_before / 1024);
    o.fig("rss_peak_mb", rss_peak / 1024);
    o.check(growth_mb < 48, || {
        format!("the hub's memory grew by {growth_mb} MB with a 10 MB answer")
    });
    let health = hub.healthz().await;
    o.fig(
        "healthz",
        health.map_or("none".to_owned(), |s| s.to_string()),
    );
    o.check(health == Some(200), || {
        "the hub is not healthy afterwards".to_owned()
    });
    Ok(())
}
