//! A client's side of the issuer: its credentials ([`OAuthClient`], whose
//! `Debug` hides the secret) and a blocking client credentials request
//! over plain HTTP, for the test kit's own Kafka clients
//! ([`super::context`]) and for tests that want a token in hand.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::http::form_encode;

const TIMEOUT: Duration = Duration::from_secs(10);

/// What a client logs in with: the token endpoint, its id and secret, and
/// the scope it asks for.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthClient {
    /// The issuer's `/token` URL (`http://...` only).
    pub token_url: String,
    /// The client id: the tokens' `sub`, so the Kafka principal
    /// `User:<client_id>`.
    pub client_id: String,
    client_secret: String,
    /// `scope`, if any.
    pub scope: Option<String>,
}

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("token_url", &self.token_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &"<hidden>")
            .field("scope", &self.scope)
            .finish()
    }
}

/// A token the endpoint issued.
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    /// The JWT.
    pub access_token: String,
    /// `expires_in`, seconds.
    pub expires_in: u64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("expires_in", &self.expires_in)
            .finish_non_exhaustive()
    }
}

impl OAuthClient {
    pub fn new(token_url: &str, client_id: &str, client_secret: &str) -> OAuthClient {
        OAuthClient {
            token_url: token_url.to_owned(),
            client_id: client_id.to_owned(),
            client_secret: client_secret.to_owned(),
            scope: None,
        }
    }

    /// These credentials asking for `scope`.
    #[must_use]
    pub fn with_scope(mut self, scope: &str) -> OAuthClient {
        self.scope = Some(scope.to_owned());
        self
    }

    /// The secret, for the client properties that must carry it.
    pub fn client_secret(&self) -> &str {
        &self.client_secret
    }

    /// The principal brokers see, `User:<client_id>`.
    pub fn principal(&self) -> String {
        format!("User:{}", self.client_id)
    }

    /// A client credentials request (HTTP Basic, as librdkafka sends it);
    /// an error carries the endpoint's status and answer.
    pub fn fetch_token(&self) -> anyhow::Result<IssuedToken> {
        let (addr, path) = split_http_url(&self.token_url)?;
        let mut body = "grant_type=client_credentials".to_owned();
        if let Some(scope) = &self.scope {
            body.push_str(&format!("&scope={}", form_encode(scope)));
        }
        let basic = STANDARD.encode(format!(
            "{}:{}",
            form_encode(&self.client_id),
            form_encode(&self.client_secret)
        ));
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Basic {basic}\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nAccept: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut stream = TcpStream::connect(addr)
            .with_context(|| format!("connecting to the token endpoint {}", self.token_url))?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        stream.write_all(request.as_bytes())?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("a malformed answer from {}", self.token_url))?;
        let status = head.split_whitespace().nth(1).unwrap_or("?");
        if status != "200" {
            bail!("the token endpoint answered {status}: {body}");
        }
        let json: serde_json::Value =
            serde_json::from_str(body).context("the token endpoint's JSON")?;
        Ok(IssuedToken {
            access_token: json["access_token"]
                .as_str()
                .ok_or_else(|| anyhow!("no access_token in the answer"))?
                .to_owned(),
            expires_in: json["expires_in"].as_u64().unwrap_or(0),
        })
    }
}

/// `http://HOST:PORT/PATH` as (`HOST:PORT`, `/PATH`).
fn split_http_url(url: &str) -> anyhow::Result<(&str, &str)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("{url} is not an http:// URL"))?;
    Ok(match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_secret_and_urls_split() {
        let c = OAuthClient::new("http://127.0.0.1:1/token", "relay", "hunter2").with_scope("s");
        let text = format!("{c:?}");
        assert!(
            text.contains("relay") && !text.contains("hunter2"),
            "{text}"
        );
        assert_eq!(c.principal(), "User:relay");
        assert_eq!(
            split_http_url("http://127.0.0.1:80/a/b").unwrap(),
            ("127.0.0.1:80", "/a/b")
        );
        assert_eq!(split_http_url("http://h:1").unwrap(), ("h:1", "/"));
        assert!(split_http_url("https://h/x").is_err());
    }
}
