//! Configuration errors as fixture files, in `tests/fixtures/config/`: each
//! `NAME.toml` is loaded as `hub check` loads it, with the environment of
//! `NAME.env` (`VAR=value` lines) or none at all, and must fail with exactly
//! the text of `NAME.expected`, where `{file}` stands for the file's path.
//! To add a case, write the two files; a mismatch prints the text to paste.

use std::path::{Path, PathBuf};

use super::{Config, Env};

/// Fewer would mean the directory was not found or cases got lost.
const AT_LEAST: usize = 15;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/config")
}

/// The variables of `NAME.env`: `VAR=value` per line; blank lines and `#` comments are skipped.
fn env_of(toml: &Path) -> Env {
    let Ok(text) = std::fs::read_to_string(toml.with_extension("env")) else {
        return Env::empty();
    };
    let vars: Vec<(String, String)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{}: `{l}` is not VAR=value", toml.display()));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    Env::fixed(vars)
}

/// The error loading `toml` gives, with its path written as `{file}`.
fn error_of(toml: &Path) -> Result<String, String> {
    match Config::load_with(toml, &env_of(toml)) {
        Ok(_) => Err("loaded without an error".to_owned()),
        Err(e) => Ok(e.to_string().replace(&toml.display().to_string(), "{file}")),
    }
}

#[test]
fn every_config_fixture_fails_with_its_expected_text() {
    let dir = fixture_dir();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    names.sort();
    let mut failures = Vec::new();
    let mut cases = 0;
    for path in &names {
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        match ext {
            "toml" => {}
            "expected" | "env" => {
                if !path.with_extension("toml").exists() {
                    failures.push(format!("{}: no .toml beside it", path.display()));
                }
                continue;
            }
            _ => continue,
        }
        cases += 1;
        let expected_file = path.with_extension("expected");
        // A missing `.expected` reads as empty, so the failure shows the text to put in it.
        let expected = std::fs::read_to_string(&expected_file).unwrap_or_default();
        let expected = expected.strip_suffix('\n').unwrap_or(&expected);
        match error_of(path) {
            Ok(actual) if actual == expected => {}
            Ok(actual) => failures.push(format!(
                "{}:\n--- expected\n{expected}\n--- actual\n{actual}\n---",
                expected_file.display()
            )),
            Err(e) => failures.push(format!("{}: {e}", path.display())),
        }
    }
    assert!(
        cases >= AT_LEAST,
        "{} holds {cases} fixtures, expected at least {AT_LEAST}",
        dir.display()
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} config fixtures failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
