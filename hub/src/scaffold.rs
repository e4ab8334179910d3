//! `hub plugin new`: writes a plugin project (a Rust crate, or a Python or
//! TypeScript project with `build.sh`) that builds, passes its tests and runs
//! under `hub plugin test` without edits, against the plugin-api, SDK and WIT
//! world this hub was built with.

use std::path::{Path, PathBuf};

/// A file of the new project: where it goes and its template.
struct Template {
    path: &'static str,
    text: &'static str,
}

/// The language of a new plugin project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lang {
    #[default]
    Rust,
    Python,
    TypeScript,
}

impl std::str::FromStr for Lang {
    type Err = String;

    fn from_str(s: &str) -> Result<Lang, String> {
        match s {
            "rust" | "rs" => Ok(Lang::Rust),
            "python" | "py" => Ok(Lang::Python),
            "typescript" | "ts" => Ok(Lang::TypeScript),
            _ => Err(format!("`{s}` is none of rust, python, typescript")),
        }
    }
}

/// The hub's WIT world and sample events, shared by every language.
const WIT: &str = include_str!("../../plugin-api/wit/plugin.wit");
const CUSTOMER_MESSAGE: &str = include_str!("../templates/plugin/events/customer_message.json");
const AGENT_MESSAGE: &str = include_str!("../templates/plugin/events/agent_message.json");
const CUSTOMER_TYPING: &str = include_str!("../templates/plugin/events/customer_typing.json");

/// A Python project: the plugin module, its tests, `build.sh`, and the SDK
/// and WIT vendored, so it builds with nothing but PyPI.
const PYTHON: &[Template] = &[
    Template {
        path: "{{module}}.py",
        text: include_str!("../templates/plugin-python/plugin.py.tmpl"),
    },
    Template {
        path: "test_{{module}}.py",
        text: include_str!("../templates/plugin-python/test_plugin.py.tmpl"),
    },
    Template {
        path: "build.sh",
        text: include_str!("../templates/plugin-python/build.sh.tmpl"),
    },
    Template {
        path: "hub_plugin/__init__.py",
        text: include_str!("../../sdk/python/hub_plugin/__init__.py"),
    },
    Template {
        path: "hub_plugin/sdk.py",
        text: include_str!("../../sdk/python/hub_plugin/sdk.py"),
    },
    Template {
        path: "hub_plugin/guest.py",
        text: include_str!("../../sdk/python/hub_plugin/guest.py"),
    },
    Template {
        path: "hub_plugin/testing.py",
        text: include_str!("../../sdk/python/hub_plugin/testing.py"),
    },
    Template {
        path: "hub_plugin/payloads.py",
        text: include_str!("../../sdk/python/hub_plugin/payloads.py"),
    },
    Template {
        path: "hub_plugin/py.typed",
        text: "",
    },
    Template {
        path: "wit/plugin.wit",
        text: WIT,
    },
    Template {
        path: "event.json",
        text: CUSTOMER_MESSAGE,
    },
    Template {
        path: "events/agent_message.json",
        text: AGENT_MESSAGE,
    },
    Template {
        path: "events/customer_typing.json",
        text: CUSTOMER_TYPING,
    },
    Template {
        path: "hub.toml.fragment",
        text: include_str!("../templates/plugin-python/hub.toml.fragment.tmpl"),
    },
    Template {
        path: ".gitignore",
        text: include_str!("../templates/plugin-python/gitignore.tmpl"),
    },
    Template {
        path: "README.md",
        text: include_str!("../templates/plugin-python/README.md.tmpl"),
    },
];

