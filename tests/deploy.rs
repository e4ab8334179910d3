//! The deployment files of `examples/`: the systemd unit (its hardening, the
//! command line it runs, and `systemd-analyze verify` where that tool is
//! installed) and the Containerfile (a Debian slim runtime, a user of its own,
//! the plugins built and copied to the paths the shipped `hub.toml` names).
//! No container engine runs here: the Containerfile is read, not built.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::support::repo_root;

const UNIT: &str = "examples/systemd/hub.service";
const SYSTEMD_README: &str = "examples/systemd/README.md";
const CONTAINERFILE: &str = "examples/container/Containerfile";

fn read(rel: &str) -> String {
    let path = repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shipped `hub.toml`, as a TOML table.
fn shipped_config() -> toml::Table {
    read("hub.toml").parse().expect("hub.toml is TOML")
}

/// `path`, with `.` and `..` taken out (no file system access).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

// ---------------------------------------------------------------- systemd --

/// A unit file's assignments in order: (section, key, value), comments and
/// blank lines left out, continuation lines joined.
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut entries = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        let line = std::mem::take(&mut pending) + line;
        if line.starts_with('[') && line.ends_with(']') {
            section = line[1..line.len() - 1].to_owned();
        } else if let Some((key, value)) = line.split_once('=') {
            entries.push((
                section.clone(),
                key.trim().to_owned(),
                value.trim().to_owned(),
            ));
        } else {
            panic!("{UNIT}: not an assignment: {line}");
        }
    }
    entries
}

/// The value `key` has in `[section]`: the last assignment, as systemd reads it.
fn unit_value<'a>(
    entries: &'a [(String, String, String)],
    section: &str,
    key: &str,
) -> Option<&'a str> {
    entries
        .iter()
        .rev()
        .find(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v.as_str())
}

/// A systemd time span such as `30s`, `1min 30s`, `500ms` or `45` (seconds), in ms.
fn timespan_ms(value: &str) -> u64 {
    let mut total = 0;
    for part in value.split_whitespace() {
        let digits = part
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(part.len());
        let n: u64 = part[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("time span `{value}`"));
        let unit = match &part[digits..] {
            "ms" | "msec" => 1,
            "" | "s" | "sec" | "second" | "seconds" => 1_000,
            "m" | "min" | "minute" | "minutes" => 60_000,
            "h" | "hr" | "hour" | "hours" => 3_600_000,
            other => panic!("time span `{value}`: unit `{other}`"),
        };
        total += n * unit;
    }
    total
}

