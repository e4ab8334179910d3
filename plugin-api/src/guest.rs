//! The wasm side of the SDK: a [`Host`] over the hub's imports and
//! [`export_plugin!`](crate::export_plugin), which exports a [`Plugin`] as `handle`.

use serde_json::Value;

use crate::sdk::{
    Action, Config, Direction, Event, Host, LazyJson, Level, Needs, Outcome, Plugin, Response,
    empty_object,
};

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "plugin",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "::plugin_api::guest::bindings",
        runtime_path: "::plugin_api::guest::__rt",
    });
}

// Plugin crates reach wit-bindgen's runtime through this crate, so they need
// no dependency of their own on it.
#[doc(hidden)]
pub use wit_bindgen::rt as __rt;

use bindings::hub::plugin::{host, types as wit};

/// Exports `$plugin` (a type implementing [`Plugin`]) as the component's
/// `handle`, `validate-config` and `needs-for`.
///
/// ```ignore
/// struct Redact;
/// impl plugin_api::sdk::Plugin for Redact { /* … */ }
/// plugin_api::export_plugin!(Redact);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        const _: () = {
            struct __HubPluginExport;

            impl $crate::guest::bindings::Guest for __HubPluginExport {
                fn handle(
                    event: $crate::guest::bindings::hub::plugin::types::Event,
                ) -> ::core::result::Result<
                    $crate::guest::bindings::hub::plugin::types::Outcome,
                    ::std::string::String,
                > {
                    $crate::guest::run::<$plugin>(event)
                }

                fn validate_config(
                    config: ::std::string::String,
                ) -> ::core::result::Result<(), ::std::string::String> {
                    $crate::guest::validate::<$plugin>(&config)
                }

                fn needs_for(
                    config: ::std::string::String,
                ) -> ::core::result::Result<
                    $crate::guest::bindings::hub::plugin::types::Needs,
                    ::std::string::String,
                > {
                    $crate::guest::needs::<$plugin>(&config)
                }
            }

            $crate::guest::bindings::__export_plugin_world!(__HubPluginExport);
        };
    };
}

/// The [`Host`] of a running component: each call goes to the hub.
pub struct WitHost;

impl Host for WitHost {
    fn log(&mut self, level: Level, message: &str) {
        host::log(wit_level(level), message);
    }

    fn config(&self) -> Value {
        let raw = host::config();
        match serde_json::from_str::<Value>(&raw) {
            Ok(Value::Null) => empty_object(),
            Ok(config) => config,
            Err(e) => {
                // The hub writes this JSON itself, so this is a hub bug; a plugin
                // still works with its defaults.
                host::log(wit::Level::Warn, &format!("config is not JSON: {e}"));
                empty_object()
            }
        }
    }

    fn kv_get(&mut self, key: &str) -> Result<Option<String>, String> {
        host::kv_get(key)
    }

    fn kv_set(&mut self, key: &str, value: &str) -> Result<(), String> {
        host::kv_set(key, value)
    }

    fn kv_delete(&mut self, key: &str) -> Result<(), String> {
        host::kv_delete(key)
    }

    fn send(&mut self, destination: &str, payload: &Value) -> Result<Response, String> {
        let body = serde_json::to_string(payload).map_err(|e| e.to_string())?;
        host::send(destination, &body).map(|r| Response {
            status: r.status,
            body: r.body,
        })
    }
}

/// What `export_plugin!` calls: converts the event, runs the plugin, converts back.
#[doc(hidden)]
pub fn run<P: Plugin>(event: wit::Event) -> Result<wit::Outcome, String> {
    let event = event_from_wit(event);
    let outcome = P::handle(&event, &mut WitHost)?;
    outcome_to_wit(outcome)
}

/// What `export_plugin!` calls for `validate-config`.
#[doc(hidden)]
pub fn validate<P: Plugin>(config: &str) -> Result<(), String> {
    P::validate_config(&config_of(config)?)
}

/// What `export_plugin!` calls for `needs-for`.
#[doc(hidden)]
pub fn needs<P: Plugin>(config: &str) -> Result<wit::Needs, String> {
    let Needs { kv, destinations } = P::needs(&config_of(config)?)?;
    Ok(wit::Needs { kv, destinations })
}

/// The config table the hub hands over as JSON text.
fn config_of(config: &str) -> Result<Config, String> {
    let value = match serde_json::from_str::<Value>(config) {
        Ok(Value::Null) => empty_object(),
        Ok(value) => value,
        Err(e) => return Err(format!("config is not JSON: {e}")),
    };
    Config::new(value)
}

/// The payload and the context stay text until the plugin asks for them.
fn event_from_wit(e: wit::Event) -> Event {
    Event {
        id: e.id,
        kind: e.kind,
        direction: match e.direction {
            wit::Direction::Inbound => Direction::Inbound,
            wit::Direction::Outbound => Direction::Outbound,
        },
        channel_id: e.channel_id,
        channel: e.channel,
        chat_id: e.chat_id,
        payload: LazyJson::text(e.payload, || Value::Null),
        at: e.at,
        // An event without surroundings may come with no context at all.
        context: LazyJson::text(e.context, empty_object),
    }
}

fn outcome_to_wit(o: Outcome) -> Result<wit::Outcome, String> {
    let action = match o.action {
        Action::Continue(None) => wit::Action::Continue(None),
        Action::Continue(Some(p)) => wit::Action::Continue(Some(json(&p)?)),
        Action::Drop(reason) => wit::Action::Drop(reason),
        Action::Reply(p) => wit::Action::Reply(json(&p)?),
    };
    let forwards = o
        .forwards
        .into_iter()
        .map(|f| {
            Ok(wit::Forward {
                destination: f.destination,
                payload: json(&f.payload)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(wit::Outcome { action, forwards })
}

fn json(value: &Value) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot write JSON: {e}"))
}

fn wit_level(level: Level) -> wit::Level {
    match level {
        Level::Trace => wit::Level::Trace,
        Level::Debug => wit::Level::Debug,
        Level::Info => wit::Level::Info,
        Level::Warn => wit::Level::Warn,
        Level::Error => wit::Level::Error,
    }
}
