//! The plugin wiring of `hub.toml`: plugins, destinations, routes and the
//! runtime they share, with the checks that tie them together.

use std::collections::HashSet;
use std::path::PathBuf;

use http::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::{Config, Env, is_http_url, line_at};

/// The plugin runtime shared by every plugin.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Where compiled plugins are kept so a restart does not compile them again.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
    /// Plugin calls running at once; further calls wait for a slot.
    #[serde(default = "default_max_concurrent_calls")]
    pub max_concurrent_calls: u32,
    /// Linear memory of all plugin calls running at once, together: a
    /// call that would grow past it fails as `memory`.
    #[serde(default = "default_max_memory_mb")]
    pub max_memory_mb: u32,
}

/// A WebAssembly plugin and what it is granted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    pub name: String,
    /// The `.wasm` component, relative to the configuration file.
    pub path: PathBuf,
    /// Handed to the plugin as a JSON object through the `config` import.
    #[serde(default)]
    pub config: toml::Table,
    /// Wall-clock bound of one call, host calls included.
    #[serde(default = "default_plugin_timeout_ms")]
    pub timeout_ms: u64,
    /// Largest linear memory of one call.
    #[serde(default = "default_plugin_memory_mb")]
    pub memory_mb: u32,
    /// Largest payload, reply and forwards of one call together.
    #[serde(default = "default_plugin_max_output_bytes")]
    pub max_output_bytes: usize,
    /// Host calls one call may make.
    #[serde(default = "default_plugin_max_host_calls")]
    pub max_host_calls: u32,
    /// Destinations the plugin may `send` or forward to.
    #[serde(default)]
    pub destinations: Vec<String>,
    /// Whether the plugin gets a key-value namespace of its own.
    #[serde(default)]
    pub kv: bool,
    /// Long calls (still running after one epoch tick) of this plugin that
    /// may run at once; another long call waits (within its `timeout_ms`).
    /// Fewer than the machine's cores, so that a plugin that burns CPU leaves
    /// the rest of the hub a core; short calls never wait.
    #[serde(default = "default_plugin_max_concurrency")]
    pub max_concurrency: u32,
    /// Seconds of call time the events of one channel may take of this
    /// plugin per second (1.0 is one core's worth); past it, that channel's
    /// next calls wait (within `timeout_ms`, else they fail as `busy`). A
    /// flood of short, heavy calls on one channel so leaves the other
    /// channels their cores.
    #[serde(default = "default_plugin_time_share")]
    pub time_share: f64,
    /// Forwards one call may make.
    #[serde(default = "default_plugin_max_forwards")]
    pub max_forwards: usize,
    /// Keys the plugin may keep in its key-value namespace.
    #[serde(default = "default_plugin_kv_max_keys")]
    pub kv_max_keys: u64,
    /// Bytes (keys and values) the plugin may keep.
    #[serde(default = "default_plugin_kv_max_bytes")]
    pub kv_max_bytes: u64,
    /// Distinct keys one call may set or delete.
    #[serde(default = "default_plugin_kv_max_writes_per_call")]
    pub kv_max_writes_per_call: usize,
    /// Bytes (keys and values) one call may write.
    #[serde(default = "default_plugin_kv_max_bytes_per_call")]
    pub kv_max_bytes_per_call: usize,
    /// Whether the hub refuses to start (or reload) without this plugin.
    /// Unset: required when a `reject` route uses it (see
    /// [`Config::plugin_required`]).
    #[serde(default)]
    pub required: Option<bool>,
    /// For a shadow plugin (a route's `shadow`): the live plugin of that
    /// route it is a candidate for. It then sees what that plugin saw and
    /// is compared with what it did; `hub plugin promote` puts it in its place.
    #[serde(default)]
    pub shadows: Option<String>,
    /// Where the entry is written. Filled by loading only.
    #[serde(skip)]
    pub lines: EntryLines,
}

