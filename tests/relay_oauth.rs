//! walrelay on Kafka as the managed services run it: Apache Kafka 4.1.1
//! whose SASL_SSL listener takes OAUTHBEARER tokens, validated by Kafka's
//! own validator (RS256 against a JWKS, issuer and audience checked)
//! from a token endpoint the test serves, with tokens that live 15 s and
//! sessions that must log in again before their token expires
//! (`connections.max.reauth.ms`), so that every run refreshes tokens.
//!
//! - the relay (producer, tail fence, source record, `/readyz`'s probe,
//!   walrelay's own connections) logs in with OIDC client credentials;
//!   killed with kill -9 under load several times, nothing is lost and
//!   nothing is written twice (the fence on);
//! - a wrong client secret stops it with the token endpoint's answer; a
//!   token signed by a key the brokers do not trust is reported with the
//!   brokers' answer;
//! - the Rust, the Python and the Java example consumers log in with their
//!   own OAuth configuration and apply a relayed topic exactly once.
//!
//! Uses the real binaries (`target/<profile>/walrelay`,
//! `examples/apply_events`), the Python virtualenv and the Java example's
//! classpath, which `scripts/test.sh` builds first. Apache Kafka only
//! (WALRELAY_BROKER=kafka); the tests share one node, one at a time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use walrelay_suite::binary;
use walrelay_testkit::oauth::{IssuerOptions, OAuthClient, OAuthClientConfig, TokenIssuer};
use walrelay_testkit::{
    await_condition, java_classpath, python_interpreter, read_until_quiet, BrokerKind,
    ClusterOptions, KafkaCluster, KafkaOptions, KafkaSecurity, OAuthValidation, PgCluster, TestCa,
};

const WAIT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(50);
const RELAY: &str = "relay";
const RELAY_SECRET: &str = "relay-oauth-secret-510e527f";
const CONSUMER: &str = "consumer";
const CONSUMER_SECRET: &str = "consumer-oauth-secret-9b05688c";
/// The environment variable the relay reads its client secret from.
const SECRET_ENV: &str = "WALRELAY_TEST_OAUTH_SECRET";

/// The issuer, the node and the CA file the clients trust.
struct Fixture {
    issuer: TokenIssuer,
    kafka: KafkaCluster,
    ca_path: PathBuf,
}

impl Fixture {
    fn start() -> Result<Fixture> {
        let began = Instant::now();
        let issuer = TokenIssuer::start(IssuerOptions::default())?;
        issuer.register_client(RELAY, RELAY_SECRET);
        issuer.register_client(CONSUMER, CONSUMER_SECRET);
        let ca = TestCa::new("walrelay test Kafka CA")?;
        // Sessions log in again before their token expires (KIP-368): a
        // client that did not refresh its token would be cut off.
        let validation =
            OAuthValidation::for_issuer(&issuer).with_max_reauth(Duration::from_secs(60));
        let mut security = KafkaSecurity::oauth(&ca, validation)?;
        // ACLs are kafka_security.rs's subject; here the principals may
        // do everything, DescribeConfigs included (the fence's durability
        // rule reads it).
        security
            .super_users
            .extend([format!("User:{RELAY}"), format!("User:{CONSUMER}")]);
        let kafka = KafkaCluster::start(KafkaOptions {
            security: Some(security),
            ..KafkaOptions::default()
        })?;
        let ca_path = kafka.nodes()[0].dir().join("client-ca.pem");
        std::fs::write(&ca_path, kafka.ca_pem().context("a secured node")?)?;
        println!("issuer and OAuth Kafka node ready in {:?}", began.elapsed());
        Ok(Fixture {
            issuer,
            kafka,
            ca_path,
        })
    }

    fn client(&self, id: &str, secret: &str, token_url: &str) -> Result<OAuthClientConfig> {
        let client = OAuthClient::new(token_url, id, secret).with_scope("kafka");
        self.kafka.oauth_client_config(&client, &self.ca_path)
    }

