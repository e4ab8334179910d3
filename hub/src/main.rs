//! The `hub` command: serve, check a configuration, provision channels and
//! agents, inspect deliveries and events, and write and try plugins.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use hub::config::Config;
use hub::core::provisioning::{self, BotSpec, ChannelSpec};
use hub::store::ChannelKind;
use hub::store::bots::BotTarget;
use hub::store::{OutboxState, Store};
use hub::{scaffold, tryout};

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

#[derive(Subcommand)]
enum EventsCommand {
    /// Print one logged event as JSON.
    Show {
        /// The event's id (a UUID, as in logs and delivery results).
        id: String,
        /// Print it as an event file for `hub plugin test`.
        #[arg(long)]
        as_event: bool,
    },
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
    /// Write a new plugin project that builds and passes `hub plugin test` as it is.
    New {
        /// The plugin's name: letters, digits, `-` and `_`, starting with a letter.
        name: String,
        /// Where to write the project (default: ./NAME); must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The plugin's language: rust (a crate), python or typescript (a
        /// project that `./build.sh` builds into NAME.wasm).
        #[arg(long, default_value = "rust")]
        lang: scaffold::Lang,
    },
    /// Run one plugin on one recorded event; prints the outcome as JSON and
    /// the plugin's logs on stderr.
    Test(TestArgs),
    /// Print a plugin's key-value data from the hub's database.
    Kv {
        /// The plugin's name in hub.toml (its key-value namespace).
        name: String,
        /// One JSON object per line: {"key", "value", "updated_at"}.
        #[arg(long)]
        json: bool,
    },
    /// Run a candidate plugin on recorded events and compare each outcome
    /// with what the live plugin did; the hub's database is only read.
    Replay(ReplayArgs),
    /// Make a shadow plugin live in place of the plugin it shadows: edits
    /// the configuration file; a reload (SIGHUP) puts it in force.
    Promote {
        /// The shadow plugin's name.
        name: String,
    },
}

#[derive(Args)]
struct ReplayArgs {
    /// A plugin named in the configuration, or the path of a .wasm file.
    plugin: String,
    /// The candidate's config table as JSON or TOML (replaces the one in hub.toml).
    #[arg(long = "plugin-config")]
    plugin_config: Option<String>,
    /// The live plugin to compare with (default: the candidate's name).
    #[arg(long)]
    against: Option<String>,
    /// Events of the last DURATION (`90s`, `30m`, `24h`, `7d`).
    #[arg(long, conflicts_with_all = ["from", "to"])]
    since: Option<String>,
    /// Events from this id on (ids are time-ordered).
    #[arg(long)]
    from: Option<String>,
    /// Events up to this id.
    #[arg(long)]
    to: Option<String>,
    /// Events of this kind only.
    #[arg(long)]
    kind: Option<String>,
    /// Events of the channel of this name only.
    #[arg(long)]
    channel: Option<String>,
    /// Events at most.
    #[arg(long)]
    limit: Option<u64>,
    /// Print each differing event with its changes.
    #[arg(long)]
    diff: bool,
    /// The summary (and differences) as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TestArgs {
    /// A plugin named in the configuration, or the path of a .wasm file.
    plugin: String,
    /// The event file: {"kind": "channel.customer_message", "payload": {...}}.
    #[arg(required_unless_present = "event", conflicts_with = "event")]
    event_file: Option<PathBuf>,
    /// The event file, as a flag.
    #[arg(long, value_name = "EVENT_FILE")]
    event: Option<PathBuf>,
    /// The plugin's config table as JSON or TOML (replaces the one in hub.toml).
    #[arg(long = "plugin-config")]
    plugin_config: Option<String>,
    /// Grant the plugin this destination (repeatable); it gets no other.
    /// Without a hub.toml destination of that name, a stand-in records its sends.
    #[arg(long = "grant", value_name = "NAME")]
    grants: Vec<String>,
    /// Really send to granted destinations of hub.toml, with their headers;
    /// otherwise every `send` is answered 200 {} and printed.
    #[arg(long)]
    live_send: bool,
    /// Rebuild the crate in the current directory (cargo build --release
    /// --target wasm32-wasip2) and run again whenever src/ changes.
    #[arg(long)]
    watch: bool,
}

