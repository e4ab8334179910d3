//! A plugin that misbehaves as its config `fault` says, so the hub's tests can
//! check that each kind of failure is contained; `"none"` makes it a no-op.
//! What it needs granted is what its config's `needs` table says (`kv`,
//! `destinations`), or a call that never ends with `needs = "loop"`.

use std::hint::black_box;

use plugin_api::sdk::{Config, Event, Host, Level, Needs, Outcome, Plugin};
use serde_json::{Value, json};

pub struct Fault;

/// Default size of the `huge_output` string: 8 MiB.
const HUGE_OUTPUT_BYTES: u64 = 8 << 20;
const HOST_CALLS: u64 = 100_000;
const MIB: usize = 1 << 20;

impl Plugin for Fault {
    fn needs(config: &Config) -> Result<Needs, String> {
        let table = match config.get("needs") {
            None => return Ok(Needs::none()),
            Some(Value::String(s)) if s == "loop" => spin(),
            Some(table) => Config::new(table.clone())?,
        };
        let mut needs = Needs::none().kv_if(table.bool_or("kv", false)?);
        for name in table.strings("destinations")?.unwrap_or_default() {
            needs = needs.destination(name);
        }
        Ok(needs)
    }

    fn handle(event: &Event, host: &mut dyn Host) -> Result<Outcome, String> {
        let config = Config::new(host.config())?;
        match config.str_or("fault", "none")? {
            "none" => Ok(Outcome::pass()),
            "loop" => spin(),
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(config.u64_or("secs", 3600)?));
                Ok(Outcome::pass())
            }
            "naps" => {
                // Not hostile: a short call that waits a few times (a lookup
                // of a few ms), not running meanwhile.
                let ms = config.u64_or("ms", 2)?;
                for _ in 0..config.u64_or("count", 3)? {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                Ok(Outcome::pass())
            }
            "recursion" => {
                black_box(deep(black_box(u64::MAX)));
                Ok(Outcome::pass())
            }
            "memory" => hoard(),
            "trap" => panic!("fault plugin: trap"),
            "huge_output" => {
                let size = config.u64_or("size_bytes", HUGE_OUTPUT_BYTES)?;
                let size = usize::try_from(size).map_err(|e| e.to_string())?;
                Ok(Outcome::replace(Value::String("x".repeat(size))))
            }
            "host_calls" => host_calls(&config, host),
            "forbidden_send" => {
                let destination = config.str_or("destination", "not-granted")?;
                host.send(destination, &json!({}))?;
                Ok(Outcome::pass())
            }
            "replace" => Ok(Outcome::replace(required(&config, "payload")?)),
            "drop" => Ok(Outcome::drop(
                config.str_or("reason", "dropped by fault plugin")?,
            )),
            "reply" => Ok(Outcome::reply(required(&config, "payload")?)),
            "error" => Err(config.str_or("message", "fault plugin: error")?.to_owned()),
            "everything" => {
                // Every effect a plugin has, at once, then a drop: a shadow
                // doing this must change nothing of live traffic.
                let destination = config.required_str("destination")?;
                host.kv_set(&format!("seen:{}", event.id), "1")?;
                let _ = host.send(destination, event.payload())?;
                Ok(Outcome::drop("dropped by fault plugin (everything)")
                    .forward(destination, event.payload().clone()))
            }
            "forward" => {
                let destination = config.required_str("destination")?;
                Ok(Outcome::pass().forward(destination, event.payload().clone()))
            }
            "echo_context" => {
                let echo = json!({
                    "id": event.id,
                    "kind": event.kind,
                    "direction": event.direction.as_str(),
                    "channel_id": event.channel_id,
                    "channel": event.channel,
                    "chat_id": event.chat_id,
                    "at": event.at,
                    "context": event.context(),
                });
                host.log(Level::Info, &echo.to_string());
                Ok(Outcome::pass())
            }
            "note_chat" => {
                // The chat the plugin was told, under the message's text.
                let text = event.payload()["message"]["text"].as_str().unwrap_or("");
                let chat = event.chat_id.map_or("none".to_owned(), |c| c.to_string());
                host.kv_set(&format!("chat:{text}"), &chat)?;
                Ok(Outcome::pass())
            }
            "kv_flood" => {
                // New keys each event; refusals are answered, not fatal.
                let count = config.u64_or("count", 1000)?;
                let value =
                    "v".repeat(usize::try_from(config.u64_or("size_bytes", 1024)?).unwrap_or(0));
                for i in 0..count {
                    let _ = host.kv_set(&format!("{}-{i}", event.id), &value);
                }
                Ok(Outcome::pass())
            }
            "forward_flood" => {
                let destination = config.required_str("destination")?;
                let mut outcome = Outcome::pass();
                for _ in 0..config.u64_or("count", 1000)? {
                    outcome = outcome.forward(destination, event.payload().clone());
                }
                Ok(outcome)
            }
            "log_flood" => {
                let line = format!("{}\nfake hub line", "l".repeat(1000));
                let level = match config.str_or("level", "error")? {
                    "debug" => Level::Debug,
                    _ => Level::Error,
                };
                for _ in 0..config.u64_or("count", 1000)? {
                    host.log(level, &line);
                }
                Ok(Outcome::pass())
            }
            "stdout_flood" => {
                let chunk = "o".repeat(1023);
                for _ in 0..config.u64_or("count", 100)? {
                    println!("{chunk}");
                }
                Ok(Outcome::pass())
            }
            other => Err(format!("config: fault \"{other}\" is not known")),
        }
    }
}

