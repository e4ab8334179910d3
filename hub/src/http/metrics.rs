//! `/metrics` in the Prometheus text format: the process (`hub_up`, build,
//! start time), client connections, HTTP requests, events, deliveries, webhook replies and live
//! streams as counted in `obs`; the outbox and the connection pool read at
//! scrape time; per-plugin calls, outcomes, errors by kind and time spent
//! (with the phases of a call), log bytes and quota refusals; webhook reply
//! fields that were skipped.

use std::fmt::Write;

use http::StatusCode;

use crate::clock::now_ms;
use crate::http::App;
use crate::http::respond::{Resp, full, with_type};
use crate::obs::{escape, header};
use crate::runtime::DURATION_BUCKETS_MICROS;
use crate::store::outbox::{
    POLICY_BOT, POLICY_CHANNEL, POLICY_TYPING, POLICY_WEBHOOK, POLICY_WEBHOOK_SYNC,
};
use crate::store::{OutboxDepth, PoolUse};

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

pub async fn handle(app: &App) -> Resp {
    let mut text = String::new();
    crate::obs::render(&mut text);
    render_connections(&mut text, app);
    render_pool(&mut text, app.store.pool_use());
    render_outbox(&mut text, app).await;
    text.push_str(&render(app));
    app.wiring.shadows().render(&mut text);
    render_kv(&mut text, app).await;
    with_type(StatusCode::OK, CONTENT_TYPE, full(text))
}

/// Client connections: those never reach a route when refused, so the
/// request counters cannot show them.
fn render_connections(out: &mut String, app: &App) {
    let connections = &app.limits.connections;
    let open = "hub_http_connections_open";
    header(
        out,
        open,
        "gauge",
        "Client connections open now (at most `[server] max_connections`).",
    );
    let _ = writeln!(out, "{open} {}", connections.open_now());
    let refused = "hub_http_connections_refused_total";
    header(
        out,
        refused,
        "counter",
        "Connections answered 503 and closed because `[server] max_connections` were open.",
    );
    let _ = writeln!(out, "{refused} {}", connections.refused());
}

fn render_pool(out: &mut String, pool: PoolUse) {
    let name = "hub_db_connections";
    header(
        out,
        name,
        "gauge",
        "This process's database pool: connections in use, idle, and the most it opens.",
    );
    for (state, n) in [
        ("in_use", pool.in_use),
        ("idle", pool.idle),
        ("max", pool.max),
    ] {
        let _ = writeln!(out, "{name}{{state=\"{state}\"}} {n}");
    }
}

/// What waits in the outbox and the dead letters, for the whole database
/// (every instance on it). When the database does not answer, the families
/// are left out rather than shown as zero.
async fn render_outbox(out: &mut String, app: &App) {
    let depth = match app.store.outbox_depth().await {
        Ok(depth) => depth,
        Err(e) => {
            tracing::warn!(error = %e, "cannot measure the outbox");
            return;
        }
    };
    render_depth(out, &depth, now_ms());
}

fn render_depth(out: &mut String, depth: &OutboxDepth, now: i64) {
    // The hub's own policies show at zero too, so an alert on one of them
    // has a series to watch; destinations' (`dest:<name>`) only when used.
    let mut rows: Vec<(&str, i64, i64)> = depth
        .pending
        .iter()
        .map(|p| (p.policy.as_str(), p.rows, p.oldest_created_at))
        .collect();
    for policy in [
        POLICY_CHANNEL,
        POLICY_TYPING,
        POLICY_WEBHOOK_SYNC,
        POLICY_WEBHOOK,
        POLICY_BOT,
    ] {
        if !rows.iter().any(|(p, ..)| *p == policy) {
            rows.push((policy, 0, now));
        }
    }
    rows.sort_unstable();
    let pending = "hub_outbox_pending";
    header(
        out,
        pending,
        "gauge",
        "Outbox rows waiting to be delivered, by retry policy (all instances).",
    );
    for (policy, n, _) in &rows {
        let _ = writeln!(out, "{pending}{{policy=\"{}\"}} {n}", escape(policy));
    }
    let oldest = "hub_outbox_oldest_pending_seconds";
    header(
        out,
        oldest,
        "gauge",
        "Age of the oldest waiting outbox row, by retry policy (all instances).",
    );
    for (policy, _, oldest_at) in &rows {
        let age = (now - oldest_at).max(0) as f64 / 1e3;
        let _ = writeln!(out, "{oldest}{{policy=\"{}\"}} {age}", escape(policy));
    }
    let dead = "hub_dead_letters";
    header(
        out,
        dead,
        "gauge",
        "Outbox rows that failed for good and wait for a replay (all instances).",
    );
    let _ = writeln!(out, "{dead} {}", depth.dead_letters);
}

