//! libpq-compatible connection settings.
//!
//! [`Config::parse`] accepts both forms libpq accepts:
//!
//! * URLs: `postgresql://[user[:password]@][host[:port]][,...][/dbname][?param=value&...]`
//!   (also `postgres://`), with strict percent-decoding, IPv6 literals in
//!   brackets and several comma-separated hosts, each with an optional port.
//! * keyword/value strings: `host=db port=5432 password='it\'s secret'`.
//!   Values may be single-quoted; inside or outside quotes a backslash escapes
//!   the next character. As a small extension over libpq, a doubled single
//!   quote (`''`) inside a quoted value stands for one quote (libpq rejects
//!   such strings, so no string libpq accepts changes meaning).
//!
//! Settings missing from the string are taken from the usual `PG*`
//! environment variables ([`Config::from_env_and_str`]); explicit values in
//! the string always win. [`Config::parse_with_env`] takes the environment as
//! a closure so tests never touch the process environment.
//!
//! Keywords walrelay understands: `host`, `port`, `user`, `password`,
//! `dbname`, `application_name`, `fallback_application_name`, `options`,
//! `sslmode`, `sslrootcert`, `connect_timeout`, `passfile`,
//! `channel_binding` (and `ssl=true` in URLs, meaning `sslmode=require`, as
//! libpq does).
//!
//! Keywords that are accepted and ignored because they are harmless for
//! walrelay: `sslcompression` (any value; modern libpq ignores it too),
//! `gssencmode=disable|prefer`, `sslsni=1`, `sslnegotiation=postgres`,
//! `sslcertmode=disable|allow`, `target_session_attrs=any`,
//! `load_balance_hosts=disable`, `client_encoding=UTF8`, `keepalives`,
//! `keepalives_idle`, `keepalives_interval`, `keepalives_count` and
//! `tcp_user_timeout` (logged with a warning that they have no effect). Other
//! values of those keywords are rejected, since they ask for something
//! walrelay would not do.
//!
//! Every other libpq keyword (e.g. `replication`, `hostaddr`, `sslcert`,
//! `service`) and every unknown keyword is an error naming the keyword.
//!
//! Deviations from libpq, on purpose:
//! * when no host is given anywhere, walrelay connects to `localhost` over
//!   TCP (libpq uses a compiled-in Unix-socket directory);
//! * `sslmode=allow` is not supported (use `prefer` or `disable`);
//! * empty values are treated as "not set" everywhere, like libpq does for
//!   almost every keyword.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Default PostgreSQL port.
pub const DEFAULT_PORT: u16 = 5432;
/// Host used when none is configured.
pub const DEFAULT_HOST: &str = "localhost";
/// `application_name` used when none is configured.
pub const DEFAULT_APPLICATION_NAME: &str = "walrelay";

/// Errors from parsing or validating connection settings.
///
/// Messages never contain the password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A keyword walrelay does not know at all.
    #[error(
        "unknown connection option \"{keyword}\"; check the spelling (walrelay understands: host, \
         port, user, password, dbname, application_name, fallback_application_name, options, \
         sslmode, sslrootcert, connect_timeout, passfile, channel_binding)"
    )]
    UnknownKeyword {
        /// The keyword as written.
        keyword: String,
    },
    /// A libpq keyword walrelay deliberately does not support.
    #[error("connection option \"{keyword}\" is not supported by walrelay: {reason}")]
    UnsupportedKeyword {
        /// The keyword as written.
        keyword: String,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// A keyword that is only accepted with certain (harmless) values.
    #[error("{keyword}={value} is not supported by walrelay: {reason}")]
    UnsupportedValue {
        /// The keyword.
        keyword: String,
        /// The offending value.
        value: String,
        /// Why, and what to do instead.
        reason: &'static str,
    },
    /// A value that does not parse.
    #[error("invalid value \"{value}\" for {keyword} ({source_desc}): expected {expected}")]
    InvalidValue {
        /// The keyword the value belongs to.
        keyword: &'static str,
        /// Where the value came from: "connection string" or "environment variable PGPORT".
        source_desc: String,
        /// The offending value.
        value: String,
        /// What would have been accepted.
        expected: &'static str,
    },
    /// Malformed keyword/value string.
    #[error("invalid connection string at byte {position}: {message}")]
    Syntax {
        /// Byte offset in the input.
        position: usize,
        /// What is wrong.
        message: String,
    },
    /// Malformed `postgresql://` URL.
    #[error("invalid connection URL: {message}")]
    InvalidUrl {
        /// What is wrong (never contains the password).
        message: String,
    },
    /// `port` lists a number of ports that matches neither 1 nor the number of hosts.
    #[error(
        "{hosts} host(s) but {ports} port(s) given; give either one port for all hosts or one \
         port per host"
    )]
    PortCountMismatch {
        /// Number of hosts.
        hosts: usize,
        /// Number of ports.
        ports: usize,
    },
    /// No user name anywhere.
    #[error(
        "no user name given: set user in the connection string (user=NAME or \
         postgresql://NAME@host/...), or set PGUSER"
    )]
    MissingUser,
    /// `sslrootcert=system` with an sslmode weaker than verify-full (libpq rule).
    #[error(
        "sslmode={sslmode} may not be used with sslrootcert=system; use sslmode=verify-full (the \
         default with sslrootcert=system) or point sslrootcert at a CA file"
    )]
    WeakSslModeWithSystemRoots {
        /// The configured mode.
        sslmode: SslMode,
    },
}

