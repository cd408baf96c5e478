//! The envelope that `walrelay.emit(...)` (see `sql/walrelay.sql`) wraps an
//! event in, so one `pg_logical_emit_message` can name its own topic, key
//! and headers.
//!
//! Message prefix: [`PREFIX`] (`walrelay.v1`; the version is in the prefix
//! so a future format can coexist). Content layout:
//!
//! ```text
//! +----------------------+---------------------------+------------------+
//! | header length: u32   | header: UTF-8 JSON object | payload: bytes   |
//! | big-endian           | (header length bytes)     | (the rest)       |
//! +----------------------+---------------------------+------------------+
//! header = {"topic": "orders",            required, non-empty string
//!           "key": "o-1" | null,          optional record key
//!           "headers": {"k": "v"} | null, optional record headers
//!           "tombstone": true}            optional: value is null
//! ```
//!
//! The payload is carried byte for byte (a `bytea` payload round-trips
//! exactly; a `jsonb` payload is its text form). Parsing is pure and never
//! panics: malformed input is an [`EnvelopeError`] that says what is wrong.

use bytes::Bytes;
use serde::Deserialize;

/// The reserved message prefix of envelope messages.
pub const PREFIX: &str = "walrelay.v1";

/// A decoded envelope. `payload` is a zero-copy slice of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub topic: String,
    pub key: Option<String>,
    /// Header values are strings as given; non-string JSON values keep
    /// their JSON text (`5`, `true`, `{"a":1}`).
    pub headers: Vec<(String, String)>,
    /// `None` for a tombstone.
    pub payload: Option<Bytes>,
}

/// Why an envelope could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("envelope is {0} bytes long, shorter than its 4-byte header length")]
    TooShort(usize),
    #[error("envelope header length {declared} exceeds the {available} bytes after it")]
    HeaderLength { declared: u32, available: usize },
    #[error("envelope header is not valid JSON: {0}")]
    Json(String),
    #[error("envelope header has no \"topic\" (or it is empty): every envelope names its topic")]
    MissingTopic,
    #[error("envelope topic {0:?} is not a valid Kafka topic name (1-249 of [a-zA-Z0-9._-])")]
    InvalidTopic(String),
    #[error("envelope is a tombstone but carries {0} payload bytes")]
    TombstoneWithPayload(usize),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    topic: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    headers: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    tombstone: bool,
}

/// Kafka's topic name rule: 1 to 249 characters of ASCII letters, digits,
/// `.`, `_` and `-`, and not `.` or `..`.
pub fn is_valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Parse the content of a `walrelay.v1` message.
pub fn parse(content: &Bytes) -> Result<Envelope, EnvelopeError> {
    if content.len() < 4 {
        return Err(EnvelopeError::TooShort(content.len()));
    }
    let declared = u32::from_be_bytes([content[0], content[1], content[2], content[3]]);
    let available = content.len() - 4;
    let header_len = usize::try_from(declared).unwrap_or(usize::MAX);
    if header_len > available {
        return Err(EnvelopeError::HeaderLength {
            declared,
            available,
        });
    }
    let header: Header = serde_json::from_slice(&content[4..4 + header_len])
        .map_err(|e| EnvelopeError::Json(e.to_string()))?;
    let topic = header
        .topic
        .filter(|t| !t.is_empty())
        .ok_or(EnvelopeError::MissingTopic)?;
    if !is_valid_topic(&topic) {
        return Err(EnvelopeError::InvalidTopic(topic));
    }
    let payload = content.slice(4 + header_len..);
    let payload = if header.tombstone {
        if !payload.is_empty() {
            return Err(EnvelopeError::TombstoneWithPayload(payload.len()));
        }
        None
    } else {
        Some(payload)
    };
    let headers = header
        .headers
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect();
    Ok(Envelope {
        topic,
        key: header.key,
        headers,
        payload,
    })
}

