//! Standard Webhooks signatures (`webhook-id`, `webhook-timestamp`,
//! `webhook-signature`), off unless a receiver has a secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// A receiver's signing key: `whsec_` followed by base64 of at least 24 bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    pub fn parse(text: &str) -> Result<Secret, String> {
        let encoded = text
            .strip_prefix("whsec_")
            .ok_or_else(|| "a signing secret starts with `whsec_`".to_owned())?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|e| format!("the part after `whsec_` is not base64: {e}"))?;
        if key.len() < 24 {
            return Err("the key must be at least 24 bytes".to_owned());
        }
        Ok(Secret(key))
    }

    /// Makes a new random secret: 32 bytes from the operating system's generator.
    pub fn generate() -> String {
        let mut key = [0u8; 32];
        // As in `ids`: a machine that cannot produce secrets must not hand
        // out a predictable one.
        getrandom::fill(&mut key).expect("the operating system's random generator failed");
        format!("whsec_{}", STANDARD.encode(key))
    }

    /// `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        // An HMAC takes keys of any length, so this cannot fail.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            return String::new();
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_follow_the_standard_webhooks_scheme() {
        // Worked example of the Standard Webhooks specification.
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn secrets_must_be_whsec_base64() {
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_***").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err());
        assert!(Secret::parse(&Secret::generate()).is_ok());
    }
}
