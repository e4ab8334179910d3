//! `hub plugin new`: writes a plugin crate that builds, passes its tests and
//! runs under `hub plugin test` without edits, against the plugin-api this
//! hub was built with.

use std::path::{Path, PathBuf};

/// A file of the new crate: where it goes and its template.
struct Template {
    path: &'static str,
    text: &'static str,
}

const TEMPLATES: &[Template] = &[
    Template {
        path: "Cargo.toml",
        text: include_str!("../templates/plugin/Cargo.toml.tmpl"),
    },
    Template {
        path: "src/lib.rs",
        text: include_str!("../templates/plugin/lib.rs.tmpl"),
    },
    Template {
        // The example plugins' own linker settings, so the two cannot drift apart.
        path: ".cargo/config.toml",
        text: include_str!("../../plugins/.cargo/config.toml"),
    },
    Template {
        // The versions the example plugins build with: a new crate resolves
        // to them (cargo drops what it does not use), not to whatever the
        // registry holds that day.
        path: "Cargo.lock",
        text: include_str!("../../plugins/Cargo.lock"),
    },
    Template {
        path: ".gitignore",
        text: include_str!("../templates/plugin/gitignore.tmpl"),
    },
    Template {
        path: "events/customer_message.json",
        text: include_str!("../templates/plugin/events/customer_message.json"),
    },
    Template {
        path: "events/agent_message.json",
        text: include_str!("../templates/plugin/events/agent_message.json"),
    },
    Template {
        path: "events/customer_typing.json",
        text: include_str!("../templates/plugin/events/customer_typing.json"),
    },
    Template {
        path: "hub.toml.fragment",
        text: include_str!("../templates/plugin/hub.toml.fragment.tmpl"),
    },
    Template {
        path: "README.md",
        text: include_str!("../templates/plugin/README.md.tmpl"),
    },
];

/// Names cargo refuses for a package, or that would shadow a crate every
/// plugin links.
const RESERVED: &[&str] = &[
    "as",
    "async",
    "await",
    "break",
    "const",
    "continue",
    "crate",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "abstract",
    "become",
    "box",
    "do",
    "final",
    "gen",
    "macro",
    "override",
    "priv",
    "try",
    "typeof",
    "unsized",
    "virtual",
    "yield",
    "test",
    "std",
    "core",
    "alloc",
    "proc_macro",
    "proc-macro",
    "plugin-api",
    "plugin_api",
    "serde_json",
];

/// Names the template imports; a plugin type of the same name would clash.
const IMPORTED: &[&str] = &[
    "Config", "Event", "FakeHost", "Host", "Level", "Outcome", "Plugin",
];

#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error("`{0}` is not a plugin name: use letters, digits, `-` and `_`, starting with a letter")]
    Name(String),
    #[error("`{0}` cannot be the name of a crate (a Rust keyword or a crate every plugin uses)")]
    Reserved(String),
    #[error("{0} exists and is not empty; choose another name or --dir")]
    NotEmpty(PathBuf),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What `new_plugin` wrote.
#[derive(Debug)]
pub struct Written {
    /// The crate's directory, absolute.
    pub dir: PathBuf,
    /// Paths relative to `dir`, in the order written.
    pub files: Vec<&'static str>,
    /// The component `cargo build --release --target wasm32-wasip2` makes, relative to `dir`.
    pub wasm: String,
    /// The plugin-api the crate depends on.
    pub plugin_api: PathBuf,
    /// Set when that plugin-api is not where the hub was built (the binary
    /// was moved): the crate needs its dependency pointed elsewhere.
    pub plugin_api_missing: bool,
}

