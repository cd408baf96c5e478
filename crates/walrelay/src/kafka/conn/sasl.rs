//! Kafka's SASL framing (KIP-152): a SaslHandshake v1 names the
//! mechanism, then SaslAuthenticate v1 requests carry its messages until
//! the mechanism is done. Pure encoders and parsers, tested byte for
//! byte; [`super::Connection`] sends them.
//!
//! The mechanisms: `PLAIN` (one message, `\0user\0password`) and
//! `SCRAM-SHA-256` / `SCRAM-SHA-512` ([`super::scram`], two rounds).
//! `OAUTHBEARER`: one message carrying a token ([`oauthbearer_message`]),
//! answered with nothing or with the broker's error
//! ([`parse_oauthbearer_answer`]).

use crate::kafka::wire::{Reader, Request};

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
/// `UNSUPPORTED_SASL_MECHANISM`.
const UNSUPPORTED_MECHANISM: i16 = 33;
/// `SASL_AUTHENTICATION_FAILED`.
const AUTHENTICATION_FAILED: i16 = 58;

/// A mechanism walrelay's own requests can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    /// A token from [`walrelay_oauth`] (RFC 7628).
    OAuthBearer,
}

impl Mechanism {
    /// From librdkafka's `sasl.mechanism` value; `None` for a mechanism
    /// walrelay does not speak (GSSAPI).
    #[must_use]
    pub fn parse(name: &str) -> Option<Mechanism> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Some(Mechanism::Plain),
            "SCRAM-SHA-256" => Some(Mechanism::ScramSha256),
            "SCRAM-SHA-512" => Some(Mechanism::ScramSha512),
            "OAUTHBEARER" => Some(Mechanism::OAuthBearer),
            _ => None,
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

/// A SaslHandshake v1 request for `mechanism`.
#[must_use]
pub fn handshake_request(correlation_id: i32, mechanism: Mechanism) -> Vec<u8> {
    let mut request = Request::new(SASL_HANDSHAKE, 1, correlation_id, "walrelay");
    request.string(mechanism.name());
    request.framed()
}

/// A SaslHandshake v1 response (without its length prefix): `Ok` when
/// the broker enables `mechanism`, otherwise what it enables.
pub fn parse_handshake(
    bytes: &[u8],
    correlation_id: i32,
    mechanism: Mechanism,
) -> Result<(), String> {
    let mut r = Reader::new(bytes);
    expect_correlation(&mut r, correlation_id)?;
    let error = r.i16()?;
    let enabled = (0..r.count()?)
        .map(|_| r.string())
        .collect::<Result<Vec<_>, _>>()?;
    match error {
        0 => Ok(()),
        UNSUPPORTED_MECHANISM => Err(format!(
            "the broker does not enable SASL mechanism {} (it enables {})",
            mechanism.name(),
            enabled.join(", ")
        )),
        code => Err(format!("SaslHandshake error code {code}")),
    }
}

/// A SaslAuthenticate v1 request carrying `auth_bytes`.
#[must_use]
pub fn authenticate_request(correlation_id: i32, auth_bytes: &[u8]) -> Vec<u8> {
    let mut request = Request::new(SASL_AUTHENTICATE, 1, correlation_id, "walrelay");
    request.bytes(auth_bytes);
    request.framed()
}

/// A SaslAuthenticate v1 response (without its length prefix): the
/// mechanism's next message from the broker, or why it refused.
pub fn parse_authenticate(bytes: &[u8], correlation_id: i32) -> Result<Vec<u8>, String> {
    let mut r = Reader::new(bytes);
    expect_correlation(&mut r, correlation_id)?;
    let error = r.i16()?;
    let message = r.nullable_string()?;
    let auth = r.bytes()?.to_vec();
    let _session_lifetime_ms = r.i64()?;
    match error {
        0 => Ok(auth),
        AUTHENTICATION_FAILED => Err(format!(
            "SASL authentication failed: {}",
            message.unwrap_or_else(|| "no reason given".to_owned())
        )),
        code => Err(format!(
            "SaslAuthenticate error code {code}{}",
            message.map(|m| format!(": {m}")).unwrap_or_default()
        )),
    }
}

/// The `PLAIN` message: no authorization identity, the user, the password.
#[must_use]
pub fn plain_message(username: &str, password: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + username.len() + password.len());
    out.push(0);
    out.extend_from_slice(username.as_bytes());
    out.push(0);
    out.extend_from_slice(password.as_bytes());
    out
}

