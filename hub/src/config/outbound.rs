//! The `[outbound]` table: where the hub may send requests (the guard
//! against server-side request forgery; `outbound::policy` enforces it).

use serde::Deserialize;

use super::{Config, is_http_url};
use crate::outbound::Policy;

/// `[outbound]`: which addresses requests may go to, whatever their URL.
/// The unspecified, multicast, broadcast and link-local ranges and the cloud
/// metadata addresses are always refused unless `allow` lists them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboundConfig {
    /// Loopback, RFC 1918, CGNAT (100.64.0.0/10), unique local (fc00::/7)
    /// and the IPv6 forms that embed them.
    #[serde(default)]
    pub private: Private,
    /// CIDRs (`10.1.0.0/16`), addresses and host names requests may go to
    /// whatever the rules above say; a host name allows every address it
    /// resolves to.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `[outbound] private`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Private {
    /// A self-hosted hub talks to its neighbours (the default).
    #[default]
    Allow,
    Deny,
}

impl OutboundConfig {
    /// The policy this table describes. Entries that do not parse (which
    /// the checks refused already) are left out.
    pub fn policy(&self) -> Policy {
        let deny = self.private == Private::Deny;
        let valid: Vec<String> = self
            .allow
            .iter()
            .filter(|entry| Policy::new(deny, std::slice::from_ref(*entry)).is_ok())
            .cloned()
            .collect();
        Policy::new(deny, &valid).unwrap_or_default()
    }
}

/// Problems with `[outbound]`, each naming its key, and the URLs declared
/// elsewhere in the file that the policy refuses as written (an IP literal,
/// user info: what can be told without resolving a name).
pub(super) fn check(config: &Config, problems: &mut Vec<String>) {
    let outbound = &config.outbound;
    if let Err(bad) = Policy::new(outbound.private == Private::Deny, &outbound.allow) {
        for (i, problem) in bad {
            problems.push(format!("outbound.allow[{i}]: {problem}"));
        }
    }
    let policy = outbound.policy();
    let mut declared: Vec<(String, &str)> = Vec::new();
    for (i, ch) in config.channels.iter().enumerate() {
        if !ch.customer_endpoint.is_empty() {
            declared.push((
                format!("channels[{i}].customer_endpoint"),
                &ch.customer_endpoint,
            ));
        }
        if let Some(url) = &ch.webhook_url {
            declared.push((format!("channels[{i}].webhook_url"), url));
        }
    }
    if let Some(url) = &config.crm.webhook_url {
        declared.push(("crm.webhook_url".to_owned(), url));
    }
    for (i, d) in config.destinations.iter().enumerate() {
        declared.push((format!("destinations[{i}].url"), &d.url));
    }
    for (i, bot) in config.bots.iter().enumerate() {
        if let Some(url) = &bot.endpoint {
            declared.push((format!("bots[{i}].endpoint"), url));
        }
        if let Some(auth) = &bot.auth {
            declared.push((format!("bots[{i}].auth.token_url"), &auth.token_url));
        }
    }
    for (key, url) in declared {
        // A URL that is not http(s) at all is reported by its own check.
        if !is_http_url(url) {
            continue;
        }
        if let Err(refused) = policy.check_url(url) {
            problems.push(format!("{key}: {refused}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("hub.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn private_targets_are_allowed_by_default() {
        let c = parse("").expect("empty config");
        assert_eq!(c.outbound.private, Private::Allow);
        assert!(c.outbound.allow.is_empty());
        let policy = c.outbound.policy();
        assert!(!policy.denies_private());
        assert!(policy.check_url("http://127.0.0.1:9/x").is_ok());
        assert!(policy.check_url("http://169.254.169.254/").is_err());
    }

    #[test]
    fn the_strict_setting_and_allow_entries_are_read() {
        let text = "[outbound]\nprivate = \"deny\"\nallow = [\"10.1.0.0/16\", \"crm.internal\"]\n";
        let c = parse(text).expect("config");
        assert_eq!(c.outbound.private, Private::Deny);
        let policy = c.outbound.policy();
        assert!(policy.denies_private());
        assert!(policy.check_url("http://10.1.2.3/").is_ok());
        assert!(policy.check_url("http://10.2.0.1/").is_err());
        assert!(policy.allows_host("CRM.internal"));
    }

    #[test]
    fn bad_entries_and_refused_declared_urls_are_named_by_key() {
        let text = "[outbound]\nprivate = \"deny\"\n\
                    allow = [\"10.0.0.0/8\", \"example.com\", \"10.0.0.0/33\"]\n\n\
                    [[channels]]\nname = \"shop\"\ncustomer_endpoint = \"http://127.0.0.1:9/x\"\n\
                    webhook_url = \"http://169.254.169.254/latest/meta-data\"\n\n\
                    [crm]\nwebhook_url = \"http://evil@crm.example.com/\"\n\n\
                    [[destinations]]\nname = \"ok\"\nurl = \"http://10.9.9.9/in\"\n";
        let err = parse(text).expect_err("refused");
        for expected in [
            "outbound.allow[2]: `10.0.0.0/33`: the prefix length must be 0 to 32",
            "channels[0].customer_endpoint: 127.0.0.1 is loopback: \
             refused by `[outbound] private = \"deny\"`",
            "channels[0].webhook_url: 169.254.169.254 is link-local (cloud metadata): \
             refused unless `[outbound] allow` lists it",
            "crm.webhook_url: URLs with user info (`user@host`) are refused",
        ] {
            assert!(err.contains(expected), "missing `{expected}` in:\n{err}");
        }
        assert!(!err.contains("destinations[0]"), "{err}");
    }

    #[test]
    fn an_unknown_key_or_setting_is_refused() {
        let err = parse("[outbound]\nprivate = \"block\"\n").expect_err("refused");
        assert!(err.contains("outbound.private"), "{err}");
        let err = parse("[outbound]\nallowed = []\n").expect_err("refused");
        assert!(err.contains("outbound.allowed"), "{err}");
    }
}