fn required(config: &Config, key: &str) -> Result<Value, String> {
    config
        .get(key)
        .cloned()
        .ok_or_else(|| format!("config: {key} is required"))
}

/// Burns fuel or epochs until the host interrupts the call.
fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        // black_box keeps the optimizer from proving the loop useless.
        n = black_box(n).wrapping_add(1);
    }
}

/// Recurses until the stack runs out; the frame is kept large and live so
/// the compiler can neither shrink nor loop it.
fn deep(n: u64) -> u64 {
    let frame = black_box([n; 32]);
    if n == 0 {
        return 0;
    }
    deep(n - 1).wrapping_add(frame[7])
}

/// Grows and writes memory until the host's limit makes an allocation fail.
fn hoard() -> ! {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut block = vec![0u8; MIB];
        // Touch every page so the memory is really committed.
        for byte in block.iter_mut().step_by(4096) {
            *byte = 1;
        }
        blocks.push(black_box(block));
    }
}

/// Makes `count` cheap host calls: `call` picks `config` (default), `kv_get` or `log`.
fn host_calls(config: &Config, host: &mut dyn Host) -> Result<Outcome, String> {
    let count = config.u64_or("count", HOST_CALLS)?;
    match config.str_or("call", "config")? {
        "config" => {
            for _ in 0..count {
                black_box(host.config());
            }
        }
        "kv_get" => {
            for _ in 0..count {
                black_box(host.kv_get("fault")?);
            }
        }
        "log" => {
            for _ in 0..count {
                host.log(Level::Trace, "fault plugin: host call");
            }
        }
        other => return Err(format!("config: call \"{other}\" is not known")),
    }
    Ok(Outcome::pass())
}

#[cfg(target_arch = "wasm32")]
plugin_api::export_plugin!(Fault);

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::sdk::Action;
    use plugin_api::testing::{FakeHost, customer_text};

    fn run(config: Value) -> (Result<Outcome, String>, FakeHost) {
        let mut host = FakeHost::new(config).respond("crm", 200, "");
        let out = Fault::handle(&customer_text("1", "hi"), &mut host);
        (out, host)
    }

    #[test]
    fn needs_come_from_the_config() {
        let needs = |c: Value| Fault::needs(&Config::new(c).unwrap());
        assert_eq!(needs(json!({})), Ok(Needs::none()));
        assert_eq!(
            needs(json!({"needs": {"kv": true, "destinations": ["crm", "audit"]}})),
            Ok(Needs::none().kv().destination("crm").destination("audit"))
        );
        assert!(needs(json!({"needs": {"kv": 1}})).is_err());
    }

    #[test]
    fn default_is_a_no_op() {
        assert_eq!(run(json!({})).0, Ok(Outcome::pass()));
        assert_eq!(run(json!({"fault": "none"})).0, Ok(Outcome::pass()));
    }

    #[test]
    fn outcomes_from_config() {
        let p = json!({"a": 1});
        assert_eq!(
            run(json!({"fault": "replace", "payload": p})).0,
            Ok(Outcome::replace(p.clone()))
        );
        assert_eq!(
            run(json!({"fault": "reply", "payload": p})).0,
            Ok(Outcome::reply(p))
        );
        assert_eq!(
            run(json!({"fault": "drop"})).0,
            Ok(Outcome::drop("dropped by fault plugin"))
        );
        assert_eq!(
            run(json!({"fault": "error", "message": "boom"})).0,
            Err("boom".into())
        );
        assert_eq!(
            run(json!({"fault": "naps", "ms": 1, "count": 2})).0,
            Ok(Outcome::pass())
        );
        assert!(run(json!({"fault": "replace"})).0.is_err());
        assert!(run(json!({"fault": "nonsense"})).0.is_err());
    }

    #[test]
    fn huge_output_has_the_asked_size() {
        let out = run(json!({"fault": "huge_output", "size_bytes": 1000})).0;
        let Ok(Outcome {
            action: Action::Continue(Some(Value::String(s))),
            ..
        }) = out
        else {
            panic!("unexpected {out:?}")
        };
        assert_eq!(s.len(), 1000);
    }

    #[test]
    fn sends_and_forwards() {
        let (out, host) = run(json!({"fault": "forbidden_send"}));
        assert!(out.unwrap_err().contains("not granted"));
        assert_eq!(host.sent().len(), 1);
        let (out, _) = run(json!({"fault": "forbidden_send", "destination": "crm"}));
        assert_eq!(out, Ok(Outcome::pass()));
        let (out, _) = run(json!({"fault": "forward", "destination": "crm"}));
        let out = out.unwrap();
        assert_eq!(out.forwards[0].destination, "crm");
        assert_eq!(out.forwards[0].payload["message"]["text"], "hi");
    }

    #[test]
    fn host_calls_and_echo() {
        let (out, host) = run(json!({"fault": "host_calls", "count": 3, "call": "log"}));
        assert_eq!(out, Ok(Outcome::pass()));
        assert_eq!(host.logs().len(), 3);
        let (_, host) = run(json!({"fault": "echo_context"}));
        let (level, line) = &host.logs()[0];
        assert_eq!(*level, Level::Info);
        let echoed: Value = serde_json::from_str(line).unwrap();
        assert_eq!(echoed["kind"], "channel.customer_message");
        assert_eq!(echoed["context"], json!({"agents_online": 1}));
    }
}
