//! `[log]`: the log's format and filter.

use serde::Deserialize;

/// `[log]`: how the hub writes its log (to standard error).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter such as `"info"` or `"info,hub::delivery=debug"`;
    /// `RUST_LOG`, when set, wins.
    #[serde(default)]
    pub level: Option<String>,
}

/// One line per record: words for a terminal, or a JSON object for a log
/// collector, with the event id, channel and chat of the spans it ran in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogConfig {
    /// Checked whether or not `RUST_LOG` overrides it, so that `hub check`
    /// tells before the day the variable is not set.
    pub(super) fn check(&self, problems: &mut Vec<String>) {
        if let Some(level) = &self.level
            && let Err(e) = tracing_subscriber::EnvFilter::try_new(level)
        {
            problems.push(format!("log.level: `{level}` is not a log filter: {e}"));
        }
    }
}