#[derive(Subcommand)]
enum ChannelCommand {
    /// Create a channel and print its endpoint URL.
    Create {
        #[arg(long)]
        name: String,
        /// `custom` (an integrator's server) or `widget` (the hub's script in
        /// visitors' browsers).
        #[arg(long = "type", default_value = "custom")]
        kind: String,
        /// The integrator's endpoint agent messages are posted to (custom channels).
        #[arg(long, default_value = "")]
        endpoint: String,
        /// A widget's id as pages embed it (random when not given).
        #[arg(long = "widget-id")]
        widget_id: Option<String>,
        /// A widget's colour, `#rrggbb`.
        #[arg(long)]
        color: Option<String>,
        /// An origin allowed to use the widget (repeatable; none: any).
        #[arg(long = "allowed-origin")]
        allowed_origins: Vec<String>,
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
enum BotCommand {
    /// Connect a bot and print the URLs its provider posts to. A running
    /// hub sees it after SIGHUP (the admin API takes effect at once).
    Create {
        /// Shown to customers and agents as the sender.
        #[arg(long)]
        name: String,
        /// The provider's URL; the hub posts to `<endpoint>/<token>`.
        #[arg(long, requires = "token", conflicts_with = "plugin")]
        endpoint: Option<String>,
        /// The provider's token.
        #[arg(long, requires = "endpoint")]
        token: Option<String>,
        /// A plugin that is the bot, instead of a provider.
        #[arg(long)]
        plugin: Option<String>,
        /// The id in the provider's URLs (random when not given).
        #[arg(long = "provider-id")]
        provider_id: Option<String>,
        /// A channel whose new chats start with this bot (repeatable).
        #[arg(long = "channel")]
        channels: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// List bots with the URLs their providers post to.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a bot (by id, name or provider id); its URLs answer 404.
    Delete { bot: String },
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
        /// Read a console password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        /// Let the agent use the admin API from the console.
        #[arg(long)]
        admin: bool,
        #[arg(long)]
        json: bool,
    },
    /// List agents.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Set an agent's console password (ends its console sessions).
    SetPassword {
        #[arg(long)]
        email: String,
        /// Read the password from the first line of standard input.
        #[arg(long, required = true)]
        password_stdin: bool,
    },
}

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

async fn events(config: Config, cmd: EventsCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let EventsCommand::Show { id, as_event } = cmd;
    let event = store
        .event_by_id(&id)
        .await?
        .with_context(|| format!("no event has the id `{id}`"))?;
    let outcomes = store.outcomes_of(&id).await?;
    let text = if as_event {
        let channel = match event.channel_id {
            Some(channel_id) => store.channel_by_id(channel_id).await?.map(|c| c.name),
            None => None,
        };
        let mut file = tryout::EventFile::of(&event, channel);
        // Plugins see the channel's agents online when the event passes; the
        // log does not keep that, so the file gets today's count.
        if let Some(channel_id) = event.channel_id {
            let online = store.channel_online_agents(channel_id).await?;
            file.context = Some(serde_json::json!({ "agents_online": online }));
            eprintln!(
                "note: context.agents_online is the channel's count now ({online}), not when the event passed"
            );
        }
        serde_json::to_string_pretty(&file)?
    } else {
        // What each plugin of the live chain did, so "which plugin changed
        // this message?" has an answer.
        let mut value = serde_json::to_value(&event)?;
        value["outcomes"] = outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "plugin": o.plugin,
                    "verdict": o.verdict,
                    "payload_hash": o.payload_hash,
                    "forwards": o.forwards,
                    "error_kind": o.error_kind,
                })
            })
            .collect();
        serde_json::to_string_pretty(&value)?
    };
    store.close().await;
    out(&text)
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
    let mut checked = tryout::check_plugins(config).await;
    // The GeoIP file must be a database the hub can read, not only a file.
    if let Some(db) = &config.geoip.database
        && let Err(e) = hub::http::geoip::GeoIp::open(&config.resolve(db))
    {
        let problem = format!("geoip.database: {e}");
        match &mut checked {
            Ok(_) => checked = Err(vec![problem]),
            Err(problems) => problems.push(problem),
        }
    }
    // A PostgreSQL URL is checked by connecting (within the connect
    // timeout, at most 2 minutes): a wrong host, port, database or password
    // shows here rather than at the first start.
    if config.storage.url.starts_with("postgres")
        && let Err(e) =
            hub::store::probe_postgres(&config.storage.url, config.storage.connect_timeout()).await
    {
        let key = match config.env.get(hub::config::ENV_DATABASE_URL) {
            Some(_) => format!("storage.url ({})", hub::config::ENV_DATABASE_URL),
            None => "storage.url".to_owned(),
        };
        let problem = format!("{key}: {e}");
        match &mut checked {
            Ok(_) => checked = Err(vec![problem]),
            Err(problems) => problems.push(problem),
        }
    }
    match checked {
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
        PluginCommand::New { name, dir, lang } => plugin_new(lang, &name, dir.as_deref()),
        PluginCommand::Test(args) if args.watch => watch(&config, &args).await,
        PluginCommand::Test(args) => test_once(&config, &args).await,
        PluginCommand::Kv { name, json } => plugin_kv(&config, &name, json).await,
        PluginCommand::Replay(args) => plugin_replay(&config, args).await,
        PluginCommand::Promote { name } => plugin_promote(&config, &name),
    }
}

