//! Compact RS256 JSON Web Tokens (RFC 7519): what the issuer hands out and
//! Kafka's validator checks (signature by the header's `kid`, `iss`,
//! `aud`, `exp`, `sub` as the principal, `scope`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::keys::SigningKey;

/// A token's claims. The issuer fills them in ([`super::TokenIssuer::claims`])
/// and a negative test changes one (audience, expiry) before signing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    /// `iss`.
    pub issuer: String,
    /// `aud`.
    pub audience: String,
    /// `sub`: the client id; Kafka's principal is `User:<sub>`.
    pub subject: String,
    /// `iat`, seconds since the epoch.
    pub issued_at: u64,
    /// `exp`, seconds since the epoch.
    pub expires_at: u64,
    /// `scope` (space-separated), when asked for.
    pub scope: Option<String>,
}

impl Claims {
    /// Claims issued now that expire after `lifetime`.
    pub(crate) fn new(
        issuer: &str,
        audience: &str,
        subject: &str,
        lifetime: Duration,
        scope: Option<&str>,
    ) -> Claims {
        let now = unix_now();
        Claims {
            issuer: issuer.to_owned(),
            audience: audience.to_owned(),
            subject: subject.to_owned(),
            issued_at: now,
            expires_at: now + lifetime.as_secs().max(1),
            scope: scope.map(str::to_owned),
        }
    }

    /// These claims as having expired `ago` before now (issued a minute
    /// before that). Kafka allows 30 s of clock skew
    /// (`sasl.oauthbearer.clock.skew.seconds`), so a token meant to be
    /// refused as expired needs `ago` beyond that.
    #[must_use]
    pub fn expired(mut self, ago: Duration) -> Claims {
        self.expires_at = unix_now().saturating_sub(ago.as_secs());
        self.issued_at = self.expires_at.saturating_sub(60);
        self
    }

    fn json(&self) -> serde_json::Value {
        let mut claims = serde_json::json!({
            "iss": self.issuer,
            "aud": self.audience,
            "sub": self.subject,
            "iat": self.issued_at,
            "exp": self.expires_at,
        });
        if let Some(scope) = &self.scope {
            claims["scope"] = scope.as_str().into();
        }
        claims
    }
}

/// Seconds since the epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `claims` signed by `key`: `header.payload.signature`, each base64url.
pub(crate) fn sign(claims: &Claims, key: &SigningKey) -> anyhow::Result<String> {
    let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": key.kid()});
    let b64 = |v: &serde_json::Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let signing_input = format!("{}.{}", b64(&header), b64(&claims.json()));
    let signature = key.sign(signing_input.as_bytes())?;
    Ok(format!(
        "{signing_input}.{}",
        URL_SAFE_NO_PAD.encode(signature)
    ))
}

/// The header and claims of a compact JWT (unverified), for assertions.
pub fn decode_unverified(token: &str) -> anyhow::Result<(serde_json::Value, serde_json::Value)> {
    let mut parts = token.split('.');
    let mut part = |what: &str| -> anyhow::Result<serde_json::Value> {
        let text = parts
            .next()
            .ok_or_else(|| anyhow::anyhow!("a JWT without a {what}"))?;
        let bytes = URL_SAFE_NO_PAD.decode(text)?;
        Ok(serde_json::from_slice(&bytes)?)
    };
    Ok((part("header")?, part("payload")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    #[test]
    fn a_token_carries_the_kid_and_claims_and_verifies() {
        let key = SigningKey::fixture(0, "kid").unwrap();
        let claims = Claims::new(
            "http://iss",
            "kafka",
            "relay",
            Duration::from_secs(15),
            Some("a b"),
        );
        let token = sign(&claims, &key).unwrap();
        let (header, payload) = decode_unverified(&token).unwrap();
        assert_eq!(header["alg"], "RS256");
        assert_eq!(header["kid"], "kid-1");
        assert_eq!(payload["sub"], "relay");
        assert_eq!(payload["aud"], "kafka");
        assert_eq!(payload["iss"], "http://iss");
        assert_eq!(payload["scope"], "a b");
        let (iat, exp) = (
            payload["iat"].as_u64().unwrap(),
            payload["exp"].as_u64().unwrap(),
        );
        assert_eq!(exp - iat, 15);
        let (input, sig) = token.rsplit_once('.').unwrap();
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_der())
            .verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).unwrap())
            .unwrap();
    }

    #[test]
    fn expired_claims_lie_in_the_past_and_no_scope_means_no_claim() {
        let claims = Claims::new("i", "a", "s", Duration::from_secs(15), None)
            .expired(Duration::from_secs(120));
        assert!(claims.expires_at + 119 < unix_now());
        assert!(claims.issued_at < claims.expires_at);
        assert!(claims.json().get("scope").is_none());
    }
}