/// Lines (from 1) of a `[[plugins]]` entry and of its grants in the file,
/// for problems found only once the plugin is loaded: a need the entry does
/// not grant. `None` for a configuration not read from text, or a key not written.
#[derive(Debug, Clone, Default)]
pub struct EntryLines {
    pub entry: Option<usize>,
    pub kv: Option<usize>,
    pub destinations: Option<usize>,
}

impl PluginConfig {
    /// A plugin with every limit at its default.
    pub fn new(name: String, path: PathBuf) -> PluginConfig {
        PluginConfig {
            name,
            path,
            config: toml::Table::new(),
            timeout_ms: default_plugin_timeout_ms(),
            memory_mb: default_plugin_memory_mb(),
            max_output_bytes: default_plugin_max_output_bytes(),
            max_host_calls: default_plugin_max_host_calls(),
            destinations: Vec::new(),
            kv: false,
            max_concurrency: default_plugin_max_concurrency(),
            time_share: default_plugin_time_share(),
            max_forwards: default_plugin_max_forwards(),
            kv_max_keys: default_plugin_kv_max_keys(),
            kv_max_bytes: default_plugin_kv_max_bytes(),
            kv_max_writes_per_call: default_plugin_kv_max_writes_per_call(),
            kv_max_bytes_per_call: default_plugin_kv_max_bytes_per_call(),
            required: None,
            shadows: None,
            lines: EntryLines::default(),
        }
    }
}

impl Config {
    /// Whether `plugin` must load for the hub to start: as set, or, when
    /// unset, whether a route that rejects on failure uses it (its events
    /// would all be refused anyway).
    pub fn plugin_required(&self, plugin: &PluginConfig) -> bool {
        plugin.required.unwrap_or_else(|| {
            self.routes
                .iter()
                .any(|r| r.on_error == OnError::Reject && r.plugins.contains(&plugin.name))
        })
    }

    /// What the plugin of entry `index` needs (`kv`, `destinations`, as it
    /// says once loaded) and its entry does not grant: one problem per
    /// grant, naming the key, the plugin, the grant and the line to change.
    pub fn ungranted(&self, index: usize, kv: bool, destinations: &[String]) -> Vec<String> {
        let Some(p) = self.plugins.get(index) else {
            return Vec::new();
        };
        let line = |key: Option<usize>| {
            key.or(p.lines.entry)
                .map_or_else(String::new, |l| format!(" (line {l})"))
        };
        let mut problems = Vec::new();
        if kv && !p.kv {
            problems.push(format!(
                "plugins[{index}].kv: plugin `{}` needs key-value storage, which its entry does \
                 not grant: set `kv = true`{}",
                p.name,
                line(p.lines.kv)
            ));
        }
        for d in destinations.iter().filter(|d| !p.destinations.contains(d)) {
            let declare = if self.destinations.iter().any(|x| &x.name == d) {
                String::new()
            } else {
                format!(" and declare a [[destinations]] table named `{d}`")
            };
            problems.push(format!(
                "plugins[{index}].destinations: plugin `{}` needs destination `{d}`, which its \
                 entry does not grant: add \"{d}\" to `destinations`{declare}{}",
                p.name,
                line(p.lines.destinations)
            ));
        }
        problems
    }
}

/// Notes where each `[[plugins]]` entry of `text`, and its `kv` and
/// `destinations`, are written. Called once `text` has deserialized, so the
/// document parses and its entries are `plugins`, in order.
pub(super) fn note_lines(plugins: &mut [PluginConfig], text: &str) {
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return;
    };
    let Some((_, entries)) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == "plugins") else {
        return;
    };
    let toml::de::DeValue::Array(entries) = entries.get_ref() else {
        return;
    };
    for (p, entry) in plugins.iter_mut().zip(entries.iter()) {
        let toml::de::DeValue::Table(table) = entry.get_ref() else {
            continue;
        };
        let key_line = |name: &str| {
            table
                .iter()
                .find(|(k, _)| k.get_ref() == name)
                .map(|(k, _)| line_at(text, k.span().start))
        };
        p.lines = EntryLines {
            entry: Some(line_at(text, entry.span().start)),
            kv: key_line("kv"),
            destinations: key_line("destinations"),
        };
    }
}