#[test]
fn the_systemd_unit_runs_the_hub_as_its_own_user_with_the_hardening_on() {
    let text = read(UNIT);
    let entries = unit_entries(&text);
    let service = |key: &str| unit_value(&entries, "Service", key);

    let dynamic = service("DynamicUser") == Some("yes");
    let user = service("User").unwrap_or_default();
    assert!(
        dynamic || !(user.is_empty() || user == "root" || user == "0"),
        "{UNIT}: the hub needs a user of its own (DynamicUser=yes or User=), not `{user}`"
    );
    assert_eq!(
        service("StateDirectory"),
        Some("hub"),
        "{UNIT}: StateDirectory"
    );
    assert!(
        service("ConfigurationDirectory") == Some("hub")
            || service("ExecStart").is_some_and(|e| e.contains("/etc/hub/hub.toml")),
        "{UNIT}: the configuration belongs in /etc/hub"
    );
    assert_eq!(
        service("ExecStart"),
        Some("/usr/local/bin/hub --config /etc/hub/hub.toml serve"),
        "{UNIT}: ExecStart"
    );
    assert_eq!(
        service("ExecReload"),
        Some("/bin/kill -HUP $MAINPID"),
        "{UNIT}: ExecReload"
    );

    let expected = [
        ("Restart", "on-failure"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("SystemCallArchitectures", "native"),
        ("CapabilityBoundingSet", ""),
        // wasmtime maps the machine code it compiles plugins to executable.
        ("MemoryDenyWriteExecute", "no"),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter(|(key, value)| service(key) != Some(*value))
        .map(|(key, value)| format!("{key}={value} (found {:?})", service(key)))
        .collect();
    assert!(wrong.is_empty(), "{UNIT}: expected {wrong:#?}");

    let mut families: Vec<&str> = service("RestrictAddressFamilies")
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    families.sort_unstable();
    assert_eq!(
        families,
        ["AF_INET", "AF_INET6", "AF_UNIX"],
        "{UNIT}: RestrictAddressFamilies"
    );

    // The comment above MemoryDenyWriteExecute=no says why it must stay off.
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with("MemoryDenyWriteExecute="))
        .expect("MemoryDenyWriteExecute line");
    let comment: String = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with('#'))
        .map(|l| l.to_lowercase())
        .collect();
    assert!(
        comment.contains("wasmtime") && comment.contains("jit"),
        "{UNIT}: say above MemoryDenyWriteExecute=no that wasmtime JIT-compiles: {comment:?}"
    );

    // systemd must wait for the hub's graceful shutdown (with room to spare)
    // before it kills it: the default grace and the shipped hub.toml's.
    let shipped = shipped_config()
        .get("server")
        .and_then(|s| s.get("shutdown_grace_ms"))
        .and_then(toml::Value::as_integer)
        .map_or(0, |ms| u64::try_from(ms).expect("a positive grace"));
    let grace = hub::config::ServerConfig::default()
        .shutdown_grace_ms
        .max(shipped);
    let stop = timespan_ms(service("TimeoutStopSec").expect("TimeoutStopSec"));
    assert!(
        stop > grace + 5_000,
        "{UNIT}: TimeoutStopSec ({stop} ms) must be well above the shutdown grace ({grace} ms)"
    );
    assert!(
        matches!(service("KillSignal"), None | Some("SIGTERM")),
        "{UNIT}: the hub stops gracefully on SIGTERM"
    );
}