/// RFC 7628's key/value separator.
const KVSEP: u8 = 0x01;

/// What the client sends after the broker refused its OAUTHBEARER
/// message (RFC 7628 section 3.2.3): a lone separator, to which the
/// broker answers with the SASL failure.
pub const OAUTHBEARER_ABORT: &[u8] = &[KVSEP];

/// The OAUTHBEARER client's first message (RFC 7628 section 3.1): the
/// GS2 header `n,,` (no authorization identity), `auth=Bearer <token>`,
/// each extension as `key=value`, each followed by `\x01`, and a final
/// `\x01`. The extensions are expected checked
/// ([`walrelay_oauth::Extensions`]); the token is checked here: a
/// bearer token is printable ASCII (RFC 6750's b64token is narrower), and
/// a control character would break the framing.
pub fn oauthbearer_message<'a>(
    token: &str,
    extensions: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<u8>, String> {
    if token.is_empty() || !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(
            "the OAuth token is empty or holds characters a bearer token cannot hold".to_owned(),
        );
    }
    let mut out = b"n,,".to_vec();
    out.push(KVSEP);
    out.extend_from_slice(b"auth=Bearer ");
    out.extend_from_slice(token.as_bytes());
    out.push(KVSEP);
    for (key, value) in extensions {
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(KVSEP);
    }
    out.push(KVSEP);
    Ok(out)
}

