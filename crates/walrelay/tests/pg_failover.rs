//! PostgreSQL high availability (issue 38): failover slots made by
//! `setup`, and what `walrelay status` says about a failover, on the
//! PostgreSQL that `WALRELAY_PG_BIN` names. Failover slots came with
//! PostgreSQL 17: on older servers only the refusal runs, and the
//! PostgreSQL 18 stage of scripts/test.sh runs the rest.

mod support;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use support::{walrelay_status, Env, WAIT};
use walrelay::commands::setup::Step;
use walrelay::config::Config;
use walrelay_pg::{Config as PgConfig, PgOutputOptions, ReplicationConnection, StreamOptions};
use walrelay_testkit::{await_condition, read_until_quiet, ClusterOptions};

/// Never contacted: setup and status need no broker.
const NO_BROKER: &str = "127.0.0.1:9";

/// The cluster's major version, and whether it has failover slots.
fn has_failover_slots(env: &Env) -> bool {
    let major = env.cluster.pg_bin().major();
    if major < 17 {
        eprintln!("PostgreSQL {major} has no failover slots: the PostgreSQL 18 stage runs this");
    }
    major >= 17
}

fn failover_config(env: &Env, slot: &str) -> Config {
    let mut config = env.config(NO_BROKER);
    config.postgres.slot = slot.to_owned();
    config.postgres.slot_failover = true;
    config
}

