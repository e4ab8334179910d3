//! The one door through which configuration reads environment variables: the
//! `HUB_*` overrides and `${VAR}` in destination headers. `main` passes the
//! process environment; tests pass an empty or a fixed one, so a developer's
//! own `HUB_*` variables never reach them.

use std::collections::HashMap;
use std::sync::Arc;

/// The value of one variable, if it is set.
type Getter = dyn Fn(&str) -> Option<String> + Send + Sync;

/// Reads environment variables for configuration loading. Cloning shares it.
#[derive(Clone)]
pub struct Env(Arc<Getter>);

impl Env {
    /// The process environment. Only `main` (and the reload of what it
    /// loaded) should read it.
    pub fn process() -> Env {
        Env(Arc::new(|name| std::env::var(name).ok()))
    }

    /// No variable is set.
    pub fn empty() -> Env {
        Env(Arc::new(|_| None))
    }

    /// Exactly these variables are set.
    pub fn fixed<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Env
    where
        K: Into<String>,
        V: Into<String>,
    {
        let vars: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Env(Arc::new(move |name| vars.get(name).cloned()))
    }

    /// The value of `name`, if it is set (and valid Unicode).
    pub fn get(&self, name: &str) -> Option<String> {
        (self.0)(name)
    }
}

impl Default for Env {
    fn default() -> Env {
        Env::empty()
    }
}

impl std::fmt::Debug for Env {
    // Values may be secrets; never print them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Env")
    }
}
