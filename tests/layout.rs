//! The dependency rules of ARCHITECTURE.md, checked on the source: arrows
//! point down (edges → core → pipeline/runtime/delivery → store/outbound),
//! only `store/` names sqlx, only `runtime/` names wasmtime, the outbound
//! client imports nothing of the hub, edges never call other edges, only
//! the edges' layer checks credentials and limits, `plugin-api` never
//! depends on `hub`, and what decides by time reads the hub's `Clock`.

use std::path::{Path, PathBuf};

use crate::support::repo_root;

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source file");
                out.push((path, text));
            }
        }
    }
    out
}

fn hub_src() -> PathBuf {
    repo_root().join("hub/src")
}

/// The layer a file of `hub/src` belongs to: its first path component.
fn layer(path: &Path) -> String {
    let rel = path.strip_prefix(hub_src()).expect("under hub/src");
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// Lines of code (comments left out) that mention `needle`.
fn code_lines<'a>(text: &'a str, needle: &'a str) -> impl Iterator<Item = (usize, &'a str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .filter(move |(_, l)| l.contains(needle))
        .map(|(n, l)| (n + 1, l))
}

/// Layers each layer may import (besides the leaves `clock`, `ids`, `event`,
/// `obs`).
fn allowed(layer: &str) -> Option<&'static [&'static str]> {
    Some(match layer {
        "http" => &[
            "http", "core", "pipeline", "runtime", "delivery", "store", "outbound", "config",
        ],
        "core" => &[
            "core", "pipeline", "runtime", "delivery", "store", "outbound", "config",
        ],
        // The deliverer reads the current destinations from the wiring.
        "delivery" => &[
            "delivery", "pipeline", "runtime", "store", "outbound", "config",
        ],
        "pipeline" => &["pipeline", "runtime", "store", "outbound", "config"],
        "runtime" => &["runtime", "store", "outbound", "config"],
        "store" => &["store"],
        "outbound" => &[],
        "config" => &["config", "outbound"],
        // Leaves, which every layer may import, import only each other.
        "clock" | "ids" | "event" | "obs" => &[],
        // The assembler, the CLI and the CLI's plugin tryout see everything.
        _ => return None,
    })
}

