//! The replication stream and the pgoutput decoder against a real
//! PostgreSQL: what arrives, in which order, with which LSNs.

use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use futures_util::SinkExt;
use walrelay_pg::StreamOptions;
use walrelay_pgoutput::Lsn;
use walrelay_suite::{
    confirmed_flush_lsn, replication_config, test_db, test_db_with, transactions, ClusterOptions,
    Event, Session, WAIT,
};
use walrelay_testkit::await_condition;

fn messages(events: &[Event]) -> Vec<(&str, &[u8], bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message {
                prefix,
                content,
                transactional,
                ..
            } => Some((prefix.as_str(), &content[..], *transactional)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_messages_text_bytea_empty_and_5mb() -> Result<()> {
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "msgs").await?;
    db.client
        .batch_execute(
            "BEGIN;
             SELECT pg_logical_emit_message(true, 'app.text', 'héllo');
             SELECT pg_logical_emit_message(true, 'app.bin', '\\x00ff10'::bytea);
             SELECT pg_logical_emit_message(true, 'app.empty', '');
             SELECT pg_logical_emit_message(true, 'app.big', repeat('x', 5 * 1024 * 1024));
             COMMIT;",
        )
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    let txs = transactions(&events)?;
    assert_eq!(txs.len(), 1);
    let tx = &txs[0];
    let big = vec![b'x'; 5 * 1024 * 1024];
    assert_eq!(
        messages(tx),
        vec![
            ("app.text", "héllo".as_bytes(), true),
            ("app.bin", &[0x00, 0xff, 0x10][..], true),
            ("app.empty", &b""[..], true),
            ("app.big", &big[..], true),
        ]
    );
    let (
        Event::Begin { final_lsn, xid, .. },
        Event::Commit {
            commit_lsn,
            end_lsn,
            ..
        },
    ) = (&tx[0], &tx[tx.len() - 1])
    else {
        panic!("not a Begin..Commit: {tx:?}")
    };
    assert_eq!(
        final_lsn, commit_lsn,
        "Begin.final_lsn must equal Commit.commit_lsn"
    );
    assert!(end_lsn > commit_lsn);
    assert!(*xid > 0);
    // A message reports the end of its record, in XLogData and in its own
    // lsn field alike, and the positions increase.
    let mut last = Lsn::ZERO;
    for e in tx {
        if let Event::Message { wal_start, lsn, .. } = e {
            assert_eq!(wal_start, lsn);
            assert!(
                *lsn > last && lsn <= final_lsn,
                "{lsn} after {last}, final {final_lsn}"
            );
            last = *lsn;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_transactional_message_arrives_even_if_its_transaction_rolls_back() -> Result<()> {
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "nontx").await?;
    db.client
        .batch_execute(
            "BEGIN;
             INSERT INTO busy (v) VALUES ('gets an xid');
             SELECT pg_logical_emit_message(false, 'app.audit', 'attempted');
             ROLLBACK;
             SELECT pg_logical_emit_message(true, 'app.marker', 'after');",
        )
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    // The non-transactional message comes first, outside any Begin/Commit.
    match &events[0] {
        Event::Message {
            prefix,
            content,
            transactional,
            wal_start,
            lsn,
        } => {
            assert_eq!(
                (prefix.as_str(), &content[..], *transactional),
                ("app.audit", &b"attempted"[..], false)
            );
            assert_eq!(wal_start, lsn);
        }
        other => panic!("expected the non-transactional message first, got {other:?}"),
    }
    let txs = transactions(&events)?;
    assert_eq!(txs.len(), 1);
    assert_eq!(messages(&txs[0]), vec![("app.marker", &b"after"[..], true)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_inserts_copy_rows_and_a_mixed_transaction() -> Result<()> {
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "outbox").await?;

    // 1. Two plain inserts, read back by column name.
    db.client
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES
               ('a1', 'order', 'o-1', 'created', '{\"total\": 5}', '{\"trace\": \"t1\"}'),
               ('a2', 'order', 'o-2', 'created', NULL, NULL);",
        )
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    let inserts: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::Insert { .. }))
        .collect();
    assert_eq!(inserts.len(), 2);
    assert_eq!(inserts[0].column("id"), Some("a1"));
    assert_eq!(inserts[0].column("aggregatetype"), Some("order"));
    assert_eq!(inserts[0].column("aggregateid"), Some("o-1"));
    assert_eq!(inserts[0].column("payload"), Some("{\"total\": 5}"));
    assert_eq!(inserts[0].column("headers"), Some("{\"trace\": \"t1\"}"));
    assert_eq!(inserts[1].column("payload"), None, "NULL payload");
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Relation { table } if table == "outbox")));

    // 2. COPY: heap multi-insert, every row decoded with the same LSN.
    let sink = db
        .client
        .copy_in("COPY outbox (id, aggregatetype, aggregateid, type, payload) FROM STDIN")
        .await?;
    let mut sink = std::pin::pin!(sink);
    sink.send(Bytes::from_static(
        b"c1\tuser\tu-1\tsignup\t{}\nc2\tuser\tu-2\tsignup\t{}\nc3\tuser\tu-3\tsignup\t{}\n",
    ))
    .await?;
    assert_eq!(sink.finish().await?, 3);
    let events = s.until_commits(1, WAIT).await?;
    let copy_lsns: Vec<Lsn> = events
        .iter()
        .filter_map(|e| match e {
            Event::Insert { wal_start, .. } => Some(*wal_start),
            _ => None,
        })
        .collect();
    assert_eq!(copy_lsns.len(), 3);
    assert!(
        copy_lsns.iter().all(|l| *l == copy_lsns[0]),
        "COPY rows share one LSN: {copy_lsns:?}"
    );

    // 3. Messages and an insert in one transaction: the insert starts where
    // the message before it ends (a text key writes no sequence record).
    db.client
        .batch_execute(
            "BEGIN;
             SELECT pg_logical_emit_message(true, 'app', 'm1');
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('x1', 'order', 'o-9', 'paid', '{}');
             SELECT pg_logical_emit_message(true, 'app', 'm2');
             SELECT pg_logical_emit_message(true, 'app', 'm3');
             COMMIT;",
        )
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    let tx = transactions(&events)?.pop().unwrap();
    let order: Vec<String> = tx
        .iter()
        .filter_map(|e| match e {
            Event::Message { content, .. } => Some(String::from_utf8_lossy(content).into_owned()),
            Event::Insert { .. } => e.column("id").map(str::to_owned),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["m1", "x1", "m2", "m3"]);
    let pos = |i: usize| match tx
        .iter()
        .filter(|e| matches!(e, Event::Message { .. } | Event::Insert { .. }))
        .nth(i)
    {
        Some(Event::Message { lsn, .. }) => *lsn,
        Some(Event::Insert { wal_start, .. }) => *wal_start,
        _ => unreachable!(),
    };
    let Event::Begin { final_lsn, .. } = tx[0] else {
        panic!()
    };
    assert_eq!(
        pos(1),
        pos(0),
        "the insert's LSN equals the end LSN m1 reports"
    );
    assert!(pos(2) > pos(1) && pos(3) > pos(2));
    assert!(
        pos(3) <= final_lsn,
        "the last message ends at or before the commit record"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transaction_sends_nothing() -> Result<()> {
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "rollback").await?;
    db.client
        .batch_execute(
            "BEGIN;
             SELECT pg_logical_emit_message(true, 'app', 'never');
             INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ('rb', 'order', 'o', 't');
             ROLLBACK;
             SELECT pg_logical_emit_message(true, 'app', 'marker');",
        )
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    assert!(
        !events.iter().any(|e| matches!(e, Event::Insert { .. })),
        "{events:?}"
    );
    assert_eq!(messages(&events), vec![("app", &b"marker"[..], true)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100k_event_transaction_arrives_complete_and_in_order() -> Result<()> {
    let db = test_db().await?;
    let mut s = Session::open(&replication_config(&db.cluster), "bulk").await?;
    db.client
        .batch_execute(
            "BEGIN;
             INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
               SELECT 'id-' || g, 'bulk', g::text, 'n', jsonb_build_object('n', g) FROM generate_series(1, 50000) g;
             SELECT count(pg_logical_emit_message(true, 'bulk', g::text)) FROM generate_series(1, 50000) g;
             COMMIT;",
        )
        .await?;
    let (mut inserts, mut msgs, mut last_msg, mut last_lsn) = (0u32, 0u32, 0u32, Lsn::ZERO);
    loop {
        match s.next_event(WAIT).await? {
            Event::Insert { wal_start, .. } => {
                inserts += 1;
                assert!(wal_start >= last_lsn);
                last_lsn = wal_start;
            }
            Event::Message { content, lsn, .. } => {
                msgs += 1;
                let n: u32 = std::str::from_utf8(&content)?.parse()?;
                assert_eq!(n, last_msg + 1, "messages arrive in emit order");
                assert!(lsn > last_lsn);
                last_msg = n;
                last_lsn = lsn;
            }
            Event::Commit { .. } => break,
            _ => {}
        }
    }
    assert_eq!((inserts, msgs), (50_000, 50_000));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_updates_move_confirmed_flush_lsn_and_keepalives_arrive() -> Result<()> {
    let db = test_db().await?;
    let options = StreamOptions {
        status_interval: Duration::from_millis(200),
        ..StreamOptions::default()
    };
    let mut s = Session::open_with(&replication_config(&db.cluster), "status", options).await?;
    let start = confirmed_flush_lsn(&db.client, "status")
        .await?
        .expect("slot exists");

    db.client
        .batch_execute("SELECT pg_logical_emit_message(true, 'app', 'one');")
        .await?;
    let tx = s.until_commits(1, WAIT).await?;
    let Some(Event::Commit { end_lsn, .. }) = tx.last().cloned() else {
        panic!()
    };
    // Having sent everything while we confirmed nothing, the walsender
    // tells us how far the WAL goes with a keepalive.
    let k = s.next_keepalive(WAIT).await?;
    assert!(
        k.wal_end >= end_lsn,
        "keepalive {} < end {}",
        k.wal_end,
        end_lsn
    );
    // Nothing confirmed yet: the slot must not have moved past `start`.
    assert_eq!(
        confirmed_flush_lsn(&db.client, "status").await?,
        Some(start)
    );

    // Confirm; the timer carries it to the server.
    s.stream.confirm(end_lsn);
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(confirmed_flush_lsn(&db.client, "status").await? >= Some(end_lsn))
    })
    .await?;
    assert!(s.stream.stats().status_updates_sent >= 1);

    // Confirming less than before is ignored (monotonic).
    s.stream.confirm(start);
    s.stream.status_handle().send_now().await?;
    assert_eq!(s.stream.stats().reported, end_lsn);
    assert!(confirmed_flush_lsn(&db.client, "status").await? >= Some(end_lsn));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_requested_keepalives_are_answered_and_the_connection_survives() -> Result<()> {
    // A short wal_sender_timeout makes the walsender ask for replies every
    // second; the timer is set far away so only the replies keep it alive.
    let db = test_db_with(ClusterOptions::default().conf("wal_sender_timeout", "2s")).await?;
    let options = StreamOptions {
        status_interval: Duration::from_secs(3600),
        ..StreamOptions::default()
    };
    let mut s = Session::open_with(&replication_config(&db.cluster), "replies", options).await?;
    let mut asked = 0;
    while asked < 4 {
        if s.next_keepalive(WAIT).await?.reply_requested {
            asked += 1;
        }
    }
    // Four requests span more than the 2 s timeout: the connection lives.
    assert!(s.stream.stats().status_updates_sent >= 4);
    db.client
        .batch_execute("SELECT pg_logical_emit_message(true, 'app', 'alive');")
        .await?;
    let events = s.until_commits(1, WAIT).await?;
    assert_eq!(messages(&events), vec![("app", &b"alive"[..], true)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_updates_flow_while_the_consumer_is_slow() -> Result<()> {
    let db = test_db_with(ClusterOptions::default().conf("wal_sender_timeout", "2s")).await?;
    let options = StreamOptions {
        status_interval: Duration::from_millis(250),
        channel_capacity: 8,
        channel_bytes: 64 * 1024,
        ..StreamOptions::default()
    };
    let mut s = Session::open_with(&replication_config(&db.cluster), "slow", options).await?;
    db.client
        .batch_execute("SELECT count(pg_logical_emit_message(true, 'bulk', repeat('y', 200))) FROM generate_series(1, 20000) g;")
        .await?;
    // Do not read: the channel fills and the I/O task stops reading the
    // socket. Status updates must go on for longer than wal_sender_timeout.
    let before = s.stream.stats().status_updates_sent;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(s.stream.stats().status_updates_sent >= before + 12)
    })
    .await?;
    // 12 updates at 250 ms = 3 s > 2 s timeout; everything still arrives.
    let events = s.until_commits(1, WAIT).await?;
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, Event::Message { .. }))
            .count(),
        20_000
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_sends_a_last_status_update_and_restart_resumes_after_it() -> Result<()> {
    let db = test_db().await?;
    let config = replication_config(&db.cluster);
    let mut s = Session::open(&config, "resume").await?;
    // Two statements in one simple query would be one transaction.
    for content in ["first", "second"] {
        db.client
            .execute(
                "SELECT pg_logical_emit_message(true, 'app', $1::text)",
                &[&content],
            )
            .await?;
    }
    let events = s.until_commits(1, WAIT).await?;
    assert_eq!(messages(&events), vec![("app", &b"first"[..], true)]);
    let Some(Event::Commit { end_lsn, .. }) = events.last().cloned() else {
        panic!()
    };
    // Confirm only the first transaction, then stop cleanly.
    s.stream.confirm(end_lsn);
    s.stream.stop().await?;
    assert_eq!(
        confirmed_flush_lsn(&db.client, "resume").await?,
        Some(end_lsn)
    );

    // The second transaction was received but never confirmed: it comes again.
    let mut s = Session::open(&config, "resume").await?;
    let events = s.until_commits(1, WAIT).await?;
    assert_eq!(messages(&events), vec![("app", &b"second"[..], true)]);
    Ok(())
}
