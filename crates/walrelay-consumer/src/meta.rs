//! What walrelay's headers say about a record: its idempotency key, its
//! source, its LSNs and the key sent before it.

use std::fmt;

use rdkafka::message::{BorrowedMessage, Headers, Message};
use walrelay_contract::header;
use walrelay_contract::{EventKey, ParseEventKeyError};
use walrelay_pgoutput::{Lsn, ParseLsnError};

/// The walrelay metadata of one record, parsed from its headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    /// The idempotency key (`idempotency-key`).
    pub key: EventKey,
    /// Where the key sequence comes from (`walrelay-source`). Keys of
    /// different sources are not comparable.
    pub source: String,
    /// The LSN the server reported for the event (`walrelay-lsn`), if
    /// present.
    pub lsn: Option<Lsn>,
    /// Start of the transaction's commit record (`walrelay-commit-lsn`);
    /// absent for non-transactional messages.
    pub commit_lsn: Option<Lsn>,
    /// The key the relay sent before this one to the same topic and
    /// partition in the same session (`walrelay-prev-key`, or
    /// `walrelay-prev` in the compact form of the lean header set). `None`
    /// for the first record of a session there (empty header), and for
    /// records of relays that do not send the header.
    pub prev_key: Option<EventKey>,
}

/// Why a record's headers are not usable walrelay metadata.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// A required header is absent (or has a null value).
    #[error(
        "the record has no {header:?} header: it was not produced by walrelay, \
         or its headers were stripped by a proxy or bridge on the way"
    )]
    MissingHeader {
        /// The missing header's name.
        header: &'static str,
    },
    /// A header's value is not UTF-8.
    #[error("the {header:?} header is not UTF-8 (walrelay writes ASCII)")]
    NotUtf8 {
        /// The header's name.
        header: &'static str,
    },
    /// The `walrelay-source` header is empty.
    #[error(
        "the {header:?} header is empty: walrelay always names the source \
         (cluster/database/slot, or relay.source_id)",
        header = header::SOURCE
    )]
    EmptySource,
    /// A key header that is not 32 hex digits.
    #[error("the {header:?} header {value:?} is not an idempotency key: {source}")]
    BadKey {
        /// The header's name.
        header: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        source: ParseEventKeyError,
    },
    /// A header name reserved for walrelay (`idempotency-key`,
    /// `walrelay-*`) occurs more than once: an application forged it, or
    /// something on the way rewrote the record. Which copy is the relay's
    /// cannot be told, so the record is refused rather than trusted.
    #[error(
        "the record carries the walrelay header {header:?} more than once: walrelay writes each \
         of its headers exactly once, so one copy was added by someone else (an application \
         header named like walrelay's, or a proxy); the record is not trusted"
    )]
    DuplicateHeader {
        /// The header's name.
        header: String,
    },
    /// The previous key in both forms (`walrelay-prev-key` and
    /// `walrelay-prev`): walrelay writes one of them, so one was added by
    /// someone else and neither can be trusted.
    #[error(
        "the record carries both {full:?} and {lean:?}: walrelay writes one of them (the full \
         or the lean header set), so one was added by someone else; the record is not trusted",
        full = header::PREV_KEY,
        lean = header::PREV
    )]
    TwoPreviousKeys,
    /// An LSN header that is not `HIGH/LOW` hex.
    #[error("the {header:?} header {value:?} is not an LSN: {source}")]
    BadLsn {
        /// The header's name.
        header: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        source: ParseLsnError,
    },
}

