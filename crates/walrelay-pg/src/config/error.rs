//! What can be wrong with connection settings. Messages never contain the
//! password.

use super::SslMode;

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
         sslmode, sslrootcert, connect_timeout, passfile, channel_binding, target_session_attrs)"
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
