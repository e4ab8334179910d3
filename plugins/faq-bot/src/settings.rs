//! The config, read and checked in one place, so `validate_config` and every
//! call agree; errors name the key as `config: <key> …`.

use plugin_api::bot::MAX_BUTTONS;
use plugin_api::sdk::Config;
use serde_json::Value;

const DEFAULT_GREETING: &str = "Hello! How can I help?";
const DEFAULT_MENU_TITLE: &str = "Choose a topic";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub greeting: String,
    pub menu_title: String,
    pub menu: Vec<String>,
    /// Ordered so that the first keyword found is the one that wins.
    answers: Vec<Answer>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    /// Lowercased, so a match is a plain substring search.
    keyword: String,
    text: String,
}

impl Settings {
    pub fn read(config: &Config) -> Result<Settings, String> {
        Ok(Settings {
            greeting: non_blank(config, "greeting", DEFAULT_GREETING)?,
            menu_title: non_blank(config, "menu_title", DEFAULT_MENU_TITLE)?,
            menu: menu(config)?,
            answers: answers(config.get("answers"))?,
        })
    }

    /// The answer whose keyword occurs in `text`, ignoring case.
    pub fn answer(&self, text: &str) -> Option<&str> {
        let text = text.to_lowercase();
        self.answers
            .iter()
            .find(|a| text.contains(a.keyword.as_str()))
            .map(|a| a.text.as_str())
    }
}

fn non_blank(config: &Config, key: &str, default: &str) -> Result<String, String> {
    let value = config.str_or(key, default)?;
    if value.trim().is_empty() {
        return Err(format!("config: {key} must not be empty"));
    }
    Ok(value.to_owned())
}

fn menu(config: &Config) -> Result<Vec<String>, String> {
    let menu = config.strings("menu")?.unwrap_or_default();
    if menu.len() > MAX_BUTTONS {
        return Err(format!(
            "config: menu has {} topics; at most {MAX_BUTTONS} fit as buttons",
            menu.len()
        ));
    }
    if let Some(n) = menu.iter().position(|t| t.trim().is_empty()) {
        return Err(format!("config: menu[{n}] must not be empty"));
    }
    Ok(menu)
}

fn answers(table: Option<&Value>) -> Result<Vec<Answer>, String> {
    let Some(table) = table else {
        return Ok(Vec::new());
    };
    let Some(table) = table.as_object() else {
        return Err("config: answers must be a table of keyword = \"answer\"".to_owned());
    };
    let mut answers = Vec::with_capacity(table.len());
    for (keyword, text) in table {
        if keyword.trim().is_empty() {
            return Err("config: answers has an empty keyword".to_owned());
        }
        let text = text
            .as_str()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| format!("config: answers.{keyword:?} must be a non-empty string"))?;
        answers.push(Answer {
            keyword: keyword.to_lowercase(),
            text: text.to_owned(),
        });
    }
    answers.sort_by(|a, b| {
        b.keyword
            .chars()
            .count()
            .cmp(&a.keyword.chars().count())
            .then_with(|| a.keyword.cmp(&b.keyword))
    });
    // Keywords equal but for case would tie with no rule to break it.
    if let Some(pair) = answers.windows(2).find(|w| w[0].keyword == w[1].keyword) {
        return Err(format!(
            "config: answers has the keyword {:?} twice (keywords ignore case)",
            pair[0].keyword
        ));
    }
    Ok(answers)
}
