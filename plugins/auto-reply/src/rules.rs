//! Keyword rules: `{"match": "word" | ["word", …], "reply": "…"}`, read once
//! per event and checked in order.

use plugin_api::sdk::strings;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Lowercased, so a match is a plain substring search.
    words: Vec<String>,
    reply: String,
}

impl Rule {
    /// The `keywords` array of the config; absent means no rules.
    pub fn parse_all(keywords: Option<&Value>) -> Result<Vec<Rule>, String> {
        let Some(keywords) = keywords else {
            return Ok(Vec::new());
        };
        let Some(items) = keywords.as_array() else {
            return Err("config: keywords must be an array".to_owned());
        };
        items
            .iter()
            .enumerate()
            .map(|(n, item)| {
                let words = item.get("match").and_then(strings).ok_or_else(|| {
                    format!("config: keywords[{n}].match must be a string or an array of strings")
                })?;
                let reply = item
                    .get("reply")
                    .and_then(Value::as_str)
                    .filter(|r| !r.trim().is_empty())
                    .ok_or_else(|| {
                        format!("config: keywords[{n}].reply must be a non-empty string")
                    })?;
                Ok(Rule {
                    words: words
                        .iter()
                        .filter(|w| !w.is_empty())
                        .map(|w| w.to_lowercase())
                        .collect(),
                    reply: reply.to_owned(),
                })
            })
            .collect()
    }
}

/// The reply of the first rule with a word in `text`.
pub fn first_match<'r>(rules: &'r [Rule], text: &str) -> Option<&'r str> {
    let text = text.to_lowercase();
    rules
        .iter()
        .find(|r| r.words.iter().any(|w| text.contains(w.as_str())))
        .map(|r| r.reply.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn first_rule_that_matches_wins() {
        let rules = Rule::parse_all(Some(&json!([
            {"match": ["price", "COST"], "reply": "See our prices."},
            {"match": "hours", "reply": "9 to 5."},
            {"match": "price list", "reply": "never reached"},
        ])))
        .unwrap();
        assert_eq!(
            first_match(&rules, "What does it Cost?"),
            Some("See our prices.")
        );
        assert_eq!(
            first_match(&rules, "send the PRICE LIST"),
            Some("See our prices.")
        );
        assert_eq!(first_match(&rules, "opening hours?"), Some("9 to 5."));
        assert_eq!(first_match(&rules, "hello"), None);
    }

    #[test]
    fn empty_words_match_nothing() {
        let rules = Rule::parse_all(Some(&json!([{"match": [""], "reply": "x"}]))).unwrap();
        assert_eq!(first_match(&rules, "anything"), None);
    }

    #[test]
    fn malformed_rules_are_config_errors() {
        for bad in [
            json!({"match": "x"}),
            json!([{"match": 1, "reply": "x"}]),
            json!([{"reply": "x"}]),
            json!([{"match": "x"}]),
            json!([{"match": "x", "reply": " "}]),
        ] {
            let err = Rule::parse_all(Some(&bad)).unwrap_err();
            assert!(err.starts_with("config: keywords"), "{bad}: {err}");
        }
        assert_eq!(Rule::parse_all(None).unwrap(), Vec::new());
    }
}