/// The broker's answer to [`oauthbearer_message`]: nothing when it
/// accepts the token; otherwise its error (RFC 7628 section 3.2.2, a
/// JSON object with `status` and maybe `scope` and
/// `openid-configuration`) as a sentence. The caller then sends
/// [`OAUTHBEARER_ABORT`].
pub fn parse_oauthbearer_answer(bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(bytes);
    let json: Option<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_slice(bytes).ok();
    let field = |name: &str| {
        json.as_ref()
            .and_then(|j| j.get(name))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let Some(status) = field("status") else {
        let shown: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
        return Err(format!("the broker refused the OAuth token: {shown}"));
    };
    let mut message = format!("the broker refused the OAuth token: status {status}");
    if let Some(scope) = field("scope") {
        message.push_str(&format!(", scope needed: {scope}"));
    }
    if let Some(config) = field("openid-configuration") {
        message.push_str(&format!(", openid-configuration: {config}"));
    }
    message.push_str(
        " (check the token's audience, issuer, scope and expiry against the brokers' \
         OAUTHBEARER settings)",
    );
    Err(message)
}

fn expect_correlation(r: &mut Reader<'_>, correlation_id: i32) -> Result<(), String> {
    let got = r.i32()?;
    if got == correlation_id {
        Ok(())
    } else {
        Err(format!("correlation id {got}, expected {correlation_id}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_names_the_mechanism_in_a_v1_header() {
        let req = handshake_request(7, Mechanism::ScramSha512);
        let mut expected = vec![0, 0, 0, 33, 0, 17, 0, 1, 0, 0, 0, 7, 0, 8];
        expected.extend_from_slice(b"walrelay");
        expected.extend_from_slice(&[0, 13]);
        expected.extend_from_slice(b"SCRAM-SHA-512");
        assert_eq!(req, expected);
    }

    #[test]
    fn a_refused_mechanism_names_the_enabled_ones() {
        let mut resp = vec![0, 0, 0, 7, 0, 33, 0, 0, 0, 2, 0, 5];
        resp.extend_from_slice(b"PLAIN");
        resp.extend_from_slice(&[0, 6]);
        resp.extend_from_slice(b"GSSAPI");
        let e = parse_handshake(&resp, 7, Mechanism::ScramSha256).unwrap_err();
        assert_eq!(
            e,
            "the broker does not enable SASL mechanism SCRAM-SHA-256 (it enables PLAIN, GSSAPI)"
        );
        let ok = [0, 0, 0, 7, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse_handshake(&ok, 7, Mechanism::Plain), Ok(()));
        assert!(parse_handshake(&ok, 8, Mechanism::Plain)
            .unwrap_err()
            .contains("correlation"));
    }

    #[test]
    fn authenticate_carries_bytes_and_returns_the_brokers_or_its_reason() {
        let req = authenticate_request(9, &plain_message("u", "pw"));
        let mut expected = vec![0, 0, 0, 27, 0, 36, 0, 1, 0, 0, 0, 9, 0, 8];
        expected.extend_from_slice(b"walrelay");
        expected.extend_from_slice(&[0, 0, 0, 5, 0, b'u', 0, b'p', b'w']);
        assert_eq!(req, expected);

        let ok = [
            0, 0, 0, 9, 0, 0, 0xff, 0xff, 0, 0, 0, 2, b'h', b'i', 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(parse_authenticate(&ok, 9), Ok(b"hi".to_vec()));
        let mut refused = vec![0, 0, 0, 9, 0, 58, 0, 3];
        refused.extend_from_slice(b"bad");
        refused.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            parse_authenticate(&refused, 9),
            Err("SASL authentication failed: bad".to_owned())
        );
    }

    #[test]
    fn mechanisms_parse_as_librdkafka_names_them() {
        assert_eq!(
            Mechanism::parse("scram-sha-512"),
            Some(Mechanism::ScramSha512)
        );
        assert_eq!(Mechanism::parse("PLAIN"), Some(Mechanism::Plain));
        assert_eq!(Mechanism::parse("GSSAPI"), None);
        assert_eq!(
            Mechanism::parse("oauthbearer"),
            Some(Mechanism::OAuthBearer)
        );
    }

    #[test]
    fn the_oauthbearer_message_is_rfc_7628_byte_for_byte() {
        let msg = oauthbearer_message(
            "eyJ.x-y_z",
            [("identityPoolId", "p-1"), ("logicalCluster", "lkc 1")],
        )
        .unwrap();
        assert_eq!(
            msg,
            b"n,,\x01auth=Bearer eyJ.x-y_z\x01identityPoolId=p-1\x01logicalCluster=lkc 1\x01\x01"
        );
        assert_eq!(
            oauthbearer_message("t", []).unwrap(),
            b"n,,\x01auth=Bearer t\x01\x01"
        );
        assert!(oauthbearer_message("", []).is_err());
        assert!(oauthbearer_message("a\x01b", []).is_err());
        assert!(oauthbearer_message("a b", []).is_err());
        assert_eq!(OAUTHBEARER_ABORT, b"\x01");
    }

    #[test]
    fn the_brokers_oauthbearer_error_becomes_a_sentence() {
        assert_eq!(parse_oauthbearer_answer(b""), Ok(()));
        let e = parse_oauthbearer_answer(
            br#"{"status":"invalid_token","scope":"kafka","openid-configuration":"https://idp/.well-known/openid-configuration"}"#,
        )
        .unwrap_err();
        assert!(
            e.starts_with(
                "the broker refused the OAuth token: status invalid_token, scope needed: kafka, \
                 openid-configuration: https://idp/.well-known/openid-configuration (check"
            ),
            "{e}"
        );
        let e = parse_oauthbearer_answer(b"not json\n").unwrap_err();
        assert_eq!(e, "the broker refused the OAuth token: not json");
    }
}
