//! The source database the faults hit: one PostgreSQL, or (with
//! `--pg-failover`) a primary and a failover standby behind one host
//! list that follows the primary, as docs/operations.md sets them up.
//!
//! The pair is protected the way the operations guide asks: the relay's
//! slot and the audit slot are failover slots, the standby keeps
//! synchronized copies (`sync_replication_slots`, `hot_standby_feedback`,
//! its own physical slot), and the primary lists that slot in
//! `synchronized_standby_slots`, so no logical decoding gets ahead of
//! the standby. Commits are synchronous to the standby
//! (`synchronous_standby_names = '*'`): a COMMIT the workload saw succeed
//! survives the failover, so the ledger check ("COMMIT succeeded but the
//! ledger lacks it") stays exact. A commit whose answer was lost is
//! settled by the new primary's ledger, as after any fault.
//!
//! The failover ([`Source::fail_over`]): `kill -9` of the primary's
//! postmaster, `pg_ctl promote` of the standby, then the old primary
//! rebuilt from a base backup as the new primary's standby on its old
//! port (the host list never changes), so the next failover can happen.
//! Between the promotion and the rebuilt standby's connection the new
//! primary runs unprotected (nothing to fail over to); the harness waits
//! for the synchronized copies ([`Source::standby_ready`]) before the next
//! fault.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use walrelay_testkit::{ClusterOptions, PgCluster};

use crate::services::{AUDIT_SLOT, SLOT};
use crate::workload::connect;

/// What a failover did, for the log and the report.
#[derive(Debug)]
pub struct FailedOver {
    /// The new primary's port and timeline.
    pub primary_port: u16,
    pub timeline: i64,
    /// From the kill to the rebuilt standby's start.
    pub took: std::time::Duration,
}

pub struct Source {
    /// One node, or two: `nodes[primary]` is the primary.
    nodes: Vec<Arc<PgCluster>>,
    primary: AtomicUsize,
    failovers: AtomicUsize,
}

/// The physical slot of the first standby.
const INITIAL_STANDBY_SLOT: &str = "standby_initial";

/// The physical slot through which the node on `port` streams as a
/// standby (unique per node, so a rebuilt node gets a fresh one).
fn standby_slot(port: u16) -> String {
    format!("standby_{port}")
}

impl Source {
    /// Starts the source: one cluster, or a primary and its failover
    /// standby (PostgreSQL 17 or later).
    pub fn start(pair: bool) -> Result<Source> {
        let primary = PgCluster::start(ClusterOptions::default().conf("max_wal_size", "1GB"))?;
        let mut nodes = vec![Arc::new(primary)];
        if pair {
            let major = nodes[0].major_version();
            ensure!(
                major >= 17,
                "--pg-failover needs PostgreSQL 17 or later (failover slots); this is {major}: \
                 point WALRELAY_PG_BIN at a newer server (scripts/install-postgres-wheels.sh 17)"
            );
            // The standby gets a port of its own at its first start: its
            // slot is named after the port only once the port is known.
            let standby = nodes[0].failover_standby(INITIAL_STANDBY_SLOT)?;
            nodes.push(Arc::new(standby));
        }
        Ok(Source {
            nodes,
            primary: AtomicUsize::new(0),
            failovers: AtomicUsize::new(0),
        })
    }

    pub fn is_pair(&self) -> bool {
        self.nodes.len() == 2
    }

    pub fn primary(&self) -> Arc<PgCluster> {
        Arc::clone(&self.nodes[self.primary.load(Ordering::SeqCst)])
    }

    fn standby(&self) -> Option<Arc<PgCluster>> {
        self.is_pair()
            .then(|| Arc::clone(&self.nodes[1 - self.primary.load(Ordering::SeqCst)]))
    }

    pub fn failovers(&self) -> usize {
        self.failovers.load(Ordering::SeqCst)
    }

