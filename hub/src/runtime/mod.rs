//! The wasmtime host: one engine, compiled-plugin cache, the bounded pool of
//! call slots, and the plugins loaded on it. Each call runs in a fresh store.

mod bindings;
mod cache;
mod counters;
mod deadline;
pub(crate) mod destinations;
mod engine;
mod host;
mod plugin;
mod sanitize;
mod scope;
/// Untrusted text as one bounded log line (plugins' output, and what an
/// edge logs of a request).
pub use sanitize::one_line;
mod share;
mod threads;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Semaphore;

pub use bindings::Needs;
pub use cache::{Origin, compile_in_child, compile_into};
pub use counters::{Counters, DURATION_BUCKETS_MICROS, PluginCounters, Snapshot};
pub use plugin::{Action, Forward, KvWrites, Outcome, Plugin, PluginEvent};
pub use scope::Services;

/// Why a plugin call failed; each kind is counted per plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The guest trapped (a panic, an unreachable, a stack overflow).
    Trap,
    /// The call ran past its `timeout_ms`.
    Timeout,
    /// The guest asked for more memory than `memory_mb`.
    Memory,
    /// Payloads returned were larger than `max_output_bytes`.
    OutputTooLarge,
    /// A `send` or forward to a destination the plugin was not granted.
    Destination,
    /// More host calls than `max_host_calls`.
    HostCalls,
    /// A payload that is not JSON, or not valid for the event's kind.
    InvalidOutput,
    /// The plugin returned an error of its own.
    Failed,
    /// The component could not be instantiated.
    Instantiate,
    /// More forwards or key-value data than the plugin's quotas allow.
    Quota,
    /// The plugin's earlier calls kept it busy for a whole `timeout_ms`
    /// (`max_concurrency`), or its channel's calls used up its `time_share`.
    Busy,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Trap,
        ErrorKind::Timeout,
        ErrorKind::Memory,
        ErrorKind::OutputTooLarge,
        ErrorKind::Destination,
        ErrorKind::HostCalls,
        ErrorKind::InvalidOutput,
        ErrorKind::Failed,
        ErrorKind::Instantiate,
        ErrorKind::Quota,
        ErrorKind::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Trap => "trap",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Memory => "memory",
            ErrorKind::OutputTooLarge => "output_too_large",
            ErrorKind::Destination => "destination",
            ErrorKind::HostCalls => "host_calls",
            ErrorKind::InvalidOutput => "invalid_output",
            ErrorKind::Failed => "failed",
            ErrorKind::Instantiate => "instantiate",
            ErrorKind::Quota => "quota",
            ErrorKind::Busy => "busy",
        }
    }
}

/// A failed plugin call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("plugin `{plugin}` failed ({}): {message}", .kind.as_str())]
pub struct PluginError {
    pub plugin: String,
    pub kind: ErrorKind,
    pub message: String,
}

/// A plugin that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("plugin `{name}`: {path} is missing: {hint}")]
    Unbuilt {
        name: String,
        path: PathBuf,
        hint: String,
    },
    #[error("plugin `{name}`: cannot read {path}: {source}")]
    Read {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("plugin `{name}`: {path} is not a usable component: {message}")]
    Compile {
        name: String,
        path: PathBuf,
        message: String,
    },
    #[error("plugin `{name}`: {path} does not fit the hub:plugin world: {message}")]
    World {
        name: String,
        path: PathBuf,
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start the plugin runtime: {0}")]
pub struct RuntimeError(String);

/// The engine and what every call shares.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    engine: wasmtime::Engine,
    linker: wasmtime::component::Linker<host::HostState>,
    cache: cache::ComponentCache,
    /// One permit per pooled instance slot: a call waits here instead of
    /// failing when the pool is busy.
    slots: Arc<Semaphore>,
    /// Linear memory of every running call together.
    memory: scope::MemoryBudget,
    counters: Counters,
    /// Where calls that outlive their first tick go on running.
    threads: threads::PluginThreads,
    /// Advances the epoch while sandboxes exist.
    ticker: engine::Ticker,
}

impl Runtime {
    pub fn new(cache_dir: PathBuf, slots: u32) -> Result<Runtime, RuntimeError> {
        let budget = (crate::config::RuntimeConfig::default().max_memory_mb as usize) << 20;
        Runtime::with_memory_budget(cache_dir, slots, budget)
    }

    /// A runtime whose running calls hold at most `memory_bytes` of linear
    /// memory together (`[runtime] max_memory_mb`).
    pub fn with_memory_budget(
        cache_dir: PathBuf,
        slots: u32,
        memory_bytes: usize,
    ) -> Result<Runtime, RuntimeError> {
        let engine = engine::build(slots).map_err(|e| RuntimeError(format!("{e:#}")))?;
        let linker = host::linker(&engine).map_err(|e| RuntimeError(format!("{e:#}")))?;
        let ticker = engine::Ticker::start(&engine).map_err(|e| RuntimeError(e.to_string()))?;
        let threads = threads::PluginThreads::start().map_err(|e| RuntimeError(e.to_string()))?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                engine,
                linker,
                cache: cache::ComponentCache::new(cache_dir, slots),
                slots: Arc::new(Semaphore::new(slots as usize)),
                memory: scope::MemoryBudget::new(memory_bytes),
                counters: Counters::default(),
                threads,
                ticker,
            }),
        })
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    pub(crate) fn memory_budget(&self) -> &scope::MemoryBudget {
        &self.inner.memory
    }
}

/// Why a component is missing, when it sits where a Python or TypeScript
/// project of `hub plugin new` writes it and the project's `build.sh` has
/// not made it yet: the toolchain problem in the author's terms.
pub fn unbuilt_project(wasm: &std::path::Path) -> Option<String> {
    let dir = match wasm.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if wasm.exists() || !dir.join("build.sh").is_file() || !dir.join("wit").is_dir() {
        return None;
    }
    let (lang, tools) = if dir.join("hub_plugin").is_dir() {
        (
            "Python",
            "componentize-py from PyPI (Python 3.11+ with venv)",
        )
    } else if dir.join("package.json").is_file() {
        (
            "TypeScript",
            "componentize-js, esbuild and TypeScript from npm (Node.js 18+)",
        )
    } else {
        return None;
    };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    Some(format!(
        "{} is a {lang} plugin project whose `./build.sh` has not been run: run it there \
         (the first run installs {tools}), then try again",
        dir.display()
    ))
}