/// A named receiver plugins send and forward to; they never see its URL or headers.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestinationConfig {
    pub name: String,
    pub url: String,
    /// Request headers as written; `${VAR}` in a value names an environment variable.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// `headers` as sent: `${VAR}` filled in when the file was loaded, values
    /// marked sensitive (kept out of `Debug`). Filled by the checks only.
    #[serde(skip)]
    pub expanded_headers: Vec<(HeaderName, HeaderValue)>,
    #[serde(default = "default_destination_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryConfig,
}

/// Attempts of a forward: each wait is the previous one times `backoff`, at most `max_interval_ms`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    #[serde(default = "default_retry_attempts")]
    pub attempts: u32,
    #[serde(default = "default_retry_interval_ms")]
    pub interval_ms: u64,
    #[serde(default = "default_backoff")]
    pub backoff: f64,
    #[serde(default = "default_max_interval_ms")]
    pub max_interval_ms: u64,
}

/// Which events go through which plugins, in order.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Globs over dotted event kinds, for example `channel.*`.
    pub events: Vec<String>,
    /// Channel names; empty means every channel (and events of no channel).
    #[serde(default)]
    pub channels: Vec<String>,
    pub plugins: Vec<String>,
    #[serde(default)]
    pub on_error: OnError,
    /// Plugins run on the route's events after its chain, without effect,
    /// to compare their outcome with the live one.
    #[serde(default)]
    pub shadow: Vec<String>,
}

/// What a failed plugin call means for the event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Pass the event on as it was before the failed plugin.
    #[default]
    Skip,
    /// Refuse the event; an inbound request gets a 5xx it may retry.
    Reject,
}

fn default_cache_dir() -> PathBuf {
    PathBuf::from("data/plugin-cache")
}
fn default_max_concurrent_calls() -> u32 {
    64
}
fn default_max_memory_mb() -> u32 {
    1024
}
fn default_plugin_timeout_ms() -> u64 {
    100
}
fn default_plugin_memory_mb() -> u32 {
    32
}
fn default_plugin_max_output_bytes() -> usize {
    256 * 1024
}
fn default_plugin_max_host_calls() -> u32 {
    1000
}
fn default_plugin_max_concurrency() -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    u32::try_from(cores.saturating_sub(1).max(1)).unwrap_or(1)
}
/// As many cores as the plugin threads (every core but one): the hub keeps
/// a core whatever one channel's events cost, and a legitimately busy
/// channel (`redact` at 13 000 messages/s takes about half a core of wall
/// time on a loaded 2-core machine) is not capped.
fn default_plugin_time_share() -> f64 {
    f64::from(default_plugin_max_concurrency())
}
fn default_plugin_max_forwards() -> usize {
    10
}
fn default_plugin_kv_max_keys() -> u64 {
    10_000
}
fn default_plugin_kv_max_bytes() -> u64 {
    16 << 20
}
fn default_plugin_kv_max_writes_per_call() -> usize {
    100
}
fn default_plugin_kv_max_bytes_per_call() -> usize {
    256 * 1024
}
fn default_destination_timeout_ms() -> u64 {
    5_000
}
fn default_retry_attempts() -> u32 {
    5
}
fn default_retry_interval_ms() -> u64 {
    1_000
}
fn default_backoff() -> f64 {
    2.0
}
fn default_max_interval_ms() -> u64 {
    60_000
}

/// Largest `memory_mb` a plugin may ask for; the pooling allocator reserves this much per slot.
pub const MAX_PLUGIN_MEMORY_MB: u32 = 512;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: default_cache_dir(),
            max_concurrent_calls: default_max_concurrent_calls(),
            max_memory_mb: default_max_memory_mb(),
        }
    }
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            attempts: default_retry_attempts(),
            interval_ms: default_retry_interval_ms(),
            backoff: default_backoff(),
            max_interval_ms: default_max_interval_ms(),
        }
    }
}

