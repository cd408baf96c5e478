//! The AWS MSK IAM token: what AWS's `aws-msk-iam-sasl-signer` libraries
//! (Python, Go, JavaScript) produce and MSK brokers accept as an
//! OAUTHBEARER token. A SigV4 presigned URL of
//! `GET https://kafka.<region>.amazonaws.com/?Action=kafka-cluster%3AConnect`
//! (service `kafka-cluster`, `host` signed, the empty payload's hash,
//! valid 900 s, the session token signed in when there is one), then a
//! `User-Agent` parameter appended after signing, the whole URL
//! base64url-encoded without padding.
//!
//! Checked here against the signing steps (the canonical request and the
//! string to sign written out in the tests) and a signature recomputed
//! independently; [`super::sigv4`]'s tests check the signing itself
//! against AWS's published examples. It has not been tried against MSK:
//! no AWS account is reachable from walrelay's tests.

use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::super::error::OAuthError;
use super::super::extensions::Extensions;
use super::super::refresh::Fetch;
use super::super::token::{Secret, Token};
use super::credentials::{Chain, Credentials};
use super::sigv4::{self, Presign, Presigned};

/// The service name MSK's signatures are made for.
pub const SIGNING_SERVICE: &str = "kafka-cluster";
/// How long a token is valid (`X-Amz-Expires`), as the signer libraries
/// make it.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);

/// MSK's signing host in `region`.
#[must_use]
pub fn host(region: &str) -> String {
    format!("kafka.{region}.amazonaws.com")
}

/// The presigned `kafka-cluster:Connect` request.
#[must_use]
pub fn presign(region: &str, credentials: &Credentials, now: SystemTime) -> Presigned {
    let host = host(region);
    sigv4::presign(
        &Presign {
            host: &host,
            path: "/",
            params: &[("Action", "kafka-cluster:Connect")],
            service: SIGNING_SERVICE,
            region,
            time: now,
            expires: TOKEN_LIFETIME.as_secs(),
            payload_hash: sigv4::EMPTY_PAYLOAD_SHA256,
        },
        credentials,
    )
}

/// The token for `credentials` at `now`: valid for 900 s, or until the
/// credentials expire if sooner. The principal reported is the access
/// key id (the broker takes the real one from the signature).
#[must_use]
pub fn token(region: &str, credentials: &Credentials, now: SystemTime) -> Token {
    let signed = presign(region, credentials, now);
    let url = format!(
        "{}&User-Agent={}",
        signed.url(&host(region), "/"),
        sigv4::uri_encode(super::super::USER_AGENT)
    );
    let lifetime_end = now + TOKEN_LIFETIME;
    Token {
        value: Secret::new(URL_SAFE_NO_PAD.encode(url)),
        principal: credentials.access_key_id.clone(),
        expires_at: credentials
            .expires
            .map_or(lifetime_end, |t| t.min(lifetime_end)),
        extensions: Extensions::default(),
    }
}

/// The MSK IAM token provider: a region and the credential chain.
#[derive(Debug)]
pub struct MskIam {
    pub region: String,
    pub chain: Chain,
}

impl MskIam {
    /// The provider for `region`; refused unless it is a region's name.
    pub fn new(region: &str) -> Result<MskIam, OAuthError> {
        Ok(MskIam {
            region: region.to_owned(),
            chain: Chain::new(region)?,
        })
    }
}

impl Fetch for MskIam {
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
        let credentials = self.chain.resolve(now)?;
        Ok(token(&self.region, &credentials, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> Credentials {
        Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
            session_token: Some(Secret::new("session/token=")),
            expires: None,
        }
    }

    fn may_24_2013() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_369_353_600)
    }

    #[test]
    fn the_connect_request_is_canonicalised_as_sigv4_says() {
        let signed = presign("us-west-2", &credentials(), may_24_2013());
        assert_eq!(
            signed.canonical_request,
            "GET\n/\n\
             Action=kafka-cluster%3AConnect&X-Amz-Algorithm=AWS4-HMAC-SHA256&\
             X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-west-2%2Fkafka-cluster%2F\
             aws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=900&\
             X-Amz-Security-Token=session%2Ftoken%3D&X-Amz-SignedHeaders=host\n\
             host:kafka.us-west-2.amazonaws.com\n\nhost\n\
             e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // The hash and the signature were recomputed from the canonical
        // request above with Python's hashlib and hmac.
        assert_eq!(
            signed.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-west-2/kafka-cluster/aws4_request\n\
             ab68938e946cd3fcf06903869dde59625ece4363d2c92514bf48596a4b907255"
        );
        assert_eq!(
            signed.signature,
            "46249afb4aad0d7edb72a39990ae52348dbb7f753eb13e0601813f31762c214a"
        );
    }

    #[test]
    fn the_token_is_the_url_with_a_user_agent_in_unpadded_base64url() {
        let token = token("us-west-2", &credentials(), may_24_2013());
        let url = String::from_utf8(URL_SAFE_NO_PAD.decode(token.value.expose()).unwrap()).unwrap();
        assert!(
            url.starts_with(
                "https://kafka.us-west-2.amazonaws.com/?Action=kafka-cluster%3AConnect&"
            ),
            "{url}"
        );
        assert!(url.ends_with(&format!(
            "&X-Amz-Signature=46249afb4aad0d7edb72a39990ae52348dbb7f753eb13e0601813f31762c214a\
             &User-Agent={}",
            sigv4::uri_encode(super::super::super::USER_AGENT)
        )));
        assert!(!token.value.expose().contains('='));
        assert_eq!(token.expires_at, may_24_2013() + TOKEN_LIFETIME);
        assert_eq!(token.principal, "AKIAIOSFODNN7EXAMPLE");
        assert!(!format!("{token:?}").contains("EXAMPLEKEY"));
    }

    #[test]
    fn credentials_expiring_first_shorten_the_token() {
        let mut c = credentials();
        c.expires = Some(may_24_2013() + Duration::from_secs(300));
        c.session_token = None;
        let t = token("eu-west-1", &c, may_24_2013());
        assert_eq!(t.expires_at, may_24_2013() + Duration::from_secs(300));
        let url = String::from_utf8(URL_SAFE_NO_PAD.decode(t.value.expose()).unwrap()).unwrap();
        assert!(!url.contains("X-Amz-Security-Token"), "{url}");
    }
}
