//! PostgreSQL going away under a running `hub serve`: requests that need it
//! are answered 503 (the interface's error body) within the request
//! timeout, the process stays up, and it recovers by itself once the
//! database is back; nothing answered 200 is lost.
//!
//! The test stops and starts a server, so it runs only under
//! `scripts/with-postgres.sh` (`HUB_TEST_DATABASE_URL` and
//! `HUB_TEST_PG_CTL`, with `HUB_TEST_PG_RUNAS` as root), and never on the
//! suite's shared server, which the other tests use at the same time: it
//! makes a cluster of its own in a temporary directory with the same
//! binaries (`initdb` beside that `pg_ctl`) and removes it afterwards.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{ADMIN_TOKEN, HubProcess, TestAgent, admin_create};

/// How long a client waits for an answer: the hub must answer within it
/// (the acquire timeout set below, plus one write turn's wait), never
/// keep the request hanging on a database that is gone.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How soon after the database is back a message must be taken again.
const RECOVERY: Duration = Duration::from_secs(30);
const AGENT_EMAIL: &str = "ann@example.com";
/// The channel dialect's 503 body (`http/problem.rs`).
const UNAVAILABLE: &str = "temporarily unavailable, retry";

/// Where `pg_ctl` and `initdb` are and whom they run as, or why the test
/// cannot run here (it is ignored by a plain `cargo test`; run by hand
/// outside `with-postgres.sh` it fails with that reason).
struct Tools {
    bin: PathBuf,
    run_as: Option<String>,
}

fn tools() -> Result<Tools, String> {
    if crate::support::postgres_server().is_none() {
        return Err("HUB_TEST_DATABASE_URL is not set (run under scripts/with-postgres.sh)".into());
    }
    let pg_ctl = std::env::var("HUB_TEST_PG_CTL").unwrap_or_default();
    let Some(pg_ctl) = pg_ctl.split_whitespace().next() else {
        return Err("HUB_TEST_PG_CTL is not set: not the throwaway cluster of \
                    scripts/with-postgres.sh"
            .into());
    };
    let bin = Path::new(pg_ctl)
        .parent()
        .ok_or_else(|| format!("HUB_TEST_PG_CTL `{pg_ctl}` names no directory"))?
        .to_owned();
    if !bin.join("initdb").exists() || !bin.join("pg_ctl").exists() {
        return Err(format!("no initdb and pg_ctl in {}", bin.display()));
    }
    let run_as = std::env::var("HUB_TEST_PG_RUNAS")
        .ok()
        .filter(|u| !u.trim().is_empty());
    Ok(Tools { bin, run_as })
}

/// A PostgreSQL cluster of the test's own, stopped and removed on drop.
struct Cluster {
    tools: Tools,
    dir: tempfile::TempDir,
    port: u16,
}

impl Cluster {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `tool args…` as the cluster's owner, to its end.
    fn run(tools: &Tools, tool: &str, args: &[&str]) -> Output {
        let program = tools.bin.join(tool);
        let mut command = match &tools.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&program);
                c
            }
            None => Command::new(&program),
        };
        // The server inherits nothing the test would wait on.
        command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        let data = self.data().display().to_string();
        let mut all = vec!["-D", data.as_str()];
        all.extend_from_slice(args);
        Cluster::run(&self.tools, "pg_ctl", &all)
    }

    /// `initdb` in a fresh directory, its settings (port, loopback, socket
    /// directory) written into `postgresql.conf` so a plain `pg_ctl start`
    /// brings it back the same, then started.
    fn create(tools: Tools) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let sock = dir.path().join("sock");
        for d in [&data, &sock] {
            std::fs::create_dir(d).expect("cluster directory");
        }
        if let Some(user) = &tools.run_as {
            // The owner must reach its directories: the temporary
            // directory opened to others, the cluster's own handed over.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod the cluster's directory");
            let (uid, gid) = ids_of(user);
            for d in [dir.path(), &data, &sock] {
                std::os::unix::fs::chown(d, Some(uid), Some(gid))
                    .expect("chown the cluster's directory");
            }
        }
        let data_arg = data.display().to_string();
        let init = Cluster::run(
            &tools,
            "initdb",
            &[
                "-D",
                &data_arg,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
            ],
        );
        assert!(
            init.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        let mut cluster = Cluster {
            tools,
            dir,
            port: 0,
        };
        let conf = cluster.data().join("postgresql.conf");
        let base = std::fs::read_to_string(&conf).expect("postgresql.conf");
        // A port nobody listens on, retried if another process takes it first.
        for _ in 0..10 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let settings = format!(
                "{base}\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
                 unix_socket_directories = '{}'\nfsync = off\nsynchronous_commit = off\n\
                 full_page_writes = off\nmax_connections = 100\n",
                sock.display()
            );
            std::fs::write(&conf, settings).expect("write postgresql.conf");
            cluster.port = port;
            if cluster.start().status.success() {
                return cluster;
            }
        }
        panic!(
            "the test's PostgreSQL did not start: {}",
            std::fs::read_to_string(cluster.log()).unwrap_or_default()
        );
    }

    fn start(&self) -> Output {
        let log = self.log().display().to_string();
        self.pg_ctl(&["-l", &log, "-w", "-t", "60", "start"])
    }

    fn stop(&self) -> Output {
        self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"])
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
    }
}