/// libpq `sslmode`. `allow` is not supported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Use TLS if the server supports it, plaintext if it refuses; the certificate is not verified
    /// unless a root certificate is configured.
    #[default]
    Prefer,
    /// Require TLS; the certificate is not verified unless a root certificate is configured
    /// (then it behaves like `VerifyCa`).
    Require,
    /// Require TLS and a certificate chain that verifies against the root certificates.
    VerifyCa,
    /// Like `VerifyCa`, and the certificate must match the host name.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the server certificate must be verified against roots.
    pub fn verifies_certificate(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            "allow" => Err(ConfigError::UnsupportedValue {
                keyword: "sslmode".into(),
                value: s.into(),
                reason: "use sslmode=prefer (try TLS first) or sslmode=disable",
            }),
            _ => Err(ConfigError::InvalidValue {
                keyword: "sslmode",
                source_desc: "connection string".into(),
                value: s.into(),
                expected: "one of disable, prefer, require, verify-ca, verify-full",
            }),
        }
    }
}

/// libpq `channel_binding` (SCRAM channel binding policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ChannelBinding {
    /// Never use channel binding.
    Disable,
    /// Use channel binding when TLS and the server support it.
    #[default]
    Prefer,
    /// Fail unless channel binding is used.
    Require,
}

impl ChannelBinding {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        }
    }
}

impl fmt::Display for ChannelBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where trusted root certificates come from (`sslrootcert`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RootCert {
    /// A PEM file with one or more CA certificates.
    File(PathBuf),
    /// The operating system's trust store (`sslrootcert=system`).
    System,
}

impl fmt::Display for RootCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootCert::File(p) => write!(f, "{}", p.display()),
            RootCert::System => f.write_str("system"),
        }
    }
}

/// A password. `Debug` and `Display` print `********`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }

    /// The password text, for authentication only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The password bytes, for authentication only.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("********")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("********")
    }
}

impl From<&str> for Password {
    fn from(s: &str) -> Self {
        Password::new(s)
    }
}

impl From<String> for Password {
    fn from(s: String) -> Self {
        Password(s)
    }
}

/// Connection settings. `Debug` and `Display` never show the password;
/// `Display` is [`Config::redacted_url`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    hosts: Vec<String>,
    ports: Vec<u16>,
    user: String,
    password: Option<Password>,
    dbname: Option<String>,
    application_name: Option<String>,
    options: Option<String>,
    sslmode: Option<SslMode>,
    sslrootcert: Option<RootCert>,
    connect_timeout: Option<Duration>,
    channel_binding: ChannelBinding,
    passfile: Option<PathBuf>,
    default_sslrootcert: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted_url())
    }
}

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
];

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
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
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

/// Raw settings collected from the string: canonical keyword -> value.
type Raw = HashMap<&'static str, String>;

impl Config {
    /// Settings with every default and no environment lookups: no hosts
    /// (meaning `localhost`), port 5432, empty user (set one with
    /// [`Config::user`]), no password, no password file, sslmode=prefer.
    pub fn new() -> Self {
        Config {
            hosts: Vec::new(),
            ports: Vec::new(),
            user: String::new(),
            password: None,
            dbname: None,
            application_name: None,
            options: None,
            sslmode: None,
            sslrootcert: None,
            connect_timeout: None,
            channel_binding: ChannelBinding::Prefer,
            passfile: None,
            default_sslrootcert: None,
        }
    }

