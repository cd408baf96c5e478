//! AWS Signature Version 4 for presigned URLs (query-string signing):
//! the canonical request, the string to sign, the derived signing key
//! and the signature, each a pure function so that the tests check each
//! step against AWS's published examples.
//!
//! Only what MSK IAM needs: one `GET`, the `host` header signed, the
//! signature in `X-Amz-Signature`.

use std::time::SystemTime;

use ring::{digest, hmac};

use super::credentials::Credentials;

/// The algorithm's name, in the query and the string to sign.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// SHA-256 of the empty payload (a GET's body).
pub const EMPTY_PAYLOAD_SHA256: &str =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// A request to presign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presign<'a> {
    pub host: &'a str,
    /// The absolute path, already URI-encoded (`/` for MSK).
    pub path: &'a str,
    /// The request's own query parameters (not yet encoded).
    pub params: &'a [(&'a str, &'a str)],
    pub service: &'a str,
    pub region: &'a str,
    pub time: SystemTime,
    /// `X-Amz-Expires`, seconds.
    pub expires: u64,
    /// The hex SHA-256 of the payload, or `UNSIGNED-PAYLOAD` (S3).
    pub payload_hash: &'a str,
}

/// A presigned request, with the intermediate steps (for tests and for
/// diagnosing a refused signature).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Presigned {
    pub canonical_request: String,
    pub string_to_sign: String,
    /// Hex, lower case.
    pub signature: String,
    /// The canonical query string (sorted, encoded), without the
    /// signature.
    pub query: String,
}

impl Presigned {
    /// `https://host/path?query&X-Amz-Signature=...`.
    #[must_use]
    pub fn url(&self, host: &str, path: &str) -> String {
        format!(
            "https://{host}{path}?{}&X-Amz-Signature={}",
            self.query, self.signature
        )
    }
}

/// URI encoding as SigV4 wants it: unreserved characters (`A-Z a-z 0-9 - . _ ~`)
/// as they are, every other byte `%XX` in upper-case hex.
#[must_use]
pub fn uri_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `(YYYYMMDD, YYYYMMDDTHHMMSSZ)` of `time`, in UTC.
#[must_use]
pub fn dates(time: SystemTime) -> (String, String) {
    // "2013-05-24T00:00:00Z" -> "20130524", "20130524T000000Z".
    let rfc3339 = humantime::format_rfc3339_seconds(time).to_string();
    let stamp: String = rfc3339.chars().filter(|c| *c != '-' && *c != ':').collect();
    (stamp[..8].to_owned(), stamp)
}

/// The signing key: HMAC chain over "AWS4"+secret, date, region, service,
/// "aws4_request".
#[must_use]
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let mut key = format!("AWS4{secret}").into_bytes();
    for part in [date, region, service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes()).to_vec();
    }
    key.try_into().expect("HMAC-SHA256 is 32 bytes")
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data);
    tag.as_ref().try_into().expect("HMAC-SHA256 is 32 bytes")
}

/// Lower-case hex.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_hex(text: &str) -> String {
    hex(digest::digest(&digest::SHA256, text.as_bytes()).as_ref())
}

/// Presigns `request` with `credentials`: the request's parameters and
/// the `X-Amz-*` ones (the session token among them when there is one),
/// sorted and encoded, signed with the `host` header.
#[must_use]
pub fn presign(request: &Presign<'_>, credentials: &Credentials) -> Presigned {
    let (date, stamp) = dates(request.time);
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let credential = format!("{}/{scope}", credentials.access_key_id);
    let expires = request.expires.to_string();
    let mut params: Vec<(String, String)> = request
        .params
        .iter()
        .map(|(k, v)| (uri_encode(k), uri_encode(v)))
        .collect();
    let mut add = |k: &str, v: &str| params.push((uri_encode(k), uri_encode(v)));
    add("X-Amz-Algorithm", ALGORITHM);
    add("X-Amz-Credential", &credential);
    add("X-Amz-Date", &stamp);
    add("X-Amz-Expires", &expires);
    if let Some(token) = &credentials.session_token {
        add("X-Amz-Security-Token", token.expose());
    }
    add("X-Amz-SignedHeaders", "host");
    params.sort();
    let query = params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let canonical_request = format!(
        "GET\n{}\n{query}\nhost:{}\n\nhost\n{}",
        request.path, request.host, request.payload_hash
    );
    let string_to_sign = format!(
        "{ALGORITHM}\n{stamp}\n{scope}\n{}",
        sha256_hex(&canonical_request)
    );
    let key = signing_key(
        credentials.secret_access_key.expose(),
        &date,
        request.region,
        request.service,
    );
    let signature = hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
    Presigned {
        canonical_request,
        string_to_sign,
        signature,
        query,
    }
}

#[cfg(test)]
mod tests;
