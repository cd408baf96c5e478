//! The consumer conformance suite, Rust side: every scenario of
//! `conformance/scenarios.json` (the file the Python package's
//! `python/tests/test_conformance.py` runs too) against one real
//! PostgreSQL and one broker (Tansu, or Apache Kafka with
//! WALRELAY_BROKER=kafka), each scenario in its own database,
//! topic and consumer group, all scenarios at once.
//!
//! conformance/README.md describes the actions and the checks; both
//! runners implement exactly those, and refuse anything else.

mod handler;
mod login;
mod scenario;
#[path = "../support/mod.rs"]
mod support;
mod world;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_postgres::Transaction;
use walrelay_consumer::{ConsumerLoop, Database, Delivery, GroupProtocol, PgHwmStore, Settings};
use walrelay_testkit::{BrokerKind, ClusterOptions, PgCluster, TestBroker};

use handler::apply;
use world::run;

/// Set in the environment of a consumer process this suite starts (and
/// kills): the test `conformance_child` then runs the consumer.
const CHILD_ENV: &str = "WALRELAY_CONFORMANCE_CHILD";
/// The consumer process's login properties (`NAME=VALUE` lines).
const CHILD_LOGIN_ENV: &str = "WALRELAY_CONFORMANCE_CHILD_LOGIN";
/// `oauth`: the consumers log in to the broker with OAUTHBEARER (OIDC
/// client credentials from a token endpoint the suite serves, tokens of
/// 15 s that the broker makes them renew), on Apache Kafka only.
const LOGIN_ENV: &str = "WALRELAY_CONFORMANCE_LOGIN";
const AWAIT: Duration = Duration::from_secs(60);

const CREATE_EFFECTS: &str = "CREATE TABLE effects (
    event_key text NOT NULL,
    partition int NOT NULL,
    consumer text NOT NULL
);
CREATE TABLE commit_check (
    id int,
    CONSTRAINT commit_check_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED
)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_of_the_shared_file() -> anyhow::Result<()> {
    support::init_tracing();
    let file = scenario::load()?;
    // Every scenario at once on one cluster: each holds a world client,
    // its consumer's pool and, while it re-drives, one more. The test
    // clusters' default of 30 was hit at 21 scenarios ("sorry, too many
    // clients already").
    let cluster = tokio::task::spawn_blocking(|| {
        PgCluster::start(ClusterOptions::default().conf("max_connections", "200"))
    });
    let (broker, login) = match std::env::var(LOGIN_ENV).as_deref() {
        Ok("oauth") => {
            let (broker, login) = tokio::task::spawn_blocking(login::oauth_broker).await??;
            (broker, Some(login))
        }
        Ok("") | Err(_) => (tokio::task::spawn_blocking(TestBroker::start).await??, None),
        Ok(other) => bail!("{LOGIN_ENV}={other:?}: only oauth is known"),
    };
    let shared = Arc::new(Shared {
        cluster: cluster.await??,
        broker,
        login,
    });
    let broker = match shared.broker.kind() {
        BrokerKind::Kafka => "kafka",
        BrokerKind::Tansu => "tansu",
    };
    let mut failed = Vec::new();
    let mut passed = 0;
    // One protocol after the other, on the same broker and cluster.
    for protocol in support::group_protocols()? {
        let name = support::protocol_name(protocol);
        ensure!(
            protocol == GroupProtocol::Classic || broker == "kafka",
            "the consumer group protocol needs Apache Kafka 4 (WALRELAY_BROKER=kafka)"
        );
        let mut runs = JoinSet::new();
        // Read again for each protocol: the scenarios are moved into the runs.
        for scenario in scenario::load()?.scenarios {
            if !scenario.runs_on(broker) {
                eprintln!("scenario {}: not played on {broker}", scenario.name);
                continue;
            }
            let (shared, defaults) = (Arc::clone(&shared), file.defaults.clone());
            runs.spawn(async move {
                let name = scenario.name.clone();
                (name, run(&shared, &defaults, scenario, protocol).await)
            });
        }
        let (mut ok, mut bad) = (0, 0);
        while let Some(joined) = runs.join_next().await {
            match joined? {
                (_, Ok(())) => ok += 1,
                (scenario, Err(e)) => {
                    bad += 1;
                    failed.push(format!("scenario {scenario} ({name} protocol): {e:#}"));
                }
            }
        }
        eprintln!("group protocol {name}: {ok} scenarios passed, {bad} failed");
        passed += ok;
    }
    ensure!(
        failed.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failed.len(),
        failed.len() + passed,
        failed.join("\n")
    );
    Ok(())
}