async fn plugin_replay(config: &Config, args: ReplayArgs) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let since = match &args.since {
        Some(text) => {
            let back = parse_age(text).with_context(|| format!("--since `{text}`"))?;
            let back = i64::try_from(back.as_millis()).unwrap_or(i64::MAX);
            Some(hub::clock::now_ms().saturating_sub(back))
        }
        None => None,
    };
    let request = tryout::replay::Request {
        plugin: args.plugin,
        plugin_config: args.plugin_config,
        against: args.against,
        filter: hub::store::outcomes::LogFilter {
            since,
            from: args.from,
            to: args.to,
            kind: args.kind,
            channel_id: None,
        },
        channel: args.channel,
        limit: args.limit,
        diff: args.diff,
    };
    // Ctrl-C ends the replay with the summary of what was done.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            flag.store(true, Ordering::Relaxed);
        }
    });
    let tty = std::io::stderr().is_terminal();
    let mut progress = |done: u64, limit: Option<u64>| {
        if tty {
            let of = limit.map_or_else(String::new, |l| format!(" of {l}"));
            eprint!("\r{done}{of} events replayed");
        }
    };
    let summary = tryout::replay::replay(config, &request, &stop, &mut progress).await?;
    if tty {
        eprint!("\r\x1b[2K");
    }
    if args.json {
        return out(&serde_json::to_string_pretty(&summary)?);
    }
    let mut text = String::new();
    for d in &summary.differences {
        text.push_str(&format!(
            "--- {} {} ({}{})\n",
            d.event_id,
            d.kind,
            serde_json::to_value(d.result)?.as_str().unwrap_or_default(),
            d.error_kind
                .as_deref()
                .map(|k| format!(": {k}"))
                .unwrap_or_default()
        ));
        for c in &d.changes {
            text.push_str(&format!(
                "  {}\n    - live:      {}\n    + candidate: {}\n",
                c["path"].as_str().unwrap_or_default(),
                c["live"],
                c["candidate"]
            ));
        }
    }
    text.push_str(&tryout::replay::render(&summary));
    out(&text)
}