/// A TypeScript project: `src/plugin.ts`, its tests, `build.sh`, the npm
/// manifest and lock of the SDK's pinned tools, and the SDK and WIT vendored.
const TYPESCRIPT: &[Template] = &[
    Template {
        path: "src/plugin.ts",
        text: include_str!("../templates/plugin-typescript/plugin.ts.tmpl"),
    },
    Template {
        path: "test/plugin.test.ts",
        text: include_str!("../templates/plugin-typescript/plugin.test.ts.tmpl"),
    },
    Template {
        path: "build.sh",
        text: include_str!("../templates/plugin-typescript/build.sh.tmpl"),
    },
    Template {
        path: "package.json",
        text: include_str!("../templates/plugin-typescript/package.json.tmpl"),
    },
    Template {
        // The SDK's own lock: the project installs exactly the tools the SDK is tested with.
        path: "package-lock.json",
        text: include_str!("../../sdk/typescript/package-lock.json"),
    },
    Template {
        path: "tsconfig.json",
        text: include_str!("../templates/plugin-typescript/tsconfig.json.tmpl"),
    },
    Template {
        path: "hub-plugin/index.ts",
        text: include_str!("../../sdk/typescript/src/index.ts"),
    },
    Template {
        path: "hub-plugin/testing.ts",
        text: include_str!("../../sdk/typescript/src/testing.ts"),
    },
    Template {
        path: "hub-plugin/guest.ts",
        text: include_str!("../../sdk/typescript/src/guest.ts"),
    },
    Template {
        path: "hub-plugin/payloads.ts",
        text: include_str!("../../sdk/typescript/src/payloads.ts"),
    },
    Template {
        path: "hub-plugin/wit.d.ts",
        text: include_str!("../../sdk/typescript/src/wit.d.ts"),
    },
    Template {
        path: "wit/plugin.wit",
        text: WIT,
    },
    Template {
        path: "event.json",
        text: CUSTOMER_MESSAGE,
    },
    Template {
        path: "events/agent_message.json",
        text: AGENT_MESSAGE,
    },
    Template {
        path: "events/customer_typing.json",
        text: CUSTOMER_TYPING,
    },
    Template {
        path: "hub.toml.fragment",
        text: include_str!("../templates/plugin-typescript/hub.toml.fragment.tmpl"),
    },
    Template {
        path: ".gitignore",
        text: include_str!("../templates/plugin-typescript/gitignore.tmpl"),
    },
    Template {
        path: "README.md",
        text: include_str!("../templates/plugin-typescript/README.md.tmpl"),
    },
];

/// The SDK's npm manifest: its pinned tools become the project's.
const SDK_PACKAGE_JSON: &str = include_str!("../../sdk/typescript/package.json");

/// Names a Python plugin module cannot take: keywords, the SDK's and the
/// build's own modules, and standard modules a plugin is likely to import.
const PYTHON_RESERVED: &[&str] = &[
    "False",
    "None",
    "True",
    "and",
    "as",
    "assert",
    "async",
    "await",
    "break",
    "class",
    "continue",
    "def",
    "del",
    "elif",
    "else",
    "except",
    "finally",
    "for",
    "from",
    "global",
    "if",
    "import",
    "in",
    "is",
    "lambda",
    "nonlocal",
    "not",
    "or",
    "pass",
    "raise",
    "return",
    "try",
    "while",
    "with",
    "yield",
    "hub_plugin",
    "wit_world",
    "componentize_py_types",
    "json",
    "re",
    "typing",
    "dataclasses",
    "enum",
    "test",
    "app",
];

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
    pub lang: Lang,
    /// The project's directory, absolute.
    pub dir: PathBuf,
    /// Paths relative to `dir`, in the order written.
    pub files: Vec<String>,
    /// The component the build makes, relative to `dir`.
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
    new_plugin_in(Lang::Rust, name, dir)
}

