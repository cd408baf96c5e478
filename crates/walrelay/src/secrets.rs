//! Secrets in the Kafka configuration: read from a file or an environment
//! variable at startup, never written anywhere.
//!
//! The value of a secret Kafka property ([`is_secret_property`]: passwords,
//! client secrets, passphrases, private keys) may be a reference instead of
//! the secret itself:
//!
//! | value | resolves to |
//! |---|---|
//! | `env:NAME` | the value of environment variable `NAME` |
//! | `file:/path/to/file` | the file's contents, without one trailing newline |
//! | `literal:text` | `text` as written (for a secret that starts with `env:`, `file:` or `literal:`) |
//! | anything else | itself |
//!
//! ```toml
//! [kafka.properties]
//! "sasl.password" = "file:/run/secrets/kafka-password"
//! "ssl.key.password" = "env:KAFKA_SSL_KEY_PASSWORD"
//! ```
//!
//! References are resolved each time a producer is created
//! ([`crate::kafka::properties::SinkConfig::effective_properties`]), so a rotated secret
//! file is picked up when the relay reconnects, and they are checked once
//! when the configuration is validated, so that a missing file or variable
//! stops `walrelay run` before it connects. A reference is not a secret:
//! `walrelay config` and `Debug` show it as written. A resolved value, or a
//! literal secret, is shown as `<redacted>`; errors name the property, the
//! variable or the file, never the value.
//!
//! Only secret properties are resolved: in any other property `env:` or
//! `file:` is passed to librdkafka unchanged.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// What a secret Kafka property's value stands for.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// The value itself.
    Literal(String),
    /// `env:NAME`: an environment variable.
    Env(String),
    /// `file:/path`: a file's contents.
    File(PathBuf),
}

impl fmt::Debug for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Literal(_) => f.write_str("Literal(<redacted>)"),
            SecretRef::Env(name) => f.debug_tuple("Env").field(name).finish(),
            SecretRef::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl SecretRef {
    /// Parses a secret property's value (see the module documentation).
    pub fn parse(value: &str) -> SecretRef {
        if let Some(name) = value.strip_prefix("env:") {
            SecretRef::Env(name.to_owned())
        } else if let Some(path) = value.strip_prefix("file:") {
            SecretRef::File(PathBuf::from(path))
        } else if let Some(text) = value.strip_prefix("literal:") {
            SecretRef::Literal(text.to_owned())
        } else {
            SecretRef::Literal(value.to_owned())
        }
    }

    /// Whether the value names where the secret is (`env:`/`file:`) rather
    /// than holding it.
    pub fn is_reference(&self) -> bool {
        !matches!(self, SecretRef::Literal(_))
    }

    /// The secret, read now. `property` only names it in errors.
    pub fn resolve(&self, property: &str) -> Result<String, SecretError> {
        let (value, origin) = match self {
            SecretRef::Literal(text) => return Ok(text.clone()),
            SecretRef::Env(name) => {
                if name.is_empty() || name.contains('=') || name.contains('\0') {
                    return Err(SecretError::BadReference {
                        property: property.to_owned(),
                        message: format!(
                            "`env:{name}` does not name an environment variable (write \
                             `env:NAME`)"
                        ),
                    });
                }
                let value = std::env::var(name).map_err(|e| SecretError::Env {
                    property: property.to_owned(),
                    variable: name.clone(),
                    problem: match e {
                        std::env::VarError::NotPresent => "is not set",
                        std::env::VarError::NotUnicode(_) => "is not valid UTF-8",
                    },
                })?;
                (value, format!("environment variable {name}"))
            }
            SecretRef::File(path) => {
                if path.as_os_str().is_empty() {
                    return Err(SecretError::BadReference {
                        property: property.to_owned(),
                        message: "`file:` names no file (write `file:/path/to/secret`)".to_owned(),
                    });
                }
                let bytes = std::fs::read(path).map_err(|source| SecretError::File {
                    property: property.to_owned(),
                    path: path.clone(),
                    problem: source.to_string(),
                })?;
                let mut text = String::from_utf8(bytes).map_err(|_| SecretError::File {
                    property: property.to_owned(),
                    path: path.clone(),
                    problem: "the file is not valid UTF-8".to_owned(),
                })?;
                // `echo secret > file` and most editors end the file with a
                // newline that is not part of the secret.
                if text.ends_with('\n') {
                    text.pop();
                    if text.ends_with('\r') {
                        text.pop();
                    }
                }
                (text, format!("file {}", path.display()))
            }
        };
        if value.is_empty() {
            return Err(SecretError::Empty {
                property: property.to_owned(),
                origin,
            });
        }
        Ok(value)
    }
}

