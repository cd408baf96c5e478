//! SASL extensions (RFC 7628 section 3.1): key/value pairs sent beside
//! the token in the OAUTHBEARER client message. Managed services need
//! them (Confluent Cloud's `logicalCluster` and `identityPoolId`), so a
//! malformed one is refused at start, by name, rather than by the broker.
//!
//! Written as librdkafka reads `sasl.oauthbearer.extensions`:
//! `key=value,key=value`.

use std::collections::BTreeMap;

use super::error::OAuthError;

/// Validated extensions, in key order. `auth` is never one of them (RFC
/// 7628 reserves it for the token).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extensions(BTreeMap<String, String>);

impl Extensions {
    /// Parses `key=value,key=value` (an empty string: none). Spaces around
    /// a pair are dropped; inside it they are kept.
    pub fn parse(text: &str, property: &str) -> Result<Extensions, OAuthError> {
        let mut map = BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(OAuthError::config(
                    property,
                    format!("`{pair}` is not key=value (write key=value,key=value)"),
                ));
            };
            check(key, value).map_err(|reason| OAuthError::config(property, reason))?;
            if map.insert(key.to_owned(), value.to_owned()).is_some() {
                return Err(OAuthError::config(
                    property,
                    format!("extension `{key}` is given twice"),
                ));
            }
        }
        Ok(Extensions(map))
    }

    /// One pair, checked.
    pub fn insert(&mut self, key: &str, value: &str) -> Result<(), String> {
        check(key, value)?;
        self.0.insert(key.to_owned(), value.to_owned());
        Ok(())
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// RFC 7628: `key = 1*(ALPHA)`, `value = *(VCHAR / SP / HTAB / CR / LF)`;
/// `auth` is reserved. Kafka's broker also refuses an empty value.
fn check(key: &str, value: &str) -> Result<(), String> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(format!(
            "extension key `{key}` must be one or more ASCII letters (RFC 7628)"
        ));
    }
    if key == "auth" {
        return Err("extension key `auth` is reserved for the token (RFC 7628)".to_owned());
    }
    if value.is_empty() {
        return Err(format!("extension `{key}` has an empty value"));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !matches!(c, '\x21'..='\x7e' | ' ' | '\t' | '\r' | '\n'))
    {
        return Err(format!(
            "extension `{key}`'s value holds {c:?}: only printable ASCII, spaces, tabs and line \
             breaks are allowed (RFC 7628)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_parse_in_key_order() {
        let e = Extensions::parse(
            "logicalCluster=lkc-abc12, identityPoolId=pool-X9y",
            "sasl.oauthbearer.extensions",
        )
        .unwrap();
        let pairs: Vec<_> = e.iter().collect();
        assert_eq!(
            pairs,
            [
                ("identityPoolId", "pool-X9y"),
                ("logicalCluster", "lkc-abc12")
            ]
        );
        assert!(Extensions::parse("", "p").unwrap().is_empty());
        // A value may hold '=' and spaces.
        let e = Extensions::parse("traceId=a=b c", "p").unwrap();
        assert_eq!(e.iter().next(), Some(("traceId", "a=b c")));
    }

    #[test]
    fn rfc_7628_violations_are_refused_by_name() {
        let cases = [
            ("noequals", "not key=value"),
            ("key1=v", "ASCII letters"),
            ("=v", "ASCII letters"),
            ("auth=Bearer x", "reserved"),
            ("a=", "empty value"),
            ("a=caf\u{e9}", "printable ASCII"),
            ("a=\x01", "printable ASCII"),
            ("a=1,a=2", "twice"),
        ];
        for (text, says) in cases {
            let e = Extensions::parse(text, "sasl.oauthbearer.extensions").unwrap_err();
            let shown = e.to_string();
            assert!(
                shown.contains(says) && shown.contains("sasl.oauthbearer.extensions"),
                "{text:?}: {shown}"
            );
        }
    }
}
