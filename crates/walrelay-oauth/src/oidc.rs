//! OIDC client credentials (RFC 6749 section 4.4), as librdkafka's
//! `sasl.oauthbearer.method=oidc` does it: the client id and secret in
//! HTTP Basic, `grant_type=client_credentials` and the scope in the form,
//! the access token in the JSON answer. [`token_request`] and
//! [`parse_token_response`] are pure; [`Oidc::fetch`] sends one over
//! [`super::transport`].

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::error::{excerpt, OAuthError};
use super::extensions::Extensions;
use super::http::{basic_auth, form, Request, Url};
use super::jwt;
use super::refresh::Fetch;
use super::token::{Secret, Token};
use super::transport::Client;

const SERVICE: &str = "the OAuth token endpoint";

/// What an OIDC login needs (from librdkafka's property names, see
/// [`super::plan`]). `Debug` hides the secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcSettings {
    /// `sasl.oauthbearer.token.endpoint.url`.
    pub endpoint: Url,
    /// `sasl.oauthbearer.client.id`.
    pub client_id: String,
    /// `sasl.oauthbearer.client.secret` (resolved: the relay's
    /// `env:NAME` and `file:/path` references work).
    pub client_secret: Secret,
    /// `sasl.oauthbearer.scope`.
    pub scope: Option<String>,
    /// `sasl.oauthbearer.extensions`.
    pub extensions: Extensions,
}

/// The token request of `settings`.
#[must_use]
pub fn token_request(settings: &OidcSettings) -> Request {
    let mut pairs = vec![("grant_type", "client_credentials")];
    if let Some(scope) = &settings.scope {
        pairs.push(("scope", scope));
    }
    Request {
        method: "POST",
        url: settings.endpoint.clone(),
        headers: vec![
            (
                "Authorization".to_owned(),
                basic_auth(&settings.client_id, settings.client_secret.expose()),
            ),
            (
                "Content-Type".to_owned(),
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("Accept".to_owned(), "application/json".to_owned()),
            ("User-Agent".to_owned(), super::USER_AGENT.to_owned()),
        ],
        body: form(&pairs),
    }
}

/// A successful answer's fields (RFC 6749 section 5.1). `expires_in` is a
/// number, though some servers send it as a string.
#[derive(Deserialize)]
struct Success {
    access_token: String,
    token_type: Option<String>,
    expires_in: Option<serde_json::Value>,
}

/// An error answer's fields (RFC 6749 section 5.2).
#[derive(Deserialize)]
struct Failure {
    error: String,
    error_description: Option<String>,
}

/// The token in the endpoint's answer (`status`, `body`) received at
/// `now`, or the endpoint's refusal in its own words.
///
/// The expiry is the earlier of `expires_in` and the JWT's `exp` (either
/// may be missing, not both); the principal is the JWT's `sub`, else the
/// client id (an opaque token names no one).
pub fn parse_token_response(
    settings: &OidcSettings,
    status: u16,
    body: &[u8],
    now: SystemTime,
) -> Result<Token, OAuthError> {
    let endpoint = settings.endpoint.shown();
    let text = String::from_utf8_lossy(body);
    if !(200..300).contains(&status) {
        let answer = match serde_json::from_slice::<Failure>(body) {
            Ok(f) => match f.error_description {
                Some(d) => format!("{}: {}", f.error, excerpt(&d, 300)),
                None => f.error,
            },
            Err(_) if text.trim().is_empty() => "an empty body".to_owned(),
            Err(_) => excerpt(&text, 200),
        };
        return Err(OAuthError::Refused {
            service: SERVICE,
            endpoint,
            status,
            answer,
            advice: advice(status),
        });
    }
    let unreadable = |reason: String| OAuthError::Unreadable {
        service: SERVICE,
        endpoint: endpoint.clone(),
        reason,
    };
    let success: Success = serde_json::from_slice(body)
        .map_err(|e| unreadable(format!("not a token answer ({e})")))?;
    if let Some(kind) = &success.token_type {
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(unreadable(format!(
                "token_type `{}`, where Kafka needs a Bearer token",
                excerpt(kind, 40)
            )));
        }
    }
    if success.access_token.is_empty() {
        return Err(unreadable("an empty access_token".to_owned()));
    }
    let expires_in = match &success.expires_in {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .ok_or_else(|| unreadable(format!("expires_in `{v}` is not a number")))?,
        ),
    };
    let claims = jwt::claims(&success.access_token).unwrap_or_default();
    let from_expires_in = expires_in.map(|s| now + Duration::from_secs(s));
    let expires_at = match (from_expires_in, claims.expires) {
        (Some(a), Some(b)) => a.min(b),
        (Some(t), None) | (None, Some(t)) => t,
        (None, None) => {
            return Err(OAuthError::Unusable {
                source_name: format!("{SERVICE} {endpoint}"),
                reason: "the answer has no expires_in and the token is not a JWT with an \
                         `exp` claim, so walrelay cannot know when to refresh it"
                    .to_owned(),
            })
        }
    };
    Ok(Token {
        value: Secret::new(success.access_token),
        principal: claims.subject.unwrap_or_else(|| settings.client_id.clone()),
        expires_at,
        extensions: settings.extensions.clone(),
    })
}

fn advice(status: u16) -> &'static str {
    match status {
        400 | 401 | 403 => {
            "check sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret and \
             sasl.oauthbearer.scope against the identity provider's client"
        }
        404 | 405 => "check sasl.oauthbearer.token.endpoint.url",
        _ => "the identity provider may be down; walrelay retries",
    }
}

/// An OIDC token provider: the settings and an HTTP client.
#[derive(Debug)]
pub struct Oidc {
    pub settings: OidcSettings,
    pub client: Client,
}

impl Fetch for Oidc {
    fn fetch(&self, now: SystemTime) -> Result<Token, OAuthError> {
        let answer = self.client.send(&token_request(&self.settings))?;
        parse_token_response(&self.settings, answer.status, &answer.body, now)
    }
}

#[cfg(test)]
mod tests;
