//! `hub plugin test` and `hub check`: loading plugins outside a running hub,
//! against a scratch database, and running one plugin on one recorded event.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{Config, PluginConfig};
use crate::event::{Direction, Event, EventKind};
use crate::outbound::HttpSender;
use crate::pipeline::wiring::Wiring;
use crate::runtime::destinations::Destinations;
use crate::runtime::{Action, Plugin, PluginEvent, Runtime, Services};
use crate::store::{Durability, Store};

#[derive(Debug, thiserror::Error)]
pub enum TryoutError {
    #[error("{0}")]
    Setup(String),
    #[error("{file}: {message}")]
    Event { file: PathBuf, message: String },
    #[error("{0}")]
    Plugin(String),
}

/// A database in a temporary file, removed on drop: plugins get a real
/// key-value store without touching the hub's own.
pub struct Scratch {
    pub store: Store,
    path: PathBuf,
}

impl Scratch {
    pub async fn open() -> Result<Scratch, TryoutError> {
        let mut bytes = [0u8; 8];
        getrandom::fill(&mut bytes).map_err(|e| TryoutError::Setup(e.to_string()))?;
        let path = std::env::temp_dir().join(format!("hub-scratch-{}.db", hex::encode(bytes)));
        let store = Store::open(&format!("sqlite://{}", path.display()), Durability::Normal)
            .await
            .map_err(|e| TryoutError::Setup(format!("scratch database: {e}")))?;
        Ok(Scratch { store, path })
    }

    pub async fn close(self) {
        self.store.close().await;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Loads and type-checks every plugin of `config`: the plugin half of `hub check`.
pub async fn check_plugins(config: &Config) -> Result<usize, Vec<String>> {
    let scratch = Scratch::open().await.map_err(|e| vec![e.to_string()])?;
    let result = (|| {
        let runtime = runtime(config).map_err(|e| vec![e.to_string()])?;
        let sender = HttpSender::new().map_err(|e| vec![e.to_string()])?;
        Wiring::load(config, &runtime, &scratch.store, &sender).map(|(w, _)| w.plugins.len())
    })();
    scratch.close().await;
    result
}

fn runtime(config: &Config) -> Result<Runtime, TryoutError> {
    Runtime::new(config.resolve(&config.runtime.cache_dir), 4)
        .map_err(|e| TryoutError::Setup(e.to_string()))
}

/// A recorded event: the kind and the payload as on the wire, and optionally
/// what the hub would add.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventFile {
    pub kind: String,
    pub payload: Value,
    #[serde(default)]
    pub direction: Option<String>,
    #[serde(default)]
    pub channel_id: Option<i64>,
    #[serde(default)]
    pub channel: Option<String>,
    #[serde(default)]
    pub chat_id: Option<i64>,
    #[serde(default)]
    pub context: Option<Value>,
}

/// Which plugin to try: one named in the configuration, or a `.wasm` file
/// with a config table given on the command line.
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
        destinations: config.destinations.iter().map(|d| d.name.clone()).collect(),
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

/// Runs one plugin on the event in `event_file` and describes the outcome as JSON.
pub async fn run(
    config: &Config,
    plugin: (PluginConfig, PathBuf),
    event_file: &Path,
) -> Result<Value, TryoutError> {
    let text = std::fs::read_to_string(event_file).map_err(|e| TryoutError::Event {
        file: event_file.to_owned(),
        message: e.to_string(),
    })?;
    let recorded: EventFile = serde_json::from_str(&text).map_err(|e| TryoutError::Event {
        file: event_file.to_owned(),
        message: e.to_string(),
    })?;
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

    let scratch = Scratch::open().await?;
    let runtime = runtime(config)?;
    let destinations = Destinations::from_config(&config.destinations);
    let services = Services {
        store: scratch.store.clone(),
        destinations: Arc::new(destinations),
        sender: HttpSender::new().map_err(|e| TryoutError::Setup(e.to_string()))?,
    };
    let (plugin_config, path) = plugin;
    let (loaded, _) = Plugin::load(&runtime, &plugin_config, &path, services)
        .map_err(|e| TryoutError::Setup(e.to_string()))?;
    let loaded = Arc::new(loaded);
    let input = PluginEvent {
        event: &event,
        channel: recorded.channel.as_deref(),
        context: &context,
    };
    let kind = event.kind.clone();
    let check = move |action: &mut Action| crate::pipeline::check_action(&kind, action);
    let result = loaded.call(&input, &check).await;
    let micros = loaded.counters().snapshot().micros;
    scratch.close().await;
    let outcome = result.map_err(|e| TryoutError::Plugin(e.to_string()))?;
    let forwards: Vec<Value> = outcome
        .forwards
        .iter()
        .map(|f| json!({ "destination": f.destination.name, "payload": f.payload }))
        .collect();
    let kv_writes = outcome.kv_writes;
    let mut out = match outcome.action {
        Action::Continue(None) => json!({ "outcome": "continue", "changed": false }),
        Action::Continue(Some(p)) => {
            json!({ "outcome": "continue", "changed": true, "payload": p })
        }
        Action::Drop(reason) => json!({ "outcome": "drop", "reason": reason }),
        Action::Reply(reply) => json!({ "outcome": "reply", "reply": reply }),
    };
    out["forwards"] = Value::Array(forwards);
    // Shown, not kept: the scratch database goes away with the test.
    out["kv_writes"] = json!(kv_writes);
    out["micros"] = json!(micros);
    Ok(out)
}