/// What each plugin with a key-value namespace keeps, read at scrape time.
async fn render_kv(out: &mut String, app: &App) {
    let wiring = app.wiring.current();
    let mut names: Vec<&str> = wiring
        .plugins
        .values()
        .filter(|p| p.kv_enabled())
        .map(|p| p.name())
        .collect();
    names.sort_unstable();
    let mut keys = String::new();
    let mut bytes = String::new();
    for name in names {
        match app.store.kv_usage(name).await {
            Ok(usage) => {
                let label = escape(name);
                let _ = writeln!(
                    keys,
                    "hub_plugin_kv_keys{{plugin=\"{label}\"}} {}",
                    usage.keys
                );
                let _ = writeln!(
                    bytes,
                    "hub_plugin_kv_bytes{{plugin=\"{label}\"}} {}",
                    usage.bytes
                );
            }
            Err(e) => tracing::warn!(plugin = name, error = %e, "cannot measure a plugin's keys"),
        }
    }
    let _ = writeln!(
        out,
        "# HELP hub_plugin_kv_keys Keys a plugin keeps.\n# TYPE hub_plugin_kv_keys gauge\n{keys}\
         # HELP hub_plugin_kv_bytes Bytes of keys and values a plugin keeps.\n# TYPE hub_plugin_kv_bytes gauge\n{bytes}"
    );
}

fn render(app: &App) -> String {
    let plugins = app.runtime.counters().snapshot();
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (plugin, s) in &plugins {
            let label = escape(plugin);
            match name {
                "hub_plugin_errors_total" => {
                    for (k, v) in &s.errors {
                        let _ = writeln!(out, "{name}{{plugin=\"{label}\",kind=\"{k}\"}} {v}");
                    }
                }
                _ => {
                    let v = match name {
                        "hub_plugin_calls_total" => s.calls as f64,
                        "hub_plugin_drops_total" => s.drops as f64,
                        "hub_plugin_replies_total" => s.replies as f64,
                        "hub_plugin_forwards_total" => s.forwards as f64,
                        "hub_plugin_instantiate_seconds_total" => s.instantiate_nanos as f64 / 1e9,
                        "hub_plugin_guest_seconds_total" => s.guest_nanos as f64 / 1e9,
                        "hub_plugin_teardown_seconds_total" => s.teardown_nanos as f64 / 1e9,
                        "hub_plugin_log_bytes_total" => s.log_bytes as f64,
                        "hub_plugin_logs_dropped_total" => s.logs_dropped as f64,
                        "hub_plugin_quota_refusals_total" => s.quota_refusals as f64,
                        _ => s.micros as f64 / 1e6,
                    };
                    let _ = writeln!(out, "{name}{{plugin=\"{label}\"}} {v}");
                }
            }
        }
    };
    family("hub_plugin_calls_total", "Plugin calls made.", "counter");
    family(
        "hub_plugin_drops_total",
        "Events plugins dropped.",
        "counter",
    );
    family(
        "hub_plugin_replies_total",
        "Events plugins answered.",
        "counter",
    );
    family(
        "hub_plugin_forwards_total",
        "Forwards plugins asked for.",
        "counter",
    );
    family(
        "hub_plugin_errors_total",
        "Failed plugin calls by kind.",
        "counter",
    );
    family(
        "hub_plugin_call_seconds_total",
        "Time spent in plugin calls.",
        "counter",
    );
    family(
        "hub_plugin_instantiate_seconds_total",
        "Successful calls: time creating each call's sandbox.",
        "counter",
    );
    family(
        "hub_plugin_guest_seconds_total",
        "Successful calls: time in the plugin's handler.",
        "counter",
    );
    family(
        "hub_plugin_teardown_seconds_total",
        "Successful calls: time dropping each call's sandbox.",
        "counter",
    );
    family(
        "hub_plugin_log_bytes_total",
        "Bytes of plugin log() messages written to the hub's log.",
        "counter",
    );
    family(
        "hub_plugin_logs_dropped_total",
        "Plugin log() messages dropped past the per-call cap.",
        "counter",
    );
    family(
        "hub_plugin_quota_refusals_total",
        "Key-value writes refused by a plugin's quotas.",
        "counter",
    );
    render_durations(&mut out, &plugins);
    render_reply_skips(&mut out, &app.conversations.reply_skips().snapshot());
    out
}

