//! `hub plugin test` and `hub check`: loading plugins outside a running hub,
//! against a scratch database, and running one plugin on one recorded event
//! with stand-ins for its destinations.

pub mod promote;
pub mod replay;
mod stand_in;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{Config, DestinationConfig, PluginConfig};
use crate::event::{Direction, Event, EventKind};
use crate::outbound::HttpSender;
use crate::pipeline::wiring::Wiring;
use crate::runtime::destinations::Destinations;
use crate::runtime::{
    Action, ErrorKind, Needs, Plugin, PluginError, PluginEvent, Runtime, Services,
};
use crate::store::{Durability, Store};
use stand_in::{Answer, StandIns, Target};

#[derive(Debug, thiserror::Error)]
pub enum TryoutError {
    #[error("{0}")]
    Setup(String),
    #[error("{file}: {message}")]
    Event { file: PathBuf, message: String },
    #[error("{0}")]
    Plugin(String),
}

/// A temporary directory, removed on drop, holding a database (plugins get
/// a real key-value store without touching the hub's own) and, when no
/// `hub.toml` names a cache, the compiled plugins: nothing is left behind in
/// the working folder.
pub struct Scratch {
    pub store: Store,
    dir: PathBuf,
}

impl Scratch {
    pub async fn open() -> Result<Scratch, TryoutError> {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| TryoutError::Setup(e.to_string()))?;
        let dir = std::env::temp_dir().join(format!("hub-scratch-{}", hex::encode(bytes)));
        // `create_dir`, not `create_dir_all`: a directory someone made in
        // advance under this name is refused, not used.
        std::fs::create_dir(&dir)
            .map_err(|e| TryoutError::Setup(format!("{}: {e}", dir.display())))?;
        let scratch_db = dir.join("scratch.db");
        let store = match Store::open(
            &format!("sqlite://{}", scratch_db.display()),
            Durability::Normal,
        )
        .await
        {
            Ok(store) => store,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(TryoutError::Setup(format!("scratch database: {e}")));
            }
        };
        Ok(Scratch { store, dir })
    }

    /// Where compiled plugins go when the configuration names no cache of its own.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join("plugin-cache")
    }

    pub async fn close(self) {
        self.store.close().await;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Loads and type-checks every plugin of `config`: the plugin half of `hub check`.
/// Loads every plugin and checks its config (`validate-config`). Stricter
/// than `hub serve`: a plugin that is not required and would be left out
/// (the hub would run degraded) is a problem here too, said as such.
pub async fn check_plugins(config: &Config) -> Result<usize, Vec<String>> {
    let scratch = Scratch::open().await.map_err(|e| vec![e.to_string()])?;
    let result = check_with(config, &scratch.store).await;
    scratch.close().await;
    result
}

async fn check_with(config: &Config, store: &Store) -> Result<usize, Vec<String>> {
    let cache = config.resolve(&config.runtime.cache_dir);
    let runtime = runtime(cache).map_err(|e| vec![e.to_string()])?;
    let sender = HttpSender::new().map_err(|e| vec![e.to_string()])?;
    let (wiring, _) = Wiring::load(config, &runtime, store, &sender)?;
    let wiring = wiring.validate_configs(config).await?;
    if wiring.unavailable.is_empty() {
        return Ok(wiring.plugins.len());
    }
    Err(wiring
        .unavailable
        .iter()
        .map(|(_, error)| {
            format!("{error} (required = false: `hub serve` would start without it, degraded)")
        })
        .collect())
}

fn runtime(cache_dir: PathBuf) -> Result<Runtime, TryoutError> {
    Runtime::new(cache_dir, 4).map_err(|e| TryoutError::Setup(e.to_string()))
}

/// A recorded event: the kind and the payload as on the wire, and optionally
/// what the hub would add. `hub events show --as-event` writes this form.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventFile {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    pub payload: Value,
}