/// `90s`, `30m`, `24h`, `7d`.
fn parse_age(text: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n: u64 = n
        .parse()
        .context("a number and a unit: 90s, 30m, 24h, 7d")?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("the unit is one of s, m, h, d"),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

fn plugin_promote(config: &Config, name: &str) -> Result<()> {
    let file = config
        .source
        .clone()
        .context("promote edits the configuration file; none was read")?;
    let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
    let (new_text, said) =
        tryout::promote::promote(config, &text, name).map_err(anyhow::Error::msg)?;
    // The edited file must load as the old one did, or it is not written.
    Config::parse(&new_text, &file).context("the edited configuration")?;
    let tmp = file.with_extension("toml.promote");
    std::fs::write(&tmp, &new_text).with_context(|| tmp.display().to_string())?;
    std::fs::rename(&tmp, &file).with_context(|| file.display().to_string())?;
    let mut text = said.join("\n");
    text.push_str(&format!(
        "\n{} written; reload the hub to put it in force (SIGHUP: `systemctl reload hub` or `kill -HUP <pid>`)",
        file.display()
    ));
    out(&text)
}

fn plugin_new(lang: scaffold::Lang, name: &str, dir: Option<&Path>) -> Result<()> {
    let dir = dir.map_or_else(|| PathBuf::from(name), Path::to_owned);
    let written = scaffold::new_plugin_in(lang, name, &dir)?;
    let mut text = format!("created plugin `{name}` in {}:\n", written.dir.display());
    for file in &written.files {
        text.push_str(&format!("  {file}\n"));
    }
    if written.plugin_api_missing {
        text.push_str(&format!(
            "warning: {} (the plugin-api this hub was built with) is missing: point the \
             plugin-api dependency in Cargo.toml at your checkout of the hub\n",
            written.plugin_api.display()
        ));
    }
    if lang == scaffold::Lang::Rust {
        text.push_str(&format!(
            "next, in {} (once: rustup target add wasm32-wasip2):\n  cargo test\n  \
             cargo build --release --target wasm32-wasip2\n  \
             hub plugin test {} events/customer_message.json",
            written.dir.display(),
            written.wasm
        ));
    } else {
        text.push_str(&format!(
            "next, in {} (the first run installs the pinned tools):\n  ./build.sh test\n  \
             ./build.sh\n  hub plugin test {} --event event.json",
            written.dir.display(),
            written.wasm
        ));
    }
    out(&text)
}

async fn plugin_kv(config: &Config, name: &str, json: bool) -> Result<()> {
    let store = open_store(config).await?;
    let entries = store.kv_entries(name).await;
    store.close().await;
    let entries = entries?;
    if entries.is_empty() && !config.plugins.iter().any(|p| p.name == name) {
        eprintln!("note: no plugin of the configuration is named `{name}`");
    }
    for e in entries {
        if json {
            out(&serde_json::to_string(&e)?)?;
        } else {
            out(&format!("{}\t{}", one_line(&e.key), one_line(&e.value)))?;
        }
    }
    Ok(())
}

/// Control characters escaped, so one entry stays one line of the table.
fn one_line(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// One `hub plugin test`: notes (stubbed sends, grants) and the plugin's
/// logs on stderr, the outcome on stdout.
async fn test_once(config: &Config, args: &TestArgs) -> Result<()> {
    let event = args
        .event_file
        .as_ref()
        .or(args.event.as_ref())
        .context("name the event file")?;
    let chosen = tryout::plugin_config(config, &args.plugin, args.plugin_config.as_deref())?;
    let grants = tryout::Grants {
        names: args.grants.clone(),
        live_send: args.live_send,
    };
    let mut notes = Vec::new();
    let outcome = tryout::run(config, chosen, event, &grants, &mut notes).await;
    for note in notes {
        eprintln!("note: {note}");
    }
    out(&serde_json::to_string_pretty(&outcome?)?)
}

/// `--watch`: runs once, then polls the crate's sources and the event file
/// every 500 ms; a change in the sources rebuilds the component first.
async fn watch(config: &Config, args: &TestArgs) -> Result<()> {
    let dir = std::env::current_dir().context("the current directory")?;
    if !dir.join("Cargo.toml").is_file() {
        anyhow::bail!(
            "--watch rebuilds the plugin crate in the current directory, and {} has no Cargo.toml",
            dir.display()
        );
    }
    let event = args.event_file.as_ref().or(args.event.as_ref());
    let mut seen = Stamps::of(&dir, event.map(PathBuf::as_path));
    report(test_once(config, args).await);
    eprintln!(
        "watching {} for changes (Ctrl-C ends)",
        dir.join("src").display()
    );
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            r = tokio::signal::ctrl_c() => return r.context("waiting for Ctrl-C"),
        }
        let now = Stamps::of(&dir, event.map(PathBuf::as_path));
        if now == seen {
            continue;
        }
        let rebuild = now.sources != seen.sources;
        seen = now;
        if rebuild {
            eprintln!("change in the sources: cargo build --release --target wasm32-wasip2");
            let status = tokio::process::Command::new("cargo")
                .args(["build", "--release", "--target", "wasm32-wasip2"])
                .current_dir(&dir)
                .status()
                .await
                .context("running cargo")?;
            if !status.success() {
                eprintln!("the build failed; waiting for the next change");
                continue;
            }
        }
        report(test_once(config, args).await);
    }
}