fn step_text(steps: &[Step]) -> String {
    steps.iter().map(|s| format!("{s}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_failover_before_postgresql_17_is_refused_with_what_to_do_instead() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    if env.cluster.pg_bin().major() >= 17 {
        return Ok(());
    }
    let refused = walrelay::commands::setup::setup(&failover_config(&env, "walrelay"))
        .await
        .expect_err("no failover slots before 17")
        .to_string();
    ensure!(
        refused.contains("postgres.slot_failover needs PostgreSQL 17 or later")
            && refused.contains("A lost replication slot"),
        "{refused}"
    );
    Ok(())
}

/// Item 1 and 2: `setup --slot-failover` creates a failover slot;
/// `status` shows it, and a `RISK:` line while the primary's
/// `synchronized_standby_slots` is empty; a standby keeps a synchronized
/// copy (`synced` on the standby); a second standby streaming through a
/// slot the setting does not list is a `RISK:` until it is listed, and
/// one without a slot is one too; a listed standby that is down is a
/// wait, said as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_makes_a_failover_slot_and_status_says_what_a_failover_would_do() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    if !has_failover_slots(&env) {
        return Ok(());
    }
    let steps = walrelay::commands::setup::setup(&failover_config(&env, "walrelay")).await?;
    let text = step_text(&steps);
    ensure!(
        text.contains("created:  replication slot walrelay (pgoutput, failover)"),
        "{text}"
    );
    let status = |args: &[&str]| walrelay_status(&env, &["--slot-failover"], args);
    let (code, out) = status(&[])?;
    ensure!(code == 0, "exit {code}: {out}");
    ensure!(
        out.contains("failover             yes")
            && out.contains(
                "RISK: the slot is a failover slot but synchronized_standby_slots is empty"
            ),
        "{out}"
    );
    let (_, json) = status(&["--json"])?;
    let json: serde_json::Value = serde_json::from_str(&json)?;
    ensure!(json["slot_failover"] == true, "{json}");

    let standby = env.cluster.failover_standby("standby1")?;
    env.client
        .batch_execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
        .await?;
    env.client.batch_execute("SELECT pg_reload_conf()").await?;
    let standby_client = standby.client().await?;
    let seen = std::sync::Mutex::new(String::new());
    await_condition(WAIT, Duration::from_millis(200), || async {
        // The standby keeps its copy temporary until the primary's slot
        // has moved past the position the copy reserved (a relay would
        // confirm; here the slot is advanced), and a running-transactions
        // record lets its slot sync worker catch up at once.
        env.client
            .batch_execute(
                "SELECT pg_replication_slot_advance('walrelay', pg_current_wal_lsn()); \
                 SELECT pg_log_standby_snapshot()",
            )
            .await?;
        let synced = standby_client
            .query_opt(
                "SELECT synced::text || ' ' || temporary::text FROM pg_replication_slots \
                 WHERE slot_name = 'walrelay'",
                &[],
            )
            .await?
            .map(|r| r.get::<_, String>(0));
        let (_, out) = status(&[])?;
        *seen.lock().unwrap() = format!("standby's copy (synced, temporary): {synced:?}\n{out}");
        Ok(synced.as_deref() == Some("true false")
            && !out.contains("RISK")
            && !out.contains("waiting"))
    })
    .await
    .map_err(|e| e.context(seen.lock().unwrap().clone()))?;
    let (code, out) = status(&[])?;
    ensure!(
        code == 0 && out.contains("decoding waits for standby1 (synchronized_standby_slots)"),
        "exit {code}: {out}"
    );

    // A second standby, through a physical slot the list leaves out: a
    // RISK naming its slot, with the whole list to set; gone once it is
    // listed too.
    let standby2 = env.cluster.failover_standby("standby2")?;
    let out = await_status(&env, "the RISK naming standby2's slot", |out| {
        out.contains(
            "RISK: standbys stream from the primary through physical slots that \
             synchronized_standby_slots does not name (standby2)",
        )
    })
    .await?;
    ensure!(
        out.contains("synchronized_standby_slots = 'standby1, standby2'")
            && out.matches("RISK").count() == 1
            && out.contains("health               ok"),
        "{out}"
    );
    env.client
        .batch_execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby1, standby2'")
        .await?;
    env.client.batch_execute("SELECT pg_reload_conf()").await?;
    await_status(&env, "no RISK with both slots listed", |out| {
        out.contains("decoding waits for standby1, standby2") && !out.contains("RISK")
    })
    .await?;
    // A standby without a slot cannot be listed: a RISK of its own.
    let slotless = env.cluster.standby()?;
    await_status(&env, "the RISK of a standby without a slot", |out| {
        out.contains("RISK: standbys stream from the primary without a physical slot (")
            && out.contains("promoting it loses the slot")
    })
    .await?;
    drop(slotless);
    drop(standby2);

    drop(standby_client);
    standby.stop_fast()?;
    await_condition(WAIT, Duration::from_millis(200), || async {
        let (_, out) = status(&[])?;
        Ok(out.contains("waiting              no standby streams from standby1"))
    })
    .await?;
    Ok(())
}

/// Waits until `walrelay status --slot-failover` prints what `ok` wants;
/// its output. On a timeout the error names `what` and the last output.
async fn await_status(env: &Env, what: &str, ok: impl Fn(&str) -> bool) -> Result<String> {
    let last = std::sync::Mutex::new(String::new());
    await_condition(WAIT, Duration::from_millis(200), || async {
        let (_, out) = walrelay_status(env, &["--slot-failover"], &[])?;
        let done = ok(&out);
        *last.lock().unwrap() = out;
        Ok(done)
    })
    .await
    .map_err(|e| {
        e.context(format!(
            "waiting for {what}; walrelay status said:\n{}",
            last.lock().unwrap()
        ))
    })?;
    let out = last.lock().unwrap().clone();
    Ok(out)
}