impl EventFile {
    /// A logged event as test input. The event log keeps no `context`:
    /// `hub events show --as-event` fills in what it is now.
    pub fn of(event: &Event, channel: Option<String>) -> EventFile {
        EventFile {
            kind: event.kind.as_str().to_owned(),
            direction: Some(event.direction.as_str().to_owned()),
            channel_id: event.channel_id,
            channel,
            chat_id: event.chat_id,
            context: None,
            payload: event.payload.clone(),
        }
    }
}

/// Which plugin to try: one named in the configuration (it keeps its name,
/// and so its key-value namespace, limits and config), or a `.wasm` file with
/// a config table given on the command line.
pub fn plugin_config(
    config: &Config,
    name_or_path: &str,
    plugin_config: Option<&str>,
) -> Result<(PluginConfig, PathBuf), TryoutError> {
    if let Some(p) = config.plugins.iter().find(|p| p.name == name_or_path) {
        let mut p = p.clone();
        if let Some(text) = plugin_config {
            p.config = parse_table(text)?;
        }
        let path = config.resolve(&p.path);
        return Ok((p, path));
    }
    let path = PathBuf::from(name_or_path);
    if let Some(hint) = crate::runtime::unbuilt_project(&path) {
        return Err(TryoutError::Setup(format!(
            "{name_or_path} is missing: {hint}"
        )));
    }
    if !path.is_file() {
        return Err(TryoutError::Setup(format!(
            "`{name_or_path}` is neither a plugin of the configuration nor a .wasm file"
        )));
    }
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin")
        .to_owned();
    let table = match plugin_config {
        Some(text) => parse_table(text)?,
        None => toml::Table::new(),
    };
    let p = PluginConfig {
        config: table,
        timeout_ms: 1000,
        memory_mb: 64,
        max_output_bytes: 1 << 20,
        max_host_calls: 10_000,
        kv: true,
        ..PluginConfig::new(name, path.clone())
    };
    Ok((p, path))
}

/// `--plugin-config` as a JSON object or TOML table text.
fn parse_table(text: &str) -> Result<toml::Table, TryoutError> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return serde_json::from_value(value)
            .map_err(|e| TryoutError::Setup(format!("--plugin-config: not a table: {e}")));
    }
    toml::from_str(text).map_err(|e| TryoutError::Setup(format!("--plugin-config: {e}")))
}

/// What the plugin under test may reach.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Destinations granted (`--grant`); no other, whatever `hub.toml` says.
    pub names: Vec<String>,
    /// Sends to granted destinations of `hub.toml` really go out
    /// (`--live-send`); otherwise every send is answered `200 {}`.
    pub live_send: bool,
}

/// Runs of the plugin at most: the first, and one more per forward to a
/// destination not granted (each run finds the next), up to the default
/// `max_forwards`.
const MAX_RUNS: usize = 11;

