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
//! `sslmode`, `sslrootcert`, `connect_timeout` (per host, as libpq applies
//! it), `passfile`, `channel_binding`, `target_session_attrs` (`any`,
//! `read-write`, `primary`; see [`TargetSessionAttrs`]) (and `ssl=true` in
//! URLs, meaning `sslmode=require`, as libpq does).
//!
//! Keywords that are accepted and ignored because they are harmless for
//! walrelay: `sslcompression` (any value; modern libpq ignores it too),
//! `gssencmode=disable|prefer`, `sslsni=1`, `sslnegotiation=postgres`,
//! `sslcertmode=disable|allow`, `load_balance_hosts=disable`, `client_encoding=UTF8`, `keepalives`,
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

mod env;
mod error;
mod keywords;
mod pgpass;
mod session_attrs;
#[cfg(test)]
mod tests;
mod url;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

pub use error::ConfigError;
pub use session_attrs::{verdict, ServerState, TargetSessionAttrs, Verdict};

/// Default PostgreSQL port.
pub const DEFAULT_PORT: u16 = 5432;
/// Host used when none is configured.
pub const DEFAULT_HOST: &str = "localhost";
/// `application_name` used when none is configured.
pub const DEFAULT_APPLICATION_NAME: &str = "walrelay";

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
    target_session_attrs: TargetSessionAttrs,
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
            target_session_attrs: TargetSessionAttrs::Any,
            passfile: None,
            default_sslrootcert: None,
        }
    }

    /// Parses a URL or keyword/value string, using the process environment for
    /// settings it does not give. Same as [`Config::from_env_and_str`].
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        Self::from_env_and_str(s)
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

    /// Sets `target_session_attrs`.
    pub fn target_session_attrs(mut self, attrs: TargetSessionAttrs) -> Self {
        self.target_session_attrs = attrs;
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

    /// The same settings for one host of the list only, with
    /// `target_session_attrs` `attrs`: to ask another member of a cluster
    /// something (e.g. its timeline) after connecting to the first
    /// suitable one.
    pub fn for_host(&self, host: &str, port: u16, attrs: TargetSessionAttrs) -> Config {
        Config {
            hosts: vec![host.to_owned()],
            ports: vec![port],
            target_session_attrs: attrs,
            ..self.clone()
        }
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

    /// Which server of the host list walrelay may stay connected to.
    pub fn get_target_session_attrs(&self) -> TargetSessionAttrs {
        self.target_session_attrs
    }

    /// The password file (`passfile`, `PGPASSFILE`, or `$HOME/.pgpass`).
    pub fn get_passfile(&self) -> Option<&Path> {
        self.passfile.as_deref()
    }
}
