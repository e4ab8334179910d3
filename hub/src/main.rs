//! The `hub` command: serve, check a configuration, provision channels and
//! agents, inspect deliveries and events, and write and try plugins.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use hub::config::Config;

mod cli;

use cli::agent::{AgentCommand, agent};
use cli::bot::{BotCommand, bot};
use cli::channel::{ChannelCommand, channel};
use cli::check::check;
use cli::deliveries::{DeliveriesCommand, deliveries};
use cli::events::{EventsCommand, events};
use cli::plugin::{PluginCommand, plugin, plugin_new};
use cli::serve::serve;

#[derive(Parser)]
#[command(
    name = "hub",
    version,
    about = "Self-hosted conversation integration hub"
)]
struct Cli {
    /// Configuration file.
    #[arg(long, global = true, default_value = "hub.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the hub until SIGTERM or Ctrl-C.
    Serve,
    /// Validate the configuration; exits non-zero with every reason found.
    Check,
    /// Manage channels.
    #[command(subcommand)]
    Channel(ChannelCommand),
    /// Manage agents.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Manage bots (providers and plugin bots).
    #[command(subcommand)]
    Bot(BotCommand),
    /// Work with plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Inspect outbound deliveries and replay dead letters.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Inspect the event log.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Compiles the plugin on standard input into a cache directory: what
    /// the hub runs in a child process of its own when a plugin is not in
    /// its cache (`runtime/cache.rs`).
    #[command(hide = true)]
    CompilePlugin {
        #[arg(long)]
        cache_dir: PathBuf,
        #[arg(long)]
        slots: u32,
    },
}

/// jemalloc instead of glibc's allocator, for Rust and (unprefixed) for
/// SQLite and every other C library of the process: the hub allocates on
/// one thread and frees on another all the time (rows made on SQLite's
/// threads are dropped on tokio's, and back), and glibc's arenas made the
/// threads wait on each other's locks (docs/performance.md, "The
/// allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    quiet_library_backtraces();
    let cli = Cli::parse();
    if let Command::CompilePlugin { cache_dir, slots } = &cli.command {
        return compile_plugin(cache_dir, *slots);
    }
    // Plugins are compiled by a child process, so that the compiler's
    // memory never stays in this one.
    if let Ok(program) = std::env::current_exe() {
        hub::runtime::compile_in_child(program);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `hub compile-plugin`: the `.wasm` on standard input into `cache_dir`;
/// a failure is one line on standard error, which the parent logs.
fn compile_plugin(cache_dir: &Path, slots: u32) -> std::process::ExitCode {
    use std::io::Read;
    let mut wasm = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut wasm) {
        eprintln!("reading the plugin: {e}");
        return std::process::ExitCode::FAILURE;
    }
    match hub::runtime::compile_into(cache_dir, slots, &wasm) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Every plugin call ends its store, and wasmtime builds an error on the way
/// that captures a backtrace whenever `RUST_BACKTRACE` is set: tens of
/// microseconds per call for nothing. Library backtraces are off unless
/// asked for with `RUST_LIB_BACKTRACE`; panics still honour `RUST_BACKTRACE`.
// SAFETY: see the call; `set_var` is sound only while no other thread exists.
#[allow(unsafe_code, reason = "`set_var` before any other thread exists")]
#[allow(
    clippy::disallowed_methods,
    reason = "the one place the hub changes its environment: first thing in `main`"
)]
fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

/// Starts the log as `[log]` asks (`RUST_LOG` overrides its level). Until
/// then nothing logs: a configuration error is the command's error.
fn init_tracing(log: &hub::config::LogConfig, file: &Path, quiet_store: bool) -> Result<()> {
    let filter = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => {
            let level = log.level.as_deref().unwrap_or("info");
            // `hub plugin test` makes a new scratch database each time: its
            // migrations would bury the plugin's own log lines.
            let store = if quiet_store { ",hub::store=warn" } else { "" };
            tracing_subscriber::EnvFilter::try_new(format!(
                "{level},{}{store}",
                hub::store::QUIET_DRIVER_LOGS
            ))
            .with_context(|| format!("{}: [log] level = {level:?}", file.display()))?
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        hub::config::LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        // The spans' fields are where the event id, channel and chat are:
        // every enclosing span is listed, not only the innermost one.
        hub::config::LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<()> {
    if let Command::Plugin(PluginCommand::New { name, dir, lang }) = &cli.command {
        init_tracing(&hub::config::LogConfig::default(), &cli.config, false)?;
        return plugin_new(*lang, name, dir.as_deref());
    }
    // Both open a scratch database, whose migrations are no news.
    let scratch = matches!(
        cli.command,
        Command::Plugin(PluginCommand::Test(_) | PluginCommand::Replay(_))
    );
    // A plugin file can be tried where there is no hub.toml at all.
    let config = match &cli.command {
        Command::Plugin(PluginCommand::Test(_)) if !cli.config.exists() => {
            Config::parse("", &cli.config).context("default configuration")?
        }
        _ => Config::load(&cli.config)?,
    };
    init_tracing(&config.log, &cli.config, scratch)?;
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Check => check(&cli.config, &config).await,
        Command::Channel(cmd) => channel(config, cmd).await,
        Command::Agent(cmd) => agent(config, cmd).await,
        Command::Bot(cmd) => bot(config, cmd).await,
        Command::Plugin(cmd) => plugin(config, cmd).await,
        Command::Deliveries(cmd) => deliveries(config, cmd).await,
        Command::Events(cmd) => events(config, cmd).await,
        // Run by `main` before the async runtime starts.
        Command::CompilePlugin { .. } => Ok(()),
    }
}