/// Item 1: an existing slot becomes a failover slot when setup runs with
/// `--slot-failover`, except while a relay streams from it: PostgreSQL
/// would wait for the slot to be released, and setup refuses at once,
/// saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_slot_becomes_a_failover_slot_unless_a_relay_streams_from_it() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    if !has_failover_slots(&env) {
        return Ok(());
    }
    let mut plain = failover_config(&env, "plain");
    plain.postgres.slot_failover = false;
    let text = step_text(&walrelay::commands::setup::setup(&plain).await?);
    ensure!(text.contains("replication slot plain (pgoutput)"), "{text}");

    let pg = PgConfig::parse(&plain.postgres.url)?;
    let stream = ReplicationConnection::connect(&pg)
        .await?
        .start_replication(
            "plain",
            walrelay_pgoutput::Lsn::ZERO,
            &PgOutputOptions::new(["walrelay".to_owned()]),
            StreamOptions::default(),
        )
        .await?;
    let refused = walrelay::commands::setup::setup(&failover_config(&env, "plain"))
        .await
        .expect_err("an active slot cannot be altered")
        .to_string();
    ensure!(
        refused.contains("cannot become a failover slot while a relay streams from it")
            && refused.contains("stop every walrelay run that reads this slot"),
        "{refused}"
    );
    drop(stream);
    // The walsender notices the closed connection a moment later.
    await_condition(WAIT, Duration::from_millis(100), || async {
        let row = env
            .client
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = 'plain'",
                &[],
            )
            .await?;
        Ok(!row.get::<_, bool>(0))
    })
    .await?;
    let text = step_text(&walrelay::commands::setup::setup(&failover_config(&env, "plain")).await?);
    ensure!(
        text.contains("changed:  replication slot plain is now a failover slot"),
        "{text}"
    );
    let text = step_text(&walrelay::commands::setup::setup(&failover_config(&env, "plain")).await?);
    ensure!(
        text.contains("existed:  replication slot plain (pgoutput, failover)"),
        "{text}"
    );
    Ok(())
}

/// A primary and a standby that keeps its failover slots, one host list
/// for both (`target_session_attrs=read-write`), with the primary's
/// `synchronized_standby_slots` naming the standby's slot when
/// `protected`.
struct Pair {
    env: Env,
    standby: walrelay_testkit::PgCluster,
    bootstrap: String,
}

impl Pair {
    /// `None` before PostgreSQL 17 (no failover slots).
    async fn start(protected: bool) -> Result<Option<Pair>> {
        let env = Env::start().await?;
        if !has_failover_slots(&env) {
            return Ok(None);
        }
        env.client
            .batch_execute("CREATE TABLE ledger (seq bigint PRIMARY KEY)")
            .await?;
        env.broker().create_topic(TOPIC, support::PARTITIONS)?;
        let standby = env.cluster.failover_standby("standby1")?;
        if protected {
            env.client
                .batch_execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
                .await?;
            env.client.batch_execute("SELECT pg_reload_conf()").await?;
        }
        let bootstrap = env.bootstrap();
        Ok(Some(Pair {
            env,
            standby,
            bootstrap,
        }))
    }

    /// Both hosts, the primary first, as libpq and walrelay read them.
    fn hosts(&self) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=postgres \
             target_session_attrs=read-write connect_timeout=2",
            self.env.cluster.port(),
            self.standby.port()
        )
    }

    fn relay_url(&self) -> String {
        format!("{} sslmode=disable", self.hosts())
    }

    /// The real `walrelay run` on the host list; output appended to `log`.
    fn spawn_relay(&self, log: &std::path::Path) -> Result<std::process::Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        Ok(std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
            .args(["--postgres-url", &self.relay_url()])
            .args(["--bootstrap-servers", &self.bootstrap])
            .args(["--route", "orders=orders", "--log", "info"])
            .args(["--status-interval", "200ms"])
            .arg("run")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?)
    }

    /// Waits until the standby's copy of the slot is synchronized and
    /// persistent (a temporary copy is dropped at promotion).
    async fn await_synced_copy(&self) -> Result<()> {
        let standby = self.standby.client().await?;
        await_condition(WAIT, Duration::from_millis(200), || async {
            // A running-transactions record lets the slot sync worker
            // catch up now rather than at its next nap (up to 30 s).
            self.env
                .client
                .batch_execute("SELECT pg_log_standby_snapshot()")
                .await?;
            let row = standby
                .query_opt(
                    "SELECT synced AND NOT temporary FROM pg_replication_slots \
                     WHERE slot_name = 'walrelay'",
                    &[],
                )
                .await?;
            Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
        })
        .await
    }
}

