//! Test support for walrelay: throwaway PostgreSQL clusters and
//! Kafka-compatible brokers for tests, examples and benchmarks.
//!
//! * [`PgCluster::start`] runs `initdb` into a fresh directory under the
//!   system temp dir and starts the server on a free port of 127.0.0.1
//!   (`wal_level = logical` by default). Drop stops it and deletes the
//!   directory (`WALRELAY_KEEP_CLUSTER=1` keeps it).
//! * [`PgBin`] finds the binaries: `$WALRELAY_PG_BIN`, else
//!   `/usr/lib/postgresql/15/bin`, else the newest
//!   `/usr/lib/postgresql/*/bin`. `scripts/install-postgres.sh` installs
//!   PostgreSQL 15 when none is there.
//! * When the process runs as root, `initdb`/`pg_ctl`/`postgres` run as the
//!   `postgres` user (they refuse root) and the cluster directory is owned
//!   by it.
//! * [`TestCa`] makes certificates for TLS clusters.
//! * [`TestDb`], [`outbox_table`] and the [`db`] helpers: a cluster with a
//!   schema, the outbox table every suite and example creates, and the WAL
//!   positions tests wait for.
//! * [`await_condition`] polls a condition until it holds or a timeout
//!   passes: tests await conditions instead of sleeping.
//! * [`TansuBroker::start`] runs a throwaway Tansu broker (Kafka-compatible,
//!   in-memory storage) on a free port of 127.0.0.1; Drop kills it.
//!   `scripts/install-tansu.sh` installs the pinned, hash-checked binary
//!   into `target/tools/bin/tansu` (`$WALRELAY_TANSU_BIN` overrides it).
//! * [`KafkaCluster::start`] runs throwaway Apache Kafka (KRaft, combined
//!   broker-controller nodes) from the jars `scripts/install-kafka.sh`
//!   installs under `target/tools` (`$WALRELAY_KAFKA_HOME` overrides it);
//!   [`SharedKafka`] shares single nodes between the tests of a binary.
//! * [`oauth::TokenIssuer`] is a test OAuth server whose RS256 tokens a
//!   node's OAUTHBEARER listener validates ([`KafkaSecurity::oauth`]);
//!   [`oauth::OAuthClientConfig`] holds its clients' properties.
//! * [`TestBroker::start`] gives a test the broker `$WALRELAY_BROKER`
//!   names (`tansu`, the default, or `kafka`), behind one API.
//! * [`DebeziumWorker::start`] runs Debezium's PostgreSQL connector on a
//!   Kafka Connect standalone worker (the install
//!   `scripts/install-debezium.sh` makes, `$WALRELAY_DEBEZIUM_HOME`
//!   overrides it) with the settings of `bench/debezium/`, for running it
//!   beside walrelay on the same database and broker ([`debezium`]).
//! * [`read_topics`], [`read_until_quiet`] and [`partition_count`] read
//!   back what was produced, without a consumer group and without trusting
//!   high watermarks (Tansu's are wrong).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use walrelay_testkit::{ClusterOptions, PgCluster};
//! let pg = PgCluster::start(ClusterOptions::default())?;
//! let client = pg.client().await?;
//! let row = client.query_one("SHOW wal_level", &[]).await?;
//! assert_eq!(row.get::<_, String>(0), "logical");
//! # Ok(()) }
//! ```

mod bin;
pub mod broker;
mod cluster;
pub mod db;
pub mod debezium;
mod java;
pub mod kafka;
pub mod oauth;
pub mod procstat;
mod python;
mod tls;
mod user;
mod watched;
pub mod wire;

use std::future::Future;
use std::time::{Duration, Instant};

pub use bin::{PgBin, DEBIAN_PG15_BIN, PG_BIN_ENV};
pub use broker::kafka::{KAFKA_HOME_ENV, KAFKA_VERSION};
pub use broker::{
    AclOperation, AclResource, BrokerKind, Jvm, KafkaCluster, KafkaHome, KafkaOptions,
    KafkaSecurity, ListenerAuth, OAuthValidation, ScramUser, SharedKafka, TansuBroker, TestBroker,
    BROKER_ENV, KEEP_BROKER_ENV, TANSU_BIN_ENV,
};
pub use cluster::{
    Auth, ClusterOptions, PasswordMethod, PgCluster, HOST, KEEP_CLUSTER_ENV, SUPERUSER,
};
pub use db::{outbox_table, OutboxKeys, TestDb, BUSY_TABLE};
pub use debezium::{
    ConnectDelivery, DebeziumHome, DebeziumOptions, DebeziumWorker, Delivery, StartTimings, Variant,
};
pub use java::java_classpath;
pub use kafka::{
    partition_count, read_topics, read_until_quiet, relay_headers, ConsumedRecord, EXTRA_READ_GRACE,
};
pub use python::python_interpreter;
pub use tls::{TestCa, TlsMaterial};

/// Polls `condition` every `poll_interval` until it returns `Ok(true)`, and
/// fails once `timeout` has passed. An `Err` from the condition counts as
/// "not yet" (so it may, e.g., try to connect); the last such error is part
/// of the timeout error. The condition is always evaluated at least once.
pub async fn await_condition<F, Fut>(
    timeout: Duration,
    poll_interval: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let last_error = match condition().await {
            Ok(true) => return Ok(()),
            Ok(false) => None,
            Err(e) => Some(e),
        };
        let now = Instant::now();
        if now >= deadline {
            let base = format!(
                "condition not met within {timeout:?} ({attempts} checks, every {poll_interval:?})"
            );
            return Err(match last_error {
                Some(e) => e.context(format!("{base}; the last check failed")),
                None => anyhow::anyhow!(base),
            });
        }
        tokio::time::sleep(poll_interval.min(deadline - now)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn await_condition_succeeds_and_times_out() {
        let mut n = 0;
        await_condition(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            let done = n >= 3;
            async move { Ok(done) }
        })
        .await
        .unwrap();
        assert_eq!(n, 3);

        let err = await_condition(
            Duration::from_millis(30),
            Duration::from_millis(5),
            || async { Ok(false) },
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("condition not met"), "{err:#}");

        let err = await_condition(
            Duration::from_millis(20),
            Duration::from_millis(5),
            || async { anyhow::bail!("boom") },
        )
        .await
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("condition not met") && text.contains("boom"),
            "{text}"
        );
    }
}