    /// Parses a URL or keyword/value string, using the process environment for
    /// settings it does not give. Same as [`Config::from_env_and_str`].
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        Self::from_env_and_str(s)
    }

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
        let home = env("HOME").map(PathBuf::from);
        config.passfile = match get("passfile") {
            Some((v, _)) => Some(PathBuf::from(v)),
            None => home.as_ref().map(|h| h.join(".pgpass")),
        };
        config.default_sslrootcert = home.map(|h| h.join(".postgresql").join("root.crt"));
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants the setters cannot: a user name, a port count
    /// matching the hosts, and sslrootcert=system only with verify-full.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.user.is_empty() {
            return Err(ConfigError::MissingUser);
        }
        let hosts = self.hosts.len().max(1);
        if self.ports.len() > 1 && self.ports.len() != hosts {
            return Err(ConfigError::PortCountMismatch {
                hosts,
                ports: self.ports.len(),
            });
        }
        if self.sslrootcert == Some(RootCert::System) && self.get_sslmode() != SslMode::VerifyFull {
            return Err(ConfigError::WeakSslModeWithSystemRoots {
                sslmode: self.get_sslmode(),
            });
        }
        Ok(())
    }

    // ----- builder-style setters -----

    /// Appends a host (name, IP address, or Unix-socket directory starting with `/`).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.hosts.push(host.into());
        self
    }

    /// Appends a port: one port applies to all hosts, otherwise one per host.
    pub fn port(mut self, port: u16) -> Self {
        self.ports.push(port);
        self
    }

    /// Sets the user name.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }

    /// Sets the password.
    pub fn password(mut self, password: impl Into<Password>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Sets the database name.
    pub fn dbname(mut self, dbname: impl Into<String>) -> Self {
        self.dbname = Some(dbname.into());
        self
    }

    /// Sets `application_name`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// Sets the `options` startup parameter (e.g. `-c statement_timeout=0`).
    pub fn options(mut self, options: impl Into<String>) -> Self {
        self.options = Some(options.into());
        self
    }

    /// Sets sslmode.
    pub fn sslmode(mut self, mode: SslMode) -> Self {
        self.sslmode = Some(mode);
        self
    }

    /// Sets sslrootcert.
    pub fn sslrootcert(mut self, root: RootCert) -> Self {
        self.sslrootcert = Some(root);
        self
    }

    /// Sets the connect timeout (per host, covering TCP connect and TLS negotiation).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets the channel binding policy.
    pub fn channel_binding(mut self, policy: ChannelBinding) -> Self {
        self.channel_binding = policy;
        self
    }

    /// Sets the password file.
    pub fn passfile(mut self, path: impl Into<PathBuf>) -> Self {
        self.passfile = Some(path.into());
        self
    }

    /// Sets the root certificate file used for verify-ca/verify-full when
    /// sslrootcert is not set (normally `~/.postgresql/root.crt`).
    pub fn default_sslrootcert(mut self, path: impl Into<PathBuf>) -> Self {
        self.default_sslrootcert = Some(path.into());
        self
    }

    // ----- getters -----

    /// Configured hosts (empty means [`DEFAULT_HOST`]). An empty entry also
    /// means [`DEFAULT_HOST`].
    pub fn get_hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Configured ports (empty means [`DEFAULT_PORT`]).
    pub fn get_ports(&self) -> &[u16] {
        &self.ports
    }

    /// The port of the first host.
    pub fn get_port(&self) -> u16 {
        self.ports.first().copied().unwrap_or(DEFAULT_PORT)
    }

    /// The hosts to try, in order, each with its port.
    pub fn host_ports(&self) -> Vec<(&str, u16)> {
        let port_for = |i: usize| match self.ports.len() {
            0 => DEFAULT_PORT,
            1 => self.ports[0],
            _ => self.ports.get(i).copied().unwrap_or(self.ports[0]),
        };
        if self.hosts.is_empty() {
            return vec![(DEFAULT_HOST, port_for(0))];
        }
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let h = if h.is_empty() {
                    DEFAULT_HOST
                } else {
                    h.as_str()
                };
                (h, port_for(i))
            })
            .collect()
    }

    /// The user name.
    pub fn get_user(&self) -> &str {
        &self.user
    }

    /// The password given explicitly (string or `PGPASSWORD`); see also
    /// [`Config::resolve_password`].
    pub fn get_password(&self) -> Option<&Password> {
        self.password.as_ref()
    }

    /// The database name (defaults to the user name).
    pub fn get_dbname(&self) -> &str {
        self.dbname.as_deref().unwrap_or(&self.user)
    }

    /// `application_name` (defaults to `walrelay`).
    pub fn get_application_name(&self) -> &str {
        self.application_name
            .as_deref()
            .unwrap_or(DEFAULT_APPLICATION_NAME)
    }

    /// The `options` startup parameter, if any.
    pub fn get_options(&self) -> Option<&str> {
        self.options.as_deref()
    }

    /// The effective sslmode: as configured; else verify-full with
    /// sslrootcert=system; else prefer.
    pub fn get_sslmode(&self) -> SslMode {
        self.sslmode.unwrap_or(match self.sslrootcert {
            Some(RootCert::System) => SslMode::VerifyFull,
            _ => SslMode::Prefer,
        })
    }

    /// The configured sslrootcert, if any.
    pub fn get_sslrootcert(&self) -> Option<&RootCert> {
        self.sslrootcert.as_ref()
    }

    /// Root certificate file to use when sslrootcert is not set
    /// (`$HOME/.postgresql/root.crt` when parsed with a `HOME`).
    pub fn get_default_sslrootcert(&self) -> Option<&Path> {
        self.default_sslrootcert.as_deref()
    }

    /// The connect timeout, if any.
    pub fn get_connect_timeout(&self) -> Option<Duration> {
        self.connect_timeout
    }

    /// The channel binding policy.
    pub fn get_channel_binding(&self) -> ChannelBinding {
        self.channel_binding
    }

    /// The password file (`passfile`, `PGPASSFILE`, or `$HOME/.pgpass`).
    pub fn get_passfile(&self) -> Option<&Path> {
        self.passfile.as_deref()
    }

    /// The password for the first host: the explicit one, else a matching
    /// line of the password file.
    pub fn resolve_password(&self) -> Option<Password> {
        let (host, port) = self.host_ports()[0];
        self.resolve_password_for(host, port)
    }

    /// The password for `host`/`port`: the explicit one, else the first
    /// matching line of the password file. The file is ignored (with a
    /// warning) when it is readable by group or others, like libpq does.
    pub fn resolve_password_for(&self, host: &str, port: u16) -> Option<Password> {
        if let Some(p) = &self.password {
            return Some(p.clone());
        }
        let path = self.passfile.as_deref()?;
        let contents = read_passfile(path)?;
        lookup_passfile(&contents, host, port, self.get_dbname(), &self.user)
    }

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

