//! Security on a real broker: Apache Kafka 4 with a SASL_SSL listener
//! (SCRAM-SHA-512, a certificate from a test CA) and the standard
//! authorizer, every principal holding only the ACLs it needs:
//!
//! | principal | ACLs | client |
//! |---|---|---|
//! | `relay` | Write and Read on its topic | `walrelay run` (producer, tail fence, `/readyz` probe) |
//! | `auditor` | Read on the topic | `walrelay verify` |
//! | `consumer` | Read on the topic, Read on its group | the Rust and the Python consumer loops |
//!
//! Read and Write imply Describe, so no Describe ACL is granted; the
//! idempotent producer needs no IdempotentWrite on the cluster (Kafka 2.8
//! and later authorize it with Write on a topic); the tail fence and
//! `verify` read without a group. Taking any one of these ACLs away gives
//! an error naming it and the fix, and the relay confirms nothing while
//! it lasts. `docs/security.md#acls` lists what this measures.
//!
//! Kafka-only: runs with `WALRELAY_BROKER=kafka` (the Apache Kafka stage
//! of `scripts/test.sh`), on one secured node of its own that the tests
//! share one at a time, each with topics and groups of its own. The Python
//! consumer runs with the interpreter `$WALRELAY_PYTHON` names (or the
//! virtualenv `scripts/install-python-venv.sh` makes); without one the
//! Python part fails under `CI=true` and is skipped, saying so, elsewhere.

mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use rdkafka::ClientConfig;
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay_consumer::{ConsumerLoop, Database, Delivery, PgHwmStore};
use walrelay_testkit::{
    await_condition, python_interpreter, read_topics, AclOperation, AclResource, BrokerKind,
    ClusterOptions, KafkaCluster, KafkaOptions, KafkaSecurity, ScramUser, TestCa,
};

use AclOperation::{Read as READ, Write as WRITE};

const RELAY: &str = "relay";
/// A relay principal of the missing-ACL test alone: what it is refused
/// depends on its ACLs on other topics too.
const GUARDED: &str = "guarded-relay";
const AUDITOR: &str = "auditor";
const CONSUMER: &str = "consumer";
/// Passwords that must never show in a log.
const RELAY_PASSWORD: &str = "relay-scram-pw-2b7e151628aed2a6";
const GUARDED_PASSWORD: &str = "guarded-scram-pw-3243f6a8885a308d";
const AUDITOR_PASSWORD: &str = "auditor-scram-pw-abf7158809cf4f3c";
const CONSUMER_PASSWORD: &str = "consumer-scram-pw-762e7160f38b4da5";
const POLL: Duration = Duration::from_millis(50);

/// The secured node and the files its clients use.
struct Node {
    kafka: KafkaCluster,
    dir: tempfile::TempDir,
}

