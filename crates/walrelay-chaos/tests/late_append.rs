//! A produce request that reaches the broker after the next session read
//! the partitions' tails: the one case of duplicates on the wire the tail
//! fence cannot prevent (docs/contract.md, "Duplicates on the wire").
//!
//! The relay writes through the harness's proxy. Its connections are held
//! (their bytes wait in the sockets) while it produces a burst, so its
//! session runs into `message.timeout.ms` and ends; the next session
//! connects anew (new connections flow), reads the tails, which lack the
//! held records, and writes the replay. Then the held connections are
//! let go: the first session's produce requests reach the broker after
//! everything the second wrote. Measured over a few rounds: how many
//! records went out twice, and that none was lost.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use walrelay_chaos::proxy::Proxy;
use walrelay_testkit::{await_condition, read_until_quiet, ClusterOptions, TestDb};

const TOPIC: &str = "orders";
const ROUNDS: usize = 3;
const EVENTS_PER_ROUND: usize = 2_000;
const WAIT: Duration = Duration::from_secs(90);

/// What the rounds put on the wire.
struct Measured {
    sent: usize,
    records: usize,
    distinct: usize,
    lost: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_request_delivered_after_the_next_sessions_tail_read_duplicates_never_loses(
) -> Result<()> {
    let (proxy, broker) = walrelay_chaos::services::proxied_broker().await?;
    broker.create_topic(TOPIC, 2)?;
    let db = TestDb::start(ClusterOptions::default(), "").await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let bootstrap = proxy.addr().to_string();
    let url = format!("{}?sslmode=disable", db.cluster.url("postgres", "postgres"));
    let common = [
        "--postgres-url",
        &url,
        "--bootstrap-servers",
        &bootstrap,
        "--route",
        "orders=orders",
        "--status-interval",
        "200ms",
        "--kafka-property",
        "message.timeout.ms=2000",
        "--log",
        "info",
    ];
    let relay_bin = walrelay_chaos::relay_binary_for_tests()?;
    let setup = Command::new(&relay_bin)
        .args(common)
        .arg("setup")
        .output()?;
    ensure!(setup.status.success(), "{setup:?}");
    let mut relay = Command::new(&relay_bin)
        .args(common)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let result = rounds(&db, &proxy, &relay, &log).await;
    let _ = relay.kill();
    let _ = relay.wait();
    let sent = result.with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let m = measure(&bootstrap, sent).await?;
    println!(
        "late appends: {} rounds, {} events sent, {} records on the wire ({} distinct), {} duplicates, {} lost",
        ROUNDS,
        m.sent,
        m.records,
        m.distinct,
        m.records - m.distinct,
        m.lost
    );
    ensure!(m.lost == 0, "{} events lost", m.lost);
    ensure!(
        m.distinct == m.sent,
        "{} distinct of {}",
        m.distinct,
        m.sent
    );
    Ok(())
}

/// The rounds; the number of events sent.
async fn rounds(db: &TestDb, proxy: &Proxy, relay: &Child, log: &std::path::Path) -> Result<usize> {
    let sessions = |log: &std::path::Path| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("relaying from the slot's confirmed position")
            .count()
    };
    let mut sent = 0;
    for round in 0..ROUNDS {
        // A session that has produced and been acknowledged: its
        // producer's connections are open.
        emit(db, &format!("warm{round}"), 100).await?;
        sent += 100;
        let end = current_wal(db).await?;
        await_condition(WAIT, Duration::from_millis(50), || async {
            Ok(confirmed(db).await? >= end)
        })
        .await
        .context("the relay streams")?;
        let before = sessions(log);
        proxy.hold_open_connections();
        emit(db, &format!("r{round}"), EVENTS_PER_ROUND).await?;
        sent += EVENTS_PER_ROUND;
        let end = current_wal(db).await?;
        // The held session times out; the next one connects anew and
        // writes the replay, which Kafka acknowledges.
        await_condition(WAIT, Duration::from_millis(50), || async {
            Ok(sessions(log) > before && confirmed(db).await? >= end)
        })
        .await
        .with_context(|| format!("round {round}: a new session wrote the replay"))?;
        ensure!(relay.id() > 0);
        // The first session's requests reach the broker now.
        proxy.release_held();
    }
    Ok(sent)
}

/// `n` events with values `<tag>-<i>`, 100 per transaction (`n` a
/// multiple of 100).
async fn emit(db: &TestDb, tag: &str, n: usize) -> Result<()> {
    for start in (0..n).step_by(100) {
        db.client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_logical_emit_message(true, 'orders', '{tag}-' || g)
                   FROM generate_series({start}, {last}) g;
                 COMMIT;",
                last = start + 99
            ))
            .await?;
    }
    Ok(())
}

async fn current_wal(db: &TestDb) -> Result<u64> {
    let row = db
        .client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0))?)
}

async fn confirmed(db: &TestDb) -> Result<u64> {
    let row = db
        .client
        .query_one(
            "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots \
             WHERE slot_name = 'walrelay'",
            &[],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0))?)
}

/// Reads the topic once the late appends settled.
async fn measure(bootstrap: &str, sent: usize) -> Result<Measured> {
    let mut records = read_until_quiet(bootstrap, &[TOPIC], Duration::from_secs(3), WAIT).await?;
    // A high-water-mark consumer's view: in each partition, a record at
    // or below the partition's highest key so far must repeat a key seen
    // before there (a late copy it drops), never bring a new one (which it
    // would drop too: a loss).
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut seen = std::collections::HashSet::new();
    let mut top: std::collections::HashMap<i32, String> = std::collections::HashMap::new();
    for r in &records {
        let key = r.header_str("idempotency-key").context("a key")?.to_owned();
        let high = top.entry(r.partition).or_default();
        if key <= *high {
            ensure!(
                seen.contains(&(r.partition, key.clone())),
                "partition {} offset {}: key {key} below {high}, never written there before",
                r.partition,
                r.offset
            );
        } else {
            *high = key.clone();
        }
        seen.insert((r.partition, key));
    }
    let mut values: Vec<String> = records
        .iter()
        .map(|r| r.value_str().unwrap_or_default().to_owned())
        .collect();
    let total = values.len();
    values.sort();
    values.dedup();
    let mut lost = 0;
    for round in 0..ROUNDS {
        let burst = (0..EVENTS_PER_ROUND).map(|i| format!("r{round}-{i}"));
        let warm = (0..100).map(|i| format!("warm{round}-{i}"));
        lost += burst
            .chain(warm)
            .filter(|v| values.binary_search(v).is_err())
            .count();
    }
    Ok(Measured {
        sent,
        records: total,
        distinct: values.len(),
        lost,
    })
}
