//! The database side every suite and example shares: the outbox table
//! walrelay relays from, a throwaway cluster with a schema and a superuser
//! client ([`TestDb`]), and the WAL positions tests wait for.

use anyhow::{Context, Result};
use walrelay_pgoutput::Lsn;

use crate::{ClusterOptions, PgCluster};

/// Whether the outbox's record key (`aggregateid`) and `type` must be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxKeys {
    /// `NOT NULL`, as an application's outbox would declare them.
    Required,
    /// Nullable, so a test can write the rows the relay must refuse (a
    /// NULL record key) and see them dead-lettered or reported.
    Optional,
}

/// `CREATE TABLE outbox` with Debezium's column names (`id`,
/// `aggregatetype`, `aggregateid`, `type`, `payload` jsonb, `headers`
/// jsonb) and a text primary key: a text key (unlike bigserial) writes no
/// sequence record between an emitted message and the insert, so the
/// message-end-equals-insert-start case of the key contract actually
/// happens.
pub fn outbox_table(keys: OutboxKeys) -> String {
    let required = match keys {
        OutboxKeys::Required => " NOT NULL",
        OutboxKeys::Optional => "",
    };
    format!(
        "
    CREATE TABLE outbox (
        id text PRIMARY KEY,
        aggregatetype text NOT NULL,
        aggregateid text{required},
        type text{required},
        payload jsonb,
        headers jsonb
    );"
    )
}

/// A table outside the publication, for writing WAL that the relay must
/// skip.
pub const BUSY_TABLE: &str = "
    CREATE TABLE busy (id bigserial PRIMARY KEY, v text);";

/// A running cluster with a schema and a superuser client.
pub struct TestDb {
    pub cluster: PgCluster,
    pub client: tokio_postgres::Client,
}

impl TestDb {
    /// Starts a cluster (on a blocking thread: `initdb` takes a while) and
    /// creates `schema` in its `postgres` database.
    pub async fn start(opts: ClusterOptions, schema: &str) -> Result<TestDb> {
        let cluster = tokio::task::spawn_blocking(move || PgCluster::start(opts)).await??;
        let client = cluster.client().await?;
        client
            .batch_execute(schema)
            .await
            .context("creating the test schema")?;
        Ok(TestDb { cluster, client })
    }
}

/// The slot's `confirmed_flush_lsn`, `None` if the slot does not exist or
/// has not confirmed anything.
pub async fn confirmed_flush_lsn(
    client: &tokio_postgres::Client,
    slot: &str,
) -> Result<Option<Lsn>> {
    let row = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?;
    Ok(match row {
        None => None,
        Some(r) => r
            .get::<_, Option<String>>(0)
            .map(|s| s.parse())
            .transpose()?,
    })
}

/// `pg_current_wal_lsn()`.
pub async fn current_wal_lsn(client: &tokio_postgres::Client) -> Result<Lsn> {
    let s: String = client
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    Ok(s.parse()?)
}

/// The cluster's system identifier, as the relay's default source id starts.
pub async fn system_identifier(client: &tokio_postgres::Client) -> Result<String> {
    Ok(client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await?
        .get(0))
}