impl Node {
    fn start() -> Result<Node> {
        let ca = TestCa::new("walrelay test Kafka CA")?;
        let security = KafkaSecurity::new(
            &ca,
            vec![
                ScramUser::new(RELAY, RELAY_PASSWORD),
                ScramUser::new(GUARDED, GUARDED_PASSWORD),
                ScramUser::new(AUDITOR, AUDITOR_PASSWORD),
                ScramUser::new(CONSUMER, CONSUMER_PASSWORD),
            ],
        )?;
        let kafka = KafkaCluster::start(KafkaOptions {
            security: Some(security),
            ..Default::default()
        })?;
        let dir = tempfile::tempdir()?;
        ca.write_cert(&dir.path().join("ca.pem"))?;
        TestCa::new("walrelay test Kafka CA")?.write_cert(&dir.path().join("wrong-ca.pem"))?;
        for (user, password) in [
            (RELAY, RELAY_PASSWORD),
            (GUARDED, GUARDED_PASSWORD),
            (AUDITOR, AUDITOR_PASSWORD),
            (CONSUMER, CONSUMER_PASSWORD),
        ] {
            std::fs::write(dir.path().join(format!("{user}.password")), password)?;
        }
        Ok(Node { kafka, dir })
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
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

    fn grant(&self, user: &str, resource: &AclResource, ops: &[AclOperation]) -> Result<()> {
        self.kafka.grant(&format!("User:{user}"), resource, ops)
    }

    fn revoke(&self, user: &str, resource: &AclResource, ops: &[AclOperation]) -> Result<()> {
        self.kafka.revoke(&format!("User:{user}"), resource, ops)
    }

    /// librdkafka properties of `user`, the password given as is.
    fn properties(&self, user: &str, ca: &Path) -> Vec<(String, String)> {
        let password = std::fs::read_to_string(self.dir.path().join(format!("{user}.password")))
            .expect("written at start");
        vec![
            ("security.protocol".into(), "SASL_SSL".into()),
            ("sasl.mechanism".into(), "SCRAM-SHA-512".into()),
            ("sasl.username".into(), user.into()),
            ("sasl.password".into(), password),
            ("ssl.ca.location".into(), ca.display().to_string()),
        ]
    }

    /// `--kafka-property` flags of walrelay for `user`, the password as a
    /// `file:` reference.
    fn walrelay_flags(&self, user: &str, ca: &Path) -> Vec<String> {
        let file = self.dir.path().join(format!("{user}.password"));
        self.properties(user, ca)
            .into_iter()
            .flat_map(|(k, v)| {
                let v = if k == "sasl.password" {
                    format!("file:{}", file.display())
                } else {
                    v
                };
                ["--kafka-property".to_owned(), format!("{k}={v}")]
            })
            .collect()
    }
}

static NODE: OnceLock<Node> = OnceLock::new();
/// One test at a time on the node.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shared node, started by the first test, and the turn to use it;
/// `None` when the tests do not run on Apache Kafka.
async fn node() -> Result<Option<(tokio::sync::MutexGuard<'static, ()>, &'static Node)>> {
    if BrokerKind::from_env()? != BrokerKind::Kafka {
        eprintln!("skipped: Apache Kafka only (WALRELAY_BROKER=kafka, scripts/test.sh)");
        return Ok(None);
    }
    let turn = SERIAL.lock().await;
    if NODE.get().is_none() {
        let node = tokio::task::spawn_blocking(Node::start).await??;
        let _ = NODE.set(node);
    }
    Ok(Some((turn, NODE.get().expect("set above"))))
}

// ---------------------------------------------------------------- relay

/// Everything a relay writes goes to `topic` (raw messages of prefix
/// `orders`); quick restarts after a failed session.
struct Relay {
    child: Child,
    log: PathBuf,
    metrics: SocketAddr,
}

fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

fn start_relay(
    env: &Env,
    node: &Node,
    user: &str,
    topic: &str,
    dir: &Path,
    name: &str,
) -> Result<Relay> {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, "[relay]\nmax_backoff = \"1s\"\n")?;
    let log = dir.join(format!("{name}.log"));
    let metrics = free_addr()?;
    let mut args: Vec<String> = vec![
        "--config".into(),
        config.display().to_string(),
        "--outbox-table".into(),
        "public.outbox".into(),
        "--route".into(),
        format!("orders={topic}"),
        "--metrics-addr".into(),
        metrics.to_string(),
        "--log".into(),
        "info".into(),
    ];
    args.extend(node.walrelay_flags(user, &node.ca()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = support::spawn_relay(env, &node.secure(), &log, &args)?;
    Ok(Relay {
        child,
        log,
        metrics,
    })
}

impl Relay {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM and a clean exit.
    fn stop(mut self) -> Result<String> {
        ensure!(Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?
            .success());
        let exit = self.child.wait()?;
        let log = self.log();
        ensure!(exit.success(), "graceful stop exits 0, got {exit:?}: {log}");
        Ok(log)
    }

    /// `/readyz`: status and body.
    fn readyz(&self) -> Result<(u16, String)> {
        support::http_get(self.metrics, "/readyz")
    }

    /// Waits until `/readyz` answers `status` with a body holding `text`.
    async fn await_readyz(&self, status: u16, text: &str) -> Result<String> {
        let mut last = None;
        let found = await_condition(WAIT, POLL, || {
            let answer = self.readyz();
            let hit = matches!(&answer, Ok((s, b)) if *s == status && b.contains(text));
            last = Some(answer.map_err(|e| e.to_string()));
            async move { Ok(hit) }
        })
        .await;
        found.with_context(|| {
            format!(
                "waiting for /readyz {status} with {text:?}, last answer {last:?}; log:\n{}",
                self.log()
            )
        })?;
        Ok(last
            .and_then(Result::ok)
            .map(|(_, b)| b)
            .unwrap_or_default())
    }
}

/// `n` raw messages of prefix `orders`, one transaction.
async fn emit(env: &Env, tag: &str, n: usize) -> Result<()> {
    env.client
        .batch_execute(&format!(
            "SELECT pg_logical_emit_message(true, 'orders', '{tag}-' || g) FROM generate_series(1, {n}) g"
        ))
        .await?;
    Ok(())
}

async fn await_confirmed(env: &Env, relay: &Relay, at_least: walrelay_pgoutput::Lsn) -> Result<()> {
    await_condition(WAIT, POLL, || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= at_least)
    })
    .await
    .with_context(|| {
        format!(
            "the relay did not confirm {at_least}; log:\n{}",
            relay.log()
        )
    })
}

