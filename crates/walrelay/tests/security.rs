//! Production security: librdkafka's TLS and SASL support, the checks of
//! TLS/SASL settings at startup, Kafka secrets from files and environment
//! variables (never shown), and `walrelay run` as a least-privilege role
//! (docs/security.md).

mod support;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay::config::Config;
use walrelay::engine::pipeline;
use walrelay::engine::record::Record;
use walrelay::engine::sink::{KafkaSink, SinkError};
use walrelay::kafka::properties::SinkConfig;
use walrelay::kafka::ClientError;
use walrelay_oauth::OAuthError;
use walrelay_testkit::{read_topics, TestCa};

const PASSWORD: &str = "pa55-w0rd-never-shown";

fn sink_config(bootstrap: &str, properties: &[(&str, &str)]) -> SinkConfig {
    SinkConfig::new(
        bootstrap,
        properties
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

fn config_error(result: Result<(), ClientError>) -> (String, String) {
    match result {
        Err(ClientError::Config { property, reason }) => (property, reason),
        Err(ClientError::Login(OAuthError::Config { property, reason })) => (property, reason),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

/// Everything logged in this test binary, so that tests can check what
/// librdkafka reported and that no secret was logged. librdkafka logs from
/// its own threads, hence a global subscriber.
fn captured_logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&logs);
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || Capture(Arc::clone(&writer)))
            .try_init()
            .expect("the only subscriber in this test binary");
        logs
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs_text() -> String {
    String::from_utf8_lossy(&captured_logs().lock().unwrap()).into_owned()
}

#[test]
fn librdkafka_is_built_with_tls_and_sasl_scram() {
    let features = walrelay::kafka::policy::builtin_features();
    for needed in ["ssl", "sasl_plain", "sasl_scram", "sasl_oauthbearer"] {
        assert!(
            features.iter().any(|f| f == needed),
            "librdkafka lacks {needed}: {features:?}"
        );
    }
    // librdkafka refuses these settings when producers are created without
    // the features; nothing connects here (the port is closed).
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let config = sink_config(
            "127.0.0.1:1",
            &[
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", mechanism),
                ("sasl.username", "relay"),
                ("sasl.password", PASSWORD),
            ],
        );
        config.validate().unwrap();
        let sink = KafkaSink::new(&config).unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        drop(sink);
    }
    KafkaSink::new(&sink_config("127.0.0.1:1", &[("security.protocol", "SSL")])).unwrap();
}

#[test]
fn bad_tls_and_sasl_settings_name_the_property_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-ca.pem");
    let missing = missing.to_str().unwrap();
    let sasl = |mechanism: &'static str| {
        vec![
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", mechanism),
            ("sasl.username", "relay"),
            ("sasl.password", PASSWORD),
        ]
    };
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            sasl("SCRAM-SHA-1024"),
            "sasl.mechanism",
            "unknown SASL mechanism",
        ),
        (sasl("GSSAPI"), "sasl.mechanism", "not built into"),
        (
            sasl("OAUTHBEARER"),
            "sasl.oauthbearer.method",
            "needs a token provider",
        ),
        (
            vec![("security.protocol", "TLS")],
            "security.protocol",
            "use PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        ),
        (
            vec![("security.protocol", "SASL_SSL")],
            "sasl.mechanism",
            "needs a SASL mechanism",
        ),
        (
            vec![
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("sasl.password", PASSWORD),
            ],
            "sasl.username",
            "needs sasl.username and sasl.password",
        ),
        (
            vec![("sasl.username", "relay"), ("sasl.password", PASSWORD)],
            "sasl.password",
            "no SASL authentication happens",
        ),
        (
            vec![("ssl.ca.location", "/etc/ssl/certs")],
            "ssl.ca.location",
            "does not use TLS",
        ),
        (
            vec![("security.protocol", "SSL"), ("ssl.ca.location", missing)],
            "ssl.ca.location",
            "cannot read",
        ),
    ];
    for (props, property, needle) in cases {
        let (got_property, reason) = config_error(sink_config("127.0.0.1:1", &props).validate());
        assert_eq!(got_property, property, "{props:?}: {reason}");
        assert!(reason.contains(needle), "{props:?}: {reason}");
        assert!(!reason.contains(PASSWORD), "{reason}");
        // Creating the producer fails the same way, except for properties
        // the protocol ignores: only a warning there.
        let created = KafkaSink::new(&sink_config("127.0.0.1:1", &props));
        if needle.contains("no SASL") || needle.contains("does not use TLS") {
            assert!(created.is_ok(), "{props:?}");
            continue;
        }
        let err = created.unwrap_err();
        assert!(err.to_string().contains(property), "{err}");
        assert!(!err.to_string().contains(PASSWORD), "{err}");
    }
    // The same mistakes stop the whole configuration, naming the option
    // (except for files, which only `run` reads).
    let mut config = Config::default();
    config.kafka.properties = sasl("SCRAM-SHA-1024")
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("kafka.properties.\"sasl.mechanism\"") && err.contains("unknown SASL"),
        "{err}"
    );
    assert!(!err.contains(PASSWORD), "{err}");
    // An OAuth login without a provider, likewise.
    config.kafka.properties = sasl("OAUTHBEARER")
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("kafka.properties.\"sasl.oauthbearer.method\"")
            && err.contains("needs a token provider"),
        "{err}"
    );
}