const TOPIC: &str = "orders";

/// A workload on the host list: each transaction writes a ledger row and
/// emits the event of the same `seq`, so the ledger of whichever server
/// ends up primary says which events were committed. Reconnects through
/// a failover (a commit whose answer was lost is settled by the ledger).
struct Workload {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    committed: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The highest `seq` tried so far (committed or not).
    attempted: std::sync::Arc<std::sync::atomic::AtomicI64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Workload {
    fn start(hosts: String) -> Workload {
        use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let committed = std::sync::Arc::new(AtomicU64::new(0));
        let attempted = std::sync::Arc::new(AtomicI64::new(0));
        let (s, c, a) = (stop.clone(), committed.clone(), attempted.clone());
        let task = tokio::spawn(async move {
            let mut seq: i64 = 0;
            while !s.load(Ordering::Relaxed) {
                let client = match tokio_postgres::connect(&hosts, tokio_postgres::NoTls).await {
                    Ok((client, conn)) => {
                        tokio::spawn(conn);
                        client
                    }
                    // No primary yet (the failover): try again.
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                while !s.load(Ordering::Relaxed) {
                    seq += 1;
                    let sql = format!(
                        "BEGIN; INSERT INTO ledger (seq) VALUES ({seq}); \
                         SELECT pg_logical_emit_message(true, 'orders', \
                           jsonb_build_object('id', 'e-{seq}')::text); COMMIT;"
                    );
                    a.store(seq, Ordering::Relaxed);
                    if client.batch_execute(&sql).await.is_err() {
                        break;
                    }
                    c.fetch_add(1, Ordering::Relaxed);
                    // A steady load (about 500 transactions a second),
                    // not the two cores' worth the relay must keep up with.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            Ok(())
        });
        Workload {
            stop,
            committed,
            attempted,
            task,
        }
    }

    fn attempted(&self) -> i64 {
        self.attempted.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn committed(&self) -> u64 {
        self.committed.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn await_committed(&self, n: u64) -> Result<()> {
        await_condition(WAIT, Duration::from_millis(20), || async {
            Ok(self.committed() >= n)
        })
        .await
    }

    async fn stop(self) -> Result<()> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await?
    }
}

fn event_id(r: &walrelay_testkit::ConsumedRecord) -> String {
    let value: serde_json::Value =
        serde_json::from_slice(r.value.as_deref().unwrap_or_default()).unwrap_or_default();
    value["id"].as_str().unwrap_or_default().to_owned()
}

/// Item 5: `kill -9` of the primary's postmaster under a live workload,
/// `pg_ctl promote` of the standby, and the same `walrelay run` process
/// goes on on the new primary through its host list. Expected: the new
/// primary's ledger. Every expected event is in Kafka and a
/// high-water-mark consumer applies each exactly once; no event in Kafka
/// that the new primary lacks (a phantom); no duplicate on the wire.
/// Then the old primary back as a primary: refused (item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_fails_over_with_nothing_lost_phantom_or_doubled() -> Result<()>
{
    failover_under_load(true).await
}

/// The same with a clean switchover: `pg_ctl stop -m fast` of the primary
/// (its walsenders send the standby everything before it stops), then the
/// promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_switchover_under_load_loses_nothing_and_doubles_nothing() -> Result<()> {
    failover_under_load(false).await
}

/// The failover (`kill`: `kill -9` of the postmaster; otherwise a clean
/// stop) and its checks.
async fn failover_under_load(kill: bool) -> Result<()> {
    let Some(pair) = Pair::start(true).await? else {
        return Ok(());
    };
    let mut config = pair.env.config(&pair.bootstrap);
    config.postgres.url = pair.relay_url();
    config.postgres.slot_failover = true;
    walrelay::commands::setup::setup(&config).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut relay = pair.spawn_relay(&log)?;
    let workload = Workload::start(pair.hosts());
    workload.await_committed(300).await?;
    pair.await_synced_copy().await?;
    let before = workload.committed();
    workload.await_committed(before + 200).await?;

    if kill {
        pair.env.cluster.kill_postmaster()?;
    } else {
        pair.env
            .cluster
            .stop_fast()
            .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    }
    let at_kill = workload.committed();
    pair.standby.promote()?;
    workload.await_committed(at_kill + 300).await?;
    workload.stop().await?;

    let new_primary = pair.standby.client().await?;
    let end: String = new_primary
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0);
    let end: walrelay_pgoutput::Lsn = end.parse()?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        let confirmed = walrelay_testkit::db::confirmed_flush_lsn(&new_primary, "walrelay").await?;
        Ok(confirmed.is_some_and(|c| c >= end))
    })
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let mut expected: Vec<String> = new_primary
        .query("SELECT 'e-' || seq FROM ledger ORDER BY seq", &[])
        .await?
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    expected.sort();
    let records = read_until_quiet(&pair.bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    let mut got: Vec<String> = records.iter().map(event_id).collect();
    got.sort();
    let distinct: std::collections::BTreeSet<&String> = got.iter().collect();
    let phantoms: Vec<&&String> = distinct
        .iter()
        .filter(|id| expected.binary_search(id).is_err())
        .collect();
    let missing = expected.iter().filter(|id| !distinct.contains(id)).count();
    let (fresh, duplicates) = support::apply_high_water_marks(&records)?;
    let applied: usize = fresh.values().map(Vec::len).sum();
    eprintln!(
        "{}: {} committed in the new primary's ledger ({} before the kill), {} records, \
         {missing} lost, {} phantoms, {duplicates} duplicates on the wire",
        if kill {
            "kill -9 and promote"
        } else {
            "switchover"
        },
        expected.len(),
        at_kill,
        records.len(),
        phantoms.len()
    );
    ensure!(
        missing == 0 && phantoms.is_empty() && duplicates == 0 && applied == expected.len(),
        "{missing} lost, phantoms {phantoms:?}, {duplicates} duplicates, {applied} applied of {}",
        expected.len()
    );
    if kill {
        split_brain_is_refused(&pair, &mut relay, &log, records.len()).await?;
    } else {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &relay.id().to_string()])
            .status()?;
        let exit = relay.wait()?;
        ensure!(exit.success(), "the relay exits 0 on SIGTERM: {exit:?}");
    }
    let text = std::fs::read_to_string(&log)?;
    ensure!(
        text.matches("relaying from the slot's confirmed position")
            .count()
            >= 2,
        "a session on each primary: {text}"
    );
    ensure!(
        text.matches("no primary among the hosts; retrying").count() <= 1,
        "one warning per failover: {text}"
    );
    Ok(())
}

