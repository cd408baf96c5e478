//! Handing one token to one librdkafka client
//! (`rd_kafka_oauthbearer_set_token`), with its SASL extensions, or
//! telling it that none could be had.
//!
//! rdkafka has no safe call for either with extensions, so these are the
//! crate's two foreign calls; what they are given is checked and
//! converted first ([`TokenStrings`], pure).

use std::ffi::{c_char, CStr, CString};

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};

use crate::error::OAuthError;
use crate::token::Token;

/// A token as C strings: value, principal, then the extensions as
/// key, value, key, value (librdkafka's layout).
#[derive(Debug)]
struct TokenStrings {
    value: CString,
    principal: CString,
    extensions: Vec<CString>,
}

impl TokenStrings {
    /// Refuses a NUL anywhere with a reason (librdkafka would stop at it).
    fn new(token: &Token) -> Result<TokenStrings, OAuthError> {
        let c = |s: &str| {
            CString::new(s).map_err(|_| OAuthError::Unusable {
                source_name: "the token provider".to_owned(),
                reason: "the token, its principal or an extension holds a NUL character".into(),
            })
        };
        let mut extensions = Vec::new();
        for (key, value) in token.extensions.iter() {
            extensions.push(c(key)?);
            extensions.push(c(value)?);
        }
        Ok(TokenStrings {
            value: c(token.value.expose())?,
            principal: c(&token.principal)?,
            extensions,
        })
    }
}

/// Hands `token` and its extensions to `client`; librdkafka's refusal
/// (an expired token, an extension it finds malformed) comes back with
/// its reason.
#[allow(unsafe_code)] // rdkafka has no call that passes extensions
pub fn set_token<C: ClientContext>(client: &Client<C>, token: &Token) -> Result<(), OAuthError> {
    let strings = TokenStrings::new(token)?;
    let mut extensions: Vec<*const c_char> =
        strings.extensions.iter().map(|s| s.as_ptr()).collect();
    let mut errstr = [0 as c_char; 512];
    // SAFETY: the client pointer is valid while `client` is borrowed; every
    // string is NUL-terminated and outlives the call, which copies them
    // (librdkafka strdup's the value, principal and each extension); the
    // extension array holds `extensions.len()` pointers, an even number;
    // `errstr` is writable for its stated length.
    let code = unsafe {
        rd::rd_kafka_oauthbearer_set_token(
            client.native_ptr(),
            strings.value.as_ptr(),
            token.expires_at_unix_ms(),
            strings.principal.as_ptr(),
            extensions.as_mut_ptr(),
            extensions.len(),
            errstr.as_mut_ptr(),
            errstr.len(),
        )
    };
    if code == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        return Ok(());
    }
    // SAFETY: librdkafka wrote a NUL-terminated message into `errstr`
    // (zeroed before the call, so terminated even if it wrote nothing).
    let reason = unsafe { CStr::from_ptr(errstr.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Err(OAuthError::Unusable {
        source_name: format!("librdkafka (principal {})", token.principal),
        reason: format!("it refused the token: {reason}"),
    })
}

/// Tells `client` that no token could be had and why: librdkafka reports
/// it as the login's failure ("Failed to acquire SASL OAUTHBEARER token:
/// ...") and keeps a token it still has until it expires.
#[allow(unsafe_code)] // rdkafka has no safe call for it
pub fn set_token_failure<C: ClientContext>(client: &Client<C>, reason: &str) {
    let reason = CString::new(reason.replace('\0', " ")).unwrap_or_default();
    if reason.as_bytes().is_empty() {
        return; // librdkafka refuses an empty reason
    }
    // SAFETY: the client pointer is valid while `client` is borrowed; the
    // reason is NUL-terminated and outlives the call, which copies it.
    unsafe {
        rd::rd_kafka_oauthbearer_set_token_failure(client.native_ptr(), reason.as_ptr());
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::{Extensions, Secret};

    fn token(extensions: &str) -> Token {
        Token {
            value: Secret::new("eyJ.x.y"),
            principal: "relay".into(),
            expires_at: SystemTime::now() + Duration::from_secs(600),
            extensions: Extensions::parse(extensions, "p").unwrap(),
        }
    }

    #[test]
    fn extensions_go_to_librdkafka_as_keys_and_values_in_turn() {
        let s = TokenStrings::new(&token("logicalCluster=lkc-1,identityPoolId=pool-2")).unwrap();
        let got: Vec<&str> = s.extensions.iter().map(|c| c.to_str().unwrap()).collect();
        assert_eq!(got.len(), 4);
        let pairs: Vec<(&str, &str)> = got.chunks(2).map(|p| (p[0], p[1])).collect();
        assert!(pairs.contains(&("logicalCluster", "lkc-1")), "{pairs:?}");
        assert!(pairs.contains(&("identityPoolId", "pool-2")), "{pairs:?}");
        assert_eq!(s.value.to_str().unwrap(), "eyJ.x.y");
    }

    #[test]
    fn a_nul_is_refused_with_a_reason() {
        let mut t = token("");
        t.principal = "a\0b".into();
        let e = TokenStrings::new(&t).unwrap_err().to_string();
        assert!(e.contains("NUL"), "{e}");
    }

    #[test]
    fn librdkafka_takes_the_token_and_refuses_an_expired_one() {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "OAUTHBEARER");
        let producer: rdkafka::producer::BaseProducer = config.create().unwrap();
        let client = rdkafka::producer::Producer::client(&producer);
        set_token(client, &token("logicalCluster=lkc-1")).unwrap();
        let mut old = token("");
        old.expires_at = SystemTime::now() - Duration::from_secs(1);
        let e = set_token(client, &old).unwrap_err().to_string();
        assert!(e.contains("unexpired"), "{e}");
        set_token_failure(client, "the endpoint said no");
    }
}