async fn env_with_slot(node: &Node) -> Result<Env> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    walrelay::commands::setup::setup(&env.config(&node.secure())).await?;
    Ok(env)
}

// --------------------------------------------------------------- verify

fn verify(node: &Node, user: &str, ca: &Path, topic: &str) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--bootstrap-servers", &node.secure()])
        .args(node.walrelay_flags(user, ca))
        .args(["verify", "--topic", topic, "--idle-timeout", "2s"])
        .env_remove("WALRELAY_POSTGRES_URL")
        .env_remove("WALRELAY_CONFIG")
        .env("WALRELAY_LOG", "warn")
        .output()
        .context("running walrelay verify")
}

fn describe(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// -------------------------------------------------------- Rust consumer

/// What the consumer loop logs (tracing), for the tests to read.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured_logs() -> String {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Capture)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .try_init();
    });
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

async fn create_database(env: &Env, name: &str) -> Result<String> {
    env.client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    Ok(format!(
        "{}?sslmode=disable",
        env.cluster.url("postgres", name)
    ))
}

/// The Rust consumer loop as `consumer` in `group`, applying each record
/// as a row of `rust_applied`, until `stop`.
async fn rust_consumer(
    node: &Node,
    dsn: &str,
    topic: &str,
    group: &str,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let database = Database::from_dsn(dsn)?;
    let client = database.connect().await?;
    walrelay_consumer::migrate(&client).await?;
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS rust_applied (event_key text PRIMARY KEY)")
        .await?;
    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", node.secure())
        .set("group.id", group);
    for (k, v) in node.properties(CONSUMER, &node.ca()) {
        kafka.set(k, v);
    }
    let consumer = ConsumerLoop::new(kafka, &[topic], PgHwmStore::new(), database)?;
    Ok(tokio::spawn(async move {
        consumer
            .run_batches(
                async |tx: &tokio_postgres::Transaction<'_>, batch: &[Delivery<'_>]| {
                    let keys: Vec<String> = batch.iter().map(|d| d.meta.key.to_hex()).collect();
                    tx.execute(
                        "INSERT INTO rust_applied SELECT unnest($1::text[])",
                        &[&keys],
                    )
                    .await?;
                    Ok::<(), tokio_postgres::Error>(())
                },
                stop,
            )
            .await?;
        Ok(())
    }))
}

async fn count_rows(dsn: &str, table: &str) -> Result<i64> {
    let (client, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0))
}

// ------------------------------------------------------ Python consumer

/// `python/examples/consumer.py` as `consumer` in `group`, its output in
/// `log`.
fn python_consumer(
    python: &Path,
    node: &Node,
    dsn: &str,
    topic: &str,
    group: &str,
    log: &Path,
) -> Result<Child> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/examples/consumer.py");
    let log = std::fs::File::create(log)?;
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .args(["--bootstrap", &node.secure(), "--topic", topic])
        .args(["--dsn", dsn, "--group", group]);
    for (k, v) in node.properties(CONSUMER, &node.ca()) {
        cmd.args(["--kafka", &format!("{k}={v}")]);
    }
    Ok(cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}

fn sigterm(child: &mut Child) -> Result<std::process::ExitStatus> {
    ensure!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()?
        .success());
    Ok(child.wait()?)
}