/// Item 4: the old primary restarted as a primary (crash recovery, its
/// own timeline 1) while it is still first in the host list. The relay,
/// made to reconnect, lands on it (it is read-write) and must refuse it
/// as a split brain: it exits with the error, and publishes nothing from
/// it. So must a relay started afresh, which knows no timeline but finds
/// the promoted server among the other hosts.
async fn split_brain_is_refused(
    pair: &Pair,
    relay: &mut std::process::Child,
    log: &std::path::Path,
    records_before: usize,
) -> Result<()> {
    pair.env.cluster.start_stopped()?;
    let new_primary = pair.standby.client().await?;
    new_primary
        .batch_execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = 'walrelay' AND active",
        )
        .await?;
    let exit = await_exit(relay, log).await?;
    let text = std::fs::read_to_string(log)?;
    ensure!(
        !exit.success()
            && text.contains("is a primary on timeline 1")
            && text.contains("split brain"),
        "the relay must stop on the old primary: {exit:?}\n{text}"
    );
    // A relay started afresh remembers no timeline: it asks the other
    // hosts, finds the promoted primary on a higher timeline and refuses
    // the old one too.
    let fresh_log = log.with_file_name("fresh-relay.log");
    let mut fresh = pair.spawn_relay(&fresh_log)?;
    let exit = await_exit(&mut fresh, &fresh_log).await?;
    let text = std::fs::read_to_string(&fresh_log)?;
    ensure!(
        !exit.success()
            && text.contains("is a primary on timeline 1")
            && text.contains("is a primary of the same system on timeline 2")
            && text.contains("split brain"),
        "a fresh relay must refuse the old primary too: {exit:?}\n{text}"
    );
    let records = read_until_quiet(&pair.bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    ensure!(
        records.len() == records_before,
        "{} records after the split brain, {records_before} before",
        records.len()
    );
    Ok(())
}

