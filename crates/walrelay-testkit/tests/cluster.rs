//! Runs real PostgreSQL clusters (the binaries `PgBin::discover` finds).

use std::time::Duration;

use walrelay_testkit::{await_condition, Auth, ClusterOptions, PgCluster, TestCa};

async fn show(client: &tokio_postgres::Client, name: &str) -> anyhow::Result<String> {
    Ok(client
        .query_one(&format!("SHOW {name}"), &[])
        .await?
        .get::<_, String>(0))
}

#[tokio::test]
async fn default_cluster_is_logical_and_usable() -> anyhow::Result<()> {
    let pg = PgCluster::start(ClusterOptions::default())?;
    assert!(pg.version().contains("PostgreSQL"), "{}", pg.version());
    assert!(pg.major_version() >= 10);
    assert_eq!(pg.host(), "127.0.0.1");
    assert_eq!(
        pg.conninfo("postgres", "postgres"),
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            pg.port()
        )
    );
    assert_eq!(
        pg.url("postgres", "db"),
        format!("postgresql://postgres@127.0.0.1:{}/db", pg.port())
    );
    assert!(pg.data_dir().join("PG_VERSION").is_file());
    assert!(pg.log_path().is_file());

    let client = pg.client().await?;
    assert_eq!(show(&client, "wal_level").await?, "logical");
    assert_eq!(show(&client, "port").await?, pg.port().to_string());
    assert_eq!(show(&client, "fsync").await?, "off");
    assert_eq!(show(&client, "max_replication_slots").await?, "10");
    assert_eq!(show(&client, "ssl").await?, "off");
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t VALUES (1, 'a'), (2, 'b');",
        )
        .await?;
    let rows = client.query("SELECT v FROM t ORDER BY id", &[]).await?;
    let values: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(values, ["a", "b"]);

    // A logical slot works out of the box.
    client
        .batch_execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        .await?;

    // The blocking helper works from inside a runtime.
    pg.batch_execute_blocking("INSERT INTO t VALUES (3, 'c')")?;
    let n: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await?
        .get(0);
    assert_eq!(n, 3);
    Ok(())
}

#[tokio::test]
async fn two_clusters_at_once() -> anyhow::Result<()> {
    let a = PgCluster::start(ClusterOptions::default())?;
    let b = PgCluster::start(ClusterOptions::default().wal_level("replica"))?;
    assert_ne!(a.port(), b.port());
    assert_ne!(a.data_dir(), b.data_dir());
    let ca = a.client().await?;
    let cb = b.client().await?;
    ca.batch_execute("CREATE TABLE only_in_a (x int)").await?;
    assert_eq!(show(&cb, "wal_level").await?, "replica");
    assert!(cb.batch_execute("SELECT * FROM only_in_a").await.is_err());
    let dir = a.dir().to_path_buf();
    drop(ca);
    drop(a);
    if std::env::var_os(walrelay_testkit::KEEP_CLUSTER_ENV).is_none() {
        assert!(!dir.exists(), "{} should be removed on drop", dir.display());
    }
    Ok(())
}

#[tokio::test]
async fn scram_cluster_checks_passwords() -> anyhow::Result<()> {
    let pg = PgCluster::start(ClusterOptions::default().auth(Auth::scram("s3cret")))?;
    assert!(pg
        .client_as("postgres", Some("wrong"), "postgres")
        .await
        .is_err());
    assert!(pg.client_as("postgres", None, "postgres").await.is_err());
    let client = pg.client().await?;
    assert_eq!(show(&client, "password_encryption").await?, "scram-sha-256");
    client
        .batch_execute("CREATE ROLE app LOGIN PASSWORD 'app-pw'")
        .await?;
    pg.client_as("app", Some("app-pw"), "postgres").await?;
    assert!(pg.client_as("app", Some("nope"), "postgres").await.is_err());
    let stored: String = client
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'",
            &[],
        )
        .await?
        .get(0);
    assert!(stored.starts_with("SCRAM-SHA-256$"), "{stored}");
    Ok(())
}

