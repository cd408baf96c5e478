//! Connecting, authenticating, TLS, replication commands, and the errors a
//! user meets, against real PostgreSQL clusters.

use anyhow::{Context, Result};
use walrelay_pg::{
    Config, Error, PgOutputOptions, ReplicationConnection, RootCert, SlotStatus, SslMode,
    StreamOptions,
};
use walrelay_pgoutput::Lsn;
use walrelay_suite::{
    replication_config, test_db, test_db_with, ClusterOptions, Event, Session, TestDb, PUBLICATION,
    WAIT,
};
use walrelay_testkit::{Auth, TestCa};

fn with_password(db: &TestDb, user: &str, password: &str) -> Config {
    Config::parse(&db.cluster.conninfo(user, "postgres"))
        .unwrap()
        .sslmode(SslMode::Disable)
        .password(password)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identify_system_and_slot_lifecycle() -> Result<()> {
    let db = test_db().await?;
    let mut conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let id = conn.identify_system().await?;
    let expected = walrelay_testkit::db::system_identifier(&db.client).await?;
    assert_eq!(id.system_id, expected);
    assert_eq!(id.timeline, 1);
    assert_eq!(id.dbname.as_deref(), Some("postgres"));
    assert!(id.xlogpos > Lsn::ZERO);
    assert!(conn.server_version_num().unwrap() >= 150000);
    conn.check_wal_level().await?;
    conn.check_publications(&[PUBLICATION.to_owned()]).await?;

    assert_eq!(conn.slot_info("lifecycle").await?, None);
    let created = conn.ensure_slot("lifecycle").await?;
    assert!(matches!(created, SlotStatus::Created(_)), "{created:?}");
    let info = created.info().clone();
    assert_eq!(info.plugin.as_deref(), Some("pgoutput"));
    assert_eq!(info.slot_type, "logical");
    assert!(!info.active);
    assert!(info.confirmed_flush_lsn.is_some());
    // Idempotent: a second call finds it.
    assert!(matches!(
        conn.ensure_slot("lifecycle").await?,
        SlotStatus::Existed(_)
    ));
    conn.close().await?;

    // A physical slot of the same name is refused with an explanation.
    db.client
        .batch_execute("SELECT pg_create_physical_replication_slot('phys')")
        .await?;
    let mut conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let err = conn.ensure_slot("phys").await.unwrap_err().to_string();
    assert!(
        err.contains("not a logical pgoutput slot") && err.contains("pg_drop_replication_slot"),
        "{err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_md5_and_cleartext_authentication() -> Result<()> {
    // Superuser by SCRAM; two more roles whose pg_hba lines pick md5 and
    // cleartext password authentication.
    let opts = ClusterOptions::default()
        .auth(Auth::scram("s3cret-super"))
        .hba("host all md5user 127.0.0.1/32 md5")
        .hba("host all clearuser 127.0.0.1/32 password");
    let db = test_db_with(opts).await?;
    db.client
        .batch_execute(
            "SET password_encryption = 'md5';
             CREATE ROLE md5user LOGIN REPLICATION PASSWORD 'md5-pw';
             RESET password_encryption;
             CREATE ROLE clearuser LOGIN REPLICATION PASSWORD 'clear-pw';",
        )
        .await?;
    for (user, password) in [
        ("postgres", "s3cret-super"),
        ("md5user", "md5-pw"),
        ("clearuser", "clear-pw"),
    ] {
        let mut conn = ReplicationConnection::connect(&with_password(&db, user, password))
            .await
            .unwrap_or_else(|e| panic!("{user}: {e}"));
        assert!(!conn.identify_system().await?.system_id.is_empty());
    }

    // A wrong password: the server's SQLSTATE and words, and what to check.
    let err = ReplicationConnection::connect(&with_password(&db, "postgres", "wrong"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("28P01"), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("password authentication failed for user \"postgres\""),
        "{text}"
    );
    assert!(text.contains("PGPASSWORD"), "{text}");
    assert!(
        !text.contains("wrong"),
        "the password must not appear in errors: {text}"
    );

    // No password at all: said before the server has to refuse it.
    let no_pw = Config::parse(&db.cluster.conninfo("postgres", "postgres"))?
        .sslmode(SslMode::Disable)
        .passfile("/nonexistent/pgpass");
    let err = ReplicationConnection::connect(&no_pw)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no password is configured"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_against_a_cluster_with_its_own_ca() -> Result<()> {
    let ca = TestCa::new("walrelay test CA")?;
    let wrong_ca = TestCa::new("walrelay test CA")?;
    let opts = ClusterOptions::default()
        .auth(Auth::scram("tls-pw"))
        .tls(ca.server_cert(&["localhost", "127.0.0.1"])?)
        // Role `tlsonly` may connect over TLS only.
        .hba("hostnossl all tlsonly 127.0.0.1/32 reject");
    let db = test_db_with(opts).await?;
    db.client
        .batch_execute("CREATE ROLE tlsonly LOGIN REPLICATION PASSWORD 'tls-pw'")
        .await?;
    let dir = tempfile::tempdir()?;
    let (good, bad) = (dir.path().join("ca.pem"), dir.path().join("wrong.pem"));
    ca.write_cert(&good)?;
    wrong_ca.write_cert(&bad)?;

    let config = |mode: SslMode, root: Option<&std::path::Path>, host: &str| {
        let c = Config::parse(&format!(
            "host={host} port={} user=tlsonly dbname=postgres",
            db.cluster.port()
        ))
        .unwrap()
        .password("tls-pw")
        .sslmode(mode);
        match root {
            Some(r) => c.sslrootcert(RootCert::File(r.to_owned())),
            None => c,
        }
    };

    // verify-full with the right CA: encrypted, and SCRAM used channel
    // binding (the server offers SCRAM-SHA-256-PLUS over TLS).
    for host in ["localhost", "127.0.0.1"] {
        let mut conn =
            ReplicationConnection::connect(&config(SslMode::VerifyFull, Some(&good), host)).await?;
        assert!(conn.is_tls());
        let rows = conn
            .simple_query("SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .await?;
        assert_eq!(rows[0].get("ssl")?, Some("true"));
    }
    // require and prefer encrypt without a CA.
    for mode in [SslMode::Require, SslMode::Prefer] {
        assert!(
            ReplicationConnection::connect(&config(mode, None, "127.0.0.1"))
                .await?
                .is_tls()
        );
    }
    // verify-ca and verify-full fail against the wrong CA, naming the mode.
    for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
        let err = ReplicationConnection::connect(&config(mode, Some(&bad), "127.0.0.1"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Tls(_)), "{mode:?}: {err:?}");
    }
    // disable: the server refuses plaintext for this role, and the error
    // says where to look.
    let err = ReplicationConnection::connect(&config(SslMode::Disable, None, "127.0.0.1"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("28000"), "{err}");
    assert!(err.to_string().contains("pg_hba.conf"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_required_but_the_server_has_none() -> Result<()> {
    let db = test_db().await?;
    let c = replication_config(&db.cluster).sslmode(SslMode::Require);
    let err = ReplicationConnection::connect(&c).await.unwrap_err();
    assert!(matches!(err, Error::Tls(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("sslmode"),
        "the error names the setting: {text}"
    );
    // prefer falls back to plaintext.
    let c = c.sslmode(SslMode::Prefer);
    assert!(!ReplicationConnection::connect(&c).await?.is_tls());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_active_in_another_connection_is_explained() -> Result<()> {
    let db = test_db().await?;
    let _first = Session::open(&replication_config(&db.cluster), "busy_slot").await?;
    let conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let err = conn
        .start_replication(
            "busy_slot",
            Lsn::ZERO,
            &PgOutputOptions::new([PUBLICATION]),
            StreamOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("55006"), "{err}");
    assert!(err.is_transient());
    let text = err.to_string();
    assert!(
        text.contains("is active for PID") && text.contains("one connection at a time"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_level_replica_names_the_fix() -> Result<()> {
    let db = test_db_with(ClusterOptions::default().wal_level("replica")).await?;
    let mut conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let err = conn.check_wal_level().await.unwrap_err().to_string();
    assert!(err.contains("wal_level is 'replica'"), "{err}");
    assert!(
        err.contains("set wal_level=logical") && err.contains("restart PostgreSQL"),
        "{err}"
    );
    // Without the pre-check, the server's own error gets the same advice.
    let err = conn.ensure_slot("never").await.unwrap_err();
    assert_eq!(err.code(), Some("55000"), "{err}");
    assert!(err.to_string().contains("set wal_level=logical"), "{err}");
    Ok(())
}

/// A slot invalidated by `max_slot_wal_keep_size`: `ensure_slot` refuses
/// it, and START_REPLICATION's own error (55000) gets walrelay's advice and
/// is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_slot_is_refused_with_the_fix() -> Result<()> {
    let db = test_db_with(
        ClusterOptions::default()
            .conf("max_slot_wal_keep_size", "1MB")
            .conf("wal_keep_size", "0"),
    )
    .await?;
    let mut conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    conn.ensure_slot("doomed").await?;
    walrelay_testkit::await_condition(WAIT, std::time::Duration::from_millis(10), || async {
        db.client
            .batch_execute(
                "SELECT pg_logical_emit_message(true, 'p', 'x'); SELECT pg_switch_wal(); CHECKPOINT;",
            )
            .await?;
        let status: Option<String> = db
            .client
            .query_one(
                "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'doomed'",
                &[],
            )
            .await?
            .get(0);
        Ok(status.as_deref() == Some("lost"))
    })
    .await?;

    let err = conn.ensure_slot("doomed").await.unwrap_err().to_string();
    assert!(
        err.contains("is invalidated (wal_status = lost)")
            && err.contains("events in the lost WAL cannot be recovered"),
        "{err}"
    );
    let err = conn
        .start_replication(
            "doomed",
            Lsn::ZERO,
            &PgOutputOptions::new([PUBLICATION]),
            StreamOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some("55000"), "{err}");
    assert!(!err.is_transient(), "{err}");
    let text = err.to_string();
    for part in [
        "replication slot \"doomed\"",
        "invalidated",
        "fix: the slot was invalidated",
        "`walrelay setup --accept-slot-loss`",
        "max_slot_wal_keep_size",
    ] {
        assert!(text.contains(part), "missing {part:?}: {text}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_publication_is_explained_before_and_while_streaming() -> Result<()> {
    let db = test_db().await?;
    let mut conn = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let err = conn
        .check_publications(&[PUBLICATION.to_owned(), "no_such_pub".to_owned()])
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no_such_pub") && err.contains("CREATE PUBLICATION"),
        "{err}"
    );

    // pgoutput itself only notices when it decodes a change: up to
    // PostgreSQL 17 with ERROR 42704; from 18 on it logs a WARNING
    // ("skipped loading publication") and streams on without the
    // publication's tables, which is why walrelay checks up front.
    conn.ensure_slot("nopub").await?;
    let mut stream = conn
        .start_replication(
            "nopub",
            Lsn::ZERO,
            &PgOutputOptions::new(["no_such_pub"]),
            StreamOptions::default(),
        )
        .await?;
    db.client
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('p', 'a', 'b', 'c');
             SELECT pg_logical_emit_message(true, 'marker', 'after the insert');",
        )
        .await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut decoder = walrelay_pgoutput::Decoder::new();
    let outcome = loop {
        let msg = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .context("neither an error nor the marker arrived")?
            .context("the stream ended without an error")?;
        match msg {
            Err(e) => break Err(e),
            Ok(walrelay_pg::xlog::ReplicationMessage::XLogData(x)) => {
                match decoder.decode(x.data)? {
                    walrelay_pgoutput::PgOutputMessage::Insert(_)
                    | walrelay_pgoutput::PgOutputMessage::Relation(_) => {
                        panic!("a change of a table in no publication was streamed")
                    }
                    walrelay_pgoutput::PgOutputMessage::Commit(_) => break Ok(()),
                    _ => {}
                }
            }
            Ok(_) => {}
        }
    };
    if db.cluster.major_version() >= 18 {
        outcome.expect("PostgreSQL 18 streams on past a missing publication");
    } else {
        let err = outcome.expect_err("PostgreSQL up to 17 ends the stream");
        assert_eq!(err.code(), Some("42704"), "{err}");
        assert!(err.to_string().contains("CREATE"), "{err}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_replication_is_told_what_to_grant() -> Result<()> {
    let db = test_db().await?;
    db.client.batch_execute("CREATE ROLE plain LOGIN").await?;
    let c = Config::parse(&db.cluster.conninfo("plain", "postgres"))?.sslmode(SslMode::Disable);
    let err = ReplicationConnection::connect(&c).await.unwrap_err();
    assert_eq!(err.code(), Some("42501"), "{err}");
    assert!(err.to_string().contains("WITH REPLICATION"), "{err}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_survive_a_walsender_termination() -> Result<()> {
    // pg_terminate_backend of the walsender ends the stream with an error;
    // a new session replays everything not confirmed.
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "term").await?;
    db.client
        .batch_execute("SELECT pg_logical_emit_message(true, 'app', 'before');")
        .await?;
    s.until_commits(1, WAIT).await?;
    db.client
        .batch_execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'term'")
        .await?;
    let err = loop {
        match s.stream.recv().await {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("stream ended without an error"),
        }
    };
    assert!(err.is_transient(), "{err:?}");
    // The old walsender may take a moment to release the slot.
    let config = replication_config(&db.cluster);
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut s = loop {
        match Session::open(&config, "term").await {
            Ok(s) => break s,
            Err(e)
                if tokio::time::Instant::now() < deadline
                    && e.downcast_ref::<Error>().is_some_and(Error::is_transient) =>
            {
                // Poll until the server has released the slot.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let events = s.until_commits(1, WAIT).await?;
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Message { content, .. } if &content[..] == b"before")));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sql_connection_is_an_ordinary_backend_and_cannot_stream() -> Result<()> {
    let db = test_db().await?;
    let mut conn = ReplicationConnection::connect_sql(&replication_config(&db.cluster)).await?;
    let pid = conn.process_id();
    let rows = conn
        .simple_query(&format!(
            "SELECT backend_type FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .await?;
    // Not a walsender: it does not take one of max_wal_senders.
    assert_eq!(
        rows.first()
            .context("its own pg_stat_activity row")?
            .get("backend_type")?,
        Some("client backend")
    );
    let refused = conn
        .start_replication(
            "nosuch",
            Lsn::ZERO,
            &PgOutputOptions::new([PUBLICATION.to_owned()]),
            StreamOptions::default(),
        )
        .await
        .expect_err("a plain connection cannot stream");
    assert!(
        refused.to_string().contains("plain SQL connection"),
        "{refused}"
    );

    let mut replication = ReplicationConnection::connect(&replication_config(&db.cluster)).await?;
    let pid = replication.process_id();
    let rows = replication
        .simple_query(&format!(
            "SELECT backend_type FROM pg_stat_activity WHERE pid = {pid}"
        ))
        .await?;
    assert_eq!(rows[0].get("backend_type")?, Some("walsender"));
    replication.close().await?;
    Ok(())
}

/// A listener that accepts TCP connections and never answers (a
/// blackholed host), for as long as it lives.
async fn silent_host() -> Result<(u16, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok((port, task))
}

/// Issue 38, item 3: the hosts are tried in order as libpq does, with
/// `connect_timeout` per host (a host that accepts TCP and never answers
/// costs one timeout, then the next host is tried; before, the timeout
/// bounded the whole list and the relay never reached the primary), and
/// `target_session_attrs` keeps the first primary: a standby is skipped
/// by `read-write` and `primary`, refused with the fix by `any`; only
/// standbys is a transient error (a failover in progress). The URL and the
/// keyword form, the replication and the plain SQL connection alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_session_attrs_keep_the_primary_and_connect_timeout_is_per_host() -> Result<()> {
    let db = test_db().await?;
    let standby = db.cluster.standby()?;
    let (silent, _silent_task) = silent_host().await?;
    let (primary, replica) = (db.cluster.port(), standby.port());
    let url = |attrs: &str, ports: &[u16]| {
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        Config::parse(&format!(
            "postgresql://postgres@{}/postgres?sslmode=disable&connect_timeout=2\
             &target_session_attrs={attrs}",
            hosts.join(",")
        ))
        .unwrap()
    };
    let keywords = |attrs: &str, ports: &[u16]| {
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let hosts = vec!["127.0.0.1"; ports.len()].join(",");
        Config::parse(&format!(
            "host={hosts} port={} user=postgres dbname=postgres sslmode=disable \
             connect_timeout=2 target_session_attrs={attrs}",
            ports.join(",")
        ))
        .unwrap()
    };
    let on_primary = format!("127.0.0.1:{primary}");

    for config in [
        url("read-write", &[silent, replica, primary]),
        keywords("read-write", &[replica, primary]),
        url("primary", &[replica, primary]),
        keywords("primary", &[silent, replica, primary]),
    ] {
        let conn = ReplicationConnection::connect(&config).await?;
        assert_eq!(conn.peer(), on_primary, "{config}");
        conn.close().await?;
        let sql = ReplicationConnection::connect_sql(&config).await?;
        assert_eq!(sql.peer(), on_primary, "{config}");
        sql.close().await?;
    }

    let refused = ReplicationConnection::connect(&url("any", &[replica, primary]))
        .await
        .expect_err("a standby reached with any");
    assert!(matches!(refused, Error::Standby { .. }), "{refused}");
    assert!(!refused.is_transient());
    assert!(
        refused
            .to_string()
            .contains("target_session_attrs=read-write"),
        "{refused}"
    );

    let waiting = ReplicationConnection::connect_sql(&url("read-write", &[silent, replica]))
        .await
        .expect_err("no primary listed");
    assert!(matches!(waiting, Error::NoSuitableHost { .. }), "{waiting}");
    assert!(waiting.is_transient(), "{waiting}");
    let text = waiting.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{replica}: in hot standby"))
            && text.contains(&format!("127.0.0.1:{silent}: connecting to"))
            && text.contains("promoted"),
        "{text}"
    );
    Ok(())
}
