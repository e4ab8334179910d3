//! Typed reads of a plugin's `config` table, so every plugin reports a wrong
//! setting the same way: `config: <key> must be …`.

use serde_json::{Map, Value};

/// A plugin's config object; `null` values count as absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    map: Map<String, Value>,
}

impl Config {
    /// Wraps what [`Host::config`](super::Host::config) returned; `null` is an empty config.
    pub fn new(value: Value) -> Result<Self, String> {
        match value {
            Value::Object(map) => Ok(Config { map }),
            Value::Null => Ok(Config::default()),
            other => Err(format!("config must be an object, not {other}")),
        }
    }

    /// The raw value of `key`, if set and not `null`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| must(key, "be a boolean")),
        }
    }

    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| must(key, "be a non-negative integer")),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| must(key, "be a string")),
        }
    }

    pub fn str_or<'a>(&'a self, key: &str, default: &'a str) -> Result<&'a str, String> {
        Ok(self.str(key)?.unwrap_or(default))
    }

    /// A string that must be present and not blank.
    pub fn required_str(&self, key: &str) -> Result<&str, String> {
        match self.str(key)? {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(format!("config: {key} is required")),
        }
    }

    /// An array of strings; a single string counts as an array of one.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => strings(v)
                .map(Some)
                .ok_or_else(|| must(key, "be a string or an array of strings")),
        }
    }
}

/// A string or an array of strings as a list; `None` for anything else.
pub fn strings(value: &Value) -> Option<Vec<String>> {
    match value {
        Value::String(s) => Some(vec![s.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

fn must(key: &str, what: &str) -> String {
    format!("config: {key} must {what}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_with_defaults_and_errors() {
        let c = Config::new(json!({
            "on": false, "n": 5, "name": "crm", "list": ["a", "b"], "one": "x",
            "blank": " ", "gone": null, "neg": -1, "mixed": ["a", 1]
        }))
        .unwrap();
        assert!(!c.bool_or("on", true).unwrap());
        assert!(c.bool_or("missing", true).unwrap());
        assert!(c.bool_or("gone", true).unwrap());
        assert_eq!(
            c.bool_or("n", true).unwrap_err(),
            "config: n must be a boolean"
        );
        assert_eq!(c.u64_or("n", 1).unwrap(), 5);
        assert!(c.u64_or("neg", 1).is_err());
        assert_eq!(c.str_or("name", "x").unwrap(), "crm");
        assert_eq!(c.str_or("missing", "x").unwrap(), "x");
        assert!(c.str("n").is_err());
        assert_eq!(c.required_str("name").unwrap(), "crm");
        assert_eq!(
            c.required_str("blank").unwrap_err(),
            "config: blank is required"
        );
        assert_eq!(
            c.required_str("missing").unwrap_err(),
            "config: missing is required"
        );
        assert_eq!(
            c.strings("list").unwrap(),
            Some(vec!["a".into(), "b".into()])
        );
        assert_eq!(c.strings("one").unwrap(), Some(vec!["x".into()]));
        assert_eq!(c.strings("missing").unwrap(), None);
        assert!(c.strings("mixed").is_err());
    }

    #[test]
    fn only_objects() {
        assert_eq!(Config::new(Value::Null).unwrap(), Config::default());
        assert!(Config::new(json!([1])).is_err());
    }
}