/// Plugin call durations as a Prometheus histogram (cumulative buckets).
fn render_durations(
    out: &mut String,
    plugins: &std::collections::BTreeMap<String, crate::runtime::Snapshot>,
) {
    let name = "hub_plugin_call_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Plugin calls by duration, waiting for a turn included.\n# TYPE {name} histogram"
    );
    for (plugin, s) in plugins {
        let label = escape(plugin);
        let mut cumulative = 0;
        for (i, count) in s.durations.iter().enumerate() {
            cumulative += count;
            let le = DURATION_BUCKETS_MICROS
                .get(i)
                .map_or("+Inf".to_owned(), |micros| {
                    (*micros as f64 / 1e6).to_string()
                });
            let _ = writeln!(
                out,
                "{name}_bucket{{plugin=\"{label}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_sum{{plugin=\"{label}\"}} {}",
            s.micros as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{plugin=\"{label}\"}} {}", s.calls);
    }
}

fn render_reply_skips(out: &mut String, counts: &[((String, &'static str), u64)]) {
    let name = "hub_webhook_reply_fields_skipped_total";
    let _ = writeln!(
        out,
        "# HELP {name} Malformed fields of chat_accepted/chat_updated replies that were left out.\n\
         # TYPE {name} counter"
    );
    for ((event, field), v) in counts {
        let _ = writeln!(
            out,
            "{name}{{event=\"{}\",field=\"{}\"}} {v}",
            escape(event),
            escape(field)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::webhooks::reply::SkippedCounts;
    use crate::store::PendingRows;

    #[test]
    fn the_outbox_shows_each_policy_with_its_oldest_row_and_the_dead_letters() {
        let depth = OutboxDepth {
            pending: vec![
                PendingRows {
                    policy: "channel".to_owned(),
                    rows: 3,
                    oldest_created_at: 10_000,
                },
                PendingRows {
                    policy: "dest:crm".to_owned(),
                    rows: 1,
                    oldest_created_at: 11_500,
                },
            ],
            dead_letters: 2,
        };
        let mut out = String::new();
        render_depth(&mut out, &depth, 12_000);
        assert!(out.contains("# TYPE hub_outbox_pending gauge\n"));
        assert!(out.contains("hub_outbox_pending{policy=\"channel\"} 3\n"));
        assert!(out.contains("hub_outbox_pending{policy=\"dest:crm\"} 1\n"));
        assert!(out.contains("hub_outbox_oldest_pending_seconds{policy=\"channel\"} 2\n"));
        assert!(out.contains("hub_outbox_oldest_pending_seconds{policy=\"dest:crm\"} 0.5\n"));
        assert!(out.contains("hub_dead_letters 2\n"));
        assert!(out.contains("hub_outbox_pending{policy=\"webhook\"} 0\n"));
        assert!(out.contains("hub_outbox_oldest_pending_seconds{policy=\"webhook\"} 0\n"));
    }

    #[test]
    fn pool_use_is_one_gauge_by_state() {
        let mut out = String::new();
        render_pool(
            &mut out,
            PoolUse {
                in_use: 1,
                idle: 2,
                max: 4,
            },
        );
        assert!(out.contains("hub_db_connections{state=\"in_use\"} 1\n"));
        assert!(out.contains("hub_db_connections{state=\"idle\"} 2\n"));
        assert!(out.contains("hub_db_connections{state=\"max\"} 4\n"));
    }

    #[test]
    fn skipped_reply_fields_are_counted_by_event_and_field() {
        let counts = SkippedCounts::default();
        counts.count("chat_updated", "page");
        counts.count("chat_updated", "page");
        counts.count("chat_accepted", "crm_link");
        let mut out = String::new();
        render_reply_skips(&mut out, &counts.snapshot());
        assert!(out.contains("# TYPE hub_webhook_reply_fields_skipped_total counter\n"));
        assert!(out.contains(
            "hub_webhook_reply_fields_skipped_total{event=\"chat_updated\",field=\"page\"} 2\n"
        ));
        assert!(out.contains(
            "hub_webhook_reply_fields_skipped_total{event=\"chat_accepted\",field=\"crm_link\"} 1\n"
        ));
    }
}
