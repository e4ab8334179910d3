//! Agents' console accounts: Argon2id passwords, sign-in with a limit on
//! failures per account and per address, and console sessions.
//!
//! The failure counts live in this process (a second hub instance counts its
//! own; issue 17 moves them to the database). Sessions live in the store, so
//! they survive a restart and any instance can check them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

use crate::clock::Clock;
use crate::ids::{random_bytes, random_token, token_hash};
use crate::store::{Agent, Store, StoreError};

/// Shorter passwords are refused when set.
pub const MIN_PASSWORD_CHARS: usize = 8;
/// Longer ones too: hashing cost grows with the input.
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// Why a password could not be set or checked.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("{0}")]
    Invalid(String),
    #[error("no such agent")]
    NoAgent,
    #[error("password hashing failed: {0}")]
    Hash(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a sign-in did not open a session.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("wrong e-mail or password")]
    Wrong,
    /// Too many failures for the account or the address; try again after this.
    #[error("too many failed sign-ins")]
    Locked(Duration),
    #[error(transparent)]
    Account(#[from] AccountError),
}

impl From<StoreError> for SignInError {
    fn from(e: StoreError) -> Self {
        SignInError::Account(AccountError::Store(e))
    }
}

/// A password's length rules, checked before it is hashed.
pub fn check_password(password: &str) -> Result<(), AccountError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AccountError::Invalid(format!(
            "password must have at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AccountError::Invalid(format!(
            "password must have at most {MAX_PASSWORD_BYTES} bytes"
        )));
    }
    Ok(())
}

/// The Argon2id PHC string of `password` (OWASP's parameters: 19 MiB, 2
/// passes). Runs on a blocking thread: it takes tens of milliseconds on purpose.
pub async fn hash_password(password: &str) -> Result<String, AccountError> {
    check_password(password)?;
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        let salt = SaltString::encode_b64(&random_bytes::<16>())
            .map_err(|e| AccountError::Hash(e.to_string()))?;
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| AccountError::Hash(e.to_string()))
    })
    .await
    .map_err(|e| AccountError::Hash(e.to_string()))?
}

/// Whether `password` matches `phc`; a malformed stored hash matches nothing.
async fn verify_password(password: &str, phc: String) -> bool {
    if password.len() > MAX_PASSWORD_BYTES {
        return false;
    }
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&phc).is_ok_and(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
    })
    .await
    .unwrap_or(false)
}

/// A hash no password matches, checked for unknown e-mails so that a
/// sign-in takes as long whether the account exists or not.
fn decoy_hash() -> String {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY
        .get_or_init(|| {
            let salt = SaltString::encode_b64(&random_bytes::<16>()).ok();
            salt.and_then(|salt| {
                Argon2::default()
                    .hash_password(random_token().as_bytes(), &salt)
                    .ok()
                    .map(|h| h.to_string())
            })
            .unwrap_or_default()
        })
        .clone()
}

/// Sets an agent's password (ending its sessions).
pub async fn set_password(
    store: &Store,
    agent_id: i64,
    password: &str,
) -> Result<Agent, AccountError> {
    let phc = hash_password(password).await?;
    store
        .set_agent_password(agent_id, &phc)
        .await?
        .ok_or(AccountError::NoAgent)
}

/// Limits on failed sign-ins, from `[console]`.
#[derive(Debug, Clone, Copy)]
pub struct SignInLimits {
    /// Failures within `lock` that lock an account or an address.
    pub max_failures: u32,
    /// How long the lock (and the window failures are counted in) lasts.
    pub lock: Duration,
    /// How long a session lasts.
    pub session_ttl: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Account(String),
    Address(IpAddr),
}

#[derive(Debug)]
struct Failures {
    count: u32,
    since: Instant,
    locked_until: Option<Instant>,
}

/// Counts failed sign-ins per account and per address.
pub struct SignIns {
    limits: SignInLimits,
    clock: Clock,
    failures: Mutex<HashMap<Key, Failures>>,
}

/// Beyond this many tracked keys, expired ones are dropped before a new one
/// is counted, so a flood of addresses cannot grow the map without bound.
const MAX_TRACKED: usize = 100_000;

/// An open console session: the cookie's value and the page's CSRF token.
pub struct Session {
    pub agent: Agent,
    pub cookie: String,
    pub csrf_token: String,
    pub ttl: Duration,
}