#[test]
fn secrets_come_from_files_and_environment_and_are_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("kafka-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let key_password = "key-pa55-never-shown";
    // A variable only this test uses.
    std::env::set_var("WALRELAY_SECURITY_TEST_KEY_PASSWORD", key_password);

    let file_ref = format!("file:{}", password_file.display());
    let toml = format!(
        "[postgres]\nurl = \"postgresql://relay:pg-pa55-never-shown@db.example/app\"\n\n\
         [kafka]\nbootstrap_servers = \"127.0.0.1:1\"\n\n[kafka.properties]\n\
         \"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"SCRAM-SHA-512\"\n\
         \"sasl.username\" = \"relay\"\n\"sasl.password\" = {file_ref:?}\n\
         \"ssl.key.password\" = \"env:WALRELAY_SECURITY_TEST_KEY_PASSWORD\"\n\
         \"ssl.keystore.password\" = \"literal-secret-never-shown\"\n"
    );
    let config = Config::from_toml(&toml, "test").unwrap();
    config.validate().unwrap();
    let secrets = [
        PASSWORD,
        key_password,
        "pg-pa55-never-shown",
        "literal-secret-never-shown",
    ];

    // Resolved for librdkafka.
    let sink = SinkConfig::new(
        &config.kafka.bootstrap_servers,
        config.kafka.properties.clone(),
    );
    let props = sink.effective_properties().unwrap();
    assert_eq!(props["sasl.password"], PASSWORD);
    assert_eq!(props["ssl.key.password"], key_password);
    sink.validate().unwrap();

    // Never shown: Debug of every configuration type, `walrelay config`.
    let rendered = walrelay::config::render(&config);
    for shown in [
        format!("{config:?}"),
        format!("{:?}", config.kafka),
        format!("{:?}", config.postgres),
        format!("{sink:?}"),
        format!("{:?}", walrelay::secrets::redact(&props)),
        rendered.clone(),
    ] {
        for secret in secrets {
            assert!(!shown.contains(secret), "{secret} shown in:\n{shown}");
        }
    }
    // References are shown as written: they say where the secret is.
    assert!(rendered.contains(&file_ref), "{rendered}");
    assert!(
        rendered.contains("env:WALRELAY_SECURITY_TEST_KEY_PASSWORD"),
        "{rendered}"
    );
    // What `walrelay config` prints parses again.
    Config::from_toml(&rendered, "rendered").unwrap();

    // Failed resolution names the property and where it looked.
    let broken = |name: &str, value: &str| {
        let mut p: BTreeMap<String, String> = config.kafka.properties.clone();
        p.insert(name.to_owned(), value.to_owned());
        config_error(SinkConfig::new("127.0.0.1:1", p).validate())
    };
    let (property, reason) = broken("ssl.key.password", "env:WALRELAY_SECURITY_TEST_UNSET");
    assert_eq!(property, "ssl.key.password");
    assert!(
        reason.contains("WALRELAY_SECURITY_TEST_UNSET is not set"),
        "{reason}"
    );
    let gone = dir.path().join("gone");
    let (property, reason) = broken("sasl.password", &format!("file:{}", gone.display()));
    assert_eq!(property, "sasl.password");
    assert!(reason.contains(&gone.display().to_string()), "{reason}");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let (_, reason) = broken("sasl.password", &format!("file:{}", empty.display()));
    assert!(reason.contains("is empty"), "{reason}");
    for secret in secrets {
        assert!(!reason.contains(secret), "{reason}");
    }
    // librdkafka's own rejection of a secret property's value.
    let (property, reason) = broken("sasl.oauthbearer.client.secret", PASSWORD);
    assert_eq!(property, "sasl.oauthbearer.client.secret");
    assert!(!reason.contains(PASSWORD), "{reason}");
    eprintln!("librdkafka about sasl.oauthbearer.client.secret: {reason}");

    // The binary's `walrelay config` output and errors.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args([
            "--postgres-url",
            "postgresql://relay:pg-pa55-never-shown@db/app",
        ])
        .args(["--bootstrap-servers", "127.0.0.1:1"])
        .args(["--kafka-property", "security.protocol=SASL_SSL"])
        .args(["--kafka-property", "sasl.mechanism=PLAIN"])
        .args(["--kafka-property", "sasl.username=relay"])
        .args(["--kafka-property", &format!("sasl.password={PASSWORD}")])
        .arg("config")
        .env_remove("WALRELAY_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("\"sasl.password\" = \"<redacted>\""),
        "{stdout}"
    );
    for secret in secrets {
        assert!(
            !stdout.contains(secret) && !stderr.contains(secret),
            "{stdout}\n{stderr}"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(["--bootstrap-servers", "127.0.0.1:1"])
        .args(["--kafka-property", "security.protocol=SASL_SSL"])
        .args(["--kafka-property", "sasl.mechanism=SCRAM-SHA-999"])
        .args(["--kafka-property", "sasl.username=relay"])
        .args(["--kafka-property", &format!("sasl.password={PASSWORD}")])
        .arg("config")
        .env_remove("WALRELAY_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("sasl.mechanism") && stderr.contains("unknown SASL mechanism"),
        "{stderr}"
    );
    assert!(!stderr.contains(PASSWORD), "{stderr}");
}

/// A TLS endpoint that completes handshakes and then never speaks Kafka.
/// Counts handshakes that succeeded and that failed.
struct TlsEndpoint {
    port: u16,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsEndpoint {
    async fn start(ca: &TestCa) -> Result<TlsEndpoint> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let material = ca.server_cert(&["127.0.0.1", "localhost"])?;
        let certs = CertificateDer::pem_slice_iter(material.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(material.key_pem.as_bytes())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let (ok2, failed2) = (Arc::clone(&ok), Arc::clone(&failed));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let (ok, failed) = (Arc::clone(&ok2), Arc::clone(&failed2));
                tokio::spawn(async move {
                    match acceptor.accept(tcp).await {
                        Ok(mut tls) => {
                            ok.fetch_add(1, Ordering::SeqCst);
                            // Read and ignore whatever the client sends.
                            let mut buf = [0u8; 4096];
                            use tokio::io::AsyncReadExt;
                            while matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {}
                        }
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        Ok(TlsEndpoint {
            port,
            ok,
            failed,
            task,
        })
    }
}

impl Drop for TlsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_broker_certificate_against_ssl_ca_location() -> Result<()> {
    captured_logs();
    let dir = tempfile::tempdir()?;
    let broker_ca = TestCa::new("walrelay test broker CA")?;
    let other_ca = TestCa::new("some other CA")?;
    let broker_ca_path = dir.path().join("broker-ca.pem");
    let other_ca_path = dir.path().join("other-ca.pem");
    broker_ca.write_cert(&broker_ca_path)?;
    other_ca.write_cert(&other_ca_path)?;
    let password_file = dir.path().join("password");
    std::fs::File::create(&password_file)?.write_all(PASSWORD.as_bytes())?;
    let endpoint = TlsEndpoint::start(&broker_ca).await?;
    let bootstrap = format!("127.0.0.1:{}", endpoint.port);
    let file_ref = format!("file:{}", password_file.display());
    let props = |ca: &std::path::Path| -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL".to_owned()),
            ("sasl.mechanism", "SCRAM-SHA-512".to_owned()),
            ("sasl.username", "relay".to_owned()),
            ("sasl.password", file_ref.clone()),
            ("ssl.ca.location", ca.display().to_string()),
            ("message.timeout.ms", "2000".to_owned()),
            ("debug", "security,broker".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    let record = Record {
        topic: Arc::from("secure"),
        key: Some(Bytes::from_static(b"k")),
        value: Some(Bytes::from_static(b"v")),
        headers: Vec::new(),
        event_key: walrelay::engine::key::EventKey::new(1, 0),
        timestamp_ms: None,
    };

    // The right CA: the TLS handshake completes (the endpoint then never
    // answers the Kafka protocol).
    let config = SinkConfig::new(&bootstrap, props(&broker_ca_path).into_iter().collect());
    let sink = KafkaSink::new(&config)?;
    wait_for("a TLS handshake with the right CA", || {
        endpoint.ok.load(Ordering::SeqCst) > 0
    })
    .await?;
    drop(sink);
    let failed_before = endpoint.failed.load(Ordering::SeqCst);

    // The wrong CA: librdkafka refuses the certificate, and the record is
    // never delivered (it waits until the session's delivery deadline
    // stops the producer, here at once).
    let config = SinkConfig::new(&bootstrap, props(&other_ca_path).into_iter().collect());
    let mut sink = KafkaSink::new(&config)?;
    sink.send(0, &record, 0)?;
    wait_for("a refused TLS handshake", || {
        endpoint.failed.load(Ordering::SeqCst) > failed_before
    })
    .await?;
    sink.stop_sending();
    let delivery = tokio::time::timeout(Duration::from_secs(30), sink.next_delivery())
        .await
        .context("no delivery report")?;
    let err = delivery
        .result
        .expect_err("delivered through a TLS endpoint with the wrong CA");
    assert!(matches!(err, SinkError::Delivery { .. }), "{err}");
    drop(sink);
    let logs = logs_text();
    assert!(
        logs.contains("certificate verify failed") || logs.contains("SSL handshake failed"),
        "librdkafka did not report the TLS failure:\n{logs}"
    );
    assert!(!logs.contains(PASSWORD), "the password was logged:\n{logs}");
    Ok(())
}

async fn run_relay(
    config: Config,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), pipeline::RelayError>>,
) {
    let (stop, stop_rx) = watch::channel(false);
    let task = tokio::spawn(pipeline::run(config, stop_rx, None));
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_works_as_a_login_replication_role_without_other_privileges() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let admin = env.config(&bootstrap);
    // `setup` as the superuser (docs/security.md gives the least privileges
    // it needs).
    walrelay::commands::setup::setup(&admin).await?;
    // docs/security.md, "The role for `walrelay run`".
    env.client
        .batch_execute(
            "CREATE ROLE walrelay_run WITH LOGIN REPLICATION;
             GRANT CONNECT ON DATABASE postgres TO walrelay_run;",
        )
        .await?;
    let row = env
        .client
        .query_one(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolbypassrls,
                    has_table_privilege('walrelay_run', 'public.outbox', 'SELECT'),
                    has_schema_privilege('walrelay_run', 'walrelay', 'USAGE')
               FROM pg_roles WHERE rolname = 'walrelay_run'",
            &[],
        )
        .await?;
    for i in 0..6 {
        assert!(!row.get::<_, bool>(i), "walrelay_run has privilege #{i}");
    }

    let mut config = admin.clone();
    config.postgres.url = format!(
        "{}?sslmode=disable",
        env.cluster.url("walrelay_run", "postgres")
    );
    config.validate()?;
    let (stop, task) = run_relay(config).await;

    // The application (here the superuser) publishes in all three ways.
    let c = &env.client;
    for t in 0..5 {
        c.batch_execute(&format!(
            "BEGIN;
             SELECT count(walrelay.emit('secured', 'k-' || g, jsonb_build_object('t', {t}, 'g', g))) FROM generate_series(1, 20) g;
             SELECT pg_logical_emit_message(true, 'orders', 'raw-{t}');
             INSERT INTO outbox VALUES ('e-{t}', 'secorder', 'o-{t}', 'OrderCreated', '{{}}', NULL);
             COMMIT;"
        ))
        .await?;
    }
    let expected = 5 * (20 + 1 + 1);
    let records = read_topics(
        &bootstrap,
        &["secured", "orders", "outbox.event.secorder"],
        expected,
        WAIT,
    )
    .await?;
    assert_eq!(records.len(), expected, "records: {records:#?}");
    let (fresh, duplicates) = support::apply_high_water_marks(&records)?;
    assert_eq!(duplicates, 0);
    assert_eq!(fresh.values().map(Vec::len).sum::<usize>(), expected);

    // It really streamed as walrelay_run.
    let user: String = env
        .client
        .query_one(
            "SELECT usename::text FROM pg_stat_replication WHERE application_name IS NOT NULL LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(user, "walrelay_run");

    stop.send(true)?;
    tokio::time::timeout(Duration::from_secs(60), task).await???;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_replication_gets_an_actionable_error() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let admin = env.config(&bootstrap);
    walrelay::commands::setup::setup(&admin).await?;
    env.client
        .batch_execute("CREATE ROLE walrelay_norepl WITH LOGIN;")
        .await?;
    let mut config = admin.clone();
    config.postgres.url = format!(
        "{}?sslmode=disable",
        env.cluster.url("walrelay_norepl", "postgres")
    );
    let (_stop, task) = run_relay(config).await;
    let err = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .context("the relay kept retrying instead of stopping")??
        .expect_err("relayed without the REPLICATION attribute");
    let message = err.to_string();
    assert!(message.contains("WITH REPLICATION"), "{message}");
    Ok(())
}
