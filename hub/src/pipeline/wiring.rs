//! The plugin wiring in force: destinations, loaded plugins and routes, built
//! from `hub.toml` as one unit and swapped atomically on reload. An event
//! keeps the wiring it started with until it is done.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::config::{Config, OnError};
use crate::outbound::HttpSender;
use crate::pipeline::shadow::Board;
use crate::runtime::destinations::Destinations;
use crate::runtime::{Origin, Plugin, Runtime, Services};
use crate::store::Store;

/// Which events a route takes and the plugins they cross, in order.
pub struct Route {
    pub events: Vec<String>,
    pub channels: Vec<String>,
    pub plugins: Vec<Arc<Plugin>>,
    /// Plugins of the chain that did not load (`required = false`): the
    /// route acts on them as on a failed call, per `on_error`.
    pub missing: Vec<String>,
    pub on_error: OnError,
    /// Plugins run on the same events without effect, to compare (`shadow`).
    pub shadows: Vec<Shadow>,
}

/// A route's shadow plugin and the live plugin it is a candidate for
/// (`shadows` in its entry): it sees what that plugin saw and is compared
/// with what it did. Without one, it sees the event as the chain left it.
pub struct Shadow {
    pub plugin: Arc<Plugin>,
    pub pairs: Option<String>,
}

#[derive(Default)]
pub struct Wiring {
    pub destinations: Arc<Destinations>,
    pub plugins: HashMap<String, Arc<Plugin>>,
    pub routes: Vec<Route>,
    /// Plugins that are not required and did not load, with why: the hub
    /// runs degraded without them.
    pub unavailable: Vec<(String, String)>,
}

/// What loading a wiring compiled, for the log.
#[derive(Debug, Default)]
pub struct Loaded {
    pub compiled: Vec<String>,
    pub cached: Vec<String>,
}

impl Wiring {
    /// Loads every plugin of `config` and resolves its routes; all problems
    /// are reported together. Compiling is CPU work: call it off the request path.
    pub fn load(
        config: &Config,
        runtime: &Runtime,
        store: &Store,
        sender: &HttpSender,
    ) -> Result<(Wiring, Loaded), Vec<String>> {
        let mut problems = Vec::new();
        let destinations = Arc::new(Destinations::from_config(&config.destinations));
        let services = Services {
            store: store.clone(),
            destinations: destinations.clone(),
            sender: sender.clone(),
            shadow: false,
        };
        let shadows: Vec<&str> = config
            .routes
            .iter()
            .flat_map(|r| r.shadow.iter().map(String::as_str))
            .collect();
        let mut loaded = Loaded::default();
        let mut plugins = HashMap::new();
        let mut failed = Vec::new();
        let mut unavailable = Vec::new();
        for p in &config.plugins {
            // A shadow's sends are answered without leaving the hub.
            let services = Services {
                shadow: shadows.contains(&p.name.as_str()),
                ..services.clone()
            };
            match Plugin::load(runtime, p, &config.resolve(&p.path), services) {
                Ok((plugin, origin)) => {
                    match origin {
                        Origin::Compiled => loaded.compiled.push(p.name.clone()),
                        Origin::Cached => loaded.cached.push(p.name.clone()),
                    }
                    plugins.insert(p.name.clone(), Arc::new(plugin));
                }
                Err(e) if !config.plugin_required(p) => {
                    tracing::error!(plugin = %p.name, error = %e, "plugin not loaded; it is not required, so its routes act per on_error without it");
                    unavailable.push((p.name.clone(), e.to_string()));
                    failed.push(p.name.as_str());
                }
                Err(e) => {
                    problems.push(e.to_string());
                    failed.push(p.name.as_str());
                }
            }
        }
        let mut routes = Vec::with_capacity(config.routes.len());
        for (i, r) in config.routes.iter().enumerate() {
            let mut chain = Vec::with_capacity(r.plugins.len());
            let mut missing = Vec::new();
            for name in &r.plugins {
                match plugins.get(name) {
                    Some(p) => chain.push(p.clone()),
                    // A plugin that failed to load is reported above already.
                    None if failed.contains(&name.as_str()) => missing.push(name.clone()),
                    None => problems.push(format!("routes[{i}]: no plugin is named `{name}`")),
                }
            }
            let mut route_shadows = Vec::new();
            for name in &r.shadow {
                match plugins.get(name) {
                    Some(p) => route_shadows.push(Shadow {
                        plugin: p.clone(),
                        pairs: config
                            .plugins
                            .iter()
                            .find(|c| &c.name == name)
                            .and_then(|c| c.shadows.clone()),
                    }),
                    // A shadow that did not load shadows nothing; said above.
                    None if failed.contains(&name.as_str()) => {}
                    None => problems.push(format!("routes[{i}]: no plugin is named `{name}`")),
                }
            }
            routes.push(Route {
                events: r.events.clone(),
                channels: r.channels.clone(),
                plugins: chain,
                missing,
                on_error: r.on_error,
                shadows: route_shadows,
            });
        }
        if problems.is_empty() {
            Ok((
                Wiring {
                    destinations,
                    plugins,
                    routes,
                    unavailable,
                },
                loaded,
            ))
        } else {
            problems.dedup();
            Err(problems)
        }
    }
}

