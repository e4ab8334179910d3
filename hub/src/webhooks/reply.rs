//! The integrator's answer to `chat_accepted` / `chat_updated`: what of it
//! reaches the agent. Nothing is applied unless `result` is ok
//! (case-insensitive); the body is read as JSON whatever its Content-Type.

use plugin_api::webhook::{Page, ReplyContactInfo, WebhookReply};
use plugin_api::widget::CustomDataField;
use serde::{Deserialize, Serialize};

use super::payload::escape_html;

/// The spec's limit on custom data fields.
pub const MAX_CUSTOM_FIELDS: usize = 10;

/// What the agent sees from a reply, kept on the chat (`chats.integration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Integration {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_data: Vec<CustomDataField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact_info: Option<ReplyContactInfo>,
    /// Whether the agent gets the button that links the client to the CRM.
    #[serde(default)]
    pub enable_assign: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crm_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<Page>,
}

/// Reads a reply. `receiver_host` is the host of the webhook URL: with Safe
/// URL on, custom-data links to any other host are dropped.
pub fn read(body: &str, receiver_host: Option<&str>, safe_url: bool) -> Option<Integration> {
    let reply: WebhookReply = serde_json::from_str(body.trim()).ok()?;
    if !reply.is_ok() {
        return None;
    }
    let custom_data = reply
        .custom_data
        .unwrap_or_default()
        .into_iter()
        .take(MAX_CUSTOM_FIELDS)
        .map(|f| CustomDataField {
            content: escape_html(&f.content),
            title: f.title.map(|t| escape_html(&t)),
            key: f.key.map(|k| escape_html(&k)),
            link: f
                .link
                .filter(|l| crate::config::is_http_url(l))
                .filter(|l| !safe_url || host_of(l) == receiver_host),
        })
        .collect();
    Some(Integration {
        custom_data,
        contact_info: reply.contact_info,
        enable_assign: reply.enable_assign.unwrap_or(false),
        crm_link: reply.crm_link.filter(|l| crate::config::is_http_url(l)),
        page: reply.page,
    })
}

/// The host of an http(s) URL, without port or credentials.
pub fn host_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    // Browsers read `\` as `/` in http(s) URLs: `http://a\@b/` goes to `a`.
    let authority = rest.split(['/', '?', '#', '\\']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = match host.find(']') {
        // An IPv6 literal, brackets included: `[2001:db8::1]`.
        Some(end) if host.starts_with('[') => &host[..=end],
        _ => host.split(':').next()?,
    };
    (!host.is_empty()).then_some(host)
}

impl Integration {
    /// A later reply replaces what an earlier one showed, field by field.
    pub fn merge(&mut self, newer: Integration) {
        if !newer.custom_data.is_empty() {
            self.custom_data = newer.custom_data;
        }
        if newer.contact_info.is_some() {
            self.contact_info = newer.contact_info;
        }
        self.enable_assign |= newer.enable_assign;
        if newer.crm_link.is_some() {
            self.crm_link = newer.crm_link;
        }
        if newer.page.is_some() {
            self.page = newer.page;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ok_replies_are_applied_whatever_the_case() {
        assert!(
            read(
                r#"{"result":"OK","crm_link":"https://crm.example.com/c/1"}"#,
                None,
                false
            )
            .is_some()
        );
        assert!(read(r#"{"result":"ok"}"#, None, false).is_some());
        assert!(
            read(
                r#"{"result":"FAILURE","crm_link":"https://x"}"#,
                None,
                false
            )
            .is_none()
        );
        assert!(read("FAILURE", None, false).is_none());
        assert!(read(r#"{"custom_data":[]}"#, None, false).is_none());
    }

    #[test]
    fn custom_data_is_text_at_most_ten_fields_and_safe_url_drops_foreign_links() {
        let fields: Vec<String> = (0..12)
            .map(|i| format!(r#"{{"title":"t{i}","content":"<b>{i}</b>","link":"https://other.example/{i}"}}"#))
            .collect();
        let body = format!(
            r#"{{"result":"ok","custom_data":[{},{{"content":"mine","link":"https://crm.example.com/x"}}]}}"#,
            fields.join(",")
        );
        let open = read(&body, Some("crm.example.com"), false).unwrap();
        assert_eq!(open.custom_data.len(), 10);
        assert_eq!(open.custom_data[0].content, "&lt;b&gt;0&lt;/b&gt;");
        assert!(open.custom_data[0].link.is_some());
        let safe = read(&body, Some("crm.example.com"), true).unwrap();
        assert!(safe.custom_data.iter().all(|f| f.link.is_none()));
        let body = r#"{"result":"ok","custom_data":[{"content":"mine","link":"https://crm.example.com:8443/x"}]}"#;
        let safe = read(body, Some("crm.example.com"), true).unwrap();
        assert!(safe.custom_data[0].link.is_some());
    }

    #[test]
    fn hosts_ignore_ports_paths_and_credentials() {
        assert_eq!(host_of("https://a.example:8080/p?q"), Some("a.example"));
        assert_eq!(host_of("http://u:p@b.example/"), Some("b.example"));
        assert_eq!(host_of("ftp://c"), None);
        assert_eq!(
            host_of("http://evil.example\\@b.example/"),
            Some("evil.example")
        );
        assert_eq!(host_of("http://[2001:db8::1]:8080/"), Some("[2001:db8::1]"));
    }
}