/// Reads and parses an event file.
pub fn read_event(event_file: &Path) -> Result<EventFile, TryoutError> {
    let problem = |message: String| TryoutError::Event {
        file: event_file.to_owned(),
        message,
    };
    let text = std::fs::read_to_string(event_file).map_err(|e| problem(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| problem(e.to_string()))
}

/// Runs one plugin on the event in `event_file` and describes the outcome as
/// JSON. Lines for the author (stubbed sends, grants, forwards to destinations
/// not granted) are added to `notes`, also when the run fails.
pub async fn run(
    config: &Config,
    plugin: (PluginConfig, PathBuf),
    event_file: &Path,
    grants: &Grants,
    notes: &mut Vec<String>,
) -> Result<Value, TryoutError> {
    let recorded = read_event(event_file)?;
    let direction = match recorded.direction.as_deref() {
        Some("inbound") => Direction::In,
        Some("outbound") => Direction::Out,
        Some(d) => Direction::parse(d).ok_or_else(|| TryoutError::Event {
            file: event_file.to_owned(),
            message: format!("direction `{d}` is none of `inbound`, `outbound`, `in`, `out`"),
        })?,
        None if recorded.kind.starts_with("channel.agent_") => Direction::Out,
        None => Direction::In,
    };
    let mut event = Event::new(EventKind::from(recorded.kind), direction, recorded.payload);
    event.channel_id = recorded.channel_id;
    event.chat_id = recorded.chat_id;
    let context = recorded.context.unwrap_or_else(|| json!({}));
    let input = PluginEvent {
        event: &event,
        channel: recorded.channel.as_deref(),
        context: &context,
    };

    let scratch = Scratch::open().await?;
    let result = run_on(config, plugin, &input, grants, &scratch, notes).await;
    scratch.close().await;
    result
}

async fn run_on(
    config: &Config,
    (plugin, path): (PluginConfig, PathBuf),
    input: &PluginEvent<'_>,
    grants: &Grants,
    scratch: &Scratch,
    notes: &mut Vec<String>,
) -> Result<Value, TryoutError> {
    // Without a hub.toml there is no cache of the operator's to fill.
    let cache = match config.source {
        Some(_) => config.resolve(&config.runtime.cache_dir),
        None => scratch.cache_dir(),
    };
    let runtime = runtime(cache)?;
    // The plugin's sends go to the loopback stand-ins; what a stand-in
    // passes on (`--live-send`) is held to the configured outbound policy.
    let sender = HttpSender::new().map_err(|e| TryoutError::Setup(e.to_string()))?;
    let live_sender = HttpSender::with_policy(config.outbound.policy())
        .map_err(|e| TryoutError::Setup(e.to_string()))?;
    let stand_ins = StandIns::start(live_sender)
        .await
        .map_err(|e| TryoutError::Setup(format!("stand-in destinations: {e}")))?;
    let targets = targets(config, &plugin, grants, notes);
    // Names the plugin forwarded to without a grant, given a stand-in that refuses sends.
    let mut ungranted: Vec<String> = Vec::new();
    let mut first_error: Option<PluginError> = None;
    let kind = input.event.kind.clone();
    let check = move |action: &mut Action| crate::pipeline::check_action(&kind, action);
    let (outcome, sends, micros) = loop {
        stand_ins.begin_run();
        let all = targets
            .iter()
            .cloned()
            .chain(ungranted.iter().map(|n| (n.clone(), Target::Refused)));
        let mut destinations = Vec::new();
        for (name, target) in all {
            let timeout_ms = match &target {
                Target::Live(d) => u64::try_from(d.policy.timeout.as_millis()).unwrap_or(u64::MAX),
                _ => STAND_IN_TIMEOUT_MS,
            };
            let url = stand_ins.url(&name, target);
            destinations.push(stand_in_config(&name, &url, timeout_ms)?);
        }
        let under_test = PluginConfig {
            destinations: destinations.iter().map(|d| d.name.clone()).collect(),
            ..plugin.clone()
        };
        let services = Services {
            store: scratch.store.clone(),
            destinations: Arc::new(Destinations::from_config(&destinations)),
            sender: sender.clone(),
            shadow: false,
        };
        let (loaded, _) = Plugin::load(&runtime, &under_test, &path, services)
            .map_err(|e| TryoutError::Setup(e.to_string()))?;
        let loaded = Arc::new(loaded);
        // As the hub does when it loads the plugin, before any event.
        if ungranted.is_empty() {
            let needs = loaded
                .validate_config()
                .await
                .map_err(|e| TryoutError::Plugin(format!("the config is refused: {e}")))?;
            note_needs(config, &plugin, &needs, &targets, notes);
        }
        let before = loaded.counters().snapshot().micros;
        let result = loaded.call(input, &check).await;
        let micros = loaded.counters().snapshot().micros.saturating_sub(before);
        let sends = stand_ins.sends();
        if let Some(name) = stand_ins.refused() {
            note_sends(&sends, notes);
            let error = first_error.map_or_else(
                || format!("destination `{name}` is not granted to this plugin"),
                |e| e.to_string(),
            );
            return Err(TryoutError::Plugin(format!(
                "{error}\n  the plugin called send(\"{name}\"), and the hub stops a call that sends \
                 to a destination not granted: grant it here with --grant {name}, and in hub.toml \
                 with `destinations = [\"{name}\"]`"
            )));
        }
        let error = match result {
            Ok(outcome) => break (outcome, sends, micros),
            Err(e) => e,
        };
        let retry = (error.kind == ErrorKind::Destination && ungranted.len() + 1 < MAX_RUNS)
            .then(|| not_granted(&error.message))
            .flatten()
            .filter(|name| !ungranted.contains(name) && !targets.iter().any(|(n, _)| n == name));
        let Some(name) = retry else {
            note_sends(&sends, notes);
            return Err(TryoutError::Plugin(error.to_string()));
        };
        notes.push(format!(
            "`{name}` is not granted: running the plugin again with a stand-in for it, to show \
             what it does (its log lines repeat; sends are answered as before, not made again)"
        ));
        first_error.get_or_insert(error);
        ungranted.push(name);
    };
    note_sends(&sends, notes);

    let forwards: Vec<Value> = outcome
        .forwards
        .iter()
        .map(|f| {
            let name = &f.destination.name;
            let mut forward = json!({ "destination": name, "payload": f.payload });
            if ungranted.contains(name) {
                forward["note"] = json!(format!(
                    "not granted: in the hub this forward fails the call (error kind \
                     `destination`); grant it with `destinations = [\"{name}\"]` in hub.toml"
                ));
            }
            forward
        })
        .collect();
    let mut out = match outcome.action {
        Action::Continue(None) => json!({ "outcome": "continue", "changed": false }),
        Action::Continue(Some(p)) => {
            json!({ "outcome": "continue", "changed": true, "payload": p })
        }
        Action::Drop(reason) => json!({ "outcome": "drop", "reason": reason }),
        Action::Reply(reply) => json!({ "outcome": "reply", "reply": reply }),
    };
    out["forwards"] = Value::Array(forwards);
    out["sends"] = Value::Array(sends.iter().map(send_json).collect());
    // Shown, not kept: the scratch database goes away with the test.
    out["kv_writes"] = json!(outcome.kv_writes);
    out["micros"] = json!(micros);
    Ok(out)
}

/// What the plugin says it needs that this run or its entry in `hub.toml`
/// does not grant: the run goes on (its kv calls or sends fail), and the
/// author learns what `hub check` would refuse.
fn note_needs(
    config: &Config,
    plugin: &PluginConfig,
    needs: &Needs,
    targets: &[(String, Target)],
    notes: &mut Vec<String>,
) {
    if needs.kv && !plugin.kv {
        notes.push(
            "the plugin needs key-value storage, which this run does not grant: its kv calls fail"
                .to_owned(),
        );
    }
    for name in &needs.destinations {
        if !targets.iter().any(|(n, _)| n == name) {
            notes.push(format!(
                "the plugin needs destination `{name}`: grant it here with --grant {name}"
            ));
        }
    }
    if config.source.is_some()
        && let Some(i) = config.plugins.iter().position(|p| p.name == plugin.name)
    {
        for problem in config.ungranted(i, needs.kv, &needs.destinations) {
            notes.push(format!("`hub check` refuses hub.toml: {problem}"));
        }
    }
}

/// A stand-in's `timeout_ms`: the call's own deadline bounds a send anyway.
const STAND_IN_TIMEOUT_MS: u64 = 5000;

/// What each destination of the plugin does: only granted names, live only
/// with `--live-send` and a destination of that name in `hub.toml`. Says so
/// in `notes` wherever the author might expect otherwise.
fn targets(
    config: &Config,
    plugin: &PluginConfig,
    grants: &Grants,
    notes: &mut Vec<String>,
) -> Vec<(String, Target)> {
    let real = Destinations::from_config(&config.destinations);
    let in_file = config.source.is_some();
    if grants.names.is_empty() && !plugin.destinations.is_empty() {
        notes.push(format!(
            "hub.toml grants `{}` {}; here it has no destination unless named with --grant",
            plugin.name,
            plugin.destinations.join(", ")
        ));
    }
    let mut targets = Vec::new();
    for name in &grants.names {
        if targets.iter().any(|(n, _)| n == name) {
            continue;
        }
        if in_file
            && config.plugins.iter().any(|p| p.name == plugin.name)
            && !plugin.destinations.contains(name)
        {
            notes.push(format!(
                "--grant {name}: hub.toml does not grant `{name}` to `{}`; in the hub its sends \
                 and forwards there fail",
                plugin.name
            ));
        }
        let target = match real.get(name) {
            Some(d) if grants.live_send => Target::Live(d.clone()),
            Some(_) => Target::Stub,
            None => {
                if in_file {
                    notes.push(format!(
                        "--grant {name}: no destination of hub.toml has this name; a stand-in \
                         answers its sends with 200 {{}}"
                    ));
                }
                Target::Stub
            }
        };
        targets.push((name.clone(), target));
    }
    if grants.live_send && !targets.iter().any(|(_, t)| matches!(t, Target::Live(_))) {
        notes.push(
            "--live-send: no granted destination of hub.toml, so every send is stubbed".to_owned(),
        );
    }
    targets
}

/// A destination of the plugin under test, at the stand-in server, without
/// headers: secrets of `hub.toml` never reach it.
fn stand_in_config(
    name: &str,
    url: &str,
    timeout_ms: u64,
) -> Result<DestinationConfig, TryoutError> {
    // Built through serde so that every key left out takes its default.
    serde_json::from_value(json!({ "name": name, "url": url, "timeout_ms": timeout_ms }))
        .map_err(|e| TryoutError::Setup(format!("stand-in destination `{name}`: {e}")))
}

/// The name in the runtime's "destination `NAME` is not granted" error.
fn not_granted(message: &str) -> Option<String> {
    let rest = message.split_once("destination `")?.1;
    let (name, tail) = rest.split_once('`')?;
    tail.contains("not granted").then(|| name.to_owned())
}

fn note_sends(sends: &[stand_in::Send], notes: &mut Vec<String>) {
    for s in sends.iter().filter(|s| !s.refused) {
        let how = if s.live { "sent" } else { "stubbed" };
        let answer = match &s.answer {
            Answer::Reply { status, body } => format!("{status} {body}"),
            Answer::Failed(e) => format!("failed: {e}"),
        };
        notes.push(format!(
            "send to `{}` {how}: {} -> {answer}",
            s.destination, s.payload
        ));
    }
}

fn send_json(s: &stand_in::Send) -> Value {
    let mut v = json!({
        "destination": s.destination,
        "payload": s.payload,
        "stubbed": !s.live,
    });
    match &s.answer {
        Answer::Reply { status, body } => {
            v["status"] = json!(status);
            v["body"] = json!(body);
        }
        Answer::Failed(e) => v["error"] = json!(e),
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_in_a_not_granted_error() {
        assert_eq!(
            not_granted("destination `crm` is not granted to this plugin").as_deref(),
            Some("crm")
        );
        assert_eq!(
            not_granted("plugin x: destination `a b` is not granted").as_deref(),
            Some("a b")
        );
        assert_eq!(not_granted("destination `crm` timed out"), None);
        assert_eq!(not_granted("something else"), None);
    }

    #[test]
    fn a_logged_event_reads_back_as_an_event_file() {
        let mut event = Event::new(
            EventKind::CUSTOMER_MESSAGE,
            Direction::In,
            json!({"sender": {"id": 1}, "message": {"type": "text", "text": "hi"}}),
        );
        event.channel_id = Some(3);
        let text =
            serde_json::to_string(&EventFile::of(&event, Some("shop".into()))).expect("serialised");
        let back: EventFile = serde_json::from_str(&text).expect("read back");
        assert_eq!(back.kind, "channel.customer_message");
        assert_eq!(back.direction.as_deref(), Some("in"));
        assert_eq!(back.channel.as_deref(), Some("shop"));
        assert_eq!(back.chat_id, None);
        assert_eq!(back.payload, event.payload);
    }
}
