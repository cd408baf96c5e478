//! What cluster to make: authentication, TLS, settings ([`ClusterOptions`]).

use std::fmt;

use anyhow::bail;

use crate::bin::PgBin;
use crate::tls::TlsMaterial;

/// The password authentication method of host connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PasswordMethod {
    /// `scram-sha-256`
    ScramSha256,
    /// `md5`; the cluster also sets `password_encryption = md5` and stores the
    /// superuser password as an MD5 hash, so the server really asks for MD5.
    Md5,
    /// `password` (cleartext).
    Password,
}

impl PasswordMethod {
    /// The `pg_hba.conf` name of the method.
    pub fn as_str(self) -> &'static str {
        match self {
            PasswordMethod::ScramSha256 => "scram-sha-256",
            PasswordMethod::Md5 => "md5",
            PasswordMethod::Password => "password",
        }
    }
}

impl fmt::Display for PasswordMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PasswordMethod {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "scram-sha-256" => Ok(PasswordMethod::ScramSha256),
            "md5" => Ok(PasswordMethod::Md5),
            "password" => Ok(PasswordMethod::Password),
            other => bail!("unknown password method {other:?} (scram-sha-256, md5, password)"),
        }
    }
}

/// How clients authenticate over TCP. Unix-socket connections are always
/// `trust`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Auth {
    /// `trust` for everything.
    #[default]
    Trust,
    /// `host` lines use `method`; the superuser `postgres` gets
    /// `superuser_password` (through `initdb --pwfile`).
    Password {
        method: PasswordMethod,
        superuser_password: String,
    },
}

impl Auth {
    /// `Auth::Password` with `scram-sha-256`.
    pub fn scram(superuser_password: impl Into<String>) -> Auth {
        Auth::Password {
            method: PasswordMethod::ScramSha256,
            superuser_password: superuser_password.into(),
        }
    }

    /// `Auth::Password` with `md5`.
    pub fn md5(superuser_password: impl Into<String>) -> Auth {
        Auth::Password {
            method: PasswordMethod::Md5,
            superuser_password: superuser_password.into(),
        }
    }

    /// `Auth::Password` with cleartext `password`.
    pub fn cleartext(superuser_password: impl Into<String>) -> Auth {
        Auth::Password {
            method: PasswordMethod::Password,
            superuser_password: superuser_password.into(),
        }
    }

    pub(super) fn host_method(&self) -> &'static str {
        match self {
            Auth::Trust => "trust",
            Auth::Password { method, .. } => method.as_str(),
        }
    }

    pub(super) fn superuser_password(&self) -> Option<&str> {
        match self {
            Auth::Trust => None,
            Auth::Password {
                superuser_password, ..
            } => Some(superuser_password),
        }
    }
}

/// What cluster to make. `ClusterOptions::default()` is a logical-decoding
/// ready, trust-authenticated cluster without TLS and with `fsync = off`.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The binaries to use; `None` means [`PgBin::discover`].
    pub pg_bin: Option<PgBin>,
    /// `wal_level` (default `logical`).
    pub wal_level: String,
    /// Authentication of TCP connections (default [`Auth::Trust`]).
    pub auth: Auth,
    /// Lines placed at the top of `pg_hba.conf`, before the default lines.
    pub hba_prepend: Vec<String>,
    /// Settings appended to the configuration (later ones win; a name that
    /// is already set is replaced).
    pub extra_conf: Vec<(String, String)>,
    /// Server certificate and key; when set the server runs with `ssl = on`.
    pub tls: Option<TlsMaterial>,
    /// `fsync` (default `false`: fast, but a machine crash may lose data,
    /// which is fine for throwaway clusters; a `stop_immediate` does not).
    pub fsync: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            pg_bin: None,
            wal_level: "logical".to_string(),
            auth: Auth::Trust,
            hba_prepend: Vec::new(),
            extra_conf: Vec::new(),
            tls: None,
            fsync: false,
        }
    }
}

impl ClusterOptions {
    /// Sets [`ClusterOptions::auth`].
    pub fn auth(mut self, auth: Auth) -> Self {
        self.auth = auth;
        self
    }

    /// Sets [`ClusterOptions::tls`].
    pub fn tls(mut self, tls: TlsMaterial) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets [`ClusterOptions::wal_level`].
    pub fn wal_level(mut self, wal_level: impl Into<String>) -> Self {
        self.wal_level = wal_level.into();
        self
    }

    /// Adds one setting to [`ClusterOptions::extra_conf`].
    pub fn conf(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_conf.push((name.into(), value.into()));
        self
    }

    /// Adds one line to [`ClusterOptions::hba_prepend`].
    pub fn hba(mut self, line: impl Into<String>) -> Self {
        self.hba_prepend.push(line.into());
        self
    }

    /// Sets [`ClusterOptions::fsync`].
    pub fn fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }
}

/// Sets `name` (matched case-insensitively, as PostgreSQL does) in a
/// list of `postgresql.conf` settings, replacing an earlier value.
pub(super) fn upsert(settings: &mut Vec<(String, String)>, name: &str, value: &str) {
    match settings
        .iter_mut()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
    {
        Some(entry) => entry.1 = value.to_string(),
        None => settings.push((name.to_string(), value.to_string())),
    }
}