/// Problems with plugins, destinations and routes, each naming its key; fills
/// in each destination's `expanded_headers` with `${VAR}` read through `env`.
pub(super) fn check(config: &mut Config, env: &Env, problems: &mut Vec<String>) {
    if config.runtime.max_concurrent_calls == 0 {
        problems.push("runtime.max_concurrent_calls: must be at least 1".to_owned());
    }
    if config.runtime.max_memory_mb == 0 {
        problems.push("runtime.max_memory_mb: must be at least 1".to_owned());
    }
    let mut destinations = HashSet::new();
    for (i, d) in config.destinations.iter_mut().enumerate() {
        let key = format!("destinations[{i}]");
        check_name(&d.name, &key, &mut destinations, problems);
        if !is_http_url(&d.url) {
            problems.push(format!("{key}.url: `{}` is not an http(s) URL", d.url));
        }
        d.expanded_headers = expand_headers(&d.headers, &key, env, problems);
        if d.timeout_ms == 0 {
            problems.push(format!("{key}.timeout_ms: must be positive"));
        }
        if d.retry.attempts == 0 {
            problems.push(format!("{key}.retry.attempts: must be at least 1"));
        }
        if !(d.retry.backoff.is_finite() && d.retry.backoff >= 1.0) {
            problems.push(format!(
                "{key}.retry.backoff: must be a number of at least 1"
            ));
        }
    }
    let mut plugins = HashSet::new();
    for (i, p) in config.plugins.iter().enumerate() {
        let key = format!("plugins[{i}]");
        check_name(&p.name, &key, &mut plugins, problems);
        if p.timeout_ms == 0 {
            problems.push(format!("{key}.timeout_ms: must be positive"));
        }
        if p.memory_mb == 0 || p.memory_mb > MAX_PLUGIN_MEMORY_MB {
            problems.push(format!(
                "{key}.memory_mb: must be between 1 and {MAX_PLUGIN_MEMORY_MB}"
            ));
        }
        if p.max_output_bytes == 0 {
            problems.push(format!("{key}.max_output_bytes: must be positive"));
        }
        if p.max_host_calls == 0 {
            problems.push(format!("{key}.max_host_calls: must be at least 1"));
        }
        if p.max_concurrency == 0 {
            problems.push(format!("{key}.max_concurrency: must be at least 1"));
        }
        if !(p.time_share.is_finite() && p.time_share >= 0.01) {
            problems.push(format!(
                "{key}.time_share: must be at least 0.01 (seconds of call time per second)"
            ));
        }
        for (j, d) in p.destinations.iter().enumerate() {
            if !destinations.contains(d.as_str()) {
                problems.push(format!(
                    "{key}.destinations[{j}]: no destination is named `{d}`"
                ));
            }
        }
    }
    let channels: HashSet<&str> = config.channels.iter().map(|c| c.name.as_str()).collect();
    for (i, r) in config.routes.iter().enumerate() {
        let key = format!("routes[{i}]");
        if r.events.is_empty() {
            problems.push(format!(
                "{key}.events: name at least one event kind or glob"
            ));
        }
        for (j, e) in r.events.iter().enumerate() {
            if e.trim().is_empty() || e.chars().any(char::is_whitespace) {
                problems.push(format!(
                    "{key}.events[{j}]: `{e}` is not an event kind glob"
                ));
            }
        }
        if r.plugins.is_empty() {
            problems.push(format!("{key}.plugins: name at least one plugin"));
        }
        for (j, p) in r.plugins.iter().enumerate() {
            if !plugins.contains(p.as_str()) {
                problems.push(format!("{key}.plugins[{j}]: no plugin is named `{p}`"));
            }
        }
        check_shadows(config, i, problems);
        // Channels made through the API are valid targets too, so an unknown
        // name is only worth a warning at start, not a refusal here.
        for (j, c) in r.channels.iter().enumerate() {
            if c.trim().is_empty() {
                problems.push(format!("{key}.channels[{j}]: must not be empty"));
            } else if !channels.contains(c.as_str()) {
                tracing::debug!(route = i, channel = %c, "route names a channel not declared in the file");
            }
        }
    }
}

