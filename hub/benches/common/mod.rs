//! What the benchmarks share: settings from the environment, the example
//! plugins built for them, the backtrace guard, and a process's memory and
//! CPU time.

#![allow(dead_code, reason = "each benchmark uses some of these")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A numeric setting from the environment, or `default`.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// As in the hub's own `main`: no backtrace per plugin trap, whatever the
/// user's shell sets (`RUST_BACKTRACE=1` makes wasmtime capture one per
/// call). Call it first thing in `main`, before any thread exists.
#[allow(unsafe_code, reason = "`set_var` before any other thread exists")]
#[allow(clippy::disallowed_methods, reason = "as in the hub's own `main`")]
pub fn guard_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called before the runtime starts, so no other thread exists.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

/// Builds the example plugins and the fault plugin; the directory of their
/// `.wasm`. `BENCH_PLUGINS_DIR` names another directory of the same plugins
/// (built another way, to compare) and skips the build.
pub fn plugins_dir() -> PathBuf {
    if let Some(dir) = given_dir("BENCH_PLUGINS_DIR") {
        return dir;
    }
    build_with("scripts/build-plugins.sh", &[]).join("target/plugins/wasm32-wasip2/release")
}

/// The directory the variable `name` names, if set. A relative one is
/// taken from the repository's root, where the README's commands run:
/// cargo starts a benchmark in its package's directory (`hub/`), so the
/// path as typed would miss. Panics, naming both places, if it is neither.
fn given_dir(name: &str) -> Option<PathBuf> {
    let given = PathBuf::from(std::env::var_os(name)?);
    if given.is_absolute() {
        return Some(given);
    }
    let from_root = repository_root().join(&given);
    if from_root.is_dir() {
        return Some(from_root);
    }
    assert!(
        given.is_dir(),
        "{name}={}: no such directory here or under {}",
        given.display(),
        repository_root().display()
    );
    Some(given)
}

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs a build script of the repository; the repository's root.
fn build_with(script: &str, args: &[&str]) -> PathBuf {
    let root = repository_root();
    let status = Command::new(root.join(script))
        .args(args)
        .current_dir(&root)
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(status.success(), "{script} failed");
    root
}

/// Builds the Python and TypeScript plugins (`scripts/polyglot.sh build`,
/// which installs its pinned toolchains on first use); the directory of their
/// `.wasm`. `BENCH_POLYGLOT_DIR` names another directory and skips the build.
pub fn polyglot_dir() -> PathBuf {
    if let Some(dir) = given_dir("BENCH_POLYGLOT_DIR") {
        return dir;
    }
    build_with("scripts/polyglot.sh", &["build"]).join("target/plugins/polyglot")
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10).
pub fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 2..];
            rest.split(' ').nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// A field of `/proc/<pid>/status` in KiB: `VmRSS` (now) or `VmHWM` (peak).
pub fn memory_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `/proc/<pid>/stat`'s clock ticks: `USER_HZ`, 100 on every Linux the
/// kernel's ABI has shipped with.
const TICKS_PER_SEC: f64 = 100.0;

/// A process's command name and the fields of `/proc/<pid>/stat` after it
/// (from field 3, the state: `fields[1]` is the parent, `fields[11..15]`
/// its own user and system time and its reaped children's).
fn proc_stat(pid: u32) -> Option<(String, Vec<u64>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses.
    let name = &stat[stat.find('(')? + 1..stat.rfind(')')?];
    let rest = &stat[stat.rfind(')')? + 2..];
    // The state (a letter) reads as 0: only numbers are used.
    let fields = rest.split(' ').map(|f| f.parse().unwrap_or(0)).collect();
    Some((name.to_owned(), fields))
}

/// User and system CPU time of a process so far, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let (_, fields) = proc_stat(pid)?;
    Some(fields.get(11)? + fields.get(12)?)
}

/// The postmaster of the PostgreSQL server whose backend on this machine is
/// `backend` (`pg_backend_pid()`), if that server runs here: `None` when
/// the process is not a `postgres` one (a server elsewhere, a container).
pub fn local_postmaster(backend: u32) -> Option<u32> {
    let (name, fields) = proc_stat(backend)?;
    let parent = u32::try_from(*fields.get(1)?).ok()?;
    let (parent_name, _) = proc_stat(parent)?;
    (name.starts_with("postgres") && parent_name.starts_with("postgres")).then_some(parent)
}

/// A PostgreSQL server's CPU time so far, in clock ticks: its postmaster's,
/// its live children's, and its children's that exited (reaped by the
/// postmaster, so in its children's times). The difference of two readings
/// is the server's CPU between them, backends that came and went
/// meanwhile included.
fn server_ticks(postmaster: u32) -> Option<u64> {
    let (_, own) = proc_stat(postmaster)?;
    let mut ticks: u64 = own.get(11..15)?.iter().sum();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((_, fields)) = proc_stat(pid)
            && fields.get(1) == Some(&u64::from(postmaster))
        {
            ticks += fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0);
        }
    }
    Some(ticks)
}

/// The whole machine so far (`/proc/stat`): busy and total clock ticks of
/// all cores (idle and I/O wait are not busy), and context switches.
fn machine_ticks() -> Option<(u64, u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = cpu
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    let switches = stat
        .lines()
        .find_map(|l| l.strip_prefix("ctxt "))?
        .trim()
        .parse()
        .ok()?;
    Some((total - idle, total, switches))
}

