//! Redact: masks card numbers, e-mail addresses and phone numbers in the
//! `message.text` of any event that has one, before the hub stores or sends it.
//!
//! Config (all optional): `cards`, `emails`, `phones` — booleans, default `true`.

mod email;
mod mask;
mod number;

use plugin_api::sdk::{Config, Event, Host, Level, Outcome, Plugin};
use serde_json::Value;

pub use mask::{Kinds, mask};

pub struct Redact;

impl Plugin for Redact {
    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        let Some(text) = event.message_text() else {
            return Ok(Outcome::pass());
        };
        let kinds = kinds(&Config::new(host.config())?)?;
        let Some((masked, count)) = mask(text, kinds) else {
            return Ok(Outcome::pass());
        };
        let mut payload = event.payload().clone();
        if let Some(slot) = payload.pointer_mut("/message/text") {
            *slot = Value::String(masked);
        }
        // The count only: the log must not leak what was masked.
        host.log(Level::Debug, &format!("masked {count} item(s)"));
        Ok(Outcome::replace(payload))
    }

    fn validate_config(config: &Config) -> Result<(), String> {
        kinds(config).map(|_| ())
    }
}

/// What to mask, from the config (each kind on unless set to `false`).
fn kinds(config: &Config) -> Result<Kinds, String> {
    Ok(Kinds {
        cards: config.bool_or("cards", true)?,
        emails: config.bool_or("emails", true)?,
        phones: config.bool_or("phones", true)?,
    })
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(Redact);

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::testing::{FakeHost, customer_text, event};
    use serde_json::json;

    fn run(config: Value, event: &Event) -> Outcome {
        Redact::handle(event, &mut FakeHost::new(config)).unwrap()
    }

    #[test]
    fn a_setting_of_the_wrong_type_is_refused_at_load_naming_the_key() {
        let bad = Config::new(json!({"cards": "yes"})).unwrap();
        let err = Redact::validate_config(&bad).unwrap_err();
        assert!(err.contains("cards"), "{err}");
        let good = Config::new(json!({"cards": false})).unwrap();
        assert_eq!(Redact::validate_config(&good), Ok(()));
    }

    #[test]
    fn replaces_only_the_text() {
        let e = customer_text("7", "my card is 4111 1111 1111 1111");
        let out = run(json!({}), &e);
        let mut expected = e.payload().clone();
        expected["message"]["text"] = json!("my card is [card]");
        assert_eq!(out, Outcome::replace(expected));
    }

    #[test]
    fn passes_when_nothing_to_mask() {
        assert!(
            run(
                json!({}),
                &customer_text("7", "order 123456, delivered 2026-11-22")
            )
            .is_pass()
        );
        let photo = event(
            "channel.customer_message",
            json!({"sender":{"id":1},"message":{"type":"photo","file":"https://x/y.png",
                   "file_name":"y.png","file_size":3}}),
        );
        assert!(run(json!({}), &photo).is_pass());
    }

    #[test]
    fn works_on_any_kind_with_a_message_text() {
        let bot = event(
            "bot.message",
            json!({"event":"BOT_MESSAGE","message":{"type":"TEXT","text":"mail a@b.io"}}),
        );
        let Outcome { action, .. } = run(json!({}), &bot);
        assert_eq!(
            action,
            plugin_api::sdk::Action::Continue(Some(
                json!({"event":"BOT_MESSAGE","message":{"type":"TEXT","text":"mail [email]"}})
            ))
        );
    }

    #[test]
    fn config_switches_kinds_off() {
        let e = customer_text("7", "call 555-123-4567");
        assert!(run(json!({"phones": false}), &e).is_pass());
        assert!(!run(json!({"phones": true, "cards": false}), &e).is_pass());
        let err = Redact::handle(&e, &mut FakeHost::new(json!({"phones": "no"}))).unwrap_err();
        assert_eq!(err, "config: phones must be a boolean");
    }

    #[test]
    fn logs_no_personal_data() {
        let mut host = FakeHost::new(json!({}));
        Redact::handle(&customer_text("7", "jo@x.com"), &mut host).unwrap();
        assert_eq!(
            host.logs(),
            &[(Level::Debug, "masked 1 item(s)".to_owned())]
        );
    }
}
