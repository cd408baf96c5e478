//! The claims of a JWT read without checking its signature: the brokers
//! check it; the client only needs to know whose token it is (`sub`) and
//! when it expires (`exp`) to report the principal and refresh in time.
//! Also the making of unsecured JWTs (`alg: none`) for development.

use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// What the client reads of a JWT.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claims {
    /// `sub`, when a string.
    pub subject: Option<String>,
    /// `exp` (seconds since the epoch, fractions dropped).
    pub expires: Option<SystemTime>,
}

/// The claims of `token` when it is a JWT (three dot-separated base64url
/// parts, the middle one a JSON object); why not otherwise. Never verifies.
pub fn claims(token: &str) -> Result<Claims, String> {
    let mut parts = token.split('.');
    let (Some(_header), Some(payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the token is not a JWT (not three dot-separated parts)".to_owned());
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| format!("the JWT's payload is not base64url: {e}"))?;
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the JWT's payload is not JSON: {e}"))?;
    let object = json
        .as_object()
        .ok_or("the JWT's payload is not a JSON object")?;
    let expires = match object.get("exp") {
        None => None,
        Some(exp) => {
            let secs = exp
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or("the JWT's `exp` claim is not a number of seconds")?;
            // Truncation is the intent: `exp` may carry fractions.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let secs = secs as u64;
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        }
    };
    Ok(Claims {
        subject: object
            .get("sub")
            .and_then(|s| s.as_str())
            .map(str::to_owned),
        expires,
    })
}

/// An unsecured JWT (RFC 7519 section 6: `alg: none`, empty signature) for
/// `subject`, issued at `now`, valid for `lifetime`, with `scope` as a
/// JSON array when given: what librdkafka's built-in unsecured provider
/// makes, for brokers configured to accept such tokens in development.
#[must_use]
pub fn unsecured(subject: &str, now: SystemTime, lifetime: Duration, scope: &[String]) -> String {
    let iat = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut payload = serde_json::json!({
        "sub": subject,
        "iat": iat,
        "exp": iat + lifetime.as_secs(),
    });
    if !scope.is_empty() {
        payload["scope"] = serde_json::json!(scope);
    }
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
        URL_SAFE_NO_PAD.encode(payload.to_string())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_and_exp_are_read_without_the_signature() {
        // Header {"alg":"RS256","typ":"JWT"}, payload
        // {"sub":"relay-svc","exp":1700000000,"iss":"https://idp"}.
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let payload =
            URL_SAFE_NO_PAD.encode(br#"{"sub":"relay-svc","exp":1700000000,"iss":"https://idp"}"#);
        assert_eq!(
            payload,
            "eyJzdWIiOiJyZWxheS1zdmMiLCJleHAiOjE3MDAwMDAwMDAsImlzcyI6Imh0dHBzOi8vaWRwIn0"
        );
        let got = claims(&format!("{header}.{payload}.bm90LWNoZWNrZWQ")).unwrap();
        assert_eq!(got.subject.as_deref(), Some("relay-svc"));
        assert_eq!(
            got.expires,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        // Fractional `exp`, padded base64, no `sub`.
        let padded = base64::engine::general_purpose::URL_SAFE.encode(br#"{"exp":12.75}"#);
        let got = claims(&format!("h.{padded}.s")).unwrap();
        assert_eq!(got.subject, None);
        assert_eq!(
            got.expires,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(12))
        );
    }

    #[test]
    fn what_is_not_a_jwt_says_why() {
        assert!(claims("opaque-token").unwrap_err().contains("not a JWT"));
        assert!(claims("a.b.c.d").unwrap_err().contains("not a JWT"));
        assert!(claims("a.!!!.c").unwrap_err().contains("base64url"));
        let text = URL_SAFE_NO_PAD.encode(b"[1]");
        assert!(claims(&format!("a.{text}.c"))
            .unwrap_err()
            .contains("object"));
        let bad_exp = URL_SAFE_NO_PAD.encode(br#"{"exp":"soon"}"#);
        assert!(claims(&format!("a.{bad_exp}.c"))
            .unwrap_err()
            .contains("exp"));
    }

    #[test]
    fn an_unsecured_jwt_is_alg_none_with_an_empty_signature() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let token = unsecured("dev", now, Duration::from_secs(3600), &["write".into()]);
        assert!(token.starts_with("eyJhbGciOiJub25lIn0."), "{token}");
        assert!(token.ends_with('.'));
        let payload = token.split('.').nth(1).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"sub": "dev", "iat": 1000, "exp": 4600, "scope": ["write"]})
        );
        let read = claims(&token).unwrap();
        assert_eq!(read.subject.as_deref(), Some("dev"));
    }
}
