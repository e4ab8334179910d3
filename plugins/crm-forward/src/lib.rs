//! CRM forward: sends chosen events to a CRM destination in a flat REST shape
//! (see [`shape`]), durably through the hub's outbox; the event itself goes on.
//!
//! Config: `destination` (required; the plugin needs it granted) and `events`,
//! globs of kinds to forward (default `["channel.*"]`). Typing kinds
//! (`*_typing`) are never forwarded.

pub mod shape;

use plugin_api::sdk::{Config, Event, Host, Needs, Outcome, Plugin};

pub struct CrmForward;

impl Plugin for CrmForward {
    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        let (destination, globs) = settings(&Config::new(host.config())?)?;
        let wanted = globs.iter().any(|g| event.kind_matches(g));
        if !wanted || is_typing(event) {
            return Ok(Outcome::pass());
        }
        Ok(Outcome::pass().forward(&destination, shape::record(event)))
    }

    fn validate_config(config: &Config) -> Result<(), String> {
        settings(config).map(|_| ())
    }

    fn needs(config: &Config) -> Result<Needs, String> {
        let (destination, _) = settings(config)?;
        Ok(Needs::none().destination(destination))
    }
}

/// The destination and the event globs, from the config.
fn settings(config: &Config) -> Result<(String, Vec<String>), String> {
    let destination = config.required_str("destination")?.to_owned();
    let globs = config
        .strings("events")?
        .unwrap_or_else(|| vec!["channel.*".to_owned()]);
    Ok((destination, globs))
}

/// Typing notices come and go by the second; a CRM has no use for them.
fn is_typing(event: &Event) -> bool {
    let kind = event
        .payload()
        .pointer("/message/type")
        .and_then(|t| t.as_str());
    event.kind.ends_with("_typing") || matches!(kind, Some("typein" | "typeout"))
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(CrmForward);

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::testing::{FakeHost, customer_text, event};
    use serde_json::{Value, json};

    fn run(config: Value, event: &Event) -> Result<Outcome, String> {
        CrmForward::handle(event, &mut FakeHost::new(config))
    }

    #[test]
    fn destination_is_required() {
        let e = customer_text("1", "hi");
        assert_eq!(
            run(json!({}), &e).unwrap_err(),
            "config: destination is required"
        );
        assert!(run(json!({"destination": 3}), &e).is_err());
    }

    #[test]
    fn it_needs_its_destination_granted() {
        let config = Config::new(json!({"destination": "crm"})).unwrap();
        assert_eq!(
            CrmForward::needs(&config).unwrap(),
            Needs::none().destination("crm")
        );
    }

    #[test]
    fn forwards_channel_events_by_default() {
        let out = run(json!({"destination": "crm"}), &customer_text("1", "hi")).unwrap();
        assert!(out.is_pass());
        assert_eq!(out.forwards.len(), 1);
        assert_eq!(out.forwards[0].destination, "crm");
        assert_eq!(out.forwards[0].payload["event"], "channel.customer_message");
        let other = event("crm.contact_updated", json!({"id": 1}));
        assert!(
            run(json!({"destination": "crm"}), &other)
                .unwrap()
                .forwards
                .is_empty()
        );
    }

    #[test]
    fn events_globs_choose_kinds() {
        let config = json!({"destination": "crm", "events": ["*.agent_message", "crm.*"]});
        assert!(
            run(config.clone(), &customer_text("1", "hi"))
                .unwrap()
                .forwards
                .is_empty()
        );
        let agent = event(
            "channel.agent_message",
            json!({"sender":{"name":"Ann"},"recipient":{"id":1},"message":{"type":"text","text":"yo"}}),
        );
        assert_eq!(run(config.clone(), &agent).unwrap().forwards.len(), 1);
        let crm = event("crm.contact_updated", json!({"id": 1}));
        assert_eq!(run(config, &crm).unwrap().forwards.len(), 1);
        let one = json!({"destination": "crm", "events": "channel.customer_message"});
        assert_eq!(
            run(one, &customer_text("1", "hi")).unwrap().forwards.len(),
            1
        );
    }

    #[test]
    fn typing_is_never_forwarded() {
        let config = json!({"destination": "crm", "events": ["*"]});
        let typing = event(
            "channel.customer_typing",
            json!({"sender":{"id":1},"message":{"type":"typein"}}),
        );
        assert!(run(config.clone(), &typing).unwrap().forwards.is_empty());
        let typing_message = event(
            "channel.customer_message",
            json!({"sender":{"id":1},"message":{"type":"typeout"}}),
        );
        assert!(run(config, &typing_message).unwrap().forwards.is_empty());
    }
}
