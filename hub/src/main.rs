//! The `hub` command: serve, check a configuration, provision channels and agents.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use hub::config::Config;
use hub::core::provisioning::{self, ChannelSpec};
use hub::store::{OutboxState, Store};
use hub::tryout;

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
    /// Work with plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Inspect outbound deliveries and replay dead letters.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
}

#[derive(Subcommand)]
enum DeliveriesCommand {
    /// List deliveries in a state (default: dead letters).
    List {
        /// dead (= failed), pending, delivered, dropped.
        #[arg(long, default_value = "dead")]
        state: String,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Send dead letters again with their delivery ids; a running hub picks
    /// them up within a second.
    Replay {
        /// Delivery ids; none with --all.
        ids: Vec<String>,
        /// Every failed webhook.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Run one plugin on one recorded event; prints the outcome as JSON and
    /// the plugin's logs on stderr.
    Test {
        /// A plugin named in the configuration, or the path of a .wasm file.
        plugin: String,
        /// The event: {"kind": "channel.customer_message", "payload": {...}}.
        #[arg(long)]
        event: PathBuf,
        /// The plugin's config table as JSON or TOML (replaces the one in hub.toml).
        #[arg(long = "plugin-config")]
        plugin_config: Option<String>,
    },
}

#[derive(Subcommand)]
enum ChannelCommand {
    /// Create a channel and print its endpoint URL.
    Create {
        #[arg(long)]
        name: String,
        /// The integrator's endpoint agent messages are posted to.
        #[arg(long)]
        endpoint: String,
        /// Send agent messages with Transfer-Encoding: chunked.
        #[arg(long)]
        chunked: bool,
        /// E-mail of an agent who receives the channel's chats (repeatable).
        #[arg(long = "agent")]
        agents: Vec<String>,
        /// Receiver of the channel's event webhooks.
        #[arg(long = "webhook-url")]
        webhook_url: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List channels with their endpoint URLs.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum AgentCommand {
    /// Create an agent and print its bearer token (shown only once).
    Create {
        #[arg(long)]
        name: String,
        #[arg(long)]
        email: String,
        #[arg(long)]
        photo: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List agents.
    List {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> std::process::ExitCode {
    quiet_library_backtraces();
    init_tracing();
    let cli = Cli::parse();
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

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("info,{}", hub::store::QUIET_DRIVER_LOGS))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn run(cli: Cli) -> Result<()> {
    // A plugin file can be tried where there is no hub.toml at all.
    let config = match &cli.command {
        Command::Plugin(_) if !cli.config.exists() => {
            Config::parse("", &cli.config).context("default configuration")?
        }
        _ => Config::load(&cli.config)?,
    };
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Check => check(&cli.config, &config).await,
        Command::Channel(cmd) => channel(config, cmd).await,
        Command::Agent(cmd) => agent(config, cmd).await,
        Command::Plugin(cmd) => plugin(config, cmd).await,
        Command::Deliveries(cmd) => deliveries(config, cmd).await,
    }
}

async fn deliveries(config: Config, cmd: DeliveriesCommand) -> Result<()> {
    let store = open_store(&config).await?;
    match cmd {
        DeliveriesCommand::List { state, limit, json } => {
            let parsed = match state.as_str() {
                "dead" => Some(OutboxState::Failed),
                s => OutboxState::parse(s),
            };
            let state = parsed.with_context(|| {
                format!("state `{state}` is none of dead, failed, pending, delivered, dropped")
            })?;
            let list = store.list_deliveries(state, limit).await?;
            if json {
                out(&serde_json::to_string_pretty(&list)?)?;
            } else {
                for d in list {
                    out(&format!(
                        "{}\t{}\t{}\tattempts {}\t{}",
                        d.id,
                        d.kind,
                        d.target_url,
                        d.attempts,
                        d.last_error.unwrap_or_default()
                    ))?;
                }
            }
        }
        DeliveriesCommand::Replay { ids, all } => {
            if ids.is_empty() && !all {
                anyhow::bail!("name delivery ids, or --all for every dead letter");
            }
            let replayed = store.replay_dead(&ids, hub::clock::now_ms()).await?;
            if let Some(missing) = ids.iter().find(|id| !replayed.contains(id)) {
                anyhow::bail!("`{missing}` is not a failed delivery");
            }
            out(&format!("replayed {} deliveries", replayed.len()))?;
        }
    }
    store.close().await;
    Ok(())
}

async fn check(file: &std::path::Path, config: &Config) -> Result<()> {
    match tryout::check_plugins(config).await {
        Ok(n) => out(&format!("{}: ok ({n} plugins)", file.display())),
        Err(problems) => {
            let lines: Vec<String> = problems
                .iter()
                .map(|p| format!("{}: {p}", file.display()))
                .collect();
            anyhow::bail!("{}", lines.join("\n"))
        }
    }
}

async fn plugin(config: Config, cmd: PluginCommand) -> Result<()> {
    match cmd {
        PluginCommand::Test {
            plugin,
            event,
            plugin_config,
        } => {
            let chosen = tryout::plugin_config(&config, &plugin, plugin_config.as_deref())?;
            let outcome = tryout::run(&config, chosen, &event).await?;
            out(&serde_json::to_string_pretty(&outcome)?)
        }
    }
}

fn out(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").context("writing to stdout")
}

async fn serve(config: Config) -> Result<()> {
    let running = hub::app::start(config).await?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let stop = wait_for_stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            r = &mut stop => { r?; break; }
            _ = hangup.recv() => {
                if let Err(e) = running.reload().await {
                    tracing::error!(error = %e, "reload failed; the previous plugins stay in force");
                }
            }
        }
    }
    tracing::info!("stopping: no new requests; finishing deliveries in flight");
    running.shutdown().await;
    Ok(())
}

async fn wait_for_stop_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
    }
    Ok(())
}

async fn open_store(config: &Config) -> Result<Store> {
    hub::app::open_store(&config.storage)
        .await
        .with_context(|| format!("opening {}", config.storage.url))
}

async fn channel(config: Config, cmd: ChannelCommand) -> Result<()> {
    let store = open_store(&config).await?;
    provisioning::sync_declared(&store, &config.channels).await?;
    let secret = provisioning::path_secret(&store).await?;
    let base = config.public_base(config.server.listen);
    match cmd {
        ChannelCommand::Create {
            name,
            endpoint,
            chunked,
            agents,
            webhook_url,
            json,
        } => {
            let spec = ChannelSpec {
                name,
                customer_endpoint: endpoint,
                chunked,
                agents,
                webhook_url,
                webhook_secret: None,
            };
            let ch = provisioning::create_channel(&store, &spec, false).await?;
            let view = provisioning::view(ch, &base, &secret);
            if json {
                out(&serde_json::to_string_pretty(&view)?)?;
            } else {
                out(&format!(
                    "created channel {} (public id {})\nendpoint: {}\nstatus:   {}",
                    view.name, view.public_id, view.endpoint_url, view.status_url
                ))?;
            }
        }
        ChannelCommand::List { json } => {
            let views: Vec<_> = store
                .list_channels()
                .await?
                .into_iter()
                .map(|c| provisioning::view(c, &base, &secret))
                .collect();
            if json {
                out(&serde_json::to_string_pretty(&views)?)?;
            } else {
                for v in views {
                    out(&format!(
                        "{}\t{}\t{}\tagents: {}",
                        v.name,
                        v.endpoint_url,
                        v.customer_endpoint,
                        v.agents.join(",")
                    ))?;
                }
            }
        }
    }
    store.close().await;
    Ok(())
}

async fn agent(config: Config, cmd: AgentCommand) -> Result<()> {
    let store = open_store(&config).await?;
    match cmd {
        AgentCommand::Create {
            name,
            email,
            photo,
            json,
        } => {
            let (agent, token) =
                provisioning::create_agent(&store, &name, &email, photo.as_deref()).await?;
            if json {
                let v = serde_json::json!({ "id": agent.id, "name": agent.name,
                    "email": agent.email, "photo": agent.photo, "token": token });
                out(&serde_json::to_string_pretty(&v)?)?;
            } else {
                out(&format!(
                    "created agent {} <{}> (id {})\ntoken: {token}\nThe token is shown only now.",
                    agent.name, agent.email, agent.id
                ))?;
            }
        }
        AgentCommand::List { json } => {
            let agents = store.list_agents().await?;
            if json {
                out(&serde_json::to_string_pretty(&agents)?)?;
            } else {
                for a in agents {
                    let state = if a.online { "online" } else { "offline" };
                    out(&format!("{}\t{}\t{}\t{state}", a.id, a.name, a.email))?;
                }
            }
        }
    }
    store.close().await;
    Ok(())
}
