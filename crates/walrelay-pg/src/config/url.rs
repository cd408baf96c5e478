//! `postgresql://` URLs: parsing with strict percent-decoding, IPv6
//! literals and host lists, and [`Config::redacted_url`] for logs.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::keywords::{store, Raw};
use super::{ChannelBinding, Config, ConfigError, TargetSessionAttrs, DEFAULT_PORT};

impl Config {
    /// The settings as a `postgresql://` URL without the password, for logs.
    pub fn redacted_url(&self) -> String {
        let mut out = String::from("postgresql://");
        if !self.user.is_empty() {
            out.push_str(&encode(&self.user));
            out.push('@');
        }
        let host_ports = self.host_ports();
        let explicit_ports = !self.ports.is_empty();
        for (i, (host, port)) in host_ports.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            if host.contains(':') {
                out.push('[');
                out.push_str(host);
                out.push(']');
            } else {
                out.push_str(&encode(host));
            }
            if explicit_ports || *port != DEFAULT_PORT {
                out.push(':');
                out.push_str(&port.to_string());
            }
        }
        out.push('/');
        out.push_str(&encode(self.get_dbname()));
        let mut params = vec![
            ("sslmode", self.get_sslmode().as_str().to_string()),
            ("application_name", self.get_application_name().to_string()),
        ];
        if let Some(root) = &self.sslrootcert {
            params.push(("sslrootcert", root.to_string()));
        }
        if let Some(t) = self.connect_timeout {
            params.push(("connect_timeout", t.as_secs().to_string()));
        }
        if let Some(o) = &self.options {
            params.push(("options", o.clone()));
        }
        if self.channel_binding != ChannelBinding::Prefer {
            params.push(("channel_binding", self.channel_binding.to_string()));
        }
        if self.target_session_attrs != TargetSessionAttrs::Any {
            params.push((
                "target_session_attrs",
                self.target_session_attrs.to_string(),
            ));
        }
        for (i, (k, v)) in params.iter().enumerate() {
            out.push(if i == 0 { '?' } else { '&' });
            out.push_str(k);
            out.push('=');
            out.push_str(&encode(v));
        }
        out
    }
}

const URL_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(s: &str) -> String {
    utf8_percent_encode(s, URL_COMPONENT).to_string()
}

pub(super) fn strip_url_prefix(s: &str) -> Option<&str> {
    s.strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
}

/// Strict percent-decoding as libpq does it: `%` must be followed by two hex
/// digits, `%00` is refused, the result must be UTF-8.
fn percent_decode(s: &str, what: &str, show: bool) -> Result<String, ConfigError> {
    let shown = |s: &str| {
        if show {
            format!(" \"{s}\"")
        } else {
            String::new()
        }
    };
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| (c as char).to_digit(16);
            let byte = match (
                b.get(i + 1).and_then(|&c| hex(c)),
                b.get(i + 2).and_then(|&c| hex(c)),
            ) {
                (Some(h), Some(l)) => (h * 16 + l) as u8,
                _ => {
                    return Err(ConfigError::InvalidUrl {
                        message: format!(
                            "invalid percent-encoding in {what}{}: \"%\" must be followed by two \
                             hex digits (write %25 for a literal \"%\")",
                            shown(s)
                        ),
                    })
                }
            };
            if byte == 0 {
                return Err(ConfigError::InvalidUrl {
                    message: format!("forbidden %00 in {what}{}", shown(s)),
                });
            }
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ConfigError::InvalidUrl {
        message: format!("{what}{} does not decode to valid UTF-8", shown(s)),
    })
}

