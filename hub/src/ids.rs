//! Secrets and unguessable identifiers from the operating system's CSPRNG.

use sha2::{Digest, Sha256};

/// 128 random bits as 32 lowercase hex characters.
pub fn random_token() -> String {
    hex::encode(random_bytes::<16>())
}

/// `N` bytes from the operating system's generator.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The OS generator failing means the machine cannot produce secrets at all;
    // handing out a predictable identifier instead would be worse than stopping.
    getrandom::fill(&mut bytes).expect("the operating system's random generator failed");
    bytes
}

/// An agent's bearer token: 256 bits, with a prefix that makes leaks easy to spot.
pub fn agent_token() -> String {
    format!("hub_agent_{}{}", random_token(), random_token())
}

/// What is stored in place of a token.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Compares secrets without leaking where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_and_distinct() {
        let a = random_token();
        assert_eq!(a.len(), 32);
        assert_ne!(a, random_token());
        assert!(constant_time_eq(a.as_bytes(), a.as_bytes()));
        assert!(!constant_time_eq(a.as_bytes(), random_token().as_bytes()));
    }
}