/// The uid and gid of `user`.
fn ids_of(user: &str) -> (u32, u32) {
    let id = |flag: &str| -> u32 {
        let o = Command::new("id")
            .args([flag, user])
            .output()
            .expect("run id");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no user `{user}`"))
    };
    (id("-u"), id("-g"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("http client")
}

/// Customer 7 writes `text`: the status and body, or the client's error
/// (the hub not answering within [`REQUEST_TIMEOUT`]).
async fn say(http: &reqwest::Client, url: &str, text: &str) -> Result<(u16, String), String> {
    let resp = http
        .post(url)
        .header("content-type", "application/json; charset=utf-8")
        .body(
            json!({ "sender": { "id": 7 }, "message": { "type": "text", "text": text } })
                .to_string(),
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.text().await.map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// Every message text the agent sees in its chats.
async fn stored_texts(agent: &TestAgent) -> String {
    let mut all = String::new();
    for chat in agent.chats().await {
        let id = chat["id"].as_i64().expect("chat id");
        all.push_str(&agent.chat(id).await["messages"].to_string());
    }
    all
}

fn assert_alive(hub: &mut HubProcess) {
    if let Ok(Some(status)) = hub.child.try_wait() {
        panic!("the hub exited ({status}):\n{}", hub.log());
    }
}

#[ignore = "needs PostgreSQL's throwaway cluster (scripts/with-postgres.sh)"]
#[tokio::test(flavor = "multi_thread")]
async fn while_postgresql_is_down_requests_get_503_and_the_hub_recovers_by_itself() {
    let tools = tools().unwrap_or_else(|why| panic!("this test cannot run here: {why}"));
    let cluster = tokio::task::spawn_blocking(move || Cluster::create(tools))
        .await
        .expect("the test's PostgreSQL");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("hub.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 2000\n\n\
             [storage]\nurl = \"{}\"\nmax_connections = 8\nacquire_timeout_ms = 3000\n\
             connect_timeout_ms = 5000\n\n[admin]\ntoken = \"{ADMIN_TOKEN}\"\n",
            cluster.url()
        ),
    )
    .expect("write hub.toml");
    let mut hub = tokio::task::spawn_blocking(move || HubProcess::spawn(&config))
        .await
        .expect("hub serve");
    let http = client();
    let agent = admin_create(
        &hub.base,
        "agents",
        json!({ "name": "Ann", "email": AGENT_EMAIL }),
    )
    .await;
    let channel = admin_create(
        &hub.base,
        "channels",
        json!({ "name": "shop", "customer_endpoint": "http://127.0.0.1:9/hub",
                "agents": [AGENT_EMAIL] }),
    )
    .await;
    let endpoint = channel["endpoint_url"]
        .as_str()
        .expect("endpoint")
        .to_owned();
    let agent = TestAgent {
        id: 0,
        token: agent["token"].as_str().expect("token").to_owned(),
        base: hub.base.clone(),
        http: http.clone(),
    };
    for text in ["before 1", "before 2"] {
        let answer = say(&http, &endpoint, text).await;
        assert!(matches!(answer, Ok((200, _))), "{text}: {answer:?}");
    }

    let stopped = tokio::task::block_in_place(|| cluster.stop());
    assert!(
        stopped.status.success(),
        "pg_ctl stop: {}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    for n in 1..=3 {
        let started = Instant::now();
        let answer = say(&http, &endpoint, &format!("while down {n}")).await;
        let took = started.elapsed();
        let (status, body) = answer.unwrap_or_else(|e| {
            panic!(
                "no answer while the database is down ({took:?}): {e}\n{}",
                hub.log()
            )
        });
        assert_eq!(status, 503, "while down {n} ({took:?}): {body}");
        assert_eq!(body.trim_end(), UNAVAILABLE);
        assert!(took < REQUEST_TIMEOUT, "answered after {took:?}");
        eprintln!("while down {n}: 503 after {took:?}");
        assert_alive(&mut hub);
    }
    // Several at once: each still answered within the request timeout.
    let at_once = (1..=4).map(|n| {
        let (http, endpoint) = (http.clone(), endpoint.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = say(&http, &endpoint, &format!("at once {n}")).await;
            (answer, started.elapsed())
        })
    });
    for task in at_once.collect::<Vec<_>>() {
        let (answer, took) = task.await.expect("request task");
        eprintln!("at once: {answer:?} after {took:?}");
        let (status, body) = answer.unwrap_or_else(|e| panic!("no answer ({took:?}): {e}"));
        assert_eq!(status, 503, "after {took:?}: {body}");
        assert!(took < REQUEST_TIMEOUT, "answered after {took:?}");
    }
    // The agent API's own error body.
    let (status, body) = agent.get("/agent/v1/chats").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    // A load balancer asking `/readyz` takes the instance out meanwhile;
    // `/healthz` (alive) stays 200.
    let ready = http
        .get(format!("{}/readyz", hub.base))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 503);
    let alive = http
        .get(format!("{}/healthz", hub.base))
        .send()
        .await
        .expect("healthz");
    assert_eq!(alive.status(), 200);
    assert_alive(&mut hub);

    let started = tokio::task::block_in_place(|| cluster.start());
    assert!(
        started.status.success(),
        "pg_ctl start: {}",
        String::from_utf8_lossy(&started.stderr)
    );
    let back = Instant::now();
    loop {
        match say(&http, &endpoint, "after").await {
            Ok((200, _)) => break,
            Ok((503, body)) => assert_eq!(body.trim_end(), UNAVAILABLE),
            other => panic!("while recovering: {other:?}\n{}", hub.log()),
        }
        assert!(
            back.elapsed() < RECOVERY,
            "not taken within {RECOVERY:?} of the database's return:\n{}",
            hub.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "taken again {:?} after the database's return",
        back.elapsed()
    );
    assert_alive(&mut hub);
    let ready = http
        .get(format!("{}/readyz", hub.base))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "ready again once the database is back");
    let texts = stored_texts(&agent).await;
    for text in ["before 1", "before 2", "after"] {
        assert!(texts.contains(text), "`{text}` is not stored: {texts}");
    }
}