/// The CPU a measurement cost on this machine: the processes under test
/// (`pids`), a local PostgreSQL server, this process (load generator and
/// stand-in receivers), and how busy the whole machine was and how often it
/// switched tasks.
pub struct CpuShares {
    pids: Vec<CpuClock>,
    server: Option<(u32, Option<u64>)>,
    own: CpuClock,
    machine: Option<(u64, u64, u64)>,
}

impl CpuShares {
    pub fn start(pids: &[u32], postmaster: Option<u32>) -> CpuShares {
        CpuShares {
            pids: pids.iter().map(|&pid| CpuClock::start(pid)).collect(),
            server: postmaster.map(|pm| (pm, server_ticks(pm))),
            own: CpuClock::own(),
            machine: machine_ticks(),
        }
    }

    /// Microseconds of CPU per item since the start, over `count` items:
    /// the processes under test together, the server (if local), this
    /// process; and the machine's busy share in percent.
    pub fn per_item_us(&self, count: usize) -> CpuPerItem {
        let pids = self
            .pids
            .iter()
            .map(|c| c.per_item_us(count))
            .sum::<Option<f64>>();
        let server = self.server.and_then(|(pm, start)| {
            let used = server_ticks(pm)?.checked_sub(start?)?;
            (count > 0).then(|| used as f64 * 1e6 / TICKS_PER_SEC / count as f64)
        });
        let machine = self.machine.zip(machine_ticks());
        let busy = machine.and_then(|(a, b)| {
            let total = b.1.checked_sub(a.1)?;
            let busy = b.0.checked_sub(a.0)?;
            (total > 0).then(|| 100.0 * busy as f64 / total as f64)
        });
        let switches = machine.and_then(|(a, b)| {
            let switches = b.2.checked_sub(a.2)?;
            (count > 0).then(|| switches as f64 / count as f64)
        });
        CpuPerItem {
            pids,
            server,
            own: self.own.per_item_us(count),
            busy,
            switches,
        }
    }
}

/// What [`CpuShares::per_item_us`] measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuPerItem {
    pub pids: Option<f64>,
    pub server: Option<f64>,
    pub own: Option<f64>,
    /// The machine's busy share, percent.
    pub busy: Option<f64>,
    /// The machine's context switches per item.
    pub switches: Option<f64>,
}

/// The CPU time a process has used since [`CpuClock::start`].
pub struct CpuClock {
    pid: u32,
    start: Option<u64>,
}

impl CpuClock {
    pub fn start(pid: u32) -> CpuClock {
        CpuClock {
            pid,
            start: cpu_ticks(pid),
        }
    }

    /// This process (a load generator measuring itself).
    pub fn own() -> CpuClock {
        CpuClock::start(std::process::id())
    }

    /// Microseconds of CPU per item since the start, over `count` items.
    pub fn per_item_us(&self, count: usize) -> Option<f64> {
        let used = cpu_ticks(self.pid)?.checked_sub(self.start?)?;
        (count > 0).then(|| used as f64 * 1e6 / TICKS_PER_SEC / count as f64)
    }
}

/// Creates a channel through the admin API; the path of its endpoint.
pub async fn create_channel(
    base: &str,
    admin: &str,
    name: &str,
    customer_endpoint: &str,
    agents: &[&str],
) -> String {
    let channel: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/admin/v1/channels"))
        .bearer_auth(admin)
        .json(
            &serde_json::json!({ "name": name, "customer_endpoint": customer_endpoint,
                                   "agents": agents }),
        )
        .send()
        .await
        .expect("create channel")
        .json()
        .await
        .expect("channel json");
    let endpoint = channel["endpoint_url"].as_str().expect("endpoint");
    endpoint.trim_start_matches(base).to_owned()
}

/// With `BENCH_BUSY_DISK=<MiB/s>`: another process's writes on the disk the
/// benchmark's databases are on, for as long as the guard lives: a thread
/// that writes that many MiB a second to a file in the temporary directory
/// and syncs after every MiB (a log shipper, a backup, a build). What a
/// commit's or a WAL restart's sync costs depends on it far more than on
/// the hub.
pub struct BusyDisk {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyDisk {
    pub fn from_env() -> Option<BusyDisk> {
        let rate = env_or("BENCH_BUSY_DISK", 0);
        if rate == 0 {
            return None;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            use std::io::{Seek, Write};
            use std::sync::atomic::Ordering;
            let Ok(mut file) = tempfile::tempfile() else {
                return;
            };
            let chunk = vec![0x5a_u8; 1 << 20];
            let started = std::time::Instant::now();
            let mut written = 0_u64;
            while !stopping.load(Ordering::Relaxed) {
                // 64 MiB, then over again: the disk sees writes, not growth.
                if written.is_multiple_of(64) && file.rewind().is_err() {
                    return;
                }
                if file
                    .write_all(&chunk)
                    .and_then(|()| file.sync_data())
                    .is_err()
                {
                    return;
                }
                written += 1;
                let due = std::time::Duration::from_secs_f64(written as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        });
        println!(
            "a busy disk: another writer puts {rate} MiB/s on the temporary directory's disk, synced per MiB"
        );
        Some(BusyDisk {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for BusyDisk {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