/// Writes a new plugin crate named `name` into `dir`, which must not exist
/// or be empty.
pub fn new_plugin(name: &str, dir: &Path) -> Result<Written, ScaffoldError> {
    check_name(name)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| ScaffoldError::Io { path, source }
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ScaffoldError::NotEmpty(dir.to_owned()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(io(dir))?
        }
        // A file in the way reads as "not a directory": it is not empty either.
        Err(e) if dir.exists() && e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(ScaffoldError::NotEmpty(dir.to_owned()));
        }
        Err(e) => return Err(io(dir)(e)),
    }
    let dir = dir.canonicalize().map_err(io(dir))?;
    let crate_name = name.replace('-', "_");
    let wasm = format!("target/wasm32-wasip2/release/{crate_name}.wasm");
    let (plugin_api, plugin_api_missing) = match built_plugin_api().canonicalize() {
        Ok(p) => (p, false),
        Err(_) => (built_plugin_api(), true),
    };
    let vars = [
        ("{{name}}", name.to_owned()),
        ("{{crate}}", crate_name),
        ("{{type}}", type_name(name)),
        ("{{plugin_api}}", toml_string(&plugin_api)),
        ("{{wasm}}", toml_string(&dir.join(&wasm))),
    ];
    let mut files = Vec::with_capacity(TEMPLATES.len());
    for t in TEMPLATES {
        let path = dir.join(t.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let text = vars.iter().fold(t.text.to_owned(), |text, (key, value)| {
            text.replace(key, value)
        });
        std::fs::write(&path, text).map_err(io(&path))?;
        files.push(t.path);
    }
    Ok(Written {
        dir,
        files,
        wasm,
        plugin_api,
        plugin_api_missing,
    })
}

/// The plugin-api next to the hub crate this binary was built from.
fn built_plugin_api() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-api")
}

/// The rules of `[[plugins]] name`, plus what cargo needs of a package name.
fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !starts_with_letter || !chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(ScaffoldError::Name(name.to_owned()));
    }
    if RESERVED.contains(&name) {
        return Err(ScaffoldError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// `word-filter` → `WordFilter`; a name the template imports gets a suffix.
fn type_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for part in name.split(['-', '_']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if IMPORTED.contains(&out.as_str()) {
        out.push_str("Plugin");
    }
    out
}

/// A path as a TOML string, quoted and escaped as TOML wants it.
fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["word-filter", "a", "x_1", "Spam-Guard2"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1abc", "-x", "a b", "a/b", "ü", "a.b", "../x"] {
            assert!(
                matches!(check_name(bad), Err(ScaffoldError::Name(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            check_name("test"),
            Err(ScaffoldError::Reserved(_))
        ));
        assert_eq!(type_name("word-filter"), "WordFilter");
        assert_eq!(type_name("a__b-c"), "ABC");
        assert_eq!(type_name("plugin"), "PluginPlugin");
        assert_eq!(type_name("spam_Guard"), "SpamGuard");
    }

    #[test]
    fn writes_every_file_and_refuses_a_full_directory() {
        let dir = std::env::temp_dir().join(format!("hub-scaffold-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let written = new_plugin("word-filter", &dir).expect("written");
        for f in &written.files {
            assert!(written.dir.join(f).is_file(), "{f}");
        }
        let lib = std::fs::read_to_string(written.dir.join("src/lib.rs")).expect("lib.rs");
        assert!(lib.contains("impl Plugin for WordFilter"), "{lib}");
        assert!(!lib.contains("{{"), "{lib}");
        let manifest = std::fs::read_to_string(written.dir.join("Cargo.toml")).expect("manifest");
        let manifest: toml::Table = toml::from_str(&manifest).expect("Cargo.toml is TOML");
        assert_eq!(manifest["package"]["name"].as_str(), Some("word-filter"));
        let fragment =
            std::fs::read_to_string(written.dir.join("hub.toml.fragment")).expect("fragment");
        let fragment: toml::Table = toml::from_str(&fragment).expect("the fragment is TOML");
        assert!(
            fragment["plugins"][0]["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("release/word_filter.wasm")),
            "{fragment}"
        );
        assert!(matches!(
            new_plugin("word-filter", &dir),
            Err(ScaffoldError::NotEmpty(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
