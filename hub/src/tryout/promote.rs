//! `hub plugin promote`: rewrites `hub.toml` so that a shadow plugin
//! becomes live in place of the plugin it shadows (or at the end of the
//! chain, when it shadows none), on every route that names it as a shadow.
//! Only the two lines concerned change; comments and layout stay.

use crate::config::Config;

/// The file's new text, and one line per route changed.
pub fn promote(config: &Config, text: &str, shadow: &str) -> Result<(String, Vec<String>), String> {
    let entry = config
        .plugins
        .iter()
        .find(|p| p.name == shadow)
        .ok_or_else(|| format!("no plugin is named `{shadow}`"))?;
    let routes: Vec<usize> = config
        .routes
        .iter()
        .enumerate()
        .filter(|(_, r)| r.shadow.iter().any(|s| s == shadow))
        .map(|(i, _)| i)
        .collect();
    if routes.is_empty() {
        return Err(format!("no route has `{shadow}` as a shadow"));
    }
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let starts: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.trim() == "[[routes]]")
        .map(|(i, _)| i)
        .collect();
    if starts.len() != config.routes.len() {
        return Err(
            "routes are not all written as [[routes]] tables: edit the file by hand".to_owned(),
        );
    }
    let mut said = Vec::new();
    let mut removed = Vec::new();
    for &i in &routes {
        let start = starts[i];
        let end = (start + 1..lines.len())
            .find(|&j| lines[j].trim_start().starts_with('['))
            .unwrap_or(lines.len());
        let find = |key: &str, lines: &[String]| {
            (start + 1..end).find(|&j| {
                let l = lines[j].trim_start();
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start().starts_with('='))
            })
        };
        let (Some(p), Some(s)) = (find("plugins", &lines), find("shadow", &lines)) else {
            return Err(format!(
                "routes[{i}]: `plugins` or `shadow` not found on a line of its own"
            ));
        };
        let route = &config.routes[i];
        let mut plugins = route.plugins.clone();
        match entry
            .shadows
            .as_deref()
            .and_then(|live| plugins.iter().position(|n| n == live))
        {
            Some(at) => {
                said.push(format!(
                    "routes[{i}]: `{shadow}` replaces `{}`",
                    plugins[at]
                ));
                plugins[at] = shadow.to_owned();
            }
            None => {
                said.push(format!(
                    "routes[{i}]: `{shadow}` added at the end of the chain"
                ));
                plugins.push(shadow.to_owned());
            }
        }
        let others: Vec<String> = route
            .shadow
            .iter()
            .filter(|n| *n != shadow)
            .cloned()
            .collect();
        for (j, key, values) in [(p, "plugins", &plugins), (s, "shadow", &others)] {
            if !lines[j].trim_end().ends_with(']') {
                return Err(format!(
                    "routes[{i}].{key}: write the array on one line to promote"
                ));
            }
            let indent: String = lines[j].chars().take_while(|c| c.is_whitespace()).collect();
            let list: Vec<String> = values
                .iter()
                .map(|v| toml::Value::String(v.clone()).to_string())
                .collect();
            lines[j] = format!("{indent}{key} = [{}]", list.join(", "));
        }
        if others.is_empty() {
            removed.push(s);
        }
    }
    removed.sort_unstable();
    for j in removed.into_iter().rev() {
        lines.remove(j);
    }
    let mut out = lines.join("\n");
    if text.ends_with('\n') {
        out.push('\n');
    }
    Ok((out, said))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"[storage]
url = "sqlite://hub.db"

[[plugins]]
name = "redact"
path = "redact.wasm"

[[plugins]]
name = "redact-v2"
path = "redact.wasm"
shadows = "redact"
config = { emails = true }

# customer messages
[[routes]]
events = ["channel.customer_message"]
plugins = ["redact"]
shadow = ["redact-v2"]
"#;

    #[test]
    fn the_shadow_takes_the_place_of_the_plugin_it_shadows() {
        let config = Config::parse(FILE, std::path::Path::new("hub.toml")).expect("parses");
        let (text, said) = promote(&config, FILE, "redact-v2").expect("promoted");
        assert!(text.contains("plugins = [\"redact-v2\"]\n"), "{text}");
        assert!(!text.contains("shadow = "), "{text}");
        assert!(text.contains("# customer messages"), "{text}");
        assert_eq!(
            said,
            vec!["routes[0]: `redact-v2` replaces `redact`".to_owned()]
        );
        Config::parse(&text, std::path::Path::new("hub.toml")).expect("still a valid file");
        assert!(promote(&config, FILE, "redact").is_err());
    }
}
