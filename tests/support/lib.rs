//! Shared support for walrelay's integration tests: a throwaway cluster with
//! an outbox table and a publication, and a decoding session that records
//! what the replication stream delivers, with the LSNs the server reported.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use walrelay_pg::xlog::{Keepalive, ReplicationMessage};
use walrelay_pg::{
    Config, PgOutputOptions, ReplicationConnection, ReplicationStream, SslMode, StreamOptions,
};
use walrelay_pgoutput::{Decoder, Lsn, PgOutputMessage, RelationCache};
pub use walrelay_testkit::db::confirmed_flush_lsn;
use walrelay_testkit::{outbox_table, OutboxKeys, BUSY_TABLE};
pub use walrelay_testkit::{ClusterOptions, PgCluster, TestDb};

/// The publication the test schema creates.
pub const PUBLICATION: &str = "walrelay_pub";

/// The outbox (keys required), a table outside the publication, and the
/// publication of the outbox.
pub fn schema() -> String {
    format!(
        "{}{}\n    CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox;",
        outbox_table(OutboxKeys::Required),
        BUSY_TABLE
    )
}

/// A running cluster with [`schema`] and a superuser client.
pub async fn test_db() -> Result<TestDb> {
    test_db_with(ClusterOptions::default()).await
}

/// [`test_db`] with cluster options.
pub async fn test_db_with(opts: ClusterOptions) -> Result<TestDb> {
    TestDb::start(opts, &schema()).await
}

/// Replication connection settings for the superuser, without TLS.
pub fn replication_config(cluster: &PgCluster) -> Config {
    Config::parse(&cluster.conninfo("postgres", "postgres"))
        .expect("testkit conninfo parses")
        .sslmode(SslMode::Disable)
}

/// What the stream delivered, decoded, with the XLogData `wal_start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Begin {
        wal_start: Lsn,
        final_lsn: Lsn,
        xid: u32,
    },
    Commit {
        wal_start: Lsn,
        commit_lsn: Lsn,
        end_lsn: Lsn,
    },
    Message {
        wal_start: Lsn,
        lsn: Lsn,
        transactional: bool,
        prefix: String,
        content: Bytes,
    },
    Insert {
        wal_start: Lsn,
        table: String,
        columns: Vec<(String, Option<String>)>,
    },
    Update {
        wal_start: Lsn,
        table: String,
    },
    Delete {
        wal_start: Lsn,
        table: String,
    },
    Relation {
        table: String,
    },
    Other {
        kind: String,
    },
}

impl Event {
    pub fn is_commit(&self) -> bool {
        matches!(self, Event::Commit { .. })
    }

    /// The named column of an Insert.
    pub fn column(&self, name: &str) -> Option<&str> {
        match self {
            Event::Insert { columns, .. } => columns
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.as_deref()),
            _ => None,
        }
    }
}

/// A replication session that decodes as it goes.
pub struct Session {
    pub stream: ReplicationStream,
    decoder: Decoder,
    relations: RelationCache,
    pub keepalives: Vec<Keepalive>,
    pub slot: String,
}

impl Session {
    /// Connect, create the slot if missing, and stream from its confirmed
    /// position.
    pub async fn open(config: &Config, slot: &str) -> Result<Session> {
        Self::open_with(config, slot, StreamOptions::default()).await
    }

    pub async fn open_with(
        config: &Config,
        slot: &str,
        mut options: StreamOptions,
    ) -> Result<Session> {
        let mut conn = ReplicationConnection::connect(config).await?;
        let status = conn.ensure_slot(slot).await?;
        options.initial_flush = status.info().confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
        let stream = conn
            .start_replication(
                slot,
                Lsn::ZERO,
                &PgOutputOptions::new([PUBLICATION]),
                options,
            )
            .await?;
        Ok(Session {
            stream,
            decoder: Decoder::new(),
            relations: RelationCache::new(),
            keepalives: Vec::new(),
            slot: slot.to_owned(),
        })
    }

    /// The next decoded event (keepalives are recorded, not returned).
    pub async fn next_event(&mut self, timeout: Duration) -> Result<Event> {
        loop {
            let msg = tokio::time::timeout(timeout, self.stream.recv())
                .await
                .context("timed out waiting for the replication stream")?
                .context("the replication stream ended")??;
            match msg {
                ReplicationMessage::Keepalive(k) => self.keepalives.push(k),
                ReplicationMessage::XLogData(x) => return self.decode(x.wal_start, x.data),
            }
        }
    }

