//! A full disk: the database on a small tmpfs that a filler file fills.
//! Ingress must answer 503 (never 200 for what was not stored), stay
//! healthy, and take messages again once space returns; everything
//! acknowledged is stored, also after a crash.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Mode;
use crate::outcome::Outcome;
use crate::served::{Channel, Hub, Options, integrity};

const AGENT: &str = "ann@battery.test";

/// Unmounts the tmpfs when the test ends, however it ends.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Still busy (a process that has not let go yet): detach it.
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

/// Writes zeros to `path` until the filesystem refuses; the bytes written.
fn fill(path: &Path) -> u64 {
    let Ok(mut file) = std::fs::File::create(path) else {
        return 0;
    };
    let block = vec![0u8; 64 * 1024];
    let mut written = 0;
    while file.write_all(&block).is_ok() {
        written += block.len() as u64;
    }
    // The last, partial block: byte by byte would be slow; small writes do.
    let small = [0u8; 512];
    while file.write_all(&small).is_ok() {
        written += small.len() as u64;
    }
    let _ = file.sync_all();
    written
}

/// One customer message, written down as acknowledged or not; its status (0: no answer).
async fn say(
    hub: &Hub,
    channel: &Channel,
    text: String,
    acked: &mut Vec<String>,
    unacked: &mut Vec<String>,
) -> u16 {
    let sender = format!("df-c{}", (acked.len() + unacked.len()) % 8);
    let status = hub.say(channel, &sender, &text).await.unwrap_or(0);
    if status == 200 {
        acked.push(text);
    } else {
        unacked.push(text);
    }
    status
}

pub async fn disk_full(mode: &Mode, o: &mut Outcome) -> Result<(), String> {
    let dir = o.dir()?;
    let disk = dir.join("disk");
    std::fs::create_dir(&disk).map_err(|e| format!("mkdir: {e}"))?;
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&disk)
        .output();
    match mounted {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            o.skip(format!(
                "cannot mount a tmpfs ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return Ok(());
        }
        Err(e) => {
            o.skip(format!("cannot run mount ({e})"));
            return Ok(());
        }
    }
    let _mounted = Mounted(disk.clone());
    let mut hub = Hub::start(
        &dir,
        &Options {
            database: Some(disk.join("hub.db")),
            ..Options::default()
        },
    )
    .await?;
    o.watch_log(hub.log_path());
    let token = hub.create_agent("Ann", AGENT).await?;
    let channel = hub
        .create_channel("disk", "http://127.0.0.1:9/replies", &[AGENT])
        .await?;
    let mut acked = Vec::new();
    let mut unacked = Vec::new();
    for i in 0..20 {
        let status = say(
            &hub,
            &channel,
            format!("df-warm n{i}"),
            &mut acked,
            &mut unacked,
        )
        .await;
        if status != 200 {
            return Err(format!("before the disk filled, a message got {status}"));
        }
    }

    let filler = disk.join("filler");
    let filled = fill(&filler);
    o.fig("filler_kib", filled / 1024);
    let mut answers = BTreeMap::<u16, usize>::new();
    let mut refusals_in_a_row = 0;
    let most = mode.pick(3000, 10_000);
    let mut sent = 0;
    while sent < most && refusals_in_a_row < 30 {
        let status = say(
            &hub,
            &channel,
            format!("df-full n{sent}"),
            &mut acked,
            &mut unacked,
        )
        .await;
        sent += 1;
        *answers.entry(status).or_default() += 1;
        refusals_in_a_row = if status == 200 {
            0
        } else {
            refusals_in_a_row + 1
        };
    }
    let health_full = hub.healthz().await;
    let ready_full = hub.readyz().await;
    let alive = hub.running();
    o.fig(
        "while_full",
        answers
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect::<Vec<_>>()
            .join(","),
    );
    o.fig(
        "healthz_full",
        health_full.map_or("none".to_owned(), |s| s.to_string()),
    );
    o.fig("readyz_full", ready_full.0);
    o.check(ready_full.0 == 503, || {
        format!("/readyz on a full disk: {} {}", ready_full.0, ready_full.1)
    });
    o.check(alive, || "the hub died when the disk filled".to_owned());
    o.check(answers.contains_key(&503), || {
        format!("no 503 after {sent} messages on a full disk")
    });
    o.check(answers.keys().all(|s| matches!(s, 200 | 503)), || {
        format!("answers other than 200 and 503 on a full disk: {answers:?}")
    });
    o.check(health_full == Some(200), || {
        format!("/healthz on a full disk: {health_full:?}")
    });

    let _ = std::fs::remove_file(&filler);
    let freed = Instant::now();
    let mut recovered = None;
    let mut n = 0;
    while freed.elapsed() < Duration::from_secs(20) {
        n += 1;
        if say(
            &hub,
            &channel,
            format!("df-after n{n}"),
            &mut acked,
            &mut unacked,
        )
        .await
            == 200
        {
            recovered = Some(freed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    o.fig(
        "recovered_ms",
        recovered.map_or("never".to_owned(), |d| d.as_millis().to_string()),
    );
    o.check(recovered.is_some(), || {
        "ingress did not recover within 20 s of the space returning".to_owned()
    });
    let mut later = BTreeMap::<u16, usize>::new();
    for i in 0..20 {
        let status = say(
            &hub,
            &channel,
            format!("df-later n{i}"),
            &mut acked,
            &mut unacked,
        )
        .await;
        *later.entry(status).or_default() += 1;
    }
    o.check(later.keys().all(|s| *s == 200), || {
        format!("after recovery: {later:?}")
    });
    let ready_after = hub.readyz().await;
    o.fig("readyz_after", ready_after.0);
    o.check(ready_after.0 == 200, || {
        format!(
            "/readyz after recovery: {} {}",
            ready_after.0, ready_after.1
        )
    });

    let check_stored = |texts: &std::collections::HashMap<String, usize>| {
        acked
            .iter()
            .filter(|t| !texts.contains_key(*t))
            .cloned()
            .collect::<Vec<_>>()
    };
    let missing = check_stored(&hub.stored_texts(&token).await?);
    o.check(missing.is_empty(), || {
        format!(
            "{} acknowledged messages are not stored: {:?}",
            missing.len(),
            &missing[..missing.len().min(3)]
        )
    });
    // Acknowledged means durable: the same after a crash.
    hub.kill9();
    hub.restart().await?;
    let texts = hub.stored_texts(&token).await?;
    let missing_after_crash = check_stored(&texts);
    let unacked_stored = unacked.iter().filter(|t| texts.contains_key(*t)).count();
    o.fig("acked", acked.len());
    o.fig("stored", acked.len() - missing_after_crash.len());
    o.fig("unacked_stored", unacked_stored);
    o.check(missing_after_crash.is_empty(), || {
        format!(
            "{} acknowledged messages are gone after a restart",
            missing_after_crash.len()
        )
    });
    hub.kill9();
    let integrity = integrity(&hub.db);
    o.fig("integrity", &integrity);
    o.check(integrity == "ok", || {
        format!("PRAGMA integrity_check: {integrity}")
    });
    drop(hub);
    Ok(())
}