    /// The relay's `--kafka-property` flags: librdkafka's OIDC settings,
    /// the client secret as an `env:` reference to [`SECRET_ENV`].
    fn relay_flags(&self, token_url: &str) -> Result<Vec<String>> {
        let config = self.client(RELAY, RELAY_SECRET, token_url)?;
        Ok(config
            .librdkafka_oidc()
            .into_iter()
            .filter(|(k, _)| k != "bootstrap.servers")
            .map(|(k, v)| match k.as_str() {
                "sasl.oauthbearer.client.secret" => format!("{k}=env:{SECRET_ENV}"),
                _ => format!("{k}={v}"),
            })
            .flat_map(|p| ["--kafka-property".to_owned(), p])
            .collect())
    }

    fn secure(&self) -> String {
        self.kafka
            .secure_bootstrap_servers()
            .expect("started secured")
    }

    /// The admin path (PLAINTEXT, a super user): topics, reading back.
    fn admin(&self) -> String {
        self.kafka.bootstrap_servers()
    }
}

/// One test at a time on the node.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fixture() -> Result<Option<(tokio::sync::MutexGuard<'static, ()>, &'static Fixture)>> {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(None);
    }
    let turn = TURN.lock().await;
    if FIXTURE.get().is_none() {
        let fixture = tokio::task::spawn_blocking(Fixture::start).await??;
        let _ = FIXTURE.set(fixture);
    }
    Ok(Some((turn, FIXTURE.get().expect("set above"))))
}

/// A PostgreSQL cluster with walrelay's slot, publication and schema.
struct Source {
    cluster: PgCluster,
    client: tokio_postgres::Client,
    dir: tempfile::TempDir,
}

impl Source {
    async fn start() -> Result<Source> {
        let cluster =
            tokio::task::spawn_blocking(|| PgCluster::start(ClusterOptions::default())).await??;
        let client = cluster.client().await?;
        let mut config = walrelay::config::Config::default();
        config.postgres.url = format!("{}?sslmode=disable", cluster.url("postgres", "postgres"));
        walrelay::commands::setup::setup(&config).await?;
        Ok(Source {
            cluster,
            client,
            dir: tempfile::tempdir()?,
        })
    }

    fn url(&self) -> String {
        format!(
            "{}?sslmode=disable",
            self.cluster.url("postgres", "postgres")
        )
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// `walrelay run` on the OAuth listener, its output appended to
    /// `relay.log`; `extra` flags before the command.
    fn spawn_relay(&self, fixture: &Fixture, token_url: &str, extra: &[&str]) -> Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path("relay.log"))?;
        Ok(Command::new(binary("walrelay")?)
            .args(["--postgres-url", &self.url()])
            .args(["--bootstrap-servers", &fixture.secure()])
            .args(fixture.relay_flags(token_url)?)
            .args(["--status-interval", "1s", "--log", "info"])
            .args(extra)
            .arg("run")
            .env(SECRET_ENV, RELAY_SECRET)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?)
    }

    async fn confirmed(&self) -> Result<walrelay_pgoutput::Lsn> {
        Ok(
            walrelay_testkit::db::confirmed_flush_lsn(&self.client, "walrelay")
                .await?
                .unwrap_or_default(),
        )
    }

    async fn wal_now(&self) -> Result<walrelay_pgoutput::Lsn> {
        walrelay_testkit::db::current_wal_lsn(&self.client).await
    }

    /// Waits until the slot confirmed everything written so far.
    async fn await_caught_up(&self, log: &str) -> Result<()> {
        let end = self.wal_now().await?;
        await_condition(WAIT, POLL, || async { Ok(self.confirmed().await? >= end) })
            .await
            .with_context(|| self.read_log(log))
    }
}

fn sigterm(child: &mut Child) -> Result<std::process::ExitStatus> {
    ensure!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?
        .success());
    Ok(child.wait()?)
}

