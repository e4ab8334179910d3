//! `hub plugin new/test/kv/replay/promote`: writing and trying plugins.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use hub::config::Config;
use hub::{scaffold, tryout};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{open_store, out};

#[derive(Subcommand)]
pub(crate) enum PluginCommand {
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
pub(crate) struct ReplayArgs {
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
pub(crate) struct TestArgs {
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

pub(crate) async fn plugin(config: Config, cmd: PluginCommand) -> Result<()> {
    match cmd {
        PluginCommand::New { name, dir, lang } => plugin_new(lang, &name, dir.as_deref()),
        PluginCommand::Test(args) if args.watch => watch(&config, &args).await,
        PluginCommand::Test(args) => test_once(&config, &args).await,
        PluginCommand::Kv { name, json } => plugin_kv(&config, &name, json).await,
        PluginCommand::Replay(args) => plugin_replay(&config, args).await,
        PluginCommand::Promote { name } => plugin_promote(&config, &name),
    }
}

pub(crate) async fn plugin_replay(config: &Config, args: ReplayArgs) -> Result<()> {
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
pub(crate) fn parse_age(text: &str) -> Result<Duration> {
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

pub(crate) fn plugin_promote(config: &Config, name: &str) -> Result<()> {
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

pub(crate) fn plugin_new(lang: scaffold::Lang, name: &str, dir: Option<&Path>) -> Result<()> {
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

pub(crate) async fn plugin_kv(config: &Config, name: &str, json: bool) -> Result<()> {
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
pub(crate) fn one_line(text: &str) -> String {
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
pub(crate) async fn test_once(config: &Config, args: &TestArgs) -> Result<()> {
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
pub(crate) async fn watch(config: &Config, args: &TestArgs) -> Result<()> {
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

pub(crate) fn report(result: Result<()>) {
    if let Err(e) = result {
        eprintln!("error: {e:#}");
    }
}

/// Modification times of what `--watch` follows.
#[derive(PartialEq, Eq)]
pub(crate) struct Stamps {
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