/// Whether a Kafka property holds a secret (passwords, secrets, private
/// keys): its value may be a reference (`env:`, `file:`) and is never logged
/// or shown. The one definition of the rule: the sink, `walrelay config` and
/// every `Debug` of a configuration go through it.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.contains("password")
        || name.contains("secret")
        || name.contains("passphrase")
        || name.ends_with("key.pem")
        || name == "ssl_key"
        || name == "sasl.oauthbearer.config"
}

/// The properties with every secret reference resolved. The result holds
/// secrets in clear text: hand it to librdkafka, never to a log.
pub fn resolve_properties(
    properties: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, SecretError> {
    properties
        .iter()
        .map(|(name, value)| {
            let value = if is_secret_property(name) {
                SecretRef::parse(value).resolve(name)?
            } else {
                value.clone()
            };
            Ok((name.clone(), value))
        })
        .collect()
}

/// How a property's configured value may be shown (`walrelay config`,
/// `Debug`): secret literals become `<redacted>`, references and other
/// properties are shown as written.
pub fn displayable<'a>(name: &str, value: &'a str) -> &'a str {
    if is_secret_property(name) && !SecretRef::parse(value).is_reference() {
        REDACTED
    } else {
        value
    }
}

/// What secret values are shown as.
pub const REDACTED: &str = walrelay_oauth::REDACTED;

/// A property map whose values may be resolved secrets (what librdkafka
/// gets), for logs: every secret value replaced by [`REDACTED`], references
/// included, since a resolved secret may itself look like one.
pub fn redact(properties: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    properties
        .iter()
        .map(|(k, v)| {
            let v = if is_secret_property(k) {
                REDACTED
            } else {
                v.as_str()
            };
            (k.as_str(), v)
        })
        .collect()
}

/// `Debug` of a resolved property map, through [`redact`].
pub(crate) struct Redacted<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(redact(self.0)).finish()
    }
}

/// A property map for `Debug` output, through [`displayable`].
pub struct DisplayProperties<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for DisplayProperties<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, displayable(k, v))))
            .finish()
    }
}

/// A secret reference that cannot be resolved. Names the property and the
/// variable or file, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("Kafka property `{property}`: environment variable {variable} {problem}")]
    Env {
        property: String,
        variable: String,
        problem: &'static str,
    },
    #[error("Kafka property `{property}`: cannot read the secret file {}: {problem}", path.display())]
    File {
        property: String,
        path: PathBuf,
        problem: String,
    },
    #[error("Kafka property `{property}`: the secret from {origin} is empty")]
    Empty { property: String, origin: String },
    #[error("Kafka property `{property}`: {message}")]
    BadReference { property: String, message: String },
}

impl SecretError {
    /// The message without the property's name.
    pub fn detail(&self) -> String {
        let full = self.to_string();
        let prefix = format!("Kafka property `{}`: ", self.property());
        full.strip_prefix(&prefix).unwrap_or(&full).to_owned()
    }

    /// The property whose value could not be resolved.
    pub fn property(&self) -> &str {
        match self {
            SecretError::Env { property, .. }
            | SecretError::File { property, .. }
            | SecretError::Empty { property, .. }
            | SecretError::BadReference { property, .. } => property,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        assert_eq!(SecretRef::parse("env:PW"), SecretRef::Env("PW".into()));
        assert_eq!(
            SecretRef::parse("file:/run/s"),
            SecretRef::File("/run/s".into())
        );
        assert_eq!(
            SecretRef::parse("literal:env:x"),
            SecretRef::Literal("env:x".into())
        );
        assert_eq!(
            SecretRef::parse("hunter2"),
            SecretRef::Literal("hunter2".into())
        );
        assert!(!format!("{:?}", SecretRef::parse("hunter2")).contains("hunter2"));
    }

    #[test]
    fn files_lose_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret \r\n").unwrap();
        let got = SecretRef::File(path.clone())
            .resolve("sasl.password")
            .unwrap();
        assert_eq!(got, "s3cret ");
        std::fs::write(&path, "\n").unwrap();
        let err = SecretRef::File(path).resolve("sasl.password").unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }

    #[test]
    fn only_secret_properties_are_resolved() {
        let props = BTreeMap::from([
            ("client.id".to_owned(), "env:NOT_A_SECRET".to_owned()),
            ("sasl.password".to_owned(), "literal:file:x".to_owned()),
        ]);
        let got = resolve_properties(&props).unwrap();
        assert_eq!(got["client.id"], "env:NOT_A_SECRET");
        assert_eq!(got["sasl.password"], "file:x");
    }

    #[test]
    fn display_hides_literals_and_shows_references() {
        assert_eq!(displayable("sasl.password", "hunter2"), REDACTED);
        assert_eq!(displayable("sasl.password", "env:PW"), "env:PW");
        assert_eq!(displayable("ssl.key.password", "literal:x"), REDACTED);
        assert_eq!(displayable("client.id", "app"), "app");
    }
}