impl RecordMeta {
    /// Parses the walrelay headers out of `(name, value)` pairs in record
    /// order. Other headers are ignored. A reserved name (`idempotency-key`
    /// or any `walrelay-*`) that occurs more than once is refused
    /// ([`MetaError::DuplicateHeader`]): a consumer that trusted either
    /// copy could take a forged key as its high-water mark.
    ///
    /// `idempotency-key` and `walrelay-source` are required. `walrelay-lsn`,
    /// `walrelay-commit-lsn` (both only in the full header set) and the
    /// previous key (`walrelay-prev-key`, or `walrelay-prev` in the lean
    /// set, never both) are optional; an empty or null previous key means
    /// "first record of a session".
    pub fn from_headers<'a, I>(headers: I) -> Result<RecordMeta, MetaError>
    where
        I: IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    {
        let mut key = None;
        let mut source = None;
        let mut lsn = None;
        let mut commit_lsn = None;
        let mut prev_key = None;
        let mut prev = None;
        let mut reserved: Vec<&str> = Vec::new();
        for (name, value) in headers {
            if is_reserved(name) {
                if reserved.contains(&name) {
                    return Err(MetaError::DuplicateHeader {
                        header: name.to_owned(),
                    });
                }
                reserved.push(name);
            }
            let slot = match name {
                header::IDEMPOTENCY_KEY => &mut key,
                header::SOURCE => &mut source,
                header::LSN => &mut lsn,
                header::COMMIT_LSN => &mut commit_lsn,
                header::PREV_KEY => &mut prev_key,
                header::PREV => &mut prev,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value);
            }
        }

        let key_text = required(header::IDEMPOTENCY_KEY, key)?;
        let key = parse_key(header::IDEMPOTENCY_KEY, key_text)?;
        let source = required(header::SOURCE, source)?;
        if source.is_empty() {
            return Err(MetaError::EmptySource);
        }
        let prev_key = match (prev_key, prev) {
            (Some(_), Some(_)) => return Err(MetaError::TwoPreviousKeys),
            (None, Some(compact)) => match optional(header::PREV, Some(compact))? {
                None | Some("") => None,
                Some(text) => {
                    Some(
                        EventKey::from_compact(text).map_err(|source| MetaError::BadKey {
                            header: header::PREV,
                            value: text.to_owned(),
                            source,
                        })?,
                    )
                }
            },
            (hex, None) => match optional(header::PREV_KEY, hex)? {
                None | Some("") => None,
                Some(text) => Some(parse_key(header::PREV_KEY, text)?),
            },
        };
        Ok(RecordMeta {
            key,
            source: source.to_owned(),
            lsn: parse_lsn(header::LSN, optional(header::LSN, lsn)?)?,
            commit_lsn: parse_lsn(
                header::COMMIT_LSN,
                optional(header::COMMIT_LSN, commit_lsn)?,
            )?,
            prev_key,
        })
    }

    /// Parses the walrelay headers of a consumed record (see
    /// [`RecordMeta::from_headers`]). A record without headers fails with
    /// [`MetaError::MissingHeader`].
    pub fn from_message(message: &BorrowedMessage<'_>) -> Result<RecordMeta, MetaError> {
        match message.headers() {
            Some(headers) => RecordMeta::from_kafka_headers(headers),
            None => RecordMeta::from_headers(std::iter::empty()),
        }
    }

    /// Parses walrelay headers from any rdkafka [`Headers`] (borrowed or
    /// owned).
    pub fn from_kafka_headers<H: Headers>(headers: &H) -> Result<RecordMeta, MetaError> {
        RecordMeta::from_headers(headers.iter().map(|h| (h.key, h.value)))
    }
}

impl fmt::Display for RecordMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {} from {}", self.key, self.source)
    }
}

/// Whether a header name belongs to walrelay (`idempotency-key`, and every
/// `walrelay-*`): an application can never set one. The relay's own rule
/// ([`header::is_reserved`]), so that both always agree.
pub fn is_reserved(name: &str) -> bool {
    header::is_reserved(name)
}

/// A required header as text: absent and null are both "missing".
fn required<'a>(name: &'static str, value: Option<Option<&'a [u8]>>) -> Result<&'a str, MetaError> {
    match value.flatten() {
        None => Err(MetaError::MissingHeader { header: name }),
        Some(bytes) => std::str::from_utf8(bytes).map_err(|_| MetaError::NotUtf8 { header: name }),
    }
}

/// An optional header as text: absent and null are both `None`.
fn optional<'a>(
    name: &'static str,
    value: Option<Option<&'a [u8]>>,
) -> Result<Option<&'a str>, MetaError> {
    match value.flatten() {
        None => Ok(None),
        Some(_) => required(name, value).map(Some),
    }
}