#[tokio::test]
async fn md5_cluster_stores_md5() -> anyhow::Result<()> {
    let pg = PgCluster::start(ClusterOptions::default().auth(Auth::md5("pw")))?;
    assert!(pg
        .client_as("postgres", Some("bad"), "postgres")
        .await
        .is_err());
    let client = pg.client().await?;
    let stored: String = client
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'",
            &[],
        )
        .await?
        .get(0);
    assert!(stored.starts_with("md5"), "{stored}");
    Ok(())
}

#[tokio::test]
async fn stop_immediate_and_restart_keep_data() -> anyhow::Result<()> {
    let pg = PgCluster::start(ClusterOptions::default())?;
    let port = pg.port();
    {
        let client = pg.client().await?;
        client
            .batch_execute("CREATE TABLE kept (x int); INSERT INTO kept VALUES (42);")
            .await?;
    }
    pg.stop_immediate()?;
    assert!(!pg.is_running());
    assert!(pg.client().await.is_err());
    pg.restart()?;
    assert_eq!(pg.port(), port);
    let client = pg.client().await?;
    let x: i32 = client.query_one("SELECT x FROM kept", &[]).await?.get(0);
    assert_eq!(x, 42);
    assert!(
        pg.log_tail(200).contains("not properly shut down"),
        "expected crash recovery in the log:\n{}",
        pg.log_tail(30)
    );

    // Change a restart-only setting.
    pg.set_conf_and_restart(&[("wal_level", "replica"), ("max_wal_senders", "4")])?;
    let client = pg.client().await?;
    assert_eq!(show(&client, "wal_level").await?, "replica");
    assert_eq!(show(&client, "max_wal_senders").await?, "4");

    // A reloadable setting, awaited rather than slept on.
    pg.set_conf(&[("work_mem", "7MB")])?;
    pg.reload()?;
    await_condition(Duration::from_secs(20), Duration::from_millis(50), || {
        let client = &client;
        async move {
            // SHOW in a fresh transaction sees the reloaded value.
            Ok(show(client, "work_mem").await? == "7MB")
        }
    })
    .await?;

    pg.stop_fast()?;
    pg.restart()?;
    pg.client().await?;
    Ok(())
}

#[tokio::test]
async fn tls_cluster_has_ssl_on() -> anyhow::Result<()> {
    let ca = TestCa::new("walrelay test CA")?;
    let wrong_ca = TestCa::new("walrelay test CA")?;
    assert_ne!(ca.cert_pem(), wrong_ca.cert_pem());
    let tls = ca.server_cert(&["localhost", "127.0.0.1"])?;
    assert!(tls.cert_pem.contains("BEGIN CERTIFICATE"));
    assert!(tls.key_pem.contains("PRIVATE KEY"));

    let pg = PgCluster::start(ClusterOptions::default().tls(tls))?;
    let client = pg.client().await?;
    assert_eq!(show(&client, "ssl").await?, "on");
    // The server really offers TLS: ask with an SSLRequest packet.
    let mut sock = tokio::net::TcpStream::connect((pg.host(), pg.port())).await?;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    sock.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])
        .await?;
    let mut answer = [0u8; 1];
    sock.read_exact(&mut answer).await?;
    assert_eq!(answer[0], b'S');

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ca.crt");
    ca.write_cert(&path)?;
    assert_eq!(std::fs::read_to_string(&path)?, ca.cert_pem());
    Ok(())
}

#[test]
fn start_errors_carry_the_server_log() {
    // An invalid setting makes the server refuse to start.
    let err =
        PgCluster::start(ClusterOptions::default().conf("shared_buffers", "lots")).unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("server log"), "{text}");
    assert!(text.contains("shared_buffers"), "{text}");
}