fn kill9(child: &mut Child) -> Result<()> {
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// Transactions of 5 `walrelay.emit` events each on `topic`, ids
/// `<tag>-<n>-<g>`, every 10 ms until `stop`; returns the ids committed.
fn load(
    client: tokio_postgres::Client,
    topic: &'static str,
    tag: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<String>>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            client
                .batch_execute(&format!(
                    "SELECT count(walrelay.emit('{topic}', 'k' || (g % 7), \
                     jsonb_build_object('id', '{tag}-{n}-' || g))) FROM generate_series(1, 5) g"
                ))
                .await?;
            ids.extend((1..=5).map(|g| format!("{tag}-{n}-{g}")));
            n += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(ids)
    })
}

/// The `id` of each record's JSON payload, and how often each key came.
fn ids_and_keys(records: &[walrelay_testkit::ConsumedRecord]) -> Result<(Vec<String>, usize)> {
    let mut keys: HashMap<String, usize> = HashMap::new();
    let mut ids = Vec::with_capacity(records.len());
    for r in records {
        let key = r.header_str("idempotency-key").context("a key header")?;
        *keys.entry(key.to_owned()).or_default() += 1;
        let payload: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().context("a payload")?)?;
        ids.push(
            payload["id"]
                .as_str()
                .context("an id in the payload")?
                .to_owned(),
        );
    }
    let twice = keys.values().filter(|n| **n > 1).count();
    Ok((ids, twice))
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [RELAY_SECRET, CONSUMER_SECRET] {
        assert!(!text.contains(secret), "a client secret in the {what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_killed_under_load_loses_nothing_and_writes_nothing_twice() -> Result<()> {
    let Some((_turn, fixture)) = fixture().await? else {
        return Ok(());
    };
    const TOPIC: &str = "oauth-orders";
    fixture.kafka.create_topic(TOPIC, 3)?;
    let source = Source::start().await?;
    let token_url = fixture.issuer.token_url();
    let tokens_before = fixture.issuer.tokens_issued_to(RELAY);

    let stop = Arc::new(AtomicBool::new(false));
    let load = load(
        source.cluster.client().await?,
        TOPIC,
        "l",
        Arc::clone(&stop),
    );
    // Killed three times, each time once it confirmed something new: what
    // it sent since its last confirmation is replayed by the next one,
    // and the tail fence keeps it off the wire.
    let kills = 3;
    for round in 0..kills {
        let at_start = source.wal_now().await?;
        let mut relay = source.spawn_relay(fixture, &token_url, &[])?;
        await_condition(WAIT, POLL, || async {
            Ok(source.confirmed().await? > at_start)
        })
        .await
        .with_context(|| format!("round {round}: {}", source.read_log("relay.log")))?;
        kill9(&mut relay)?;
    }
    // The last relay runs past its token's refresh (80 % of 15 s) under
    // load, with sessions the broker makes log in again.
    let mut relay = source.spawn_relay(fixture, &token_url, &[])?;
    let started = fixture.issuer.tokens_issued_to(RELAY);
    fixture
        .issuer
        .await_tokens_issued_to(RELAY, started + 2, WAIT)
        .with_context(|| source.read_log("relay.log"))?;
    stop.store(true, Ordering::Relaxed);
    let expected = load.await??;
    source.await_caught_up("relay.log").await?;
    let exit = sigterm(&mut relay)?;
    let log = source.read_log("relay.log");
    ensure!(exit.success(), "graceful stop exits 0, got {exit:?}: {log}");

    let records =
        read_until_quiet(&fixture.admin(), &[TOPIC], Duration::from_secs(1), WAIT).await?;
    let (ids, twice) = ids_and_keys(&records)?;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for id in &ids {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    let lost: Vec<_> = expected
        .iter()
        .filter(|id| !counts.contains_key(id.as_str()))
        .take(5)
        .collect();
    ensure!(
        lost.is_empty() && twice == 0 && records.len() == expected.len(),
        "{} events, {} records, lost {lost:?}, {twice} keys twice on the wire; log:\n{log}",
        expected.len(),
        records.len()
    );
    // Every session fenced the topic (one replica: nothing to prove about
    // the replicas), with tails read over the OAuth login.
    let opened = log.matches("read the partition tails of the topic").count();
    ensure!(
        opened > kills && !log.contains("fenced=false"),
        "{opened} tail reads, each fenced: {log}"
    );
    let issued = fixture.issuer.tokens_issued_to(RELAY) - tokens_before;
    ensure!(
        issued > kills as u64 + 1,
        "{issued} tokens for {} relays: the last one refreshed its token",
        kills + 1
    );
    assert_no_secret("relay's log", &log);
    println!(
        "{} events relayed through {kills} kill -9s with {issued} tokens, none lost, none twice",
        expected.len()
    );

    // `walrelay verify` (a reader) and `status --kafka` (the admin client,
    // the brokers' release) log in the same way.
    let walrelay = |args: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(binary("walrelay")?)
            .args(["--postgres-url", &source.url()])
            .args(["--bootstrap-servers", &fixture.secure()])
            .args(fixture.relay_flags(&token_url)?)
            .args(["--log", "warn"])
            .args(args)
            .env(SECRET_ENV, RELAY_SECRET)
            .env_remove("WALRELAY_CONFIG")
            .output()?)
    };
    let verify = walrelay(&["verify", "--topic", TOPIC, "--idle-timeout", "2s"])?;
    let shown = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    ensure!(
        verify.status.success(),
        "walrelay verify: {}",
        shown(&verify)
    );
    let status = walrelay(&["status", "--kafka", "--topic", TOPIC, "--json"])?;
    let json: serde_json::Value = serde_json::from_slice(&status.stdout)
        .with_context(|| format!("walrelay status --kafka: {}", shown(&status)))?;
    ensure!(
        json["kafka"]["strict_min_isr"] == "yes"
            && json["kafka"]["error"].is_null()
            && json["kafka"]["topics"][0]["fenced"] == true,
        "status --kafka over the OAuth login: {json}"
    );
    assert_no_secret("verify and status", &(shown(&verify) + &shown(&status)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_client_secret_stops_the_relay_with_the_token_endpoints_answer() -> Result<()> {
    let Some((_turn, fixture)) = fixture().await? else {
        return Ok(());
    };
    let source = Source::start().await?;
    let log_path = source.log_path("relay.log");
    let log = std::fs::File::create(&log_path)?;
    let relay = Command::new(binary("walrelay")?)
        .args(["--postgres-url", &source.url()])
        .args(["--bootstrap-servers", &fixture.secure()])
        .args(fixture.relay_flags(&fixture.issuer.token_url())?)
        .arg("run")
        .env(SECRET_ENV, "not-the-secret")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let relay = std::sync::Mutex::new(relay);
    let exited = await_condition(WAIT, POLL, || async {
        Ok(relay.lock().expect("one user").try_wait()?.is_some())
    })
    .await;
    let mut relay = relay.into_inner().expect("one user");
    // Reaped either way: killed if it kept running.
    if exited.is_err() {
        let _ = relay.kill();
    }
    let status = relay.wait()?;
    let text = source.read_log("relay.log");
    exited.with_context(|| format!("the relay kept running:\n{text}"))?;
    ensure!(!status.success(), "{status:?}: {text}");
    ensure!(
        text.contains("refused the request (HTTP 401)")
            && text.contains("invalid_client")
            && text.contains("sasl.oauthbearer.client.secret"),
        "the token endpoint's answer and the setting to check: {text}"
    );
    ensure!(!text.contains("not-the-secret"), "the secret in the log");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_signed_by_a_key_the_brokers_do_not_trust_is_reported_with_their_answer(
) -> Result<()> {
    let Some((_turn, fixture)) = fixture().await? else {
        return Ok(());
    };
    // Another token endpoint, same issuer name and audience, whose key
    // the brokers' JWKS no longer lists (a retired signing key).
    let retired = TokenIssuer::start(IssuerOptions {
        issuer: Some(fixture.issuer.issuer().to_owned()),
        ..IssuerOptions::default()
    })?;
    retired.register_client(RELAY, RELAY_SECRET);
    retired.rotate_key()?;
    const TOPIC: &str = "oauth-retired-key";
    fixture.kafka.create_topic(TOPIC, 1)?;
    let source = Source::start().await?;
    source
        .client
        .batch_execute(&format!(
            "SELECT walrelay.emit('{TOPIC}', 'k', jsonb_build_object('id', 'r-1'))"
        ))
        .await?;
    let mut relay = source.spawn_relay(fixture, &retired.token_url(), &[])?;
    let refused = await_condition(WAIT, POLL, || async {
        Ok(source.read_log("relay.log").contains("invalid_token"))
    })
    .await;
    let confirmed = source.confirmed().await?;
    kill9(&mut relay)?;
    let text = source.read_log("relay.log");
    refused.with_context(|| format!("the brokers' answer in the relay's log:\n{text}"))?;
    ensure!(
        text.contains("SASL authentication error"),
        "librdkafka's words for a refused login: {text}"
    );
    ensure!(
        source.wal_now().await? > confirmed,
        "nothing was confirmed without Kafka"
    );
    assert_no_secret("relay's log", &text);
    Ok(())
}

/// Relays `n` events to `topic` over the OAuth listener and stops.
async fn relayed_topic(fixture: &Fixture, source: &Source, topic: &str, n: usize) -> Result<()> {
    fixture.kafka.create_topic(topic, 3)?;
    source
        .client
        .batch_execute(&format!(
            "SELECT count(walrelay.emit('{topic}', 'k' || (g % 5), \
             jsonb_build_object('id', 'c-' || g))) FROM generate_series(1, {n}) g"
        ))
        .await?;
    let mut relay = source.spawn_relay(fixture, &fixture.issuer.token_url(), &[])?;
    source.await_caught_up("relay.log").await?;
    sigterm(&mut relay)?;
    Ok(())
}

/// The consumer's librdkafka properties (Rust, Python) as NAME=VALUE,
/// the secret an `env:` reference.
fn consumer_properties(fixture: &Fixture) -> Result<Vec<String>> {
    Ok(fixture
        .client(CONSUMER, CONSUMER_SECRET, &fixture.issuer.token_url())?
        .librdkafka_oidc()
        .into_iter()
        .filter(|(k, _)| k != "bootstrap.servers")
        .map(|(k, v)| match k.as_str() {
            "sasl.oauthbearer.client.secret" => format!("{k}=env:{SECRET_ENV}"),
            _ => format!("{k}={v}"),
        })
        .collect())
}

/// Runs `consumer` (its output to `<db>.log`) on a new database `db` until
/// `count` (a `SELECT count(*), count(DISTINCT key) FROM t`) reaches `n`,
/// stops it with SIGTERM, and checks that it stopped cleanly, logged no
/// secret and applied each of the `n` events exactly once.
async fn applies_each_once(
    source: &Source,
    who: &str,
    mut consumer: Command,
    db: &str,
    count: &str,
    n: i64,
) -> Result<()> {
    source
        .client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    let log_name = format!("{db}.log");
    let log = std::fs::File::create(source.log_path(&log_name))?;
    let mut child = consumer
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let client = source.cluster.client_as("postgres", None, db).await?;
    let done = await_condition(WAIT, POLL, || async {
        Ok(rows(&client, count).await?.0 >= n)
    })
    .await;
    let status = sigterm(&mut child)?;
    let text = source.read_log(&log_name);
    done.with_context(|| format!("{log_name}:\n{text}"))?;
    ensure!(
        status.success(),
        "{log_name} stopped with {status:?}:\n{text}"
    );
    assert_no_secret(&log_name, &text);
    let (rows, distinct) = rows(&client, count).await?;
    ensure!(
        (rows, distinct) == (n, n),
        "{who}: {rows} rows, {distinct} keys"
    );
    Ok(())
}

/// `count` (a `SELECT count(*), count(DISTINCT x) FROM t`), or zeros while
/// the consumer has not created its table yet.
async fn rows(client: &tokio_postgres::Client, count: &str) -> Result<(i64, i64)> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&sql_table(count)])
        .await?
        .get(0);
    if !exists {
        return Ok((0, 0));
    }
    let row = client.query_one(count, &[]).await?;
    Ok((row.get(0), row.get(1)))
}

/// The table a `SELECT count(*), count(DISTINCT x) FROM t` reads.
fn sql_table(sql: &str) -> String {
    sql.rsplit(" FROM ").next().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_python_and_java_consumers_log_in_with_oauth_and_apply_exactly_once() -> Result<()>
{
    let Some((_turn, fixture)) = fixture().await? else {
        return Ok(());
    };
    const TOPIC: &str = "oauth-consumed";
    const N: i64 = 300;
    let source = Source::start().await?;
    relayed_topic(fixture, &source, TOPIC, N as usize).await?;
    let props = consumer_properties(fixture)?;
    let consumed_before = fixture.issuer.tokens_issued_to(CONSUMER);
    let dsn = |db: &str| {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={db}",
            source.cluster.port()
        )
    };

    // Rust: the crate's example, librdkafka's OIDC property names.
    let mut rust = Command::new(binary("examples/apply_events")?);
    rust.args(["--bootstrap", &fixture.secure(), "--topic", TOPIC])
        .args(["--dsn", &dsn("rust_app"), "--group", "oauth-rust"])
        .env(SECRET_ENV, CONSUMER_SECRET)
        .env("RUST_LOG", "warn");
    for p in &props {
        rust.args(["--kafka-property", p]);
    }
    let count = "SELECT count(*), count(DISTINCT idempotency_key) FROM applied_events";
    applies_each_once(&source, "Rust", rust, "rust_app", count, N).await?;

    // Python: confluent-kafka's own OIDC login.
    match python_interpreter()? {
        Some(python) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/examples/consumer.py");
            let mut py = Command::new(python);
            py.arg(script)
                .args(["--bootstrap", &fixture.secure(), "--topic", TOPIC])
                .args(["--dsn", &dsn("py_app"), "--group", "oauth-python"])
                .env(SECRET_ENV, CONSUMER_SECRET);
            for p in &props {
                py.args(["--kafka", p]);
            }
            let count = "SELECT count(*), count(DISTINCT event_key) FROM applied_events";
            applies_each_once(&source, "Python", py, "py_app", count, N).await?;
        }
        None => eprintln!("the Python consumer part skipped: no virtualenv"),
    }

    // Java: kafka-clients' OAuth login callback handler.
    match java_classpath("examples/plain-consumer")? {
        Some(classpath) => {
            let config = fixture.client(CONSUMER, CONSUMER_SECRET, &fixture.issuer.token_url())?;
            let url = format!(
                "jdbc:postgresql://127.0.0.1:{}/java_app?user=postgres",
                source.cluster.port()
            );
            let mut java = Command::new("java");
            java.arg(config.java_jvm_flag())
                .args(["-cp", &classpath, "io.walrelay.example.ApplyEvents"])
                .args(["--bootstrap", &fixture.secure(), "--topic", TOPIC])
                .args(["--jdbc-url", &url, "--group", "oauth-java"]);
            for (k, v) in config.java() {
                if k != "bootstrap.servers" {
                    java.args(["--kafka", &format!("{k}={v}")]);
                }
            }
            let count = "SELECT count(*), count(DISTINCT event_id) FROM java_applied_events";
            applies_each_once(&source, "Java", java, "java_app", count, N).await?;
        }
        None => eprintln!("the Java consumer part skipped: no classpath"),
    }
    let issued = fixture.issuer.tokens_issued_to(CONSUMER) - consumed_before;
    ensure!(issued >= 2, "{issued} tokens for the consumers");
    Ok(())
}