/// A consumer process for `start_process`: runs only when this test binary
/// is started by [`every_scenario_of_the_shared_file`] with [`CHILD_ENV`]
/// set, and then until it is killed.
#[tokio::test]
async fn conformance_child() -> anyhow::Result<()> {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return Ok(());
    };
    // Its logs (RUST_LOG) on its stderr, which the suite's output shows.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let fields: Vec<&str> = spec.split('\t').collect();
    let [bootstrap, topic, dsn, group, name, interval_ms, instance_id, protocol] = fields[..]
    else {
        bail!("{CHILD_ENV} must hold 8 tab-separated fields, not {spec:?}");
    };
    let mut kafka = support::kafka_for(bootstrap, group, support::parse_protocol(protocol)?);
    for line in std::env::var(CHILD_LOGIN_ENV).unwrap_or_default().lines() {
        let (k, v) = line
            .split_once('=')
            .with_context(|| format!("{CHILD_LOGIN_ENV}: {line:?} is not NAME=VALUE"))?;
        kafka.set(k, v);
    }
    if !instance_id.is_empty() {
        // Static membership, with Kafka's default session timeout (under
        // the classic protocol; the consumer protocol's is the broker's):
        // a restart under the same id must not wait for it.
        kafka
            .set("group.instance.id", instance_id)
            .remove("session.timeout.ms");
        kafka.remove("heartbeat.interval.ms");
    }
    let consumer = ConsumerLoop::new(kafka, &[topic], PgHwmStore::new(), Database::from_dsn(dsn)?)?
        .with_settings(Settings {
            commit_interval: Duration::from_millis(interval_ms.parse()?),
            ..Settings::default()
        });
    let (_stop, shutdown) = watch::channel(false);
    consumer
        .run_batches(
            async |tx: &Transaction<'_>, batch: &[Delivery<'_>]| {
                apply(tx, batch, name, Duration::ZERO, false).await
            },
            shutdown,
        )
        .await?;
    bail!("the consumer process stopped before it was killed")
}

struct Shared {
    cluster: PgCluster,
    broker: TestBroker,
    /// How the consumers log in, when not on the broker's plain listener.
    login: Option<login::ConsumerLogin>,
}

impl Shared {
    /// A consumer's Kafka settings in `group`: on the login's listener
    /// with its properties, or on the plain one.
    fn consumer_kafka(&self, group: &str, protocol: GroupProtocol) -> rdkafka::ClientConfig {
        let mut kafka = support::kafka_for(&self.consumer_bootstrap(), group, protocol);
        for (k, v) in self.login.iter().flat_map(|l| &l.properties) {
            kafka.set(k, v);
        }
        kafka
    }

    fn consumer_bootstrap(&self) -> String {
        self.login
            .as_ref()
            .map_or_else(|| self.broker.bootstrap_servers(), |l| l.bootstrap.clone())
    }

    /// The login properties as `NAME=VALUE` lines, for a consumer process.
    fn login_lines(&self) -> String {
        self.login
            .iter()
            .flat_map(|l| &l.properties)
            .map(|(k, v)| format!("{k}={v}\n"))
            .collect()
    }
}