fn assert_no_password(what: &str, text: &str) {
    for password in [
        RELAY_PASSWORD,
        GUARDED_PASSWORD,
        AUDITOR_PASSWORD,
        CONSUMER_PASSWORD,
    ] {
        assert!(
            !text.contains(password),
            "a password in the {what}:\n{text}"
        );
    }
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_verify_and_both_consumers_work_with_only_their_acls() -> Result<()> {
    let Some((_turn, node)) = node().await? else {
        return Ok(());
    };
    let began = std::time::Instant::now();
    let topic = "secured-orders";
    let topic_acl = AclResource::topic(topic);
    node.kafka.create_topic(topic, 2)?;
    // The relay: Write (producer) and Read (tail fence) on its topic.
    node.grant(RELAY, &topic_acl, &[WRITE, READ])?;
    // And Read and Write on the source record's topic (which `setup`
    // creates, with Create, as an administrator here).
    let sources = walrelay::config::DEFAULT_SOURCE_RECORD_TOPIC;
    node.kafka.create_topic(sources, 1)?;
    node.grant(RELAY, &AclResource::topic(sources), &[WRITE, READ])?;
    node.grant(AUDITOR, &topic_acl, &[READ])?;
    node.grant(CONSUMER, &topic_acl, &[READ])?;
    node.grant(CONSUMER, &AclResource::group("rust-app"), &[READ])?;
    node.grant(CONSUMER, &AclResource::group("py-app"), &[READ])?;
    for user in [RELAY, AUDITOR, CONSUMER] {
        assert!(
            node.kafka
                .allowed(&format!("User:{user}"), &AclResource::Cluster)?
                .is_empty(),
            "no cluster ACL"
        );
    }

    let env = env_with_slot(node).await?;
    let dir = tempfile::tempdir()?;
    emit(&env, "a", 10).await?;
    let end = env.current_wal_lsn().await?;
    let relay = start_relay(&env, node, RELAY, topic, dir.path(), "relay")?;
    await_confirmed(&env, &relay, end).await?;
    relay.await_readyz(200, "ready").await?;
    let records = read_topics(&node.admin(), &[topic], 10, WAIT).await?;
    assert_eq!(records.len(), 10);
    // A second session reads the tails (the fence) before writing more.
    let relay_log = relay.stop()?;
    emit(&env, "b", 5).await?;
    let end = env.current_wal_lsn().await?;
    let relay = start_relay(&env, node, RELAY, topic, dir.path(), "relay")?;
    await_confirmed(&env, &relay, end).await?;
    relay.await_readyz(200, "ready").await?;
    let relay_log = relay_log + &relay.stop()?;
    assert!(relay_log.contains("tail fence"), "{relay_log}");
    assert!(!relay_log.contains("denied"), "{relay_log}");
    // The first session wrote the source record, the second read it.
    assert!(
        relay_log.contains("source record: the server has the WAL of the last recorded event")
            && !relay_log.contains("source record unavailable")
            && !relay_log.contains("cannot write the source record"),
        "{relay_log}"
    );
    assert_no_password("relay's log", &relay_log);
    let records = read_topics(&node.admin(), &[topic], 15, WAIT).await?;
    assert_eq!(records.len(), 15, "the fence wrote nothing twice");

    // walrelay verify as a principal that may only read.
    let out = verify(node, AUDITOR, &node.ca(), topic)?;
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_no_password("verify output", &describe(&out));

    // The Rust consumer.
    let rust_dsn = create_database(&env, "rust_app").await?;
    let mark = captured_logs().len();
    let (stop, stopped) = watch::channel(false);
    let consumer = rust_consumer(node, &rust_dsn, topic, "rust-app", stopped).await?;
    let applied = await_condition(WAIT, POLL, || async {
        Ok(count_rows(&rust_dsn, "rust_applied").await? == 15)
    })
    .await;
    stop.send(true)?;
    let result = consumer.await?;
    let logs = captured_logs()[mark..].to_owned();
    applied.with_context(|| format!("the Rust consumer applied all 15; logs:\n{logs}"))?;
    result.with_context(|| logs.clone())?;
    assert!(!logs.contains("Kafka consumer error"), "{logs}");
    assert_no_password("Rust consumer's logs", &logs);

    // The Python consumer.
    if let Some(python) = python_interpreter()? {
        let py_dsn = create_database(&env, "py_app").await?;
        let log = dir.path().join("python.log");
        let mut child = python_consumer(&python, node, &py_dsn, topic, "py-app", &log)?;
        let applied = await_condition(WAIT, POLL, || async {
            Ok(count_rows(&py_dsn, "applied_events").await? == 15)
        })
        .await;
        let exit = sigterm(&mut child)?;
        let output = std::fs::read_to_string(&log)?;
        applied.with_context(|| format!("the Python consumer applied all 15:\n{output}"))?;
        assert!(exit.success(), "{exit:?}: {output}");
        assert!(output.contains("stopped: 15 applied"), "{output}");
        assert!(!output.contains("Kafka consumer error"), "{output}");
        assert_no_password("Python consumer's output", &output);
    }
    println!(
        "least-privilege relay, verify and consumers in {:?}",
        began.elapsed()
    );
    Ok(())
}

/// Whether `text` names the missing ACL with the fix and the doc.
fn names_acl(text: &str, refused: &str, code: &str) -> bool {
    text.contains(&format!("Kafka denied {refused}"))
        && text.contains(&format!("({code})"))
        && text.contains("kafka-acls")
        && text.contains("docs/security.md#acls")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_missing_an_acl_names_it_confirms_nothing_and_resumes_once_granted() -> Result<()> {
    let Some((_turn, node)) = node().await? else {
        return Ok(());
    };
    let topic = "guarded-orders";
    let topic_acl = AclResource::topic(topic);
    node.kafka.create_topic(topic, 1)?;
    let env = env_with_slot(node).await?;
    let dir = tempfile::tempdir()?;
    let start = env.confirmed_flush_lsn("walrelay").await?;
    emit(&env, "a", 3).await?;
    let end = env.current_wal_lsn().await?;

    // Each case: the ACLs the relay has on its topic, whether it may write
    // to another topic, what the refusal names. Without Write on any topic
    // the idempotent producer is refused its producer id (InitProducerId)
    // before it writes anything; with Write elsewhere it gets an id and
    // its records are refused.
    let elsewhere = AclResource::topic("guarded-elsewhere");
    let write = format!("Write on topic \"{topic}\"");
    let read = format!("Read on topic \"{topic}\"");
    let describe = format!("Describe on topic \"{topic}\"");
    for (name, granted, write_elsewhere, refused, code) in [
        (
            "no-acl",
            &[][..],
            false,
            &describe,
            "TOPIC_AUTHORIZATION_FAILED",
        ),
        (
            "read-only",
            &[READ][..],
            false,
            &write,
            "CLUSTER_AUTHORIZATION_FAILED",
        ),
        (
            "read-write-elsewhere",
            &[READ][..],
            true,
            &write,
            "TOPIC_AUTHORIZATION_FAILED",
        ),
        (
            "write-only",
            &[WRITE][..],
            false,
            &read,
            "TOPIC_AUTHORIZATION_FAILED",
        ),
    ] {
        node.grant(GUARDED, &topic_acl, granted)?;
        if write_elsewhere {
            node.grant(GUARDED, &elsewhere, &[WRITE])?;
        }
        let relay = start_relay(&env, node, GUARDED, topic, dir.path(), name)?;
        let log_check = await_condition(WAIT, POLL, || async {
            Ok(names_acl(&relay.log(), refused, code))
        })
        .await;
        log_check.with_context(|| format!("{name}: the log names {refused}:\n{}", relay.log()))?;
        let body = relay
            .await_readyz(503, &format!("Kafka denied {refused}"))
            .await?;
        assert!(body.contains("docs/security.md#acls"), "{name}: {body}");
        assert_eq!(
            env.confirmed_flush_lsn("walrelay").await?,
            start,
            "{name}: nothing confirmed while denied"
        );
        let log = if name == "write-only" {
            // Granted while the relay retries: it resumes by itself.
            node.grant(GUARDED, &topic_acl, &[READ])?;
            await_confirmed(&env, &relay, end).await?;
            relay.await_readyz(200, "ready").await?;
            relay.stop()?
        } else {
            relay.stop()?
        };
        assert!(
            log.contains("relay session failed; restarting"),
            "{name}: {log}"
        );
        assert_no_password("relay's log", &log);
        for resource in [&topic_acl, &elsewhere] {
            let held = node.kafka.allowed(&format!("User:{GUARDED}"), resource)?;
            node.revoke(GUARDED, resource, &held)?;
        }
    }
    let records = read_topics(&node.admin(), &[topic], 3, WAIT).await?;
    assert_eq!(records.len(), 3);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_and_the_consumers_name_a_missing_acl_a_wrong_ca_and_a_wrong_password() -> Result<()>
{
    let Some((_turn, node)) = node().await? else {
        return Ok(());
    };
    let topic = "guarded-reads";
    let topic_acl = AclResource::topic(topic);
    node.kafka.create_topic(topic, 1)?;

    // walrelay verify without Read on the topic.
    let out = verify(node, AUDITOR, &node.ca(), topic)?;
    let text = describe(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        names_acl(
            &text,
            &format!("Read on topic \"{topic}\""),
            "TOPIC_AUTHORIZATION_FAILED"
        ),
        "{text}"
    );
    // A CA that did not sign the broker's certificate.
    let wrong_ca = node.dir.path().join("wrong-ca.pem");
    node.grant(AUDITOR, &topic_acl, &[READ])?;
    let out = verify(node, AUDITOR, &wrong_ca, topic)?;
    let text = describe(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("certificate verify failed"), "{text}");
    assert!(
        text.contains("walrelay verify: fetching metadata")
            && text.contains("the TLS handshake with the broker failed")
            && text.contains("ssl.ca.location names the CA"),
        "the final error says why: {text}"
    );
    eprintln!("walrelay verify with a wrong CA: {text}");
    assert_no_password("verify output", &text);
    // A wrong password (the auditor's flags with the consumer's file).
    std::fs::write(node.dir.path().join("impostor.password"), CONSUMER_PASSWORD)?;
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--bootstrap-servers", &node.secure()])
        .args(
            node.walrelay_flags(AUDITOR, &node.ca())
                .into_iter()
                .map(|f| f.replace(&format!("{AUDITOR}.password"), "impostor.password")),
        )
        .args(["verify", "--topic", topic, "--idle-timeout", "2s"])
        .env_remove("WALRELAY_CONFIG")
        .env("WALRELAY_LOG", "warn")
        .output()?;
    let text = describe(&out);
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("Kafka refused the login (SASL_AUTHENTICATION_FAILED)")
            && text.contains("sasl.password"),
        "{text}"
    );
    eprintln!("walrelay verify with a wrong password: {text}");
    assert_no_password("verify output", &text);

    // The consumers: first without Read on their groups, then without
    // Read on the topic.
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    let rust_dsn = create_database(&env, "rust_denied").await?;
    let py_dsn = create_database(&env, "py_denied").await?;
    let python = python_interpreter()?;
    let dir = tempfile::tempdir()?;
    let groups = [
        AclResource::group("rust-denied"),
        AclResource::group("py-denied"),
    ];
    for case in ["no-group", "no-topic"] {
        let granted: Vec<AclResource> = if case == "no-group" {
            vec![topic_acl.clone()]
        } else {
            groups.to_vec()
        };
        for resource in &granted {
            node.grant(CONSUMER, resource, &[READ])?;
        }
        let refused = |group: &str| match case {
            "no-group" => (
                format!("Read on group \"{group}\""),
                "GROUP_AUTHORIZATION_FAILED",
            ),
            _ => (
                format!("Read on topic \"{topic}\""),
                "TOPIC_AUTHORIZATION_FAILED",
            ),
        };

        let (rust_refused, code) = refused("rust-denied");
        let mark = captured_logs().len();
        let (stop, stopped) = watch::channel(false);
        let consumer = rust_consumer(node, &rust_dsn, topic, "rust-denied", stopped).await?;
        let named = await_condition(WAIT, POLL, || async {
            Ok(names_acl(&captured_logs()[mark..], &rust_refused, code))
        })
        .await;
        stop.send(true)?;
        let result = consumer.await?;
        let logs = captured_logs()[mark..].to_owned();
        named
            .with_context(|| format!("{case}: the Rust consumer names {rust_refused}:\n{logs}"))?;
        result.with_context(|| format!("{case}: the Rust consumer stops cleanly"))?;
        assert_no_password("Rust consumer's logs", &logs);

        if let Some(python) = &python {
            let (py_refused, code) = refused("py-denied");
            let log = dir.path().join(format!("{case}.log"));
            let mut child = python_consumer(python, node, &py_dsn, topic, "py-denied", &log)?;
            let named = await_condition(WAIT, POLL, || async {
                Ok(names_acl(
                    &std::fs::read_to_string(&log)?,
                    &py_refused,
                    code,
                ))
            })
            .await;
            let exit = sigterm(&mut child)?;
            let output = std::fs::read_to_string(&log)?;
            named.with_context(|| {
                format!("{case}: the Python consumer names {py_refused}:\n{output}")
            })?;
            assert!(exit.success(), "{case}: {exit:?}: {output}");
            assert_no_password("Python consumer's output", &output);
        }
        for resource in &granted {
            node.revoke(CONSUMER, resource, &[READ])?;
        }
    }
    Ok(())
}