    /// The next keepalive, skipping (and discarding) data.
    pub async fn next_keepalive(&mut self, timeout: Duration) -> Result<Keepalive> {
        loop {
            let msg = tokio::time::timeout(timeout, self.stream.recv())
                .await
                .context("timed out waiting for a keepalive")?
                .context("the replication stream ended")??;
            if let ReplicationMessage::Keepalive(k) = msg {
                self.keepalives.push(k);
                return Ok(k);
            }
        }
    }

    fn decode(&mut self, wal_start: Lsn, data: Bytes) -> Result<Event> {
        Ok(match self.decoder.decode(data)? {
            PgOutputMessage::Begin(b) => Event::Begin {
                wal_start,
                final_lsn: b.final_lsn,
                xid: b.xid,
            },
            PgOutputMessage::Commit(c) => Event::Commit {
                wal_start,
                commit_lsn: c.commit_lsn,
                end_lsn: c.end_lsn,
            },
            PgOutputMessage::Message(m) => Event::Message {
                wal_start,
                lsn: m.lsn,
                transactional: m.transactional(),
                prefix: m.prefix_str()?.to_owned(),
                content: m.content.clone(),
            },
            PgOutputMessage::Relation(r) => {
                let table = r.name.clone();
                self.relations.insert(r);
                Event::Relation { table }
            }
            PgOutputMessage::Insert(i) => {
                let row = self.relations.row(i.relation_id, &i.new)?;
                let columns = row
                    .iter()
                    .map(|(c, _)| Ok((c.name.clone(), row.text(&c.name)?.map(str::to_owned))))
                    .collect::<Result<Vec<_>>>()?;
                Event::Insert {
                    wal_start,
                    table: row.relation().name.clone(),
                    columns,
                }
            }
            PgOutputMessage::Update(u) => Event::Update {
                wal_start,
                table: self.table(u.relation_id),
            },
            PgOutputMessage::Delete(d) => Event::Delete {
                wal_start,
                table: self.table(d.relation_id),
            },
            other => Event::Other {
                kind: other.kind().to_owned(),
            },
        })
    }

    fn table(&self, id: u32) -> String {
        self.relations
            .get(id)
            .map(|r| r.name.clone())
            .unwrap_or_default()
    }

    /// Events up to and including the `n`-th Commit.
    pub async fn until_commits(&mut self, n: usize, timeout: Duration) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut commits = 0;
        while commits < n {
            let e = self.next_event(timeout).await?;
            commits += usize::from(e.is_commit());
            out.push(e);
        }
        Ok(out)
    }

    /// Events up to the first one matching `pred` (included).
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&Event) -> bool,
    ) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        loop {
            let e = self.next_event(timeout).await?;
            let done = pred(&e);
            out.push(e);
            if done {
                return Ok(out);
            }
        }
    }
}

/// Split events into transactions (Begin..Commit); fails on anything
/// outside a transaction except non-transactional messages and relations.
pub fn transactions(events: &[Event]) -> Result<Vec<Vec<Event>>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<Event>> = None;
    for e in events {
        match (e, &mut current) {
            (Event::Begin { .. }, None) => current = Some(vec![e.clone()]),
            (Event::Commit { .. }, Some(tx)) => {
                tx.push(e.clone());
                out.push(current.take().unwrap());
            }
            (_, Some(tx)) => tx.push(e.clone()),
            (
                Event::Message {
                    transactional: false,
                    ..
                }
                | Event::Relation { .. },
                None,
            ) => {}
            (other, None) => bail!("event outside a transaction: {other:?}"),
        }
    }
    Ok(out)
}

/// Default wait for stream progress in tests; generous for a loaded CI box.
pub const WAIT: Duration = Duration::from_secs(60);

/// A binary the workspace builds, under `target/<profile>/` (`walrelay`,
/// `examples/apply_events`): `scripts/test.sh` builds them before it runs
/// the tests (`cargo build --workspace --bins --examples`).
pub fn binary(relative: &str) -> Result<std::path::PathBuf> {
    // target/<profile>/deps/<test>-<hash>
    let exe = std::env::current_exe().context("the test executable's path")?;
    let profile = exe
        .parent()
        .and_then(std::path::Path::parent)
        .context("target/<profile>")?;
    let path = profile.join(relative);
    if !path.exists() {
        bail!(
            "{} is missing: scripts/test.sh builds it (cargo build --workspace --bins --examples)",
            path.display()
        );
    }
    Ok(path)
}
