//! Copies of a cluster: a base backup and its restore into the cluster's
//! own data directory, and a streaming standby that can be promoted. Each
//! keeps the system identifier; none keeps the replication slots (a base
//! backup never holds them), which is what walrelay meets after a restore
//! or a failover.

use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;

use super::options::upsert;
use super::process::run;
use super::{PgCluster, State};

impl PgCluster {
    /// `pg_basebackup` of the running server into `into` (a directory that
    /// must not exist yet), as the server's own user, WAL streamed along so
    /// that the backup is consistent by itself. `standby` adds
    /// `standby.signal` and `primary_conninfo` (`-R`).
    fn pg_basebackup(&self, into: &Path, standby: bool) -> anyhow::Result<()> {
        self.pg_basebackup_with(into, standby, &[])
    }

    /// [`Self::pg_basebackup`] with more arguments.
    fn pg_basebackup_with(&self, into: &Path, standby: bool, args: &[&str]) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_basebackup");
        cmd.args([
            "-h",
            self.host(),
            "-p",
            &self.port.to_string(),
            "-U",
            "postgres",
        ])
        .arg("-D")
        .arg(into)
        .args(["-X", "stream", "-c", "fast", "--no-sync"])
        .args(args);
        if standby {
            cmd.arg("-R");
        }
        run(cmd, "pg_basebackup").map_err(|e| self.with_log(e))
    }

    /// A base backup of the running server into `into` (see
    /// [`PgCluster::restore_base_backup`]).
    pub fn base_backup(&self, into: &Path) -> anyhow::Result<()> {
        self.pg_basebackup(into, false)
    }

    /// Restores a [`base_backup`](Self::base_backup): stops the server,
    /// moves its data directory aside (to `data.before-restore`), puts the
    /// backup in its place and starts it. The restored server recovers
    /// from the backup's label, on the same timeline, with the same
    /// configuration, port and system identifier, and without the
    /// replication slots.
    pub fn restore_base_backup(&self, backup: &Path) -> anyhow::Result<()> {
        if self.is_running() {
            self.stop_fast()?;
        }
        std::fs::rename(&self.data, self.data.with_extension("before-restore"))?;
        std::fs::rename(backup, &self.data)?;
        self.start_stopped()
    }

    /// A volume snapshot of the data directory into `into` (a directory
    /// that must not exist yet), as a cloud disk snapshot or a ZFS/LVM
    /// snapshot takes it: unlike a base backup it holds the replication
    /// slots, as they were. The server is stopped (`fast`) for the copy
    /// and started again. [`PgCluster::restore_base_backup`] puts it back.
    pub fn volume_snapshot(&self, into: &Path) -> anyhow::Result<()> {
        self.stop_fast()?;
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&self.data)
            .arg(into)
            .status()
            .context("running cp")?;
        self.start_stopped()?;
        anyhow::ensure!(copied.success(), "cp -a of the data directory failed");
        Ok(())
    }

    /// A physical standby of this (running) cluster, streaming from it, in
    /// a directory and on a port of its own, removed on drop like any
    /// cluster.
    pub fn standby(&self) -> anyhow::Result<PgCluster> {
        self.standby_with(&[], &[])
    }

    /// A standby that keeps this cluster's failover slots (PostgreSQL 17
    /// and later), as docs/operations.md sets one up: streaming through
    /// the physical slot `slot` (created by the backup), with
    /// `sync_replication_slots` and `hot_standby_feedback` on and a
    /// `dbname` in `primary_conninfo` (pg_basebackup 17 writes the one it
    /// connected with).
    pub fn failover_standby(&self, slot: &str) -> anyhow::Result<PgCluster> {
        self.standby_with(
            &["-S", slot, "-C", "-d", "dbname=postgres"],
            &[
                ("sync_replication_slots", "on"),
                ("hot_standby_feedback", "on"),
            ],
        )
    }

    /// A standby from a backup taken with `args`, with `conf` added to
    /// the configuration.
    fn standby_with(&self, args: &[&str], conf: &[(&str, &str)]) -> anyhow::Result<PgCluster> {
        let dir = tempfile::Builder::new()
            .prefix("walrelay-pg-standby-")
            .tempdir()
            .context("creating the standby's directory")?
            .keep();
        let mut settings = self.state().settings.clone();
        upsert(
            &mut settings,
            "unix_socket_directories",
            &dir.to_string_lossy(),
        );
        for (name, value) in conf {
            upsert(&mut settings, name, value);
        }
        let standby = PgCluster {
            bin: self.bin.clone(),
            user: self.user,
            data: dir.join("data"),
            log: dir.join("log"),
            dir,
            port: 0,
            auth: self.auth.clone(),
            state: Mutex::new(State {
                settings,
                hba_prepend: self.state().hba_prepend.clone(),
                running: false,
            }),
        };
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&standby.dir, std::fs::Permissions::from_mode(0o700))?;
        }
        standby.user.chown(&standby.dir)?;
        self.pg_basebackup_with(&standby.data, true, args)?;
        standby.start_fresh()
    }

    /// Makes this stopped cluster (an old primary after a failover) a
    /// failover standby of `primary`, as an operator rebuilds one: its
    /// data directory is replaced by a base backup of `primary` taken
    /// through the new physical slot `slot` (as [`Self::failover_standby`]
    /// takes it), its own settings (port, socket directory) are written
    /// over the copied ones, and it starts on the same port, so a host
    /// list naming both servers stays valid through any number of
    /// failovers.
    pub fn rebuild_as_failover_standby(
        &self,
        primary: &PgCluster,
        slot: &str,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.is_running(),
            "the cluster in {} must be stopped before it is rebuilt as a standby",
            self.dir.display()
        );
        std::fs::remove_dir_all(&self.data)
            .with_context(|| format!("removing {}", self.data.display()))?;
        primary.pg_basebackup_with(
            &self.data,
            true,
            &["-S", slot, "-C", "-d", "dbname=postgres"],
        )?;
        self.set_conf(&[
            ("sync_replication_slots", "on"),
            ("hot_standby_feedback", "on"),
        ])?;
        self.start_stopped()
    }

    /// `pg_ctl promote`, waiting until the server accepts writes.
    pub fn promote(&self) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("promote").arg("-D").arg(&self.data).arg("-w");
        run(cmd, "pg_ctl promote").map_err(|e| self.with_log(e))
    }
}