/// Parses what follows `postgresql://`.
pub(super) fn parse_url(rest: &str, raw: &mut Raw) -> Result<(), ConfigError> {
    let mut rest = rest;
    // [user[:password]@] -- like libpq, look for '@' before the first '/'.
    if let Some(at) = rest
        .find(['@', '/'])
        .filter(|&i| rest.as_bytes()[i] == b'@')
    {
        let userinfo = &rest[..at];
        rest = &rest[at + 1..];
        let (user, password) = match userinfo.find(':') {
            Some(c) => (&userinfo[..c], Some(&userinfo[c + 1..])),
            None => (userinfo, None),
        };
        raw.insert("user", percent_decode(user, "the user name", true)?);
        if let Some(p) = password {
            raw.insert("password", percent_decode(p, "the password", false)?);
        }
    }

    // host[:port][,host[:port]...]
    let mut hosts = Vec::new();
    let mut ports = Vec::new();
    if !rest.is_empty() && !rest.starts_with(['/', '?']) {
        loop {
            let host;
            if let Some(after) = rest.strip_prefix('[') {
                let close = after.find(']').ok_or_else(|| ConfigError::InvalidUrl {
                    message: "missing \"]\" after IPv6 address starting with \"[\"".into(),
                })?;
                host = percent_decode(&after[..close], "the host", true)?;
                if host.is_empty() {
                    return Err(ConfigError::InvalidUrl {
                        message: "empty IPv6 address in \"[]\"".into(),
                    });
                }
                rest = &after[close + 1..];
                if !rest.is_empty() && !rest.starts_with([':', '/', '?', ',']) {
                    return Err(ConfigError::InvalidUrl {
                        message: format!(
                            "unexpected character \"{}\" after IPv6 address [{host}]",
                            rest.chars().next().unwrap_or(' ')
                        ),
                    });
                }
            } else {
                let end = rest.find([':', '/', '?', ',']).unwrap_or(rest.len());
                host = percent_decode(&rest[..end], "the host", true)?;
                rest = &rest[end..];
            }
            let mut port = String::new();
            if let Some(after) = rest.strip_prefix(':') {
                let end = after.find(['/', '?', ',']).unwrap_or(after.len());
                port = percent_decode(&after[..end], "the port", true)?;
                rest = &after[end..];
            }
            hosts.push(host);
            ports.push(port);
            match rest.strip_prefix(',') {
                Some(after) => rest = after,
                None => break,
            }
        }
    }
    if hosts.iter().any(|h| !h.is_empty()) {
        raw.insert("host", hosts.join(","));
    }
    if ports.iter().any(|p| !p.is_empty()) {
        raw.insert("port", ports.join(","));
    }

    // [/dbname]
    if let Some(after) = rest.strip_prefix('/') {
        let end = after.find('?').unwrap_or(after.len());
        let db = percent_decode(&after[..end], "the database name", true)?;
        if !db.is_empty() {
            raw.insert("dbname", db);
        }
        rest = &after[end..];
    }

    // [?param=value&...]
    if let Some(query) = rest.strip_prefix('?') {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| ConfigError::InvalidUrl {
                    message: format!(
                        "query parameter \"{}\" has no \"=value\"",
                        pair.split_once('%').map_or(pair, |(k, _)| k)
                    ),
                })?;
            let key = percent_decode(k, "a query parameter name", true)?;
            let secret = key == "password";
            let value = percent_decode(v, &format!("the value of \"{key}\""), !secret)?;
            if key == "ssl" {
                // JDBC compatibility, as in libpq: ssl=true means sslmode=require.
                if value == "true" {
                    raw.insert("sslmode", "require".into());
                    continue;
                }
                return Err(ConfigError::UnsupportedValue {
                    keyword: key,
                    value,
                    reason: "only ssl=true is accepted (it means sslmode=require); use sslmode",
                });
            }
            store(raw, &key, value)?;
        }
    } else if !rest.is_empty() {
        return Err(ConfigError::InvalidUrl {
            message: format!(
                "unexpected character \"{}\" after the host list; expected \"/\" or \"?\"",
                rest.chars().next().unwrap_or(' ')
            ),
        });
    }
    Ok(())
}