fn report(result: Result<()>) {
    if let Err(e) = result {
        eprintln!("error: {e:#}");
    }
}

/// Modification times of what `--watch` follows.
#[derive(PartialEq, Eq)]
struct Stamps {
    /// `Cargo.toml` and every file under `src/`.
    sources: Vec<(PathBuf, Option<SystemTime>)>,
    event: Option<SystemTime>,
}

impl Stamps {
    fn of(dir: &Path, event: Option<&Path>) -> Stamps {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let mut sources = vec![(dir.join("Cargo.toml"), modified(&dir.join("Cargo.toml")))];
        let mut stack = vec![dir.join("src")];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for path in entries.flatten().map(|e| e.path()) {
                if path.is_dir() {
                    stack.push(path);
                } else {
                    sources.push((path.clone(), modified(&path)));
                }
            }
        }
        sources.sort();
        Stamps {
            sources,
            event: event.and_then(modified),
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
        .with_context(|| format!("opening {}", hub::store::redacted_url(&config.storage.url)))
}

async fn channel(config: Config, cmd: ChannelCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let outbound = config.outbound.policy();
    provisioning::sync_declared(&store, &config.channels, &outbound).await?;
    let secret = provisioning::path_secret(&store).await?;
    let base = config.public_base(config.server.listen);
    match cmd {
        ChannelCommand::Create {
            name,
            kind,
            widget_id,
            color,
            allowed_origins,
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
                kind: match kind.as_str() {
                    "custom" => ChannelKind::Custom,
                    "widget" => ChannelKind::Widget,
                    other => anyhow::bail!("--type: `{other}` is neither custom nor widget"),
                },
                widget_id,
                color,
                allowed_origins,
                calls: None,
            };
            let ch = provisioning::create_channel(&store, &spec, false, &outbound).await?;
            let view = provisioning::view(ch, &base, &secret);
            if json {
                out(&serde_json::to_string_pretty(&view)?)?;
            } else {
                match &view.widget {
                    Some(w) => out(&format!(
                        "created widget {} (widget id {})\nembed: {}\ndemo:  {}",
                        view.name, w.widget_id, w.embed, w.demo_url
                    ))?,
                    None => out(&format!(
                        "created channel {} (public id {})\nendpoint: {}\nstatus:   {}",
                        view.name, view.public_id, view.endpoint_url, view.status_url
                    ))?,
                }
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

async fn bot(config: Config, cmd: BotCommand) -> Result<()> {
    let store = open_store(&config).await?;
    let outbound = config.outbound.policy();
    provisioning::sync_declared_bots(&store, &config.bots, &outbound).await?;
    let base = config.public_base(config.server.listen);
    match cmd {
        BotCommand::Create {
            name,
            endpoint,
            token,
            plugin,
            provider_id,
            channels,
            json,
        } => {
            let target = match (endpoint, token, plugin) {
                (Some(endpoint), Some(token), None) => BotTarget::Provider {
                    endpoint,
                    token,
                    auth: None,
                },
                (None, None, Some(plugin)) => BotTarget::Plugin(plugin),
                _ => anyhow::bail!("give either --endpoint and --token, or --plugin"),
            };
            let spec = BotSpec {
                name,
                provider_id,
                target,
                channels,
            };
            let bot = provisioning::create_bot(&store, &spec, false, &outbound).await?;
            let view = provisioning::bot_view(&bot, &base);
            if json {
                out(&serde_json::to_string_pretty(&view)?)?;
            } else {
                let mut text = format!(
                    "created bot {} (provider id {})",
                    view.name, view.provider_id
                );
                if let (Some(w), Some(p)) = (&view.webhooks_url, &view.providers_url) {
                    text.push_str(&format!("\nwebhooks:  {w}\nproviders: {p}"));
                }
                out(&text)?;
            }
        }
        BotCommand::List { json } => {
            let views: Vec<_> = store
                .list_bots()
                .await?
                .iter()
                .map(|b| provisioning::bot_view(b, &base))
                .collect();
            if json {
                out(&serde_json::to_string_pretty(&views)?)?;
            } else {
                for v in views {
                    let target = v
                        .webhooks_url
                        .clone()
                        .or_else(|| v.plugin.as_ref().map(|p| format!("plugin {p}")))
                        .unwrap_or_default();
                    out(&format!(
                        "{}\t{}\t{}\tchannels: {}",
                        v.name,
                        v.provider_id,
                        target,
                        v.channels.join(",")
                    ))?;
                }
            }
        }
        BotCommand::Delete { bot } => {
            let Some(found) = provisioning::find_bot(&store, &bot).await? else {
                anyhow::bail!("no bot `{bot}`");
            };
            store.delete_bot(found.id).await?;
            out(&format!("deleted bot {}", found.name))?;
        }
    }
    // Hubs running on a PostgreSQL database reload their bots now.
    if let Err(e) = hub::core::live::announce_bots_changed(&store).await {
        tracing::warn!(error = %e, "running hubs were not told of the change; a reload (SIGHUP) picks it up");
    }
    store.close().await;
    Ok(())
}

/// The first line of standard input, without its line ending: how passwords
/// reach the command line without landing in shell history or `ps`.
fn password_from_stdin() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        anyhow::bail!("no password on standard input (--password-stdin reads its first line)");
    }
    Ok(password)
}

async fn agent(config: Config, cmd: AgentCommand) -> Result<()> {
    let store = open_store(&config).await?;
    match cmd {
        AgentCommand::Create {
            name,
            email,
            photo,
            password_stdin,
            admin,
            json,
        } => {
            let password = if password_stdin {
                Some(password_from_stdin()?)
            } else {
                None
            };
            let spec = provisioning::AgentSpec {
                name,
                email,
                photo,
                password,
                admin,
            };
            let (agent, token) = provisioning::create_agent(&store, &spec).await?;
            if json {
                let v = serde_json::json!({ "id": agent.id, "name": agent.name,
                    "email": agent.email, "photo": agent.photo, "admin": agent.admin, "token": token });
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
                    let admin = if a.admin { "\tadmin" } else { "" };
                    out(&format!(
                        "{}\t{}\t{}\t{state}{admin}",
                        a.id, a.name, a.email
                    ))?;
                }
            }
        }
        AgentCommand::SetPassword {
            email,
            password_stdin: _,
        } => {
            let password = password_from_stdin()?;
            let Some(agent) = store.agent_by_email(&email).await? else {
                anyhow::bail!("no agent has the e-mail `{email}`");
            };
            hub::core::accounts::set_password(&store, agent.id, &password).await?;
            out(&format!(
                "set the console password of {} <{}>; its console sessions have ended",
                agent.name, agent.email
            ))?;
        }
    }
    store.close().await;
    Ok(())
}