/// Writes a new plugin project of `lang` named `name` into `dir`, which must
/// not exist or be empty.
pub fn new_plugin_in(lang: Lang, name: &str, dir: &Path) -> Result<Written, ScaffoldError> {
    check_name(name)?;
    let module = name.replace('-', "_");
    if lang == Lang::Python && PYTHON_RESERVED.contains(&module.as_str()) {
        return Err(ScaffoldError::Reserved(name.to_owned()));
    }
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
    let (templates, wasm) = match lang {
        Lang::Rust => (
            TEMPLATES,
            format!("target/wasm32-wasip2/release/{module}.wasm"),
        ),
        Lang::Python => (PYTHON, format!("{name}.wasm")),
        Lang::TypeScript => (TYPESCRIPT, format!("{name}.wasm")),
    };
    let (plugin_api, plugin_api_missing) = match built_plugin_api().canonicalize() {
        Ok(p) => (p, false),
        Err(_) => (built_plugin_api(), lang == Lang::Rust),
    };
    let vars = [
        ("{{name}}", name.to_owned()),
        ("{{crate}}", module.clone()),
        ("{{module}}", module),
        ("{{type}}", type_name(name)),
        ("{{plugin_api}}", toml_string(&plugin_api)),
        ("{{wasm}}", toml_string(&dir.join(&wasm))),
        ("{{devDependencies}}", npm_dev_dependencies()),
    ];
    let fill = |text: &str| {
        vars.iter().fold(text.to_owned(), |text, (key, value)| {
            text.replace(key, value)
        })
    };
    let mut files = Vec::with_capacity(templates.len());
    for t in templates {
        let relative = fill(t.path);
        let path = dir.join(&relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let text = match relative.as_str() {
            // npm wants the lock's root name to be the project's.
            "package-lock.json" => t.text.replace(
                "\"name\": \"@hub/plugin\"",
                &format!("\"name\": \"{}\"", npm_name(name)),
            ),
            "package.json" => fill(t.text).replace(
                &format!("\"name\": \"{name}\""),
                &format!("\"name\": \"{}\"", npm_name(name)),
            ),
            // The vendored SDK is copied as it is: `{{` is code there.
            _ if relative.starts_with("hub_plugin/") || relative.starts_with("hub-plugin/") => {
                t.text.to_owned()
            }
            _ => fill(t.text),
        };
        std::fs::write(&path, text).map_err(io(&path))?;
        if relative == "build.sh" {
            make_executable(&path).map_err(io(&path))?;
        }
        files.push(relative);
    }
    Ok(Written {
        lang,
        dir,
        files,
        wasm,
        plugin_api,
        plugin_api_missing,
    })
}

/// npm wants package names in lowercase.
fn npm_name(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// The SDK's pinned `devDependencies`, as JSON for the project's manifest.
fn npm_dev_dependencies() -> String {
    serde_json::from_str::<serde_json::Value>(SDK_PACKAGE_JSON)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v["devDependencies"]).ok())
        .map(|deps| deps.replace('\n', "\n  "))
        .unwrap_or_else(|| "{}".to_owned())
}

#[cfg(unix)]
fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) -> std::io::Result<()> {
    Ok(())
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
    fn python_and_typescript_projects() {
        let base = std::env::temp_dir().join(format!("hub-scaffold-langs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let py = new_plugin_in(Lang::Python, "word-filter", &base.join("py")).expect("python");
        assert_eq!(py.wasm, "word-filter.wasm");
        let module = std::fs::read_to_string(py.dir.join("word_filter.py")).expect("module");
        assert!(module.contains("class WordFilter(Plugin)"), "{module}");
        assert!(py.dir.join("hub_plugin/sdk.py").is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(py.dir.join("build.sh"))
                .expect("build.sh")
                .permissions();
            assert_eq!(mode.mode() & 0o111, 0o111, "build.sh is not executable");
        }
        assert!(matches!(
            new_plugin_in(Lang::Python, "json", &base.join("json")),
            Err(ScaffoldError::Reserved(_))
        ));

        let ts = new_plugin_in(Lang::TypeScript, "Word-Filter", &base.join("ts")).expect("ts");
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(ts.dir.join("package.json")).expect("package.json"),
        )
        .expect("package.json is JSON");
        assert_eq!(manifest["name"], "word-filter");
        assert_eq!(
            manifest["devDependencies"]["@bytecodealliance/componentize-js"],
            "0.23.0"
        );
        let lock: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(ts.dir.join("package-lock.json")).expect("lock"),
        )
        .expect("the lock is JSON");
        assert_eq!(lock["name"], "word-filter");
        assert_eq!(lock["packages"][""]["name"], "word-filter");
        assert!("kotlin".parse::<Lang>().is_err());
        let _ = std::fs::remove_dir_all(&base);
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