fn strip_url_prefix(s: &str) -> Option<&str> {
    s.strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
}

/// Stores one keyword/value pair after classifying the keyword.
fn store(raw: &mut Raw, keyword: &str, value: String) -> Result<(), ConfigError> {
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
        "target_session_attrs" => ignore_if(
            &["any"],
            "walrelay connects to the first host that accepts the connection",
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
fn parse_keyword_value(s: &str, raw: &mut Raw) -> Result<(), ConfigError> {
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
fn parse_url(rest: &str, raw: &mut Raw) -> Result<(), ConfigError> {
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

fn read_passfile(path: &Path) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(_) => return None,
    };
    if !meta.is_file() {
        tracing::warn!(
            path = %path.display(),
            "password file is not a plain file; ignoring it"
        );
        return None;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "password file has group or world access; permissions should be u=rw (0600) or \
                 less; ignoring it"
            );
            return None;
        }
    }
    match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read password file; ignoring it");
            None
        }
    }
}

/// Splits a `.pgpass` line into fields, undoing `\:` and `\\`. Returns each
/// field with a flag telling whether it was exactly an unescaped `*`.
fn split_pgpass_line(line: &str) -> Vec<(String, bool)> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut escaped_any = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                escaped_any = true;
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            ':' if fields.len() < 4 => {
                let wild = cur == "*" && !escaped_any;
                fields.push((std::mem::take(&mut cur), wild));
                escaped_any = false;
            }
            c => cur.push(c),
        }
    }
    let wild = cur == "*" && !escaped_any;
    fields.push((cur, wild));
    fields
}

