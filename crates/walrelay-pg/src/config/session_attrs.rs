//! `target_session_attrs`: which of the listed hosts walrelay may stay
//! connected to, and the decision for one server (pure, tested here).
//!
//! libpq tries the hosts in order and keeps the first connection whose
//! server has the asked-for attributes. walrelay reads a logical slot and
//! writes its own tables, which it can only do on a primary: a standby's
//! synchronized failover slot cannot be read before the standby is
//! promoted. So of libpq's six values walrelay accepts the three that end
//! on a primary (`any`, `read-write`, `primary`) and refuses `read-only`,
//! `standby` and `prefer-standby` when the settings are parsed. And a
//! standby reached with `any` is refused too, with the fix named (see
//! [`Verdict::Standby`]): with `any`, a multi-host URL would otherwise
//! land on the standby whenever the primary is down.

use std::fmt;
use std::str::FromStr;

use super::ConfigError;

/// libpq's `target_session_attrs`, the values walrelay accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TargetSessionAttrs {
    /// The first host that accepts the connection (libpq's default). A
    /// standby is then an error rather than a host to skip.
    #[default]
    Any,
    /// A server whose sessions are read-write by default: not in hot
    /// standby, and `default_transaction_read_only` off.
    ReadWrite,
    /// A server not in hot standby.
    Primary,
}

impl TargetSessionAttrs {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::Primary => "primary",
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(TargetSessionAttrs::Any),
            "read-write" => Ok(TargetSessionAttrs::ReadWrite),
            "primary" => Ok(TargetSessionAttrs::Primary),
            "read-only" | "standby" | "prefer-standby" => Err(ConfigError::UnsupportedValue {
                keyword: "target_session_attrs".into(),
                value: s.into(),
                reason: "walrelay reads its replication slot on the primary (a standby's \
                         synchronized slot cannot be read before a promotion); use \
                         target_session_attrs=read-write, or primary",
            }),
            _ => Err(ConfigError::InvalidValue {
                keyword: "target_session_attrs",
                source_desc: "connection string".into(),
                value: s.into(),
                expected: "one of any, read-write, primary",
            }),
        }
    }
}

/// What a server reported about itself: the `in_hot_standby` and
/// `default_transaction_read_only` parameters (sent at startup by
/// PostgreSQL 14 and later), or the answers of a query asking the same
/// (`None` until known).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerState {
    pub in_hot_standby: Option<bool>,
    pub default_read_only: Option<bool>,
}

impl ServerState {
    /// From the startup parameters (`on`/`off`).
    pub fn from_parameters(param: impl Fn(&str) -> Option<String>) -> Self {
        let flag = |name: &str| param(name).map(|v| v == "on");
        ServerState {
            in_hot_standby: flag("in_hot_standby"),
            default_read_only: flag("default_transaction_read_only"),
        }
    }
}

/// The decision for one server under one `target_session_attrs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Keep the connection.
    Accept,
    /// Ask the server (`ServerState` lacks what the decision needs: a
    /// server before PostgreSQL 14), then decide again.
    Query,
    /// A standby, reached with `any`: an error that names the fix.
    Standby,
    /// Not what was asked for (a standby, or read-only by default): close
    /// it and try the next host; the reason is for the error if no host
    /// fits.
    Skip(&'static str),
}

/// Whether walrelay keeps a connection to a server in `state`.
pub fn verdict(attrs: TargetSessionAttrs, state: ServerState) -> Verdict {
    let Some(standby) = state.in_hot_standby else {
        return Verdict::Query;
    };
    match (attrs, standby) {
        (TargetSessionAttrs::Any, true) => Verdict::Standby,
        (_, true) => Verdict::Skip("in hot standby (recovery)"),
        (TargetSessionAttrs::ReadWrite, false) => match state.default_read_only {
            None => Verdict::Query,
            Some(true) => Verdict::Skip("read-only by default (default_transaction_read_only)"),
            Some(false) => Verdict::Accept,
        },
        (TargetSessionAttrs::Any | TargetSessionAttrs::Primary, false) => Verdict::Accept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(standby: Option<bool>, read_only: Option<bool>) -> ServerState {
        ServerState {
            in_hot_standby: standby,
            default_read_only: read_only,
        }
    }

    #[test]
    fn libpq_values_parse_or_are_refused_with_the_fix() {
        for (s, v) in [
            ("any", TargetSessionAttrs::Any),
            ("read-write", TargetSessionAttrs::ReadWrite),
            ("primary", TargetSessionAttrs::Primary),
        ] {
            assert_eq!(s.parse::<TargetSessionAttrs>().unwrap(), v);
            assert_eq!(v.to_string(), s);
        }
        for s in ["read-only", "standby", "prefer-standby"] {
            let e = s.parse::<TargetSessionAttrs>().unwrap_err().to_string();
            assert!(e.contains(s) && e.contains("read-write"), "{e}");
        }
        let e = "readwrite".parse::<TargetSessionAttrs>().unwrap_err();
        assert!(e.to_string().contains("any, read-write, primary"), "{e}");
    }

    #[test]
    fn a_primary_is_kept_a_standby_skipped_or_refused() {
        use TargetSessionAttrs::*;
        let primary = state(Some(false), Some(false));
        let standby = state(Some(true), Some(true));
        for attrs in [Any, ReadWrite, Primary] {
            assert_eq!(verdict(attrs, primary), Verdict::Accept, "{attrs}");
        }
        assert_eq!(verdict(Any, standby), Verdict::Standby);
        assert!(matches!(verdict(ReadWrite, standby), Verdict::Skip(_)));
        assert!(matches!(verdict(Primary, standby), Verdict::Skip(_)));
    }

    #[test]
    fn read_write_skips_a_primary_read_only_by_default_as_libpq_does() {
        use TargetSessionAttrs::*;
        let read_only = state(Some(false), Some(true));
        assert!(
            matches!(verdict(ReadWrite, read_only), Verdict::Skip(r) if r.contains("read-only"))
        );
        assert_eq!(verdict(Primary, read_only), Verdict::Accept);
        assert_eq!(verdict(Any, read_only), Verdict::Accept);
    }

    #[test]
    fn what_a_server_before_14_does_not_report_is_asked() {
        use TargetSessionAttrs::*;
        for attrs in [Any, ReadWrite, Primary] {
            assert_eq!(verdict(attrs, state(None, None)), Verdict::Query);
        }
        assert_eq!(verdict(ReadWrite, state(Some(false), None)), Verdict::Query);
    }

    #[test]
    fn startup_parameters_are_read() {
        let s = ServerState::from_parameters(|n| match n {
            "in_hot_standby" => Some("on".into()),
            "default_transaction_read_only" => Some("off".into()),
            _ => None,
        });
        assert_eq!(s, state(Some(true), Some(false)));
        assert_eq!(ServerState::from_parameters(|_| None), state(None, None));
    }
}