fn parse_key(name: &'static str, text: &str) -> Result<EventKey, MetaError> {
    EventKey::from_hex(text).map_err(|source| MetaError::BadKey {
        header: name,
        value: text.to_owned(),
        source,
    })
}

fn parse_lsn(name: &'static str, text: Option<&str>) -> Result<Option<Lsn>, MetaError> {
    match text {
        None | Some("") => Ok(None),
        Some(text) => text.parse().map(Some).map_err(|source| MetaError::BadLsn {
            header: name,
            value: text.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0000000001531f10000000000153200a";
    const PREV: &str = "0000000001531f100000000001532000";

    fn h<'a>(pairs: &'a [(&'a str, &'a str)]) -> Vec<(&'a str, Option<&'a [u8]>)> {
        pairs
            .iter()
            .map(|(k, v)| (*k, Some(v.as_bytes())))
            .collect()
    }

    #[test]
    fn good_headers() {
        let meta = RecordMeta::from_headers(h(&[
            ("trace", "x"),
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "7312/app/walrelay"),
            (header::COMMIT_LSN, "0/1531F10"),
            (header::LSN, "0/153200A"),
            (header::PREV_KEY, PREV),
            ("walrelay-xid", "77"),
        ]))
        .unwrap();
        assert_eq!(meta.key, EventKey::new(0x0153_1f10, 0x0153_200a));
        assert_eq!(meta.source, "7312/app/walrelay");
        assert_eq!(meta.commit_lsn, Some(Lsn(0x0153_1f10)));
        assert_eq!(meta.lsn, Some(Lsn(0x0153_200a)));
        assert_eq!(meta.prev_key, Some(EventKey::new(0x0153_1f10, 0x0153_2000)));
        assert_eq!(
            meta.to_string(),
            format!("key {KEY} from 7312/app/walrelay")
        );
    }

    #[test]
    fn the_lean_set_key_source_and_the_compact_previous_key() {
        let meta = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "7312/app/walrelay"),
            (header::LAYOUT, "0/4/9f86d081884c7d65"),
            (header::PREV, "1531f10/1532000"),
            ("trace", "x"),
        ]))
        .unwrap();
        assert_eq!(meta.key, EventKey::new(0x0153_1f10, 0x0153_200a));
        assert_eq!((meta.lsn, meta.commit_lsn), (None, None));
        assert_eq!(meta.prev_key, Some(EventKey::new(0x0153_1f10, 0x0153_2000)));
        // A session's first record: empty.
        let first = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV, ""),
        ]))
        .unwrap();
        assert_eq!(first.prev_key, None);
        // Not a compact key.
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV, PREV),
        ]))
        .unwrap_err();
        assert!(
            matches!(err, MetaError::BadKey { header, .. } if header == header::PREV),
            "{err}"
        );
        // Both forms: walrelay writes one.
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV_KEY, PREV),
            (header::PREV, "1531f10/1532000"),
        ]))
        .unwrap_err();
        assert_eq!(err, MetaError::TwoPreviousKeys);
        assert!(err.to_string().contains("walrelay-prev-key"), "{err}");
    }

    #[test]
    fn a_reserved_header_twice_is_refused() {
        // A forged key after walrelay's: a consumer reading the last copy
        // would skip every later record of the partition.
        for forged in [
            header::IDEMPOTENCY_KEY,
            header::PREV_KEY,
            "walrelay-anything",
        ] {
            let err = RecordMeta::from_headers(h(&[
                (header::IDEMPOTENCY_KEY, KEY),
                (header::SOURCE, "s"),
                (header::PREV_KEY, PREV),
                ("walrelay-anything", "x"),
                (forged, "ffffffffffffffffffffffffffffffff"),
            ]))
            .unwrap_err();
            assert_eq!(
                err,
                MetaError::DuplicateHeader {
                    header: forged.to_owned()
                }
            );
            assert!(err.to_string().contains("more than once"), "{err}");
        }
        // Application headers may repeat.
        RecordMeta::from_headers(h(&[
            ("trace", "1"),
            ("trace", "2"),
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
        ]))
        .unwrap();
        assert!(is_reserved("walrelay-source") && is_reserved("idempotency-key"));
        assert!(!is_reserved("idempotency") && !is_reserved("x-walrelay-y"));
    }

    #[test]
    fn minimal_headers_and_empty_prev_key() {
        let meta = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV_KEY, ""),
        ]))
        .unwrap();
        assert_eq!(meta.prev_key, None);
        assert_eq!(meta.lsn, None);
        assert_eq!(meta.commit_lsn, None);
        // Null prev-key is the same as empty.
        let meta = RecordMeta::from_headers(vec![
            (header::IDEMPOTENCY_KEY, Some(KEY.as_bytes())),
            (header::SOURCE, Some(&b"s"[..])),
            (header::PREV_KEY, None),
        ])
        .unwrap();
        assert_eq!(meta.prev_key, None);
    }

    #[test]
    fn missing_key() {
        let err = RecordMeta::from_headers(h(&[(header::SOURCE, "s")])).unwrap_err();
        assert_eq!(
            err,
            MetaError::MissingHeader {
                header: header::IDEMPOTENCY_KEY
            }
        );
        let text = err.to_string();
        assert!(text.contains("idempotency-key"), "{text}");
        assert!(text.contains("not produced by walrelay"), "{text}");
        assert!(text.contains("stripped by a proxy"), "{text}");
        // A null value is missing too.
        let err = RecordMeta::from_headers(vec![
            (header::IDEMPOTENCY_KEY, None),
            (header::SOURCE, Some(&b"s"[..])),
        ])
        .unwrap_err();
        assert!(
            matches!(err, MetaError::MissingHeader { header: h } if h == header::IDEMPOTENCY_KEY)
        );
        // No headers at all.
        assert!(matches!(
            RecordMeta::from_headers(std::iter::empty()),
            Err(MetaError::MissingHeader { .. })
        ));
    }

    #[test]
    fn missing_or_empty_source() {
        let err = RecordMeta::from_headers(h(&[(header::IDEMPOTENCY_KEY, KEY)])).unwrap_err();
        assert_eq!(
            err,
            MetaError::MissingHeader {
                header: header::SOURCE
            }
        );
        assert!(err.to_string().contains("walrelay-source"), "{err}");
        let err =
            RecordMeta::from_headers(h(&[(header::IDEMPOTENCY_KEY, KEY), (header::SOURCE, "")]))
                .unwrap_err();
        assert_eq!(err, MetaError::EmptySource);
    }

    #[test]
    fn bad_hex() {
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, "0000000001531f10000000000153200g"),
            (header::SOURCE, "s"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&err, MetaError::BadKey { header: h, source: ParseEventKeyError::Digit { index: 31, .. }, .. } if *h == header::IDEMPOTENCY_KEY),
            "{err:?}"
        );
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, "1234"),
            (header::SOURCE, "s"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                &err,
                MetaError::BadKey {
                    source: ParseEventKeyError::Length { length: 4 },
                    ..
                }
            ),
            "{err:?}"
        );
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::PREV_KEY, "nope"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&err, MetaError::BadKey { header: h, .. } if *h == header::PREV_KEY),
            "{err:?}"
        );
        let err = RecordMeta::from_headers(h(&[
            (header::IDEMPOTENCY_KEY, KEY),
            (header::SOURCE, "s"),
            (header::LSN, "12345"),
        ]))
        .unwrap_err();
        assert!(matches!(&err, MetaError::BadLsn { .. }), "{err:?}");
        let err = RecordMeta::from_headers(vec![
            (header::IDEMPOTENCY_KEY, Some(&[0xff_u8, 0xfe][..])),
            (header::SOURCE, Some(&b"s"[..])),
        ])
        .unwrap_err();
        assert!(matches!(&err, MetaError::NotUtf8 { .. }), "{err:?}");
    }

    #[test]
    fn owned_kafka_headers() {
        use rdkafka::message::{Header, OwnedHeaders};
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: header::IDEMPOTENCY_KEY,
                value: Some(KEY),
            })
            .insert(Header {
                key: header::SOURCE,
                value: Some("s"),
            });
        let meta = RecordMeta::from_kafka_headers(&headers).unwrap();
        assert_eq!(meta.key, EventKey::from_hex(KEY).unwrap());
    }
}