fn lookup_passfile(
    contents: &str,
    host: &str,
    port: u16,
    db: &str,
    user: &str,
) -> Option<Password> {
    let port = port.to_string();
    for line in contents.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = split_pgpass_line(line);
        if fields.len() != 5 {
            continue;
        }
        let matches = |(f, wild): &(String, bool), want: &str| *wild || f == want;
        let host_ok =
            matches(&fields[0], host) || (host.starts_with('/') && fields[0].0 == "localhost");
        if host_ok
            && matches(&fields[1], &port)
            && matches(&fields[2], db)
            && matches(&fields[3], user)
        {
            return Some(Password::new(fields[4].0.clone()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse_with_env(s, env_of(&[("USER", "osuser")]))
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
        assert_eq!(c.get_user(), "osuser");
        assert_eq!(c.get_dbname(), "osuser");
        assert_eq!(c.get_application_name(), "walrelay");
        assert_eq!(c.get_sslmode(), SslMode::Prefer);
        assert_eq!(c.get_password(), None);
        assert_eq!(c.get_connect_timeout(), None);
        assert_eq!(c.get_channel_binding(), ChannelBinding::Prefer);
        assert_eq!(c.get_passfile(), None);
    }

    #[test]
    fn user_fallbacks() {
        let c = Config::parse_with_env("", env_of(&[("LOGNAME", "ln")])).unwrap();
        assert_eq!(c.get_user(), "ln");
        let c = Config::parse_with_env("", env_of(&[("PGUSER", "pg"), ("USER", "u")])).unwrap();
        assert_eq!(c.get_user(), "pg");
        let e = Config::parse_with_env("host=x", env_of(&[])).unwrap_err();
        assert!(matches!(e, ConfigError::MissingUser), "{e}");
        assert!(e.to_string().contains("PGUSER"));
    }

    #[test]
    fn keyword_value_basic() {
        let c = parse(
            "host=db.example.com port=6543 user=alice password=s3cret dbname=shop \
             application_name=relay sslmode=verify-full sslrootcert=/etc/ca.pem \
             connect_timeout=10 options='-c statement_timeout=0' channel_binding=require",
        )
        .unwrap();
        assert_eq!(c.host_ports(), vec![("db.example.com", 6543)]);
        assert_eq!(c.get_user(), "alice");
        assert_eq!(c.get_password().unwrap().expose(), "s3cret");
        assert_eq!(c.get_dbname(), "shop");
        assert_eq!(c.get_application_name(), "relay");
        assert_eq!(c.get_sslmode(), SslMode::VerifyFull);
        assert_eq!(
            c.get_sslrootcert(),
            Some(&RootCert::File("/etc/ca.pem".into()))
        );
        assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(10)));
        assert_eq!(c.get_options(), Some("-c statement_timeout=0"));
        assert_eq!(c.get_channel_binding(), ChannelBinding::Require);
    }

    #[test]
    fn keyword_value_quoting() {
        // Doubled quote and backslash escapes inside quotes.
        let c = parse(r"password='it''s \\ x' user = bob").unwrap();
        assert_eq!(c.get_password().unwrap().expose(), r"it's \ x");
        assert_eq!(c.get_user(), "bob");
        // Backslash-escaped quote inside quotes, spaces preserved.
        let c = parse(r"password='a \'b\' c'").unwrap();
        assert_eq!(c.get_password().unwrap().expose(), "a 'b' c");
        // Unquoted value with escapes.
        let c = parse(r"password=a\ b\\c\'d").unwrap();
        assert_eq!(c.get_password().unwrap().expose(), r"a b\c'd");
        // Empty quoted value means unset.
        let c = parse("password='' user=u").unwrap();
        assert_eq!(c.get_password(), None);
        // Whitespace around '=' and tabs/newlines between pairs.
        let c = parse("  host =\tdb\n\nport= 1  ").unwrap();
        assert_eq!(c.host_ports(), vec![("db", 1)]);
        // Quote directly followed by the next pair, as libpq allows.
        let c = parse("user='u'dbname=d").unwrap();
        assert_eq!((c.get_user(), c.get_dbname()), ("u", "d"));
        // Non-ASCII is kept.
        let c = parse("password='pä ß'").unwrap();
        assert_eq!(c.get_password().unwrap().expose(), "pä ß");
        // Last duplicate wins.
        let c = parse("user=a user=b").unwrap();
        assert_eq!(c.get_user(), "b");
    }

    #[test]
    fn keyword_value_syntax_errors() {
        let e = parse("host").unwrap_err();
        assert!(
            e.to_string().contains("missing \"=\" after \"host\""),
            "{e}"
        );
        let e = parse("=x").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
        let e = parse("password='unterminated").unwrap_err();
        assert!(e.to_string().contains("unterminated"), "{e}");
        assert!(!e.to_string().contains("unterminated'"), "{e}");
        let e = parse("host x=1").unwrap_err();
        assert!(e.to_string().contains("missing \"=\""), "{e}");
    }

    #[test]
    fn unknown_and_unsupported_keywords() {
        let e = parse("hots=x").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownKeyword { ref keyword } if keyword == "hots"));
        assert!(e.to_string().contains("\"hots\""), "{e}");
        let e = parse("replication=database").unwrap_err();
        assert!(e.to_string().contains("walrelay sets replication"), "{e}");
        let e = parse("postgresql://h/db?replication=database").unwrap_err();
        assert!(e.to_string().contains("replication"), "{e}");
        let e = parse("sslcert=/x").unwrap_err();
        assert!(matches!(e, ConfigError::UnsupportedKeyword { .. }), "{e}");
        let e = parse("gssencmode=require").unwrap_err();
        assert!(e.to_string().contains("gssencmode=require"), "{e}");
        let e = parse("sslmode=allow").unwrap_err();
        assert!(e.to_string().contains("prefer"), "{e}");
        // Harmless ones are accepted.
        parse(
            "sslcompression=1 gssencmode=disable sslsni=1 keepalives=1 keepalives_idle=30 \
             target_session_attrs=any client_encoding=UTF8",
        )
        .unwrap();
    }

    #[test]
    fn invalid_values_are_actionable() {
        let e = parse("port=abc").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"abc\"") && msg.contains("port") && msg.contains("65535"),
            "{msg}"
        );
        let e = parse("port=0").unwrap_err();
        assert!(matches!(
            e,
            ConfigError::InvalidValue {
                keyword: "port",
                ..
            }
        ));
        let e = parse("sslmode=strict").unwrap_err();
        assert!(e.to_string().contains("verify-full"), "{e}");
        let e = parse("connect_timeout=soon").unwrap_err();
        assert!(e.to_string().contains("connect_timeout"), "{e}");
        let e = Config::parse_with_env("", env_of(&[("USER", "u"), ("PGSSLMODE", "nope")]))
            .unwrap_err();
        assert!(
            e.to_string().contains("environment variable PGSSLMODE"),
            "{e}"
        );
        let e = Config::parse_with_env("", env_of(&[("USER", "u"), ("PGPORT", "x")])).unwrap_err();
        assert!(e.to_string().contains("environment variable PGPORT"), "{e}");
    }

    #[test]
    fn connect_timeout_rules() {
        let t = |s: &str| {
            parse(&format!("connect_timeout={s}"))
                .unwrap()
                .get_connect_timeout()
        };
        assert_eq!(t("0"), None);
        assert_eq!(t("-5"), None);
        assert_eq!(t("1"), Some(Duration::from_secs(2)));
        assert_eq!(t("30"), Some(Duration::from_secs(30)));
    }

    #[test]
    fn url_full() {
        let c = parse(
            "postgresql://al%40ice:p%40ss%3Aw%2Fd@db.example.com:6543/my%20db?sslmode=require&\
             application_name=my%20app&options=-c%20synchronous_commit%3Doff&connect_timeout=5",
        )
        .unwrap();
        assert_eq!(c.get_user(), "al@ice");
        assert_eq!(c.get_password().unwrap().expose(), "p@ss:w/d");
        assert_eq!(c.host_ports(), vec![("db.example.com", 6543)]);
        assert_eq!(c.get_dbname(), "my db");
        assert_eq!(c.get_sslmode(), SslMode::Require);
        assert_eq!(c.get_application_name(), "my app");
        assert_eq!(c.get_options(), Some("-c synchronous_commit=off"));
        assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn url_forms() {
        let c = parse("postgres://h").unwrap();
        assert_eq!(c.host_ports(), vec![("h", 5432)]);
        assert_eq!(c.get_user(), "osuser");
        let c = parse("postgresql://").unwrap();
        assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
        let c = parse("postgresql:///db?host=/var/run/postgresql&port=5433").unwrap();
        assert_eq!(c.host_ports(), vec![("/var/run/postgresql", 5433)]);
        assert_eq!(c.get_dbname(), "db");
        let c = parse("postgresql://%2Ftmp%2Fsock/db").unwrap();
        assert_eq!(c.host_ports(), vec![("/tmp/sock", 5432)]);
        let c = parse("postgresql://[::1]:5433/db").unwrap();
        assert_eq!(c.host_ports(), vec![("::1", 5433)]);
        let c = parse("postgresql://[2001:db8::7]/db").unwrap();
        assert_eq!(c.host_ports(), vec![("2001:db8::7", 5432)]);
        let c = parse("postgresql://u@h1:1,[::1]:2,h3/db").unwrap();
        assert_eq!(c.host_ports(), vec![("h1", 1), ("::1", 2), ("h3", 5432)]);
        let c = parse("postgresql://h1,h2:7/db").unwrap();
        assert_eq!(c.host_ports(), vec![("h1", 5432), ("h2", 7)]);
        let c = parse("postgresql://:5433").unwrap();
        assert_eq!(c.host_ports(), vec![("localhost", 5433)]);
        let c = parse("postgresql://u:@h").unwrap();
        assert_eq!(c.get_password(), None);
        let c = parse("postgresql://h?ssl=true").unwrap();
        assert_eq!(c.get_sslmode(), SslMode::Require);
        let c = parse("postgresql://h/?application_name=a&&").unwrap();
        assert_eq!(c.get_application_name(), "a");
        // '+' is not a space in libpq URLs.
        let c = parse("postgresql://h/a+b").unwrap();
        assert_eq!(c.get_dbname(), "a+b");
        // Query parameters override the hierarchical part.
        let c = parse("postgresql://u@h/db?user=v&dbname=other").unwrap();
        assert_eq!((c.get_user(), c.get_dbname()), ("v", "other"));
    }

    #[test]
    fn url_errors() {
        let e = parse("postgresql://h/db?sslmode").unwrap_err();
        assert!(e.to_string().contains("sslmode"), "{e}");
        let e = parse("postgresql://[::1/db").unwrap_err();
        assert!(e.to_string().contains("]"), "{e}");
        let e = parse("postgresql://h/d%zzb").unwrap_err();
        assert!(e.to_string().contains("percent"), "{e}");
        let e = parse("postgresql://h/d%00").unwrap_err();
        assert!(e.to_string().contains("%00"), "{e}");
        let e = parse("postgresql://h/d%ff").unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
        let e = parse("postgresql://h:notaport/db").unwrap_err();
        assert!(e.to_string().contains("notaport"), "{e}");
        let e = parse("postgresql://h/db?bogus=1").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownKeyword { .. }), "{e}");
        let e = parse("postgresql://[::1]x/db").unwrap_err();
        assert!(matches!(e, ConfigError::InvalidUrl { .. }), "{e}");
        // Bad percent-encoding in the password does not echo it.
        let e = parse("postgresql://u:hunter%2@h").unwrap_err();
        assert!(!e.to_string().contains("hunter"), "{e}");
        let e = parse("postgresql://h/db?password=hunter%zz").unwrap_err();
        assert!(!e.to_string().contains("hunter"), "{e}");
    }

    #[test]
    fn multiple_hosts_keyword_form() {
        let c = parse("host=a,b,c port=5").unwrap();
        assert_eq!(c.host_ports(), vec![("a", 5), ("b", 5), ("c", 5)]);
        let c = parse("host=a,b port=5,6").unwrap();
        assert_eq!(c.host_ports(), vec![("a", 5), ("b", 6)]);
        let e = parse("host=a,b,c port=5,6").unwrap_err();
        assert!(
            matches!(e, ConfigError::PortCountMismatch { hosts: 3, ports: 2 }),
            "{e}"
        );
    }

    #[test]
    fn env_fills_gaps_and_string_wins() {
        let env = env_of(&[
            ("PGHOST", "envhost"),
            ("PGPORT", "7000"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpass"),
            ("PGDATABASE", "envdb"),
            ("PGAPPNAME", "envapp"),
            ("PGSSLMODE", "require"),
            ("PGSSLROOTCERT", "/env/ca.pem"),
            ("PGCONNECT_TIMEOUT", "9"),
            ("PGPASSFILE", "/env/pgpass"),
            ("HOME", "/home/x"),
        ]);
        let c = Config::parse_with_env("", &env).unwrap();
        assert_eq!(c.host_ports(), vec![("envhost", 7000)]);
        assert_eq!(c.get_user(), "envuser");
        assert_eq!(c.get_password().unwrap().expose(), "envpass");
        assert_eq!(c.get_dbname(), "envdb");
        assert_eq!(c.get_application_name(), "envapp");
        assert_eq!(c.get_sslmode(), SslMode::Require);
        assert_eq!(
            c.get_sslrootcert(),
            Some(&RootCert::File("/env/ca.pem".into()))
        );
        assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(9)));
        assert_eq!(c.get_passfile(), Some(Path::new("/env/pgpass")));
        assert_eq!(
            c.get_default_sslrootcert(),
            Some(Path::new("/home/x/.postgresql/root.crt"))
        );

        let c = Config::parse_with_env(
            "postgresql://u:p@h:1/d?sslmode=disable&application_name=s",
            &env,
        )
        .unwrap();
        assert_eq!(c.host_ports(), vec![("h", 1)]);
        assert_eq!(c.get_user(), "u");
        assert_eq!(c.get_password().unwrap().expose(), "p");
        assert_eq!(c.get_dbname(), "d");
        assert_eq!(c.get_sslmode(), SslMode::Disable);
        assert_eq!(c.get_application_name(), "s");

        // Empty env values count as unset; HOME gives the default passfile.
        let c = Config::parse_with_env("user=u", env_of(&[("PGHOST", ""), ("HOME", "/home/y")]))
            .unwrap();
        assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
        assert_eq!(c.get_passfile(), Some(Path::new("/home/y/.pgpass")));
    }

    #[test]
    fn fallback_application_name() {
        let c = parse("fallback_application_name=fb").unwrap();
        assert_eq!(c.get_application_name(), "fb");
        let c = parse("fallback_application_name=fb application_name=app").unwrap();
        assert_eq!(c.get_application_name(), "app");
    }

    #[test]
    fn sslrootcert_system_rules() {
        let c = parse("sslrootcert=system").unwrap();
        assert_eq!(c.get_sslrootcert(), Some(&RootCert::System));
        assert_eq!(c.get_sslmode(), SslMode::VerifyFull);
        for weak in ["disable", "prefer", "require", "verify-ca"] {
            let e = parse(&format!("sslrootcert=system sslmode={weak}")).unwrap_err();
            assert!(
                matches!(e, ConfigError::WeakSslModeWithSystemRoots { .. }),
                "{weak}: {e}"
            );
        }
        parse("sslrootcert=system sslmode=verify-full").unwrap();
    }

    #[test]
    fn password_never_in_debug_or_display() {
        let secret = "Sup3r-Secret-Pw";
        for s in [
            format!("postgresql://alice:{secret}@db/x?sslmode=require"),
            format!("host=db user=alice password={secret}"),
            format!("host=db user=alice password='{secret}'"),
        ] {
            let c = parse(&s).unwrap();
            assert_eq!(c.get_password().unwrap().expose(), secret);
            let dbg = format!("{c:?}");
            assert!(!dbg.contains(secret), "{dbg}");
            assert!(dbg.contains("********"), "{dbg}");
            let pretty = format!("{c:#?}");
            assert!(!pretty.contains(secret));
            assert!(!c.to_string().contains(secret));
            assert!(!c.redacted_url().contains(secret));
        }
        let p = Password::new(secret);
        assert_eq!(format!("{p:?}"), "********");
        assert_eq!(format!("{p}"), "********");
    }

    #[test]
    fn redacted_url_round_trips() {
        let c = parse(
            "postgresql://al%40ice:pw@h1:1,[::1]:2/my%20db?sslmode=verify-ca&\
             sslrootcert=/ca.pem&application_name=x&connect_timeout=4",
        )
        .unwrap();
        let url = c.redacted_url();
        assert_eq!(
            url,
            "postgresql://al%40ice@h1:1,[::1]:2/my%20db?sslmode=verify-ca&application_name=x&\
             sslrootcert=%2Fca.pem&connect_timeout=4"
        );
        let back = parse(&url).unwrap();
        assert_eq!(back.host_ports(), c.host_ports());
        assert_eq!(back.get_user(), c.get_user());
        assert_eq!(back.get_dbname(), c.get_dbname());
        assert_eq!(back.get_sslmode(), c.get_sslmode());
        assert_eq!(back.get_sslrootcert(), c.get_sslrootcert());
        assert_eq!(back.get_password(), None);

        let c = parse("host=/var/run/postgresql user=u").unwrap();
        assert_eq!(
            c.redacted_url(),
            "postgresql://u@%2Fvar%2Frun%2Fpostgresql/u?sslmode=prefer&application_name=walrelay"
        );
    }

    #[test]
    fn builder() {
        let c = Config::new()
            .host("h")
            .port(5433)
            .user("u")
            .password("pw")
            .dbname("d")
            .application_name("a")
            .options("-c x=y")
            .sslmode(SslMode::VerifyCa)
            .sslrootcert(RootCert::File("/ca".into()))
            .connect_timeout(Duration::from_secs(3))
            .channel_binding(ChannelBinding::Disable);
        c.validate().unwrap();
        assert_eq!(c.host_ports(), vec![("h", 5433)]);
        assert_eq!(c.get_port(), 5433);
        assert_eq!(c.get_password().unwrap().expose(), "pw");
        assert_eq!(c.get_dbname(), "d");
        assert_eq!(c.get_options(), Some("-c x=y"));
        assert_eq!(c.get_sslmode(), SslMode::VerifyCa);
        assert!(Config::new().validate().is_err());
    }

    #[test]
    fn pgpass_parsing() {
        let file = "\
# comment
other:5432:*:*:nope
db.example.com:5432:shop:alice:first
*:*:*:alice:wild\\:card\\\\pw
host\\:colon:*:*:bob:escaped
localhost:*:*:carol:sock
";
        let l = |h: &str, p: u16, d: &str, u: &str| {
            lookup_passfile(file, h, p, d, u).map(|p| p.expose().to_string())
        };
        assert_eq!(
            l("db.example.com", 5432, "shop", "alice").as_deref(),
            Some("first")
        );
        assert_eq!(
            l("db.example.com", 5433, "shop", "alice").as_deref(),
            Some("wild:card\\pw")
        );
        assert_eq!(l("host:colon", 1, "x", "bob").as_deref(), Some("escaped"));
        assert_eq!(l("host", 1, "x", "bob"), None);
        assert_eq!(
            l("/var/run/postgresql", 5432, "x", "carol").as_deref(),
            Some("sock")
        );
        assert_eq!(l("elsewhere", 5432, "x", "dave"), None);
        // A literal, escaped star is not a wildcard.
        assert_eq!(lookup_passfile("\\*:*:*:*:pw\n", "h", 1, "d", "u"), None);
        // Too few fields never match; CRLF endings are fine.
        assert_eq!(lookup_passfile("h:1:d:u\n", "h", 1, "d", "u"), None);
        assert_eq!(
            lookup_passfile("h:1:d:u:pw\r\n", "h", 1, "d", "u").map(|p| p.expose().to_string()),
            Some("pw".into())
        );
    }

    #[cfg(unix)]
    #[test]
    fn pgpass_file_and_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, "h:5432:d:u:from-file\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = Config::new()
            .host("h")
            .user("u")
            .dbname("d")
            .passfile(&path);
        assert_eq!(c.resolve_password().unwrap().expose(), "from-file");
        assert_eq!(c.resolve_password_for("other", 5432), None);
        // An explicit password wins.
        let c2 = c.clone().password("explicit");
        assert_eq!(c2.resolve_password().unwrap().expose(), "explicit");
        // Group/world readable: ignored.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(c.resolve_password(), None);
        // Missing file: None.
        let c3 = Config::new()
            .host("h")
            .user("u")
            .passfile(dir.path().join("missing"));
        assert_eq!(c3.resolve_password(), None);
        // Via PGPASSFILE.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c4 = Config::parse_with_env(
            "host=h user=u dbname=d",
            env_of(&[("PGPASSFILE", path.to_str().unwrap())]),
        )
        .unwrap();
        assert_eq!(c4.resolve_password().unwrap().expose(), "from-file");
    }
}
