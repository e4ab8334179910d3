//! `[geoip]`: the database widget visitors' places come from.

use std::path::PathBuf;

use serde::Deserialize;

use super::Config;

/// `[geoip]`: where widget visitors' countries and cities come from.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeoIpConfig {
    /// A GeoIP2/GeoLite2 City database file (MaxMind format); without one,
    /// `session.geoip` stays empty.
    #[serde(default)]
    pub database: Option<PathBuf>,
}

impl GeoIpConfig {
    /// The database file must be readable (`config` resolves its path).
    pub(super) fn check(&self, config: &Config, problems: &mut Vec<String>) {
        if let Some(db) = &self.database {
            let path = config.resolve(db);
            if let Err(e) = std::fs::metadata(&path) {
                // The path as written: relative ones are relative to the file.
                problems.push(format!(
                    "geoip.database: cannot read `{}`: {e}",
                    db.display()
                ));
            }
        }
    }
}