    /// The connection string every client uses: the one server's URL, or
    /// both hosts in a fixed order with `target_session_attrs=read-write`,
    /// which finds whichever is the primary now.
    pub fn url(&self) -> String {
        if !self.is_pair() {
            return format!(
                "{}?sslmode=disable",
                self.nodes[0].url("postgres", "postgres")
            );
        }
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write connect_timeout=2 sslmode=disable",
            self.nodes[0].port(),
            self.nodes[1].port()
        )
    }

    /// Protects the pair: synchronous commits to the standby and
    /// `synchronized_standby_slots` naming its slot. Run once the
    /// standby streams (at the start, and after each rebuild).
    pub async fn protect(&self) -> Result<()> {
        let Some(standby) = self.standby() else {
            return Ok(());
        };
        let slot = self.standby_slot_name(&standby);
        configure(
            &self.primary(),
            &[
                format!("ALTER SYSTEM SET synchronized_standby_slots = '{slot}'"),
                "ALTER SYSTEM SET synchronous_standby_names = '*'".to_owned(),
            ],
        )
        .await
        .context("protecting the pair")
    }

    /// The physical slot the standby streams through: the first
    /// standby's was made before its port was known.
    fn standby_slot_name(&self, standby: &PgCluster) -> String {
        if self.failovers() == 0 {
            INITIAL_STANDBY_SLOT.to_owned()
        } else {
            standby_slot(standby.port())
        }
    }

    /// Whether the standby holds synchronized, persistent copies of both
    /// failover slots (a temporary copy is dropped at promotion), so that
    /// a failover now would keep them. Asks the primary for a
    /// running-transactions record first: the slot sync worker catches up
    /// at once rather than at its next nap (up to 30 s).
    pub async fn standby_ready(&self) -> Result<bool> {
        let Some(standby) = self.standby() else {
            return Ok(true);
        };
        connect(&self.url())
            .await?
            .batch_execute("SELECT pg_log_standby_snapshot()")
            .await?;
        let row = standby
            .client()
            .await?
            .query_one(
                "SELECT count(*) FROM pg_replication_slots \
                 WHERE slot_name IN ($1, $2) AND synced AND NOT temporary",
                &[&SLOT, &AUDIT_SLOT],
            )
            .await?;
        Ok(row.get::<_, i64>(0) == 2)
    }

    /// The failover: the primary's postmaster killed, the standby
    /// promoted and left unprotected until the old primary is rebuilt as
    /// its standby, then protected again. Blocking steps run off the
    /// runtime's workers.
    pub async fn fail_over(&self) -> Result<FailedOver> {
        ensure!(self.is_pair(), "a PostgreSQL failover needs --pg-failover");
        let started = Instant::now();
        let old = self.primary();
        let new = self.standby().expect("a pair has a standby");
        {
            let (old, new) = (Arc::clone(&old), Arc::clone(&new));
            tokio::task::spawn_blocking(move || -> Result<()> {
                old.kill_postmaster()?;
                new.promote()
            })
            .await??;
        }
        self.primary
            .store(1 - self.primary.load(Ordering::SeqCst), Ordering::SeqCst);
        self.failovers.fetch_add(1, Ordering::SeqCst);
        // Its configuration came from the old primary: commits would wait
        // for a synchronous standby that is not there yet.
        configure(
            &new,
            &[
                "ALTER SYSTEM RESET synchronized_standby_slots".to_owned(),
                "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
            ],
        )
        .await
        .context("unprotecting the promoted standby until it has a standby")?;
        let slot = standby_slot(old.port());
        {
            let (old, new) = (Arc::clone(&old), Arc::clone(&new));
            tokio::task::spawn_blocking(move || old.rebuild_as_failover_standby(&new, &slot))
                .await??;
        }
        self.protect().await?;
        let timeline = new
            .client()
            .await?
            // The WAL file name starts with the timeline (the control
            // file's checkpoint may not have moved to it yet).
            .query_one(
                "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint",
                &[],
            )
            .await?
            .get(0);
        Ok(FailedOver {
            primary_port: new.port(),
            timeline,
            took: started.elapsed(),
        })
    }
}

/// Runs `ALTER SYSTEM` statements (each alone: they refuse a transaction
/// block, which a multi-statement query is) and reloads the
/// configuration.
async fn configure(server: &PgCluster, statements: &[String]) -> Result<()> {
    let client = server.client().await?;
    for sql in statements {
        client
            .batch_execute(sql)
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => anyhow::anyhow!("{sql}: {}", db.message()),
                None => anyhow::anyhow!("{sql}: {e}"),
            })?;
    }
    client.batch_execute("SELECT pg_reload_conf()").await?;
    Ok(())
}
