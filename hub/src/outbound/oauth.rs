//! OAuth 2.0 client-credentials tokens (the bot exchange's optional
//! authorization): fetched from the provider, cached per credentials, renewed
//! before they expire, and recognised when the provider presents them back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::header::CONTENT_TYPE;
use http::{HeaderName, HeaderValue};

use super::{ExchangeError, HttpSender, Request};
use crate::clock::Clock;

/// Who the hub is to the provider's token endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    pub token_url: String,
    pub client_id: String,
    pub secret: String,
}

/// Longest wait for the token endpoint.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(3);
/// Lifetime assumed when the answer gives none.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

struct Cached {
    token: String,
    /// A new token is fetched from here on (before this one runs out).
    renew_at: Instant,
    expires_at: Instant,
    /// The token it replaced, still accepted back until it expires: the
    /// provider may hold it for a request already under way.
    previous: Option<(String, Instant)>,
}

/// Tokens by credentials. One fetch at a time per cache: renewals are rare,
/// and a burst of requests must not become a burst of token requests.
pub struct TokenCache {
    sender: HttpSender,
    clock: Clock,
    tokens: Mutex<HashMap<Credentials, Cached>>,
    fetching: tokio::sync::Mutex<()>,
}

impl TokenCache {
    pub fn new(sender: HttpSender, clock: Clock) -> TokenCache {
        TokenCache {
            sender,
            clock,
            tokens: Mutex::new(HashMap::new()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// A valid token for `c`: the cached one, or a new one when it is due
    /// for renewal (or there is none).
    pub async fn token(&self, c: &Credentials) -> Result<String, ExchangeError> {
        if let Some(token) = self.fresh(c) {
            return Ok(token);
        }
        let _one = self.fetching.lock().await;
        // Someone else may have fetched it while this waited.
        if let Some(token) = self.fresh(c) {
            return Ok(token);
        }
        let (token, lifetime) = self.fetch(c).await?;
        let now = self.clock.now();
        let mut tokens = self.lock();
        let previous = tokens
            .remove(c)
            .filter(|old| old.expires_at > now)
            .map(|old| (old.token, old.expires_at));
        tokens.insert(
            c.clone(),
            Cached {
                token: token.clone(),
                // Renewed at four fifths of its life, so a request never
                // carries a token about to run out.
                renew_at: now + lifetime.mul_f64(0.8),
                expires_at: now + lifetime,
                previous,
            },
        );
        Ok(token)
    }

    /// The unexpired tokens the hub holds for `c` (the current one and the
    /// one it replaced), for checking what a provider presents back.
    pub fn held(&self, c: &Credentials) -> Vec<String> {
        let now = self.clock.now();
        let tokens = self.lock();
        let Some(cached) = tokens.get(c) else {
            return Vec::new();
        };
        let current = (cached.expires_at > now).then(|| cached.token.clone());
        let previous = cached
            .previous
            .as_ref()
            .filter(|(_, until)| *until > now)
            .map(|(token, _)| token.clone());
        current.into_iter().chain(previous).collect()
    }

    fn fresh(&self, c: &Credentials) -> Option<String> {
        let now = self.clock.now();
        self.lock()
            .get(c)
            .filter(|cached| cached.renew_at > now)
            .map(|cached| cached.token.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Credentials, Cached>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn fetch(&self, c: &Credentials) -> Result<(String, Duration), ExchangeError> {
        let body = format!(
            "grant_type=client_credentials&client_id={}&client_secret={}",
            form_encode(&c.client_id),
            form_encode(&c.secret)
        );
        let headers = [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        )];
        let request = Request {
            headers: &headers,
            ..Request::post(&c.token_url, body, TOKEN_TIMEOUT)
        };
        let (status, answer) = self
            .sender
            .exchange(request)
            .await
            .map_err(|e| e.map(|r| format!("token request failed: {r}")))?;
        if !status.is_success() {
            return Err(ExchangeError::Transient(format!(
                "the token endpoint answered {status}"
            )));
        }
        read_token(&answer).map_err(ExchangeError::Transient)
    }
}

/// Reads `{access_token, expires_in}`; `expires_in` may be a number or a string.
fn read_token(answer: &[u8]) -> Result<(String, Duration), String> {
    let value: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|e| format!("the token endpoint's answer is not JSON: {e}"))?;
    let token = value
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or("the token endpoint's answer has no access_token")?;
    // A token must fit a header; refuse one that does not rather than send garbage.
    HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| "the access_token cannot be sent in a header".to_owned())?;
    let seconds = match value.get("expires_in") {
        Some(serde_json::Value::Number(n)) => n.as_f64(),
        Some(serde_json::Value::String(s)) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let lifetime = match seconds {
        Some(s) if s.is_finite() && s >= 1.0 => Duration::from_secs_f64(s.min(86_400.0 * 365.0)),
        Some(_) => return Err("expires_in must be at least 1 second".to_owned()),
        None => DEFAULT_LIFETIME,
    };
    Ok((token.to_owned(), lifetime))
}

/// The `Authorization` header that carries `token`.
pub fn bearer_header(token: &str) -> Option<(HeaderName, HeaderValue)> {
    HeaderValue::from_str(&format!("Bearer {token}"))
        .ok()
        .map(|v| (http::header::AUTHORIZATION, v))
}

/// `application/x-www-form-urlencoded` value encoding.
fn form_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            b' ' => out.push('+'),
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_answers_are_read_leniently_and_checked() {
        let (t, life) = read_token(br#"{"access_token":"abc","expires_in":60}"#).unwrap();
        assert_eq!((t.as_str(), life), ("abc", Duration::from_secs(60)));
        let (_, life) = read_token(br#"{"access_token":"abc","expires_in":"120"}"#).unwrap();
        assert_eq!(life, Duration::from_secs(120));
        let (_, life) = read_token(br#"{"access_token":"abc"}"#).unwrap();
        assert_eq!(life, DEFAULT_LIFETIME);
        assert!(read_token(br#"{"expires_in":60}"#).is_err());
        assert!(read_token(br#"{"access_token":"a\nb"}"#).is_err());
        assert!(read_token(br#"{"access_token":"a","expires_in":0}"#).is_err());
        assert!(read_token(b"<html>").is_err());
    }

    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_encode("safe-_.~09Az"), "safe-_.~09Az");
    }
}