impl SignIns {
    pub fn new(limits: SignInLimits, clock: Clock) -> Self {
        SignIns {
            limits,
            clock,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn keys(email: &str, ip: Option<IpAddr>) -> Vec<Key> {
        let mut keys = vec![Key::Account(email.trim().to_lowercase())];
        keys.extend(ip.map(Key::Address));
        keys
    }

    /// How long until the account and the address may try again, if locked.
    fn locked(&self, keys: &[Key], now: Instant) -> Option<Duration> {
        let map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        keys.iter()
            .filter_map(|k| map.get(k)?.locked_until)
            .filter(|until| *until > now)
            .map(|until| until - now)
            .max()
    }

    fn failed(&self, keys: Vec<Key>, now: Instant) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_TRACKED {
            let lock = self.limits.lock;
            map.retain(|_, f| {
                f.locked_until.is_some_and(|u| u > now) || now.duration_since(f.since) < lock
            });
        }
        for key in keys {
            if map.len() >= MAX_TRACKED && !map.contains_key(&key) {
                tracing::warn!("too many failing sign-in sources to track; not counting one");
                continue;
            }
            let f = map.entry(key).or_insert(Failures {
                count: 0,
                since: now,
                locked_until: None,
            });
            // A window (or a lock) that ran out starts over.
            let window_over = now.duration_since(f.since) >= self.limits.lock;
            let lock_over = f.locked_until.is_some_and(|u| u <= now);
            if lock_over || (f.locked_until.is_none() && window_over) {
                *f = Failures {
                    count: 0,
                    since: now,
                    locked_until: None,
                };
            }
            f.count += 1;
            if f.count >= self.limits.max_failures && f.locked_until.is_none() {
                f.locked_until = Some(now + self.limits.lock);
            }
        }
    }

    fn succeeded(&self, email: &str) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&Key::Account(email.trim().to_lowercase()));
    }

    /// The agent and CSRF token of a session cookie's value, if it is live.
    pub async fn session(
        &self,
        store: &Store,
        cookie: &str,
    ) -> Result<Option<(Agent, String)>, StoreError> {
        store
            .session_agent(&token_hash(cookie), self.clock.now_ms())
            .await
    }

    /// Checks e-mail and password and opens a session. While the account or
    /// the address is locked, even the right password is refused.
    pub async fn sign_in(
        &self,
        store: &Store,
        email: &str,
        password: &str,
        ip: Option<IpAddr>,
    ) -> Result<Session, SignInError> {
        let keys = Self::keys(email, ip);
        if let Some(wait) = self.locked(&keys, self.clock.now()) {
            return Err(SignInError::Locked(wait));
        }
        let found = store.agent_with_password(email.trim()).await?;
        let (agent, phc) = match found {
            Some((agent, Some(phc))) => (Some(agent), phc),
            _ => (None, decoy_hash()),
        };
        let matches = verify_password(password, phc).await;
        let Some(agent) = agent.filter(|_| matches) else {
            let now = self.clock.now();
            self.failed(keys.clone(), now);
            return match self.locked(&keys, now) {
                Some(wait) => Err(SignInError::Locked(wait)),
                None => Err(SignInError::Wrong),
            };
        };
        self.succeeded(email);
        let cookie = hex::encode(random_bytes::<32>());
        let csrf_token = hex::encode(random_bytes::<24>());
        let now = self.clock.now_ms();
        let ttl = self.limits.session_ttl;
        let expires = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        store
            .insert_session(&token_hash(&cookie), agent.id, &csrf_token, now, expires)
            .await?;
        Ok(Session {
            agent,
            cookie,
            csrf_token,
            ttl,
        })
    }
}

/// Ends the session of a cookie's value.
pub async fn sign_out(store: &Store, cookie: &str) -> Result<(), StoreError> {
    store.delete_session(&token_hash(cookie)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: u32, lock_ms: u64) -> SignIns {
        SignIns::new(
            SignInLimits {
                max_failures: max,
                lock: Duration::from_millis(lock_ms),
                session_ttl: Duration::from_secs(60),
            },
            Clock::system(),
        )
    }

    #[test]
    fn an_account_locks_after_the_allowed_failures_and_unlocks_after_the_lock() {
        let s = limits(3, 60_000);
        let t0 = Instant::now();
        let keys = || SignIns::keys("Ann@Example.com", None);
        for _ in 0..2 {
            s.failed(keys(), t0);
        }
        assert_eq!(
            s.locked(&keys(), t0),
            None,
            "two of three failures do not lock"
        );
        s.failed(keys(), t0);
        let wait = s.locked(&keys(), t0).expect("the third failure locks");
        assert_eq!(wait, Duration::from_secs(60));
        // The same account in another spelling is the same account.
        assert!(
            s.locked(&SignIns::keys(" ann@example.com", None), t0)
                .is_some()
        );
        assert_eq!(s.locked(&keys(), t0 + Duration::from_secs(61)), None);
    }

    #[test]
    fn an_address_locks_across_accounts() {
        let s = limits(3, 60_000);
        let ip: IpAddr = "127.0.0.1".parse().expect("an address");
        let t0 = Instant::now();
        for i in 0..3 {
            s.failed(SignIns::keys(&format!("a{i}@example.com"), Some(ip)), t0);
        }
        assert!(
            s.locked(&SignIns::keys("new@example.com", Some(ip)), t0)
                .is_some()
        );
        assert!(
            s.locked(&SignIns::keys("new@example.com", None), t0)
                .is_none()
        );
    }

    #[test]
    fn failures_spread_beyond_the_window_do_not_add_up() {
        let s = limits(3, 1_000);
        let t0 = Instant::now();
        let keys = || SignIns::keys("bob@example.com", None);
        s.failed(keys(), t0);
        s.failed(keys(), t0);
        s.failed(keys(), t0 + Duration::from_secs(2));
        assert_eq!(s.locked(&keys(), t0 + Duration::from_secs(2)), None);
    }

    #[test]
    fn short_and_huge_passwords_are_refused() {
        assert!(check_password("short").is_err());
        assert!(check_password(&"x".repeat(MAX_PASSWORD_BYTES + 1)).is_err());
        assert!(check_password("long enough").is_ok());
    }

    #[tokio::test]
    async fn a_hash_verifies_its_password_only() {
        let phc = hash_password("correct horse").await.expect("hashes");
        assert!(phc.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", phc.clone()).await);
        assert!(!verify_password("wrong horse!", phc).await);
        assert!(!verify_password("anything", decoy_hash()).await);
    }
}
