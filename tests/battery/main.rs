//! The battery: drives a real `hub serve` over loopback through crashes, a
//! drain, hostile receivers and clients, SSRF attempts, hostile plugins and
//! a full disk, and prints one line per test with its figures.
//!
//! A test target without libtest (`harness = false` in hub/Cargo.toml), so
//! `cargo test` runs it in its short mode; `HUB_BATTERY=long` runs the long
//! one. Names on the command line pick tests as libtest filters do
//! (`--skip` too); `--list` lists them. Exits non-zero when a test fails.
//! How to read and run it: docs/battery.md.

mod crash;
mod diskfull;
mod faults;
mod hostile;
mod inputs;
mod load;
mod outcome;
mod receivers;
mod served;
mod ssrf;
mod wire;

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::outcome::{Outcome, Verdict};

/// Every test, in the order they run: the cheap ones that find a broken
/// hub fastest first, the crash series last but one, the disk last (it
/// mounts a filesystem).
const TESTS: [&str; 8] = [
    "auth",
    "bad-inputs",
    "ssrf",
    "receiver-faults",
    "sigterm-drain",
    "plugin-faults",
    "kill9-series",
    "disk-full",
];

/// How hard the battery pushes: the short mode every `cargo test` runs, or
/// the long one (`HUB_BATTERY=long`).
pub struct Mode {
    pub long: bool,
    /// Seeds the random moments of the kill series; printed, and taken from
    /// `HUB_BATTERY_SEED` to repeat a run.
    pub seed: u64,
}

impl Mode {
    /// `short` in the short mode, `long` in the long one.
    pub fn pick<T>(&self, short: T, long: T) -> T {
        if self.long { long } else { short }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // libtest's arguments, as `cargo test -- …` passes them to every test
    // binary: names filter, `--skip NAME` leaves out, other flags are ignored
    // (with their values, so a value is not taken for a name).
    let mut filters: Vec<&str> = Vec::new();
    let mut skips: Vec<&str> = Vec::new();
    let mut rest = args.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        match arg {
            "--skip" => skips.extend(rest.next()),
            "--test-threads" | "--color" | "--format" | "--logfile" | "-Z" => {
                rest.next();
            }
            flag if flag.starts_with('-') => {}
            name => filters.push(name),
        }
    }
    let chosen: Vec<&str> = TESTS
        .iter()
        .copied()
        .filter(|t| filters.is_empty() || filters.iter().any(|f| t.contains(f)))
        .filter(|t| !skips.iter().any(|s| t.contains(s)))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for name in &chosen {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let long = std::env::var("HUB_BATTERY").is_ok_and(|v| v == "long");
    let seed = std::env::var("HUB_BATTERY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mode = Mode { long, seed };
    println!(
        "battery: {} mode, {} of {} tests, seed {seed} (HUB_BATTERY=long for the long mode, \
         HUB_BATTERY_SEED to repeat)",
        mode.pick("short", "long"),
        chosen.len(),
        TESTS.len()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = Instant::now();
    let mut failed = 0;
    let mut skipped = 0;
    for name in &chosen {
        let verdict = runtime.block_on(run_one(name, &mode));
        match verdict {
            Verdict::Failed => failed += 1,
            Verdict::Skipped => skipped += 1,
            Verdict::Ok => {}
        }
    }
    println!(
        "battery: {} ok, {failed} failed, {skipped} skipped in {:.1} s",
        chosen.len() - failed - skipped,
        started.elapsed().as_secs_f64()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs one test within its time limit and prints its line.
async fn run_one(name: &str, mode: &Mode) -> Verdict {
    let mut o = Outcome::new(name);
    let limit = Duration::from_secs(mode.pick(150, 900));
    let run = AssertUnwindSafe(dispatch(name, mode, &mut o)).catch_unwind();
    let result = match tokio::time::timeout(limit, run).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(format!(
            "the battery itself panicked: {}",
            panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("?")
        )),
        Err(_) => Err(format!("did not finish within {} s", limit.as_secs())),
    };
    if let Err(reason) = result {
        o.fail(reason);
    }
    o.print(mode.long || std::env::var_os("HUB_BATTERY_VERBOSE").is_some())
}

async fn dispatch(name: &str, mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    match name {
        "kill9-series" => crash::kill9_series(mode, o).await,
        "sigterm-drain" => crash::sigterm_drain(mode, o).await,
        "receiver-faults" => faults::receiver_faults(mode, o).await,
        "bad-inputs" => inputs::bad_inputs(mode, o).await,
        "auth" => inputs::auth(mode, o).await,
        "ssrf" => ssrf::ssrf(mode, o).await,
        "plugin-faults" => hostile::plugin_faults(mode, o).await,
        "disk-full" => diskfull::disk_full(mode, o).await,
        other => Err(format!("no test is called {other}")),
    }
}