#[test]
fn the_systemd_units_command_line_is_one_the_hub_accepts() {
    let entries = unit_entries(&read(UNIT));
    let exec = unit_value(&entries, "Service", "ExecStart").expect("ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).collect();
    // `--help` after the subcommand: clap parses everything before it the way
    // `serve` would, and exits 0 without starting a hub.
    let out = Command::new(env!("CARGO_BIN_EXE_hub"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("run hub");
    assert!(
        out.status.success(),
        "hub {} --help: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Usage: hub serve"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `systemd-analyze verify` on the unit, with ExecStart pointing at the hub
/// this test run built (verify wants the binary to exist). It needs the
/// `systemd-analyze` program, so it is ignored by a plain `cargo test`;
/// `scripts/test.sh` installs the program and runs it, and without the
/// program it fails.
#[test]
#[ignore = "needs systemd-analyze (apt-get install systemd)"]
fn systemd_analyze_verify_accepts_the_unit() {
    let probe = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "systemd-analyze is not installed (apt-get install systemd)"
    );
    let text = read(UNIT);
    let bin = env!("CARGO_BIN_EXE_hub");
    assert!(
        text.contains("ExecStart=/usr/local/bin/hub "),
        "{UNIT}: ExecStart"
    );
    let local = text.replace(
        "ExecStart=/usr/local/bin/hub ",
        &format!("ExecStart={bin} "),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let unit = dir.path().join("hub.service");
    std::fs::write(&unit, local).expect("write the unit");

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify {UNIT} failed ({}):\n{stderr}",
        out.status
    );
    // Unknown keys and bad values are only warnings (exit 0): none either.
    let unit_name = unit.display().to_string();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(&unit_name) || l.starts_with("hub.service:"))
        .collect();
    assert!(
        warnings.is_empty(),
        "systemd-analyze verify {UNIT} warns:\n{}",
        warnings.join("\n")
    );
}

/// The README's `hub.toml` for the service keeps everything the hub writes in
/// the unit's StateDirectory, the only place ProtectSystem=strict leaves it.
#[test]
fn the_systemd_readmes_configuration_writes_only_under_the_state_directory() {
    let readme = read(SYSTEMD_README);
    let toml_text: String = readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a ```toml block in the README")
        .to_owned();
    let config = hub::config::Config::parse(&toml_text, Path::new("/etc/hub/hub.toml"))
        .unwrap_or_else(|e| panic!("{SYSTEMD_README}'s hub.toml: {e}"));
    let state = Path::new("/var/lib/hub");
    let cache = normalize(&config.resolve(&config.runtime.cache_dir));
    assert!(
        cache.starts_with(state),
        "{SYSTEMD_README}: [runtime] cache_dir resolves to {}, outside {}",
        cache.display(),
        state.display()
    );
    let db = config
        .storage
        .url
        .strip_prefix("sqlite://")
        .expect("the README's example uses SQLite");
    // Relative SQLite paths are relative to the unit's WorkingDirectory.
    let db = normalize(&state.join(db.split('?').next().unwrap_or_default()));
    assert!(
        db.starts_with(state),
        "{SYSTEMD_README}: the database {} is outside {}",
        db.display(),
        state.display()
    );
    let entries = unit_entries(&read(UNIT));
    assert_eq!(
        unit_value(&entries, "Service", "WorkingDirectory"),
        Some("/var/lib/hub"),
        "{UNIT}: relative SQLite URLs must land in the state directory"
    );
}

// -------------------------------------------------------------- container --

/// One instruction of a Containerfile: its keyword (upper case) and the rest.
struct Instruction {
    keyword: String,
    args: String,
}

/// A build stage: its base image, its name, its instructions after FROM.
struct Stage {
    base: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &str) -> impl Iterator<Item = &'a str> + 'a {
        let keyword = keyword.to_owned();
        self.body
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    fn last(&self, keyword: &str) -> Option<&str> {
        self.all(keyword).last()
    }

    /// The stage's COPY instructions: (the stage copied from, sources, destination).
    fn copies(&self) -> Vec<(Option<String>, Vec<String>, String)> {
        self.all("COPY")
            .map(|args| {
                assert!(!args.starts_with('['), "COPY in JSON form: {args}");
                let mut from = None;
                let mut paths = Vec::new();
                for word in args.split_whitespace() {
                    if let Some(stage) = word.strip_prefix("--from=") {
                        from = Some(stage.to_owned());
                    } else if !word.starts_with("--") {
                        paths.push(word.to_owned());
                    }
                }
                let dest = paths.pop().expect("COPY has a destination");
                (from, paths, dest)
            })
            .collect()
    }

    fn workdir(&self) -> PathBuf {
        PathBuf::from(self.last("WORKDIR").unwrap_or("/"))
    }
}

/// The stages of a Containerfile: comments dropped, continuations joined.
fn stages(text: &str) -> Vec<Stage> {
    let mut instructions = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(rest) = trimmed.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        let whole = std::mem::take(&mut pending) + trimmed;
        let (keyword, args) = whole
            .split_once(char::is_whitespace)
            .unwrap_or((&whole, ""));
        instructions.push(Instruction {
            keyword: keyword.to_uppercase(),
            args: args.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    let mut out: Vec<Stage> = Vec::new();
    for i in instructions {
        if i.keyword == "FROM" {
            let words: Vec<&str> = i
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                [_] => None,
                _ => panic!("{CONTAINERFILE}: FROM {}", i.args),
            };
            out.push(Stage {
                base: words[0].to_owned(),
                name,
                body: Vec::new(),
            });
        } else {
            out.last_mut()
                .unwrap_or_else(|| panic!("{CONTAINERFILE}: {} before FROM", i.keyword))
                .body
                .push(i);
        }
    }
    out
}

/// An image reference without its registry part: `debian:trixie-slim`.
fn short_image(reference: &str) -> &str {
    reference
        .strip_prefix("docker.io/library/")
        .or_else(|| reference.strip_prefix("docker.io/"))
        .unwrap_or(reference)
}

/// Where each file of a COPY lands: `dest/<name>` when `dest` is a directory
/// (it ends in `/`, or there are several sources), else `dest`.
fn landings(sources: &[String], dest: &str) -> Vec<(PathBuf, PathBuf)> {
    sources
        .iter()
        .map(|src| {
            let src = PathBuf::from(src);
            let to = if dest.ends_with('/') || sources.len() > 1 {
                Path::new(dest).join(src.file_name().expect("a file name"))
            } else {
                PathBuf::from(dest)
            };
            (src, to)
        })
        .collect()
}

/// The runtime (last) stage and the stage it copies the build results from.
fn runtime_and_build(stages: &[Stage]) -> (&Stage, &Stage) {
    assert!(stages.len() >= 2, "{CONTAINERFILE}: a multi-stage build");
    let runtime = stages.last().expect("a stage");
    let from: Vec<String> = runtime
        .copies()
        .into_iter()
        .filter_map(|(f, _, _)| f)
        .collect();
    let build_name = from
        .first()
        .expect("the runtime stage copies from the build stage");
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some(build_name))
        .unwrap_or_else(|| panic!("{CONTAINERFILE}: no stage named {build_name}"));
    (runtime, build)
}

#[test]
fn the_containerfile_builds_the_plugins_and_the_hub_and_runs_them_on_debian_slim_as_a_user() {
    let text = read(CONTAINERFILE);
    let stages = stages(&text);
    let (runtime, build) = runtime_and_build(&stages);

    let base = short_image(&runtime.base);
    assert!(
        base.starts_with("debian:") && base.contains("slim"),
        "{CONTAINERFILE}: the runtime base is Debian slim, not {base}"
    );
    assert!(
        short_image(&build.base).starts_with("rust:"),
        "{CONTAINERFILE}: the build stage is a Rust image, not {}",
        build.base
    );
    // The same Debian release in both stages: the binary links its glibc.
    let release = base.trim_start_matches("debian:").trim_end_matches("-slim");
    assert!(
        build.base.ends_with(release),
        "{CONTAINERFILE}: build on {} for a {base} runtime",
        build.base
    );

    let runs: Vec<&str> = build.all("RUN").collect();
    for step in [
        "rustup target add wasm32-wasip2",
        "./scripts/build-plugins.sh",
        "cargo build --release -p hub --locked",
    ] {
        assert!(
            runs.iter().any(|r| r.contains(step)),
            "{CONTAINERFILE}: the build stage runs `{step}`: {runs:#?}"
        );
    }

    // A user of its own, and when it is given by number, the one created.
    let user = runtime.last("USER").expect("a USER in the runtime stage");
    let name = user.split(':').next().unwrap_or_default();
    assert!(
        !(name.is_empty() || name == "root" || name == "0"),
        "{CONTAINERFILE}: runs as {user}"
    );
    if name.chars().all(|c| c.is_ascii_digit()) {
        assert!(
            runtime
                .all("RUN")
                .any(|r| r.contains(&format!("--uid {name}"))),
            "{CONTAINERFILE}: USER {user}, but no user with that uid is created"
        );
    }

    assert!(
        runtime.all("ENV").any(|e| e == "HUB_LISTEN=0.0.0.0:8080"),
        "{CONTAINERFILE}: ENV HUB_LISTEN=0.0.0.0:8080"
    );
    assert!(
        runtime
            .all("EXPOSE")
            .any(|e| e.split_whitespace().any(|p| p == "8080" || p == "8080/tcp")),
        "{CONTAINERFILE}: EXPOSE 8080"
    );
    assert_eq!(
        runtime.last("STOPSIGNAL"),
        Some("SIGTERM"),
        "{CONTAINERFILE}: STOPSIGNAL"
    );
    assert!(
        runtime.all("HEALTHCHECK").all(|h| {
            !h.contains("curl")
                || runtime
                    .all("RUN")
                    .any(|r| r.contains("install") && r.contains("curl"))
        }),
        "{CONTAINERFILE}: a HEALTHCHECK with curl, which Debian slim does not have"
    );
}

#[test]
fn the_containerfile_copies_every_plugin_the_shipped_hub_toml_names_to_where_it_looks() {
    let text = read(CONTAINERFILE);
    let stages = stages(&text);
    let (runtime, build) = runtime_and_build(&stages);
    let build_name = build.name.as_deref().expect("a named build stage");

    // The command: `hub --config <file> serve`, the binary from the build.
    let argv: Vec<String> = [runtime.last("ENTRYPOINT"), runtime.last("CMD")]
        .into_iter()
        .flatten()
        .flat_map(|json| {
            serde_json::from_str::<Vec<String>>(json)
                .unwrap_or_else(|e| panic!("{CONTAINERFILE}: `{json}` in exec (JSON) form: {e}"))
        })
        .collect();
    assert_eq!(argv.last().map(String::as_str), Some("serve"), "{argv:?}");
    let config_at = argv
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| argv.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| runtime.workdir().join("hub.toml"));

    let copies = runtime.copies();
    let from_build: Vec<(PathBuf, PathBuf)> = copies
        .iter()
        .filter(|(from, _, _)| from.as_deref() == Some(build_name))
        .flat_map(|(_, sources, dest)| landings(sources, dest))
        .collect();
    let bin = Path::new(&argv[0]);
    let build_dir = build.workdir();
    assert!(
        from_build
            .iter()
            .any(|(src, to)| to == bin && *src == build_dir.join("target/release/hub")),
        "{CONTAINERFILE}: {} is the hub the build stage built: {from_build:#?}",
        bin.display()
    );
    // The shipped hub.toml, from the build context, where --config names it.
    let from_context: Vec<(PathBuf, PathBuf)> = copies
        .iter()
        .filter(|(from, _, _)| from.is_none())
        .flat_map(|(_, sources, dest)| landings(sources, dest))
        .collect();
    assert!(
        from_context
            .iter()
            .any(|(src, to)| src == Path::new("hub.toml") && *to == config_at),
        "{CONTAINERFILE}: the shipped hub.toml is copied to {}: {from_context:#?}",
        config_at.display()
    );

    // build-plugins.sh builds into <repository>/target/plugins/wasm32-wasip2/release,
    // the directory the shipped hub.toml's relative plugin paths point into.
    let script = read("scripts/build-plugins.sh");
    assert!(
        script.contains("--target-dir \"$root/target/plugins\"")
            && script.contains("--target wasm32-wasip2"),
        "scripts/build-plugins.sh no longer builds into target/plugins/wasm32-wasip2"
    );
    let config = shipped_config();
    let plugins = config
        .get("plugins")
        .and_then(toml::Value::as_array)
        .expect("the shipped hub.toml has [[plugins]]");
    assert!(!plugins.is_empty());
    let config_dir = config_at.parent().expect("a directory").to_owned();
    for plugin in plugins {
        let name = plugin
            .get("name")
            .and_then(toml::Value::as_str)
            .expect("plugin name");
        let path = plugin
            .get("path")
            .and_then(toml::Value::as_str)
            .expect("plugin path");
        assert!(
            Path::new(path).is_relative()
                && path.starts_with("target/plugins/wasm32-wasip2/release/"),
            "hub.toml: plugin {name} at {path}, not where build-plugins.sh puts it"
        );
        let built = normalize(&build_dir.join(path));
        let wanted = normalize(&config_dir.join(path));
        assert!(
            from_build
                .iter()
                .any(|(src, to)| normalize(src) == built && normalize(to) == wanted),
            "{CONTAINERFILE}: plugin {name}: {} (built) is not copied to {} (where hub.toml looks)",
            built.display(),
            wanted.display()
        );
    }

    // What the hub writes (the SQLite file, relative to the working directory,
    // and the plugin cache, relative to hub.toml) is on a volume the user owns.
    let volumes: Vec<PathBuf> = runtime
        .all("VOLUME")
        .flat_map(|v| match serde_json::from_str::<Vec<String>>(v) {
            Ok(list) => list,
            Err(_) => v.split_whitespace().map(str::to_owned).collect(),
        })
        .map(PathBuf::from)
        .collect();
    let url = config
        .get("storage")
        .and_then(|s| s.get("url"))
        .and_then(toml::Value::as_str)
        .unwrap_or("sqlite://data/hub.db");
    let db = url
        .strip_prefix("sqlite://")
        .expect("the shipped hub.toml uses SQLite");
    let cache = config
        .get("runtime")
        .and_then(|r| r.get("cache_dir"))
        .and_then(toml::Value::as_str)
        .unwrap_or("data/plugin-cache");
    for (what, path) in [
        ("the database", normalize(&runtime.workdir().join(db))),
        ("the plugin cache", normalize(&config_dir.join(cache))),
    ] {
        let volume = volumes
            .iter()
            .find(|v| path.starts_with(v))
            .unwrap_or_else(|| {
                panic!(
                    "{CONTAINERFILE}: {what} ({}) is on no VOLUME {volumes:?}",
                    path.display()
                )
            });
        let volume = volume.display().to_string();
        assert!(
            runtime
                .all("RUN")
                .any(|r| r.contains("chown") && r.contains(&volume)),
            "{CONTAINERFILE}: {volume} is not given to the hub's user before it becomes a volume"
        );
    }
}

/// The build stage copies every workspace member and every file the hub's
/// sources include from outside `hub/` (the image is not built here, so a
/// file left out would only show on a real build).
#[test]
fn the_containerfiles_build_stage_has_every_source_the_build_reads() {
    let text = read(CONTAINERFILE);
    let stages = stages(&text);
    let (_, build) = runtime_and_build(&stages);
    let copied: Vec<PathBuf> = build
        .copies()
        .into_iter()
        .filter(|(from, _, _)| from.is_none())
        .flat_map(|(_, sources, _)| sources)
        .map(|s| normalize(Path::new(&s)))
        .collect();
    let covered = |rel: &Path| copied.iter().any(|c| rel.starts_with(c));

    let root = repo_root();
    let manifest: toml::Table = read("Cargo.toml").parse().expect("Cargo.toml");
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("members");
    let mut needed: Vec<PathBuf> = vec![
        "Cargo.toml".into(),
        "Cargo.lock".into(),
        "scripts/build-plugins.sh".into(),
        "plugins".into(),
        "tests/plugins".into(),
    ];
    needed.extend(
        members
            .iter()
            .map(|m| PathBuf::from(m.as_str().expect("member"))),
    );

    let mut stack = vec![root.join("hub/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read hub/src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("a source file");
            for macro_ in ["include_str!(\"", "include_bytes!(\""] {
                for rest in source.split(macro_).skip(1) {
                    let target = rest.split('"').next().unwrap_or_default();
                    let file = normalize(&path.parent().expect("dir").join(target));
                    if let Ok(rel) = file.strip_prefix(&root)
                        && !rel.starts_with("hub")
                    {
                        needed.push(rel.to_owned());
                    }
                }
            }
        }
    }
    let missing: Vec<&PathBuf> = needed.iter().filter(|n| !covered(n)).collect();
    assert!(
        missing.is_empty(),
        "{CONTAINERFILE}: the build stage does not copy {missing:?} (it copies {copied:?})"
    );
}
