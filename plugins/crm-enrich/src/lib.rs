//! CRM enrich: answers `webhook.chat_accepted` (and `chat_updated`) on the
//! integrator's behalf, so agents get CRM data with no integrator server.
//!
//! With `lookup` (a destination name, which the plugin then needs granted)
//! the plugin `send`s the visitor to the CRM and expects `{"custom_data": [...], "crm_link": "..."}` back; without
//! it, or when the lookup fails, it answers with what the event itself tells
//! (visitor number, chats count, tags). Config: `lookup` (optional),
//! `enable_assign` (default true when a link is known), `link_template`
//! (optional, `{number}` is replaced by the visitor number).

use plugin_api::sdk::{Config, Event, Host, Level, Needs, Outcome, Plugin};
use serde_json::{Value, json};

pub struct CrmEnrich;

impl Plugin for CrmEnrich {
    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        if !matches!(
            event.kind.as_str(),
            "webhook.chat_accepted" | "webhook.chat_updated"
        ) {
            return Ok(Outcome::pass());
        }
        let config = Config::new(host.config())?;
        let visitor = event
            .payload()
            .get("visitor")
            .cloned()
            .unwrap_or(Value::Null);
        let number = visitor
            .get("number")
            .map(|n| match n {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_default();
        let mut custom_data = Vec::new();
        let mut crm_link = config
            .str("link_template")?
            .map(|t| t.replace("{number}", &number));
        if let Some(destination) = config.str("lookup")? {
            let query = json!({ "visitor": visitor, "chat_id": event.payload().get("chat_id") });
            match host.send(destination, &query) {
                Ok(r) if r.is_success() => match serde_json::from_str::<Value>(&r.body) {
                    Ok(found) => {
                        if let Some(fields) = found.get("custom_data").and_then(Value::as_array) {
                            custom_data.extend(fields.iter().cloned());
                        }
                        if let Some(link) = found.get("crm_link").and_then(Value::as_str) {
                            crm_link = Some(link.to_owned());
                        }
                    }
                    Err(e) => host.log(Level::Warn, &format!("lookup answer is not JSON: {e}")),
                },
                Ok(r) => host.log(Level::Warn, &format!("lookup answered {}", r.status)),
                Err(e) => host.log(Level::Warn, &format!("lookup failed: {e}")),
            }
        }
        if custom_data.is_empty() {
            custom_data = from_event(event.payload(), &number);
        }
        let mut reply = json!({ "result": "ok", "custom_data": custom_data });
        if let Some(link) = crm_link {
            reply["enable_assign"] = json!(config.bool_or("enable_assign", true)?);
            reply["crm_link"] = json!(link);
        }
        Ok(Outcome::reply(reply))
    }

    fn validate_config(config: &Config) -> Result<(), String> {
        config.str("link_template")?;
        config.str("lookup")?;
        config.bool_or("enable_assign", true)?;
        Ok(())
    }

    fn needs(config: &Config) -> Result<Needs, String> {
        Ok(Needs::none().destination_if(config.str("lookup")?))
    }
}

/// Fields the event already carries, for when no CRM answers.
fn from_event(payload: &Value, number: &str) -> Vec<Value> {
    let mut fields = vec![json!({ "title": "Visitor", "content": format!("#{number}") })];
    if let Some(count) = payload.pointer("/visitor/chats_count") {
        fields.push(json!({ "title": "Chats", "content": count.to_string() }));
    }
    let tags: Vec<&str> = payload
        .get("tags")
        .and_then(Value::as_array)
        .map(|t| t.iter().filter_map(|t| t.get("title")?.as_str()).collect())
        .unwrap_or_default();
    if !tags.is_empty() {
        fields.push(json!({ "title": "Tags", "content": tags.join(", ") }));
    }
    fields
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(CrmEnrich);

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::testing::{FakeHost, event};

    fn accepted() -> Event {
        event(
            "webhook.chat_accepted",
            json!({"event_name": "chat_accepted", "chat_id": 7,
                   "visitor": {"number": "12", "chats_count": 3, "description": ""},
                   "tags": [{"id": 1, "title": "vip"}]}),
        )
    }

    #[test]
    fn it_needs_the_lookup_destination_only_when_one_is_named() {
        let needs = |c: Value| CrmEnrich::needs(&Config::new(c).unwrap()).unwrap();
        assert_eq!(needs(json!({})), Needs::none());
        assert_eq!(
            needs(json!({"lookup": "crm"})),
            Needs::none().destination("crm")
        );
    }

    #[test]
    fn other_events_pass() {
        let e = event(
            "channel.customer_message",
            json!({"sender":{"id":1},"message":{"type":"text","text":"x"}}),
        );
        assert!(
            CrmEnrich::handle(&e, &mut FakeHost::new(json!({})))
                .unwrap()
                .is_pass()
        );
    }

    #[test]
    fn without_a_crm_the_event_fills_the_fields() {
        let out = CrmEnrich::handle(
            &accepted(),
            &mut FakeHost::new(json!({"link_template": "https://crm.example.com/v/{number}"})),
        )
        .unwrap();
        let plugin_api::sdk::Action::Reply(reply) = out.action else {
            panic!("expected a reply");
        };
        assert_eq!(reply["result"], "ok");
        assert_eq!(reply["custom_data"][0]["content"], "#12");
        assert_eq!(reply["custom_data"][2]["content"], "vip");
        assert_eq!(reply["crm_link"], "https://crm.example.com/v/12");
        assert_eq!(reply["enable_assign"], true);
    }

    #[test]
    fn a_lookup_answer_wins_and_a_failed_lookup_falls_back() {
        let mut host = FakeHost::new(json!({"lookup": "crm"})).respond(
            "crm",
            200,
            r#"{"custom_data":[{"title":"Plan","content":"Gold"}],"crm_link":"https://crm.example.com/c/9"}"#,
        );
        let out = CrmEnrich::handle(&accepted(), &mut host).unwrap();
        let plugin_api::sdk::Action::Reply(reply) = out.action else {
            panic!("expected a reply");
        };
        assert_eq!(reply["custom_data"][0]["content"], "Gold");
        assert_eq!(reply["crm_link"], "https://crm.example.com/c/9");
        assert_eq!(host.sent()[0].1["visitor"]["number"], "12");

        let mut down = FakeHost::new(json!({"lookup": "crm"})).respond("crm", 503, "");
        let out = CrmEnrich::handle(&accepted(), &mut down).unwrap();
        let plugin_api::sdk::Action::Reply(reply) = out.action else {
            panic!("expected a reply");
        };
        assert_eq!(reply["custom_data"][0]["content"], "#12");
        assert!(reply.get("crm_link").is_none());
    }
}
