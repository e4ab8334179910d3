//! Who may use the hub's own interfaces: `[admin]` (the admin API's
//! token), `[console]` (agents' sign-in) and `[metrics]` (`/metrics`).

use serde::Deserialize;

use super::Overrides;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token of the admin API; without one the admin API answers 403.
    #[serde(default)]
    pub token: Option<String>,
}

/// `[console]`: agents' sign-in to the console at `/console`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// How long a console session lasts after sign-in.
    #[serde(default = "default_session_hours")]
    pub session_hours: u64,
    /// Failed sign-ins for one account, or from one address, that lock it.
    #[serde(default = "default_max_failed_sign_ins")]
    pub max_failed_sign_ins: u32,
    /// How long such a lock lasts (and the window failures are counted in).
    #[serde(default = "default_sign_in_lock_secs")]
    pub sign_in_lock_secs: u64,
}

fn default_session_hours() -> u64 {
    12
}

fn default_max_failed_sign_ins() -> u32 {
    30
}

fn default_sign_in_lock_secs() -> u64 {
    900
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            session_hours: default_session_hours(),
            max_failed_sign_ins: default_max_failed_sign_ins(),
            sign_in_lock_secs: default_sign_in_lock_secs(),
        }
    }
}

/// `[metrics]`: who may read `/metrics`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    #[serde(default)]
    pub access: MetricsAccess,
}

/// Who may read `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsAccess {
    /// The admin token (or an admin agent's console session): the figures
    /// name plugins, channels' traffic and failures.
    #[default]
    Admin,
    /// Anyone who can reach the hub (a scraper on a private network).
    Public,
}

impl AdminConfig {
    /// The checks of `[admin]` (and `HUB_ADMIN_TOKEN`).
    pub(super) fn check(&self, overrides: &Overrides, problems: &mut Vec<String>) {
        if self.token.as_deref().is_some_and(|t| t.len() < 16) {
            problems.push(format!(
                "{}: must be at least 16 characters",
                overrides.key("admin.token")
            ));
        }
    }
}

impl ConsoleConfig {
    /// The checks of `[console]`, each problem naming its key.
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        if self.session_hours == 0 {
            problems.push("console.session_hours: must be at least 1".to_owned());
        }
        if self.max_failed_sign_ins == 0 {
            problems.push("console.max_failed_sign_ins: must be at least 1".to_owned());
        }
        if self.sign_in_lock_secs == 0 {
            problems.push("console.sign_in_lock_secs: must be positive".to_owned());
        }
    }
}