impl Wiring {
    /// Runs every loaded plugin's `validate-config` on its config table: a
    /// required plugin whose config is refused refuses the wiring; another
    /// is taken out and listed as unavailable, like one that did not load.
    /// A plugin whose entry does not grant what it says it needs with that
    /// config refuses the wiring, required or not: it would run, but fail
    /// at what it is there for, and nobody would be told.
    pub async fn validate_configs(mut self, config: &Config) -> Result<Wiring, Vec<String>> {
        let mut problems = Vec::new();
        let mut refused = Vec::new();
        for (i, p) in config.plugins.iter().enumerate() {
            let Some(plugin) = self.plugins.get(&p.name).cloned() else {
                continue;
            };
            let e = match plugin.validate_config().await {
                Ok(needs) => {
                    problems.extend(config.ungranted(i, needs.kv, &needs.destinations));
                    continue;
                }
                Err(e) => e,
            };
            let text = format!("plugin `{}`: its config is refused: {}", p.name, e.message);
            if config.plugin_required(p) {
                problems.push(text);
            } else {
                tracing::error!(plugin = %p.name, error = %text, "plugin not loaded; it is not required, so its routes act per on_error without it");
                self.unavailable.push((p.name.clone(), text));
                refused.push(p.name.clone());
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        for name in refused {
            self.plugins.remove(&name);
            for route in &mut self.routes {
                route.shadows.retain(|s| s.plugin.name() != name);
                let before = route.plugins.len();
                route.plugins.retain(|p| p.name() != name);
                if route.plugins.len() != before {
                    route.missing.push(name.clone());
                }
            }
        }
        Ok(self)
    }
}

impl Route {
    /// True when the route takes events of `kind` on the channel named `channel`.
    pub fn takes(&self, kind: &str, channel: Option<&str>) -> bool {
        let channel_ok = self.channels.is_empty()
            || channel.is_some_and(|c| self.channels.iter().any(|n| n == c));
        channel_ok && self.events.iter().any(|g| glob_matches(g, kind))
    }
}

/// `*` matches any run of characters (dots included); everything else
/// matches itself. The SDK's function, so plugins match kinds as routes do.
pub use plugin_api::sdk::glob_matches;

/// The wiring in force, and the shadows' board (which outlives reloads);
/// cloning shares both.
#[derive(Clone, Default)]
pub struct WiringHandle(Arc<RwLock<Arc<Wiring>>>, Arc<Board>);

impl WiringHandle {
    pub fn new(wiring: Wiring) -> WiringHandle {
        WiringHandle(Arc::new(RwLock::new(Arc::new(wiring))), Arc::default())
    }

    pub fn current(&self) -> Arc<Wiring> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `wiring` in force; events already under way finish on the old one.
    pub fn replace(&self, wiring: Wiring) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(wiring);
    }

    /// Shadow outcomes: counters and recent differences.
    pub fn shadows(&self) -> &Arc<Board> {
        &self.1
    }
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_match_dotted_kinds() {
        assert!(glob_matches("channel.*", "channel.customer_message"));
        assert!(glob_matches("*", "webhook.chat_finished"));
        assert!(glob_matches(
            "crm.*.updated_deal",
            "crm.crm_deal.updated_deal"
        ));
        assert!(glob_matches("*.delivery_result", "forward.delivery_result"));
        assert!(glob_matches(
            "channel.customer_message",
            "channel.customer_message"
        ));
        assert!(!glob_matches(
            "channel.customer_message",
            "channel.customer_messages"
        ));
        assert!(!glob_matches("channel.*", "webhook.chat_accepted"));
        assert!(!glob_matches("*.typing", "channel.agent_typing"));
        assert!(glob_matches("*typing", "channel.agent_typing"));
        assert!(!glob_matches("a*a", "a"));
    }
}
