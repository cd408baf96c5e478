//! From a connection string and the environment to a [`Config`]: settings
//! the string does not give come from the `PG*` variables ([`ENV_VARS`]),
//! and every value is checked, with errors naming where it came from.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::keywords::{parse_keyword_value, Raw};
use super::url::{parse_url, strip_url_prefix};
use super::{ChannelBinding, Config, ConfigError, Password, RootCert, DEFAULT_PORT};

/// Environment variables consulted, with the keyword each one supplies.
const ENV_VARS: &[(&str, &str)] = &[
    ("host", "PGHOST"),
    ("port", "PGPORT"),
    ("user", "PGUSER"),
    ("password", "PGPASSWORD"),
    ("dbname", "PGDATABASE"),
    ("application_name", "PGAPPNAME"),
    ("options", "PGOPTIONS"),
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("connect_timeout", "PGCONNECT_TIMEOUT"),
    ("passfile", "PGPASSFILE"),
    ("channel_binding", "PGCHANNELBINDING"),
    ("target_session_attrs", "PGTARGETSESSIONATTRS"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    String,
    Env(&'static str),
}

impl Origin {
    fn describe(self) -> String {
        match self {
            Origin::String => "connection string".into(),
            Origin::Env(var) => format!("environment variable {var}"),
        }
    }
}

impl Config {
    /// Parses a URL or keyword/value string; settings it does not give come
    /// from the process environment (`PGHOST`, `PGUSER`, ...; `HOME` for
    /// `~/.pgpass` and `~/.postgresql/root.crt`; `USER`/`LOGNAME` as the
    /// last resort for the user name).
    pub fn from_env_and_str(s: &str) -> Result<Self, ConfigError> {
        Self::parse_with_env(s, |name| std::env::var(name).ok())
    }

    /// Parses a URL or keyword/value string, looking environment variables
    /// up through `env` (so tests need not touch the process environment).
    pub fn parse_with_env<F>(s: &str, env: F) -> Result<Self, ConfigError>
    where
        F: Fn(&str) -> Option<String>,
    {
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let mut raw = Raw::new();
        if let Some(rest) = strip_url_prefix(s) {
            parse_url(rest, &mut raw)?;
        } else {
            parse_keyword_value(s, &mut raw)?;
        }
        raw.retain(|_, v| !v.is_empty());

        let mut values: HashMap<&'static str, (String, Origin)> = raw
            .into_iter()
            .map(|(k, v)| (k, (v, Origin::String)))
            .collect();
        for &(keyword, var) in ENV_VARS {
            if values.contains_key(keyword) {
                continue;
            }
            if let Some(v) = env(var) {
                values.insert(keyword, (v, Origin::Env(var)));
            }
        }

        let mut config = Config::new();
        let get = |k: &str| values.get(k).map(|(v, o)| (v.as_str(), *o));

        if let Some((v, _)) = get("host") {
            config.hosts = v.split(',').map(|h| h.to_string()).collect();
        }
        if let Some((v, origin)) = get("port") {
            config.ports = v
                .split(',')
                .map(|p| {
                    if p.is_empty() {
                        Ok(DEFAULT_PORT)
                    } else {
                        parse_port(p, origin)
                    }
                })
                .collect::<Result<_, _>>()?;
        }
        config.user = match get("user") {
            Some((v, _)) => v.to_string(),
            None => env("USER")
                .or_else(|| env("LOGNAME"))
                .ok_or(ConfigError::MissingUser)?,
        };
        config.password = get("password").map(|(v, _)| Password::new(v));
        config.dbname = get("dbname").map(|(v, _)| v.to_string());
        config.application_name = get("application_name")
            .or_else(|| get("fallback_application_name"))
            .map(|(v, _)| v.to_string());
        config.options = get("options").map(|(v, _)| v.to_string());
        if let Some((v, origin)) = get("sslmode") {
            config.sslmode = Some(v.parse().map_err(|e| with_origin(e, origin))?);
        }
        config.sslrootcert = get("sslrootcert").map(|(v, _)| {
            if v == "system" {
                RootCert::System
            } else {
                RootCert::File(PathBuf::from(v))
            }
        });
        if let Some((v, origin)) = get("connect_timeout") {
            config.connect_timeout = parse_connect_timeout(v, origin)?;
        }
        if let Some((v, origin)) = get("channel_binding") {
            config.channel_binding = match v {
                "disable" => ChannelBinding::Disable,
                "prefer" => ChannelBinding::Prefer,
                "require" => ChannelBinding::Require,
                _ => {
                    return Err(ConfigError::InvalidValue {
                        keyword: "channel_binding",
                        source_desc: origin.describe(),
                        value: v.into(),
                        expected: "one of disable, prefer, require",
                    })
                }
            };
        }
        if let Some((v, origin)) = get("target_session_attrs") {
            config.target_session_attrs = v.parse().map_err(|e| with_origin(e, origin))?;
        }
        let home = env("HOME").map(PathBuf::from);
        config.passfile = match get("passfile") {
            Some((v, _)) => Some(PathBuf::from(v)),
            None => home.as_ref().map(|h| h.join(".pgpass")),
        };
        config.default_sslrootcert = home.map(|h| h.join(".postgresql").join("root.crt"));
        config.validate()?;
        Ok(config)
    }
}

fn with_origin(err: ConfigError, origin: Origin) -> ConfigError {
    match err {
        ConfigError::InvalidValue {
            keyword,
            value,
            expected,
            ..
        } => ConfigError::InvalidValue {
            keyword,
            source_desc: origin.describe(),
            value,
            expected,
        },
        other => other,
    }
}

fn parse_port(p: &str, origin: Origin) -> Result<u16, ConfigError> {
    match p.trim().parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(ConfigError::InvalidValue {
            keyword: "port",
            source_desc: origin.describe(),
            value: p.into(),
            expected: "a port number between 1 and 65535 (or a comma-separated list, one per host)",
        }),
    }
}

/// libpq: integer seconds; zero or negative means no timeout; 1 is raised to 2.
fn parse_connect_timeout(v: &str, origin: Origin) -> Result<Option<Duration>, ConfigError> {
    match v.trim().parse::<i64>() {
        Ok(n) if n <= 0 => Ok(None),
        Ok(n) => Ok(Some(Duration::from_secs(n.max(2) as u64))),
        Err(_) => Err(ConfigError::InvalidValue {
            keyword: "connect_timeout",
            source_desc: origin.describe(),
            value: v.into(),
            expected: "a whole number of seconds (0 means wait indefinitely)",
        }),
    }
}