/// Build envelope content (the inverse of [`parse`]); what the SQL helper
/// does, for tests and for clients that emit from code.
pub fn encode(
    topic: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    payload: Option<&[u8]>,
) -> Vec<u8> {
    let mut h = serde_json::Map::new();
    h.insert("topic".into(), topic.into());
    if let Some(k) = key {
        h.insert("key".into(), k.into());
    }
    if !headers.is_empty() {
        let map = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
            .collect();
        h.insert("headers".into(), serde_json::Value::Object(map));
    }
    if payload.is_none() {
        h.insert("tombstone".into(), true.into());
    }
    let header = serde_json::Value::Object(h).to_string();
    let mut out = Vec::with_capacity(4 + header.len() + payload.map_or(0, <[u8]>::len));
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(payload.unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw(header: &str, payload: &[u8]) -> Bytes {
        let mut v = (header.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(payload);
        Bytes::from(v)
    }

    #[test]
    fn full_envelope() {
        let e = parse(&raw(
            r#"{"topic":"orders","key":"o-1","headers":{"trace":"t1","n":5,"skip":null}}"#,
            b"\x00\xffbin",
        ))
        .unwrap();
        assert_eq!(e.topic, "orders");
        assert_eq!(e.key.as_deref(), Some("o-1"));
        assert_eq!(
            e.headers,
            vec![("n".into(), "5".into()), ("trace".into(), "t1".into())]
        );
        assert_eq!(e.payload.as_deref(), Some(&b"\x00\xffbin"[..]));
    }

    #[test]
    fn minimal_and_tombstone() {
        let e = parse(&raw(r#"{"topic":"t"}"#, b"")).unwrap();
        assert_eq!((e.key, e.payload.as_deref()), (None, Some(&b""[..])));
        let e = parse(&raw(r#"{"topic":"t","key":"k","tombstone":true}"#, b"")).unwrap();
        assert_eq!(e.payload, None);
        assert_eq!(
            parse(&raw(r#"{"topic":"t","tombstone":true}"#, b"x")),
            Err(EnvelopeError::TombstoneWithPayload(1))
        );
    }

    #[test]
    fn payload_is_zero_copy() {
        let content = raw(r#"{"topic":"t"}"#, b"payload");
        let e = parse(&content).unwrap();
        assert_eq!(
            e.payload.unwrap().as_ptr(),
            content[content.len() - 7..].as_ptr()
        );
    }

    #[test]
    fn malformed_envelopes_say_what_is_wrong() {
        assert_eq!(
            parse(&Bytes::from_static(b"\0\0")),
            Err(EnvelopeError::TooShort(2))
        );
        assert_eq!(
            parse(&Bytes::from_static(b"\0\0\0\x09{}")),
            Err(EnvelopeError::HeaderLength {
                declared: 9,
                available: 2
            })
        );
        assert!(matches!(
            parse(&raw("{not json", b"")),
            Err(EnvelopeError::Json(_))
        ));
        assert_eq!(
            parse(&raw(r#"{"key":"k"}"#, b"")),
            Err(EnvelopeError::MissingTopic)
        );
        assert_eq!(
            parse(&raw(r#"{"topic":""}"#, b"")),
            Err(EnvelopeError::MissingTopic)
        );
        assert_eq!(
            parse(&raw(r#"{"topic":"a b"}"#, b"")),
            Err(EnvelopeError::InvalidTopic("a b".into()))
        );
        assert!(matches!(
            parse(&raw(r#"{"topic":"t","extra":1}"#, b"")),
            Err(EnvelopeError::Json(_))
        ));
        assert!(matches!(
            parse(&raw(r#"{"topic":"t","headers":[1]}"#, b"")),
            Err(EnvelopeError::Json(_))
        ));
    }

    #[test]
    fn topic_names() {
        assert!(is_valid_topic("outbox.event.order_v2-x"));
        assert!(!is_valid_topic(".."));
        assert!(!is_valid_topic(&"a".repeat(250)));
        assert!(!is_valid_topic("ünï"));
    }

    proptest! {
        #[test]
        fn encode_parse_round_trip(
            topic in "[a-z0-9._-]{1,40}",
            key in proptest::option::of(".*"),
            payload in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
            hk in "[a-z]{1,8}", hv in ".*",
        ) {
            prop_assume!(topic != "." && topic != "..");
            let content = Bytes::from(encode(&topic, key.as_deref(), &[(&hk, &hv)], payload.as_deref()));
            let e = parse(&content).unwrap();
            prop_assert_eq!(e.topic, topic);
            prop_assert_eq!(e.key, key);
            prop_assert_eq!(e.headers, vec![(hk, hv)]);
            prop_assert_eq!(e.payload.as_deref(), payload.as_deref());
        }

        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse(&Bytes::from(data));
        }
    }
}