/// A destination's headers as they are sent; a header with a problem is left out.
fn expand_headers(
    headers: &std::collections::BTreeMap<String, String>,
    key: &str,
    env: &Env,
    problems: &mut Vec<String>,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut expanded = Vec::with_capacity(headers.len());
    for (header, value) in headers {
        let key = format!("{key}.headers.{header}");
        let name = HeaderName::from_bytes(header.as_bytes());
        if name.is_err() {
            problems.push(format!("{key}: not a valid header name"));
        }
        let value = match expand_env(value, |var| env.get(var)) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("{key}: {e}"));
                continue;
            }
        };
        // The value may hold a secret now: the problem does not quote it.
        let Ok(mut value) = HeaderValue::from_str(&value) else {
            problems.push(format!(
                "{key}: not a valid header value (a control character)"
            ));
            continue;
        };
        value.set_sensitive(true);
        if let Ok(name) = name {
            expanded.push((name, value));
        }
    }
    expanded
}

/// Whether `name` may name a plugin or destination: letters, digits, `-` or `_`.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn check_name(name: &str, key: &str, seen: &mut HashSet<String>, problems: &mut Vec<String>) {
    if !is_name(name) {
        problems.push(format!(
            "{key}.name: `{name}` must be letters, digits, `-` or `_`"
        ));
    } else if !seen.insert(name.to_owned()) {
        problems.push(format!("{key}.name: `{name}` is declared twice"));
    }
}