#[test]
fn imports_point_down_the_layers() {
    let mut wrong = Vec::new();
    for (path, text) in sources(&hub_src()) {
        let layer = layer(&path);
        let Some(allowed) = allowed(&layer) else {
            continue;
        };
        for (n, line) in code_lines(&text, "crate::") {
            for part in line.split("crate::").skip(1) {
                let target: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let leaf = matches!(target.as_str(), "clock" | "ids" | "event" | "obs");
                if !leaf && !allowed.contains(&target.as_str()) {
                    wrong.push(format!("{}:{n}: {layer} imports {target}", path.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that point up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn only_store_names_sqlx_and_only_runtime_names_wasmtime() {
    let mut wrong = Vec::new();
    for (path, text) in sources(&hub_src()) {
        let layer = layer(&path);
        for (crate_name, owner) in [("sqlx", "store"), ("wasmtime", "runtime")] {
            if layer == owner {
                continue;
            }
            for (n, _) in code_lines(&text, &format!("{crate_name}::")) {
                wrong.push(format!(
                    "{}:{n}: {crate_name} outside {owner}/",
                    path.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn edges_never_call_other_edges() {
    let edges = ["channel", "agents", "admin", "widget", "metrics"];
    let mut wrong = Vec::new();
    for (path, text) in sources(&hub_src().join("http")) {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The router hands each request to its edge; that is not an edge calling one.
        if path == hub_src().join("http/mod.rs") {
            continue;
        }
        let own = if path.components().any(|c| c.as_os_str() == "agents") {
            "agents".to_owned()
        } else {
            name
        };
        for edge in edges.iter().filter(|e| **e != own) {
            for (n, _) in code_lines(&text, &format!("http::{edge}")) {
                wrong.push(format!("{}:{n}: calls the {edge} edge", path.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn only_the_layer_checks_credentials_and_limits() {
    // `route` passes every request through `http/layer.rs` before its
    // handler: the credential the edge declares and the limits that apply.
    // A handler holds only its interface's steps, so none of them counts a
    // request, a failed credential or compares a secret. The connection cap
    // is the server's (`mod.rs`), `/metrics` reads its counters, and the
    // CSRF token is a session's (`session.rs`).
    let http = hub_src().join("http");
    let beside = ["layer.rs", "limits.rs", "mod.rs", "state.rs"];
    let mut wrong = Vec::new();
    for (path, text) in sources(&http) {
        if beside.iter().any(|f| path == http.join(f)) {
            continue;
        }
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for needle in ["limits::", "app.limits.", "widget_limits", "bearer("] {
            for (n, line) in code_lines(code, needle) {
                if line.contains("app.limits.connections") {
                    continue;
                }
                wrong.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
        if path != http.join("session.rs") {
            for (n, line) in code_lines(code, "constant_time_eq(") {
                wrong.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "credential checks or limits outside http/layer.rs:\n{}",
        wrong.join("\n")
    );
}

/// The actions the door dispatches to, each by the name of its method.
const ACTIONS: &[&str] = &[
    "customer_message",
    "offline_message",
    "agent_message",
    "accept",
    "close",
    "link_crm",
    "set_attributes",
    "report_call",
    "widget_session",
    "widget_action",
    "provider_event",
    "crm_change",
];

#[test]
fn inbound_actions_are_reached_only_through_the_door() {
    // Each action is `pub(super)` in `core` (so no edge can call it), and
    // inside `core` only the door calls it. A plugin bot's answer is a
    // provider event the hub makes itself (`bots.rs`); it crosses the
    // pipeline inside the action like one a provider posted.
    let door = hub_src().join("core/door.rs");
    let mut wrong = Vec::new();
    let mut declared = Vec::new();
    for (path, text) in sources(&hub_src()) {
        for action in ACTIONS {
            for (n, line) in code_lines(&text, &format!("fn {action}(")) {
                // Methods only: a free function of that name is no action.
                let next = text.lines().nth(n).unwrap_or_default();
                if layer(&path) != "core" || !(line.contains("&self") || next.contains("&self")) {
                    continue;
                }
                declared.push(*action);
                if !line.contains(&format!("pub(super) async fn {action}(")) {
                    wrong.push(format!(
                        "{}:{n}: {action} is not pub(super)",
                        path.display()
                    ));
                }
            }
            if layer(&path) != "core" || path == door {
                continue;
            }
            let allowed = *action == "provider_event" && path.ends_with("core/bots.rs");
            for (n, _) in code_lines(&text, &format!("self.{action}(")) {
                if !allowed {
                    wrong.push(format!(
                        "{}:{n}: calls {action} past the door",
                        path.display()
                    ));
                }
            }
        }
    }
    for action in ACTIONS {
        if !declared.contains(action) {
            wrong.push(format!("no action {action} in core/"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The modules of `dir` (a file, or a folder taken as one) and the other
/// modules of `dir` each imports (`crate::<prefix>::<module>`).
fn module_imports(dir: &Path, prefix: &str) -> Vec<(String, Vec<String>)> {
    let mut modules: Vec<(String, Vec<String>)> = Vec::new();
    for (path, text) in sources(dir) {
        let rel = path.strip_prefix(dir).expect("under dir");
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = first.trim_end_matches(".rs").to_owned();
        if name == "mod" {
            continue;
        }
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let mut targets = Vec::new();
        // In a file of `dir` itself, `super::` is `dir`'s `mod.rs`.
        let mut needles = vec![format!("crate::{prefix}::")];
        if rel.components().count() == 1 {
            needles.push("super::".to_owned());
        }
        for needle in &needles {
            for (_, line) in code_lines(code, needle) {
                for part in line.split(needle.as_str()).skip(1) {
                    // `crate::core::x` or `crate::core::{x, y::Z}`.
                    let group = match part.strip_prefix('{') {
                        Some(inner) => inner.split('}').next().unwrap_or_default(),
                        None => part,
                    };
                    for item in group.split(',') {
                        let target: String = item
                            .trim()
                            .chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect();
                        if !target.is_empty() && target != name {
                            targets.push(target);
                        }
                    }
                }
            }
        }
        match modules.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => t.extend(targets),
            None => modules.push((name, targets)),
        }
    }
    modules
}

/// The modules that reach themselves again through their imports.
fn circles(modules: &[(String, Vec<String>)]) -> Vec<String> {
    let reaches = |from: &str| {
        let mut seen: Vec<&str> = Vec::new();
        let mut todo = vec![from];
        while let Some(m) = todo.pop() {
            let Some((_, targets)) = modules.iter().find(|(n, _)| n == m) else {
                continue;
            };
            for t in targets {
                if !seen.contains(&t.as_str()) {
                    seen.push(t);
                    todo.push(t);
                }
            }
        }
        seen.contains(&from)
    };
    modules
        .iter()
        .filter(|(name, _)| reaches(name))
        .map(|(name, targets)| {
            let modules: Vec<&String> = targets
                .iter()
                .filter(|t| modules.iter().any(|(n, _)| n == *t))
                .collect();
            format!("{name} -> {modules:?}")
        })
        .collect()
}

#[test]
fn the_core_and_the_runtime_have_no_import_circles() {
    // The actions import the context (`conversations.rs`), which imports
    // the writers and the shared words (`error.rs`); nothing imports back
    // up. In the runtime, host imports reach a plugin's scope, not the
    // plugin.
    for (layer, dir) in [("core", "core"), ("runtime", "runtime")] {
        let found = circles(&module_imports(&hub_src().join(dir), layer));
        assert!(
            found.is_empty(),
            "modules of {layer}/ in an import circle:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn plugin_api_never_depends_on_the_hub() {
    let manifest =
        std::fs::read_to_string(repo_root().join("plugin-api/Cargo.toml")).expect("manifest");
    assert!(
        !manifest.lines().any(|l| l.trim_start().starts_with("hub")),
        "plugin-api/Cargo.toml names hub"
    );
}

/// Where time decides what the hub does, it reads the hub's `Clock`
/// (ARCHITECTURE.md), so a test can hold time still and move it on: no
/// system clock, no tokio timer, outside the files' tests, but where the
/// comment above says why it is `In real time`.
#[test]
fn timed_decisions_read_the_hubs_clock() {
    let timed = [
        "delivery/mod.rs",
        "delivery/heartbeat.rs",
        "outbound/oauth.rs",
        "core/accounts.rs",
        "core/reminders.rs",
        "core/bots.rs",
        "core/chats.rs",
        "core/conversations.rs",
        "core/crm/mod.rs",
        "core/integration.rs",
        "core/messages.rs",
        "core/offline.rs",
        "core/outcomes.rs",
        "core/widget.rs",
    ];
    let mut wrong = Vec::new();
    for file in timed {
        let path = hub_src().join(file);
        let text = std::fs::read_to_string(&path).expect("source file");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let lines: Vec<&str> = code.lines().collect();
        for needle in [
            "Instant::now",
            "SystemTime::now",
            "tokio::time::sleep",
            "tokio::time::timeout",
            "now_ms()",
        ] {
            for (n, line) in code_lines(code, needle) {
                // `clock.now_ms()` is the hub's clock; a bare `now_ms()` the system's.
                let bare = line
                    .match_indices(needle)
                    .any(|(at, _)| needle != "now_ms()" || !line[..at].ends_with('.'));
                // The comment block right above the line.
                let excused = lines[..n - 1]
                    .iter()
                    .rev()
                    .take_while(|l| l.trim_start().starts_with("//"))
                    .any(|l| l.trim_start().starts_with("// In real time"));
                if bare && !excused {
                    wrong.push(format!("{}:{n}: {}", path.display(), line.trim()));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
