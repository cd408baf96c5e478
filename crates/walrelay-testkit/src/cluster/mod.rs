//! Throwaway PostgreSQL clusters: `initdb` into a fresh temporary directory,
//! start on a free port, stop and remove on drop.
//!
//! [`PgCluster`] is one type; its methods live by concern: `config` writes
//! the cluster (initdb, `walrelay.conf`, `pg_hba.conf`), `process` runs the
//! server (`pg_ctl` start/stop/reload, ports, the log) and `connect` talks to
//! it (connection strings, clients, blocking SQL), `backup` copies it (base
//! backups, restores, standbys). This file holds the type,
//! its creation, its accessors and its cleanup.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use anyhow::Context;

use crate::bin::PgBin;
use crate::user::ServerUser;

mod backup;
mod config;
mod connect;
mod options;
mod process;

pub use options::{Auth, ClusterOptions, PasswordMethod};

/// Set to `1` to keep a cluster's directory (data, configuration, log)
/// after its [`PgCluster`] is dropped; the path is printed to stderr.
pub const KEEP_CLUSTER_ENV: &str = "WALRELAY_KEEP_CLUSTER";

/// The bootstrap superuser of every cluster.
pub const SUPERUSER: &str = "postgres";

/// The address every cluster listens on.
pub const HOST: &str = "127.0.0.1";

/// Mutable part of a cluster: its settings and whether it runs.
#[derive(Debug)]
struct State {
    settings: Vec<(String, String)>,
    hba_prepend: Vec<String>,
    running: bool,
}

/// A running throwaway PostgreSQL cluster.
///
/// Layout of its directory (`walrelay-pg-XXXXXX` under the system temp
/// dir): `data/` (the data directory, 0700), `log` (server log), and the Unix
/// socket. All configuration made here lives in `data/walrelay.conf`,
/// included at the end of `postgresql.conf`.
///
/// Dropping it stops the server with `pg_ctl stop -m immediate` and removes
/// the directory (unless `WALRELAY_KEEP_CLUSTER=1`).
///
/// All methods that run `pg_ctl` block; call them from async code only
/// where blocking for a second or two is acceptable (tests).
pub struct PgCluster {
    bin: PgBin,
    user: ServerUser,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    auth: Auth,
    state: Mutex<State>,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("version", &self.bin.version())
            .finish_non_exhaustive()
    }
}

impl PgCluster {
    /// Creates, configures and starts a new cluster (blocking). Errors carry
    /// the tail of the server log.
    pub fn start(opts: ClusterOptions) -> anyhow::Result<PgCluster> {
        let bin = match opts.pg_bin.clone() {
            Some(bin) => bin,
            None => PgBin::discover()?,
        };
        let user = ServerUser::detect()?;
        let dir = tempfile::Builder::new()
            .prefix("walrelay-pg-")
            .tempdir()
            .context("creating the cluster directory")?
            .keep();
        // From here on, `Drop` of `cluster` cleans up after failures.
        let cluster = PgCluster {
            data: dir.join("data"),
            log: dir.join("log"),
            dir,
            bin,
            user,
            port: 0,
            auth: opts.auth.clone(),
            state: Mutex::new(State {
                settings: Vec::new(),
                hba_prepend: opts.hba_prepend.clone(),
                running: false,
            }),
        };
        cluster.init(&opts)?;
        cluster.start_fresh()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The TCP port the server listens on (fixed for the cluster's life).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TCP host: `"127.0.0.1"`.
    pub fn host(&self) -> &'static str {
        HOST
    }

    /// The cluster directory (holds `data/`, `log` and the socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The Unix socket directory (the cluster directory).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The output of `postgres --version`.
    pub fn version(&self) -> &str {
        self.bin.version()
    }

    /// The server's major version, e.g. 15.
    pub fn major_version(&self) -> u32 {
        self.bin.major()
    }

    /// The binaries this cluster runs.
    pub fn pg_bin(&self) -> &PgBin {
        &self.bin
    }

    /// The authentication setup the cluster was made with.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// The superuser's password, if the cluster uses password auth.
    pub fn superuser_password(&self) -> Option<&str> {
        self.auth.superuser_password()
    }

    /// Whether the server was started and not stopped since (as far as
    /// this handle knows).
    pub fn is_running(&self) -> bool {
        self.state().running
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            if let Err(e) = self.pg_ctl_stop("immediate") {
                tracing::debug!("stopping the test cluster on drop: {e:#}");
            }
        }
        let keep = std::env::var(KEEP_CLUSTER_ENV)
            .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
            .unwrap_or(false);
        if keep {
            eprintln!(
                "walrelay-testkit: keeping the PostgreSQL test cluster directory {} \
                 (port {}; {KEEP_CLUSTER_ENV} is set)",
                self.dir.display(),
                self.port
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::config::{quote_conf, quote_literal};
    use super::connect::{percent_encode, quote_conninfo};
    use super::options::upsert;
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_conf("it's"), "'it''s'");
        assert_eq!(quote_conf(r"a\b"), r"'a\\b'");
        assert_eq!(quote_conninfo("plain"), "plain");
        assert_eq!(quote_conninfo("a b"), "'a b'");
        assert_eq!(quote_conninfo(""), "''");
        assert_eq!(quote_conninfo("o'k"), r"'o\'k'");
        assert_eq!(percent_encode("us er@x"), "us%20er%40x");
        assert_eq!(quote_literal("p'w"), "'p''w'");
    }

    #[test]
    fn upsert_replaces_case_insensitively() {
        let mut s = vec![("wal_level".to_string(), "logical".to_string())];
        upsert(&mut s, "WAL_LEVEL", "replica");
        upsert(&mut s, "port", "5");
        assert_eq!(
            s,
            vec![
                ("wal_level".to_string(), "replica".to_string()),
                ("port".to_string(), "5".to_string())
            ]
        );
    }

    #[test]
    fn password_methods_round_trip() {
        for m in [
            PasswordMethod::ScramSha256,
            PasswordMethod::Md5,
            PasswordMethod::Password,
        ] {
            assert_eq!(m.as_str().parse::<PasswordMethod>().unwrap(), m);
        }
        assert!("trust".parse::<PasswordMethod>().is_err());
    }
}
