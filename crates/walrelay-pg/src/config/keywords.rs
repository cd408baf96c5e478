//! Keyword/value strings (`host=db port=5432 password='it\'s secret'`), and
//! which keywords walrelay stores, accepts and ignores, or refuses.

use std::collections::HashMap;

use super::ConfigError;

/// Keywords stored as settings.
const SUPPORTED: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "dbname",
    "application_name",
    "fallback_application_name",
    "options",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "passfile",
    "channel_binding",
    "target_session_attrs",
];

/// Raw settings collected from the string: canonical keyword -> value.
pub(super) type Raw = HashMap<&'static str, String>;

/// Stores one keyword/value pair after classifying the keyword.
pub(super) fn store(raw: &mut Raw, keyword: &str, value: String) -> Result<(), ConfigError> {
    if let Some(&k) = SUPPORTED.iter().find(|&&k| k == keyword) {
        raw.insert(k, value);
        return Ok(());
    }
    let unsupported = |reason: &'static str| {
        Err(ConfigError::UnsupportedKeyword {
            keyword: keyword.to_string(),
            reason,
        })
    };
    let ignore_if = |ok: &[&str], reason: &'static str| {
        if ok.contains(&value.as_str()) {
            tracing::debug!(keyword, value = %value, "ignoring harmless connection option");
            Ok(())
        } else {
            Err(ConfigError::UnsupportedValue {
                keyword: keyword.to_string(),
                value: value.clone(),
                reason,
            })
        }
    };
    match keyword {
        "sslcompression" => {
            tracing::debug!("ignoring sslcompression: TLS compression is never used");
            Ok(())
        }
        "gssencmode" => ignore_if(
            &["disable", "prefer"],
            "walrelay does not do GSSAPI encryption; use TLS (sslmode) instead",
        ),
        "sslsni" => ignore_if(
            &["1"],
            "walrelay always sends SNI for host names (never for IP addresses)",
        ),
        "sslnegotiation" => ignore_if(
            &["postgres"],
            "walrelay only does the standard SSLRequest negotiation",
        ),
        "sslcertmode" => ignore_if(
            &["disable", "allow"],
            "walrelay does not send client certificates",
        ),
        "load_balance_hosts" => ignore_if(&["disable"], "walrelay tries hosts in the order given"),
        "client_encoding" => ignore_if(
            &["UTF8", "utf8", "UTF-8", "utf-8", "auto"],
            "walrelay always uses UTF8",
        ),
        "keepalives"
        | "keepalives_idle"
        | "keepalives_interval"
        | "keepalives_count"
        | "tcp_user_timeout" => {
            tracing::warn!(
                keyword,
                "connection option is ignored: walrelay does not configure TCP keepalives or \
                 user timeouts"
            );
            Ok(())
        }
        "replication" => unsupported(
            "walrelay sets replication=database itself for its replication connection; remove it",
        ),
        "hostaddr" => unsupported("put the IP address in host instead"),
        "sslcert" | "sslkey" | "sslpassword" => {
            unsupported("client certificate authentication is not supported; use a password")
        }
        "sslcrl" | "sslcrldir" => unsupported("certificate revocation lists are not supported"),
        "service" | "servicefile" => {
            unsupported("service files are not supported; give the settings directly")
        }
        "requirepeer" => unsupported("peer credential checks are not supported"),
        "krbsrvname" | "gsslib" | "gssdelegation" => {
            unsupported("GSSAPI/Kerberos authentication is not supported")
        }
        "ssl_min_protocol_version" | "ssl_max_protocol_version" => {
            unsupported("walrelay always uses TLS 1.2 or 1.3")
        }
        "require_auth" => unsupported(
            "remove it; walrelay supports SCRAM-SHA-256 (with channel_binding) and cleartext/MD5",
        ),
        _ => Err(ConfigError::UnknownKeyword {
            keyword: keyword.to_string(),
        }),
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// libpq keyword/value syntax: `key = value` pairs separated by whitespace.
pub(super) fn parse_keyword_value(s: &str, raw: &mut Raw) -> Result<(), ConfigError> {
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i >= b.len() {
            return Ok(());
        }
        let key_start = i;
        while i < b.len() && !is_space(b[i]) && b[i] != b'=' {
            i += 1;
        }
        let key = &s[key_start..i];
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        if i >= b.len() || b[i] != b'=' {
            return Err(ConfigError::Syntax {
                position: i,
                message: format!("missing \"=\" after \"{key}\""),
            });
        }
        if key.is_empty() {
            return Err(ConfigError::Syntax {
                position: i,
                message: "\"=\" without a keyword before it".into(),
            });
        }
        i += 1;
        while i < b.len() && is_space(b[i]) {
            i += 1;
        }
        // Collect bytes (escapes only drop ASCII backslashes/quotes, so the
        // result stays valid UTF-8).
        let mut value = Vec::new();
        if i < b.len() && b[i] == b'\'' {
            let quote_start = i;
            i += 1;
            loop {
                if i >= b.len() {
                    return Err(ConfigError::Syntax {
                        position: quote_start,
                        message: format!(
                            "unterminated quoted value for \"{key}\"; close it with a single \
                             quote (write \\' or '' for a quote inside the value)"
                        ),
                    });
                }
                match b[i] {
                    b'\\' if i + 1 < b.len() => {
                        value.push(b[i + 1]);
                        i += 2;
                    }
                    b'\\' => i += 1,
                    b'\'' if i + 1 < b.len() && b[i + 1] == b'\'' => {
                        value.push(b'\'');
                        i += 2;
                    }
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    c => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < b.len() && !is_space(b[i]) {
                if b[i] == b'\\' {
                    if i + 1 < b.len() {
                        value.push(b[i + 1]);
                    }
                    i += 2;
                } else {
                    value.push(b[i]);
                    i += 1;
                }
            }
        }
        let value = String::from_utf8(value).map_err(|_| ConfigError::Syntax {
            position: key_start,
            message: format!("value of \"{key}\" is not valid UTF-8"),
        })?;
        store(raw, key, value)?;
    }
}