/// Item 5, the same failover without `synchronized_standby_slots`: the
/// relay warns at start that a failover may contradict it; the standby
/// stops receiving while the relay publishes on; the primary dies and the
/// standby, behind, is promoted. The events walrelay published and the
/// new primary lacks are phantoms, and the new primary's own events reuse
/// their WAL positions: the relay must refuse to go on, never publish
/// under keys that consumers already passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_synchronized_standby_slots_a_failover_behind_the_published_wal_is_refused(
) -> Result<()> {
    let Some(pair) = Pair::start(false).await? else {
        return Ok(());
    };
    let mut config = pair.env.config(&pair.bootstrap);
    config.postgres.url = pair.relay_url();
    config.postgres.slot_failover = true;
    walrelay::commands::setup::setup(&config).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let mut relay = pair.spawn_relay(&log)?;
    let workload = Workload::start(pair.hosts());
    workload.await_committed(300).await?;
    pair.await_synced_copy().await?;

    // The standby falls behind; walrelay publishes what it never gets.
    pair.standby.stop_fast()?;
    let behind = workload.committed();
    workload.await_committed(behind + 300).await?;
    let published = pair.env.current_wal_lsn().await?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(pair.env.confirmed_flush_lsn("walrelay").await? >= published)
    })
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;

    pair.env.cluster.kill_postmaster()?;
    // Every transaction of the old primary has a seq up to here; the new
    // primary's start above it.
    let last_old_seq = workload.attempted();
    pair.standby.start_stopped()?;
    pair.standby.promote()?;
    let at_promotion = workload.committed();
    workload.await_committed(at_promotion + 300).await?;

    let exit = await_exit(&mut relay, &log).await?;
    workload.stop().await?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(
        text.contains("RISK")
            && text.contains("synchronized_standby_slots is empty")
            && !exit.success()
            && text.contains("had not received"),
        "the relay must warn, then refuse the standby that missed published WAL: {exit:?}\n{text}"
    );
    let records = read_until_quiet(&pair.bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    let from_new_primary: Vec<String> = records
        .iter()
        .map(event_id)
        .filter(|id| {
            id.strip_prefix("e-")
                .and_then(|n| n.parse::<i64>().ok())
                .is_some_and(|n| n > last_old_seq)
        })
        .collect();
    ensure!(
        from_new_primary.is_empty(),
        "published from the new primary's reused WAL positions: {from_new_primary:?}"
    );
    Ok(())
}

/// Waits until the relay exits by itself; its exit status.
async fn await_exit(
    relay: &mut std::process::Child,
    log: &std::path::Path,
) -> Result<std::process::ExitStatus> {
    let mut exit = None;
    await_condition(WAIT, Duration::from_millis(50), || {
        if let Ok(Some(status)) = relay.try_wait() {
            exit = Some(status);
        }
        let done = exit.is_some();
        async move { Ok(done) }
    })
    .await
    .with_context(|| std::fs::read_to_string(log).unwrap_or_default())?;
    exit.context("exited")
}