/// Replaces each `${VAR}` in `value` with the variable read through `get`.
pub fn expand_env(value: &str, get: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`${{` without a closing `}}` in `{value}`"))?;
        let var = &after[..end];
        let got = get(var).ok_or_else(|| format!("environment variable {var} is not set"))?;
        out.push_str(&got);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

// Error texts are checked by the fixtures in `tests/fixtures/config/` (see `fixtures.rs`).
/// A route's shadows: known plugins, live nowhere (a shadow's sends are
/// never made), each paired with a plugin of the route if it names one.
fn check_shadows(config: &Config, i: usize, problems: &mut Vec<String>) {
    let r = &config.routes[i];
    for (j, name) in r.shadow.iter().enumerate() {
        let key = format!("routes[{i}].shadow[{j}]");
        let Some(entry) = config.plugins.iter().find(|p| &p.name == name) else {
            problems.push(format!("{key}: no plugin is named `{name}`"));
            continue;
        };
        if config
            .routes
            .iter()
            .any(|other| other.plugins.contains(name))
        {
            problems.push(format!(
                "{key}: `{name}` is live on a route; a shadow runs only as a shadow \
                 (`hub plugin promote {name}` makes it live)"
            ));
        }
        if let Some(live) = &entry.shadows
            && !r.plugins.contains(live)
        {
            problems.push(format!(
                "{key}: `{name}` shadows `{live}`, which is not a plugin of this route"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_shadow_must_be_a_plugin_live_nowhere_and_shadow_a_plugin_of_its_route() {
        let text = r#"
            [[plugins]]
            name = "redact"
            path = "redact.wasm"
            [[plugins]]
            name = "v2"
            path = "redact.wasm"
            shadows = "spam"
            [[routes]]
            events = ["channel.*"]
            plugins = ["redact"]
            shadow = ["v2", "nope"]
            [[routes]]
            events = ["agent.*"]
            plugins = ["v2"]
        "#;
        let err = Config::from_toml(text, Path::new("hub.toml"), &Env::empty())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("routes[0].shadow[0]: `v2` is live on a route"),
            "{err}"
        );
        assert!(
            err.contains(
                "routes[0].shadow[0]: `v2` shadows `spam`, which is not a plugin of this route"
            ),
            "{err}"
        );
        assert!(
            err.contains("routes[0].shadow[1]: no plugin is named `nope`"),
            "{err}"
        );
    }

    #[test]
    fn environment_variables_fill_header_values() {
        let get = |k: &str| (k == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(expand_env("Bearer ${TOKEN}", get).unwrap(), "Bearer s3cret");
        assert_eq!(expand_env("plain", get).unwrap(), "plain");
        assert!(
            expand_env("${MISSING}", get)
                .unwrap_err()
                .contains("MISSING")
        );
        assert!(expand_env("${TOKEN", get).is_err());
    }

    #[test]
    fn loading_expands_headers_once_and_keeps_them_secret() {
        let text = r#"
            [[destinations]]
            name = "crm"
            url = "https://crm.example.com/hooks"
            headers = { Authorization = "Bearer ${CRM_TOKEN}", X-Source = "hub" }
        "#;
        let env = Env::fixed([("CRM_TOKEN", "s3cret")]);
        let c = Config::from_toml(text, Path::new("hub.toml"), &env).unwrap();
        let headers = &c.destinations[0].expanded_headers;
        let got: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [("authorization", "Bearer s3cret"), ("x-source", "hub")]
        );
        assert!(headers.iter().all(|(_, v)| v.is_sensitive()));
        // What the file says stays as written; the secret is not in `Debug`.
        assert_eq!(
            c.destinations[0].headers["Authorization"],
            "Bearer ${CRM_TOKEN}"
        );
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn an_ungranted_need_names_the_key_the_grant_and_the_line() {
        let text = "[[destinations]]\nname = \"crm\"\nurl = \"https://crm.example.com/\"\n\n\
                    [[plugins]]\nname = \"a\"\npath = \"a.wasm\"\n\n\
                    [[plugins]]\nname = \"b\"\npath = \"b.wasm\"\nkv = false\n\
                    destinations = [\"crm\"]\n";
        let c = Config::parse(text, Path::new("hub.toml")).unwrap();
        let crm = ["crm".to_owned()];
        // Nothing written: the entry's header line.
        assert_eq!(
            c.ungranted(0, true, &crm),
            [
                "plugins[0].kv: plugin `a` needs key-value storage, which its entry does not \
                 grant: set `kv = true` (line 5)",
                "plugins[0].destinations: plugin `a` needs destination `crm`, which its entry \
                 does not grant: add \"crm\" to `destinations` (line 5)",
            ]
        );
        // Written: their own lines; a destination not declared says so.
        assert_eq!(
            c.ungranted(1, true, &["crm".to_owned(), "audit".to_owned()]),
            [
                "plugins[1].kv: plugin `b` needs key-value storage, which its entry does not \
                 grant: set `kv = true` (line 12)",
                "plugins[1].destinations: plugin `b` needs destination `audit`, which its entry \
                 does not grant: add \"audit\" to `destinations` and declare a [[destinations]] \
                 table named `audit` (line 13)",
            ]
        );
        assert!(c.ungranted(1, false, &crm).is_empty(), "granted");
        // Inline entries have lines too; an entry made in code has none.
        let c = Config::parse(
            "plugins = [\n  { name = \"a\", path = \"a.wasm\" },\n]\n",
            Path::new("hub.toml"),
        )
        .unwrap();
        assert!(c.ungranted(0, true, &[])[0].ends_with("(line 2)"));
        let mut c = Config::parse("", Path::new("hub.toml")).unwrap();
        c.plugins
            .push(PluginConfig::new("a".into(), "a.wasm".into()));
        assert!(c.ungranted(0, true, &[])[0].ends_with("set `kv = true`"));
    }

    #[test]
    fn plugin_paths_are_relative_to_the_file() {
        let c = Config::parse("", Path::new("conf/hub.toml")).unwrap();
        assert_eq!(c.resolve(Path::new("p.wasm")), Path::new("conf/p.wasm"));
        assert_eq!(
            c.resolve(Path::new("/abs/p.wasm")),
            Path::new("/abs/p.wasm")
        );
    }
}
