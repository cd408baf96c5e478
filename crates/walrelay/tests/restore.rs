//! A database whose WAL went back under walrelay: a base backup restored
//! into a fresh data directory, the same with WAL written past the old
//! keys before walrelay runs again (what a point-in-time recovery to an
//! earlier LSN looks like to the relay), and a failover to a physical
//! standby that had not received the last WAL walrelay published. The restored server keeps its system identifier, so the default
//! source id, while its WAL positions go back: new events would get keys
//! at or below keys already in Kafka, and the tail fence and every
//! high-water-mark consumer would skip them. walrelay must stop with an
//! error that names the fix, confirm nothing meanwhile, and after the fix
//! (a new `relay.source_id`) deliver every new event so that a
//! high-water-mark consumer applies it.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use support::{apply_high_water_marks, key_of, spawn_relay, Env, WAIT};
use walrelay_pgoutput::Lsn;
use walrelay_testkit::{await_condition, read_until_quiet, ConsumedRecord};

const TOPIC: &str = "orders";

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--route", "orders=orders", "--log", "info"];
    a.extend_from_slice(extra);
    a
}

/// `n` raw `orders` messages with ids `<tag>-<i>`, 10 per transaction.
async fn emit(env: &Env, tag: &str, n: usize) -> Result<Vec<String>> {
    for start in (0..n).step_by(10) {
        let end = (start + 10).min(n);
        env.client
            .batch_execute(&format!(
                "BEGIN;
                 SELECT pg_logical_emit_message(true, 'orders', jsonb_build_object('id', '{tag}-' || g)::text)
                   FROM generate_series({start}, {last}) g;
                 COMMIT;",
                last = end - 1
            ))
            .await?;
    }
    Ok((0..n).map(|i| format!("{tag}-{i}")).collect())
}

/// Moves the WAL position on by about `segments` × 16 MB (a row and a
/// segment switch each), as a busy database would.
async fn write_wal(env: &Env, segments: usize) -> Result<()> {
    for _ in 0..segments {
        env.client
            .batch_execute("INSERT INTO busy (v) VALUES ('x'); SELECT pg_switch_wal();")
            .await?;
    }
    Ok(())
}

fn event_id(r: &ConsumedRecord) -> String {
    let value: serde_json::Value =
        serde_json::from_slice(r.value.as_deref().unwrap_or_default()).unwrap_or_default();
    value["id"].as_str().unwrap_or_default().to_owned()
}

/// Puts the backup in place of the cluster's data directory and starts it
/// (see [`walrelay_testkit::PgCluster::restore_base_backup`]).
async fn restore(env: &mut Env, backup: &Path) -> Result<()> {
    env.cluster.restore_base_backup(backup)?;
    env.client = env.cluster.client().await?;
    Ok(())
}

/// Waits for the relay to exit by itself.
fn wait_exit(relay: &mut Child, log: &Path) -> Result<ExitStatus> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = relay.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            relay.kill()?;
            bail!(
                "the relay kept running: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the relay until the slot confirmed the current WAL position, then
/// stops it with SIGTERM.
async fn relay_to_the_end(env: &Env, bootstrap: &str, log: &Path, extra: &[&str]) -> Result<()> {
    let end = env.current_wal_lsn().await?;
    let mut relay = spawn_relay(env, bootstrap, log, &args(extra))?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        Ok(env.confirmed_flush_lsn("walrelay").await? >= end)
    })
    .await
    .with_context(|| std::fs::read_to_string(log).unwrap_or_default())?;
    ensure!(Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()?
        .success());
    let exit = relay.wait()?;
    ensure!(exit.success(), "graceful stop exits 0, got {exit:?}");
    Ok(())
}

/// The relay refuses to go on under the old source: it exits non-zero with
/// `expect` in its log, and the slot confirmed nothing.
fn expect_refusal(relay: &mut Child, log: &Path, expect: &[&str]) -> Result<String> {
    let status = wait_exit(relay, log)?;
    let text = std::fs::read_to_string(log)?;
    ensure!(
        !status.success(),
        "the relay must stop with an error: {text}"
    );
    for e in expect {
        ensure!(text.contains(e), "the log says {e:?}: {text}");
    }
    Ok(text)
}

/// After the fix: every new event is in Kafka exactly once under the new
/// source, and a high-water-mark consumer applies each of them.
async fn check_delivered(bootstrap: &str, source: &str, ids: &[String]) -> Result<()> {
    let records = read_until_quiet(bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    let new: Vec<ConsumedRecord> = records
        .iter()
        .filter(|r| r.header_str("walrelay-source") == Some(source))
        .cloned()
        .collect();
    let mut got: Vec<String> = new.iter().map(event_id).collect();
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    ensure!(
        got == want,
        "under source {source}: {} records for {} new events",
        got.len(),
        want.len()
    );
    let (fresh, duplicates) = apply_high_water_marks(&new)?;
    let applied: usize = fresh.values().map(Vec::len).sum();
    ensure!(
        applied == ids.len() && duplicates == 0,
        "a high-water-mark consumer applied {applied} of {} ({duplicates} duplicates)",
        ids.len()
    );
    Ok(())
}

/// Relays `before` events written after a base backup and ~112 MB of WAL,
/// then restores the backup. Returns the highest key's LSN in Kafka.
async fn relay_then_restore(env: &mut Env, bootstrap: &str, log: &Path) -> Result<Lsn> {
    let dir = env.cluster.dir().to_owned();
    let backup = dir.join("backup");
    env.cluster.base_backup(&backup)?;
    write_wal(env, 7).await?;
    let before = emit(env, "before", 300).await?;
    relay_to_the_end(env, bootstrap, log, &[]).await?;
    let records = read_until_quiet(bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    ensure!(records.len() == before.len(), "{} records", records.len());
    let highest = records.iter().map(key_of).max().context("records")?;
    restore(env, &backup).await?;
    Ok(Lsn(highest.high()))
}

/// What an operator does after the WAL went back: `walrelay setup` (a new
/// slot), events, `walrelay run` (after `wal_segments` × 16 MB more WAL).
/// The relay must refuse with `expect` in its log and confirm nothing;
/// then, under the new source `new_source`, every new event is delivered
/// and applied once.
async fn refused_then_delivered_under(
    env: &Env,
    bootstrap: &str,
    log: &Path,
    wal_segments: usize,
    expect: &[&str],
    new_source: &str,
) -> Result<()> {
    refused_with_then_delivered_under(env, bootstrap, log, wal_segments, &[], expect, new_source)
        .await
}

/// [`refused_then_delivered_under`], the refused relay run with `extra`
/// flags.
async fn refused_with_then_delivered_under(
    env: &Env,
    bootstrap: &str,
    log: &Path,
    wal_segments: usize,
    extra: &[&str],
    expect: &[&str],
    new_source: &str,
) -> Result<()> {
    // `setup` finds the slot it created gone and refuses to create one in
    // silence (issue 36).
    let refusal = walrelay::commands::setup::setup(&env.config(bootstrap))
        .await
        .expect_err("setup refuses to replace a lost slot in silence")
        .to_string();
    ensure!(
        refusal.contains("replication slot \"walrelay\" no longer exists")
            && refusal.contains("--accept-slot-loss"),
        "{refusal}"
    );
    // A slot made by hand (or by an older walrelay) meets the relay's own
    // checks, the second line of defence.
    env.client
        .batch_execute("SELECT pg_create_logical_replication_slot('walrelay', 'pgoutput')")
        .await?;
    let start = env.confirmed_flush_lsn("walrelay").await?;
    let after = emit(env, "after", 100).await?;
    write_wal(env, wal_segments).await?;
    let mut relay = spawn_relay(env, bootstrap, log, &args(extra))?;
    let mut all = vec!["set relay.source_id to a new value"];
    all.extend_from_slice(expect);
    expect_refusal(&mut relay, log, &all)?;
    ensure!(
        env.confirmed_flush_lsn("walrelay").await? == start,
        "nothing is confirmed under a sequence that went back: what the relay skipped stays in the slot"
    );
    relay_to_the_end(env, bootstrap, log, &["--source-id", new_source]).await?;
    check_delivered(bootstrap, new_source, &after).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_base_backup_stops_the_relay_and_a_new_source_delivers_every_new_event(
) -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let log = env.cluster.dir().join("relay.log");
    let highest = relay_then_restore(&mut env, &bootstrap, &log).await?;
    let now = env.current_wal_lsn().await?;
    ensure!(now < highest, "the WAL went back: {now} < {highest}");

    refused_then_delivered_under(
        &env,
        &bootstrap,
        &log,
        0,
        &["the database's WAL went back"],
        "restored-1",
    )
    .await?;
    // Nothing was published under the old source after the restore.
    let all = read_until_quiet(&bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    ensure!(all.len() == 300 + 100, "{} records", all.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_does_not_reproduce_the_fence_stops_the_relay_and_loses_nothing() -> Result<()>
{
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    // One partition: every new event would fall under the fence key.
    env.broker
        .as_ref()
        .expect("a broker")
        .create_topic(TOPIC, 1)?;
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let log = env.cluster.dir().join("relay.log");
    relay_then_restore(&mut env, &bootstrap, &log).await?;

    // The slot is created right after the restore and events are written,
    // but walrelay runs only once the server's WAL has passed the old
    // keys: nothing is ahead of the server any more, yet the new events'
    // keys are below the fence key.
    refused_then_delivered_under(
        &env,
        &bootstrap,
        &log,
        9,
        &["the replay reached"],
        "restored-1",
    )
    .await
}

/// The case above on a topic the fence does not skip by: restore
/// detection does not rest on the fence's trust. Each tail key of this
/// source after the slot's start must come back in the replay somewhere.
async fn an_unfenced_topic_still_catches_a_replay_that_does_not_reproduce_its_tail(
    extra: impl FnOnce(&Path) -> Result<Vec<String>>,
) -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.broker
        .as_ref()
        .expect("a broker")
        .create_topic(TOPIC, 1)?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let log = env.cluster.dir().join("relay.log");
    relay_then_restore(&mut env, &bootstrap, &log).await?;
    let extra = extra(env.cluster.dir())?;
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    refused_with_then_delivered_under(
        &env,
        &bootstrap,
        &log,
        9,
        &extra,
        &["the replay reached"],
        "restored-1",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fence_off_a_replay_that_does_not_reproduce_the_tail_stops_the_relay() -> Result<()>
{
    an_unfenced_topic_still_catches_a_replay_that_does_not_reproduce_its_tail(|dir| {
        let config = dir.join("fence-off.toml");
        std::fs::write(&config, "[relay]\nfence = false\n")?;
        Ok(vec!["-c".to_owned(), config.display().to_string()])
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_route_change_a_replay_that_does_not_reproduce_the_tail_stops_the_relay(
) -> Result<()> {
    // Another prefix routed to the topic: its layout changed, so the
    // fence does not skip by its tail in this session.
    an_unfenced_topic_still_catches_a_replay_that_does_not_reproduce_its_tail(|_| {
        Ok(vec!["--route".to_owned(), "audit=orders".to_owned()])
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_standby_behind_the_published_wal_stops_the_relay_and_loses_nothing(
) -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("relay.log");
    let standby = env.cluster.standby()?;
    ensure!(standby.port() != env.cluster.port());

    // The standby has everything up to here, then stops receiving: the
    // primary writes ~112 MB of WAL and 300 events that walrelay relays.
    let caught_up = env.current_wal_lsn().await?;
    let standby_client = standby.client().await?;
    await_condition(WAIT, Duration::from_millis(50), || async {
        let row = standby_client
            .query_one("SELECT pg_last_wal_replay_lsn()::text", &[])
            .await?;
        let replayed: Lsn = row.get::<_, String>(0).parse()?;
        Ok(replayed >= caught_up)
    })
    .await?;
    drop(standby_client);
    standby.stop_fast()?;
    write_wal(&env, 7).await?;
    let before = emit(&env, "before", 300).await?;
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;
    let records = read_until_quiet(&bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    ensure!(records.len() == before.len(), "{} records", records.len());

    // The primary is lost; the standby is promoted and takes its place.
    env.cluster.stop_immediate()?;
    standby.start_stopped()?;
    standby.promote()?;
    env.cluster = standby;
    env.client = env.cluster.client().await?;
    refused_then_delivered_under(
        &env,
        &bootstrap,
        &log,
        0,
        &["the database's WAL went back"],
        "promoted-1",
    )
    .await
}

/// Issue 36, item 1: after a restore the application writes before anyone
/// runs walrelay; `setup` finds the slot it created (recorded in
/// `walrelay.slots`, which the backup kept) gone and refuses, naming the
/// positions and the procedure. The procedure of docs/operations.md ("A
/// lost replication slot"): accept the loss under a new source, re-drive
/// the outbox rows committed meanwhile: each arrives once; the emitted
/// messages of the gap cannot be recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_lost_in_a_restore_is_refused_by_setup_and_the_procedure_redrives_the_outbox(
) -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let mut config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let log = env.cluster.dir().join("relay.log");
    relay_then_restore(&mut env, &bootstrap, &log).await?;

    // The application writes while nobody runs walrelay.
    env.client
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
               SELECT 'meanwhile-' || g, 'order', g::text, 'created', '{}'::jsonb
               FROM generate_series(0, 19) g;",
        )
        .await?;
    emit(&env, "meanwhile", 10).await?;

    let refusal = walrelay::commands::setup::setup(&config)
        .await
        .expect_err("setup refuses to replace a lost slot in silence")
        .to_string();
    for part in [
        "replication slot \"walrelay\" no longer exists",
        "would skip it in silence",
        "A lost replication slot",
        "--accept-slot-loss",
        "new relay.source_id",
    ] {
        ensure!(refusal.contains(part), "{part:?} in {refusal}");
    }
    ensure!(
        env.client
            .query_opt("SELECT 1 FROM pg_replication_slots", &[])
            .await?
            .is_none(),
        "no slot was created"
    );

    // The procedure: accept the loss under a new source, then re-drive
    // the outbox rows of the gap (DELETE and INSERT in one statement: the
    // relay publishes the INSERTs, with the keys of this transaction).
    config.relay.source_id = Some("restored-1".into());
    let options = walrelay::commands::setup::SetupOptions {
        accept_slot_loss: true,
    };
    let steps = walrelay::commands::setup::setup_with(&config, options).await?;
    ensure!(
        steps
            .iter()
            .any(|s| s.to_string().contains("replacing the lost one")),
        "{steps:?}"
    );
    env.client
        .batch_execute(
            "WITH lost AS (DELETE FROM outbox WHERE id LIKE 'meanwhile-%' RETURNING *)
             INSERT INTO outbox SELECT * FROM lost;",
        )
        .await?;
    // setup is idempotent again: the slot exists.
    let again = walrelay::commands::setup::setup(&config).await?;
    ensure!(
        again
            .iter()
            .any(|s| s.to_string().starts_with("existed:  replication slot")),
        "{again:?}"
    );
    relay_to_the_end(
        &env,
        &bootstrap,
        &log,
        &[
            "--source-id",
            "restored-1",
            "--outbox-table",
            "public.outbox",
        ],
    )
    .await?;

    let records = read_until_quiet(
        &bootstrap,
        &["outbox.event.order", TOPIC],
        Duration::from_secs(1),
        WAIT,
    )
    .await?;
    let mut redriven: Vec<String> = records
        .iter()
        .filter(|r| r.topic == "outbox.event.order")
        .map(|r| {
            ensure!(r.header_str("walrelay-source") == Some("restored-1"));
            Ok(r.header_str("id").unwrap_or_default().to_owned())
        })
        .collect::<Result<_>>()?;
    redriven.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("meanwhile-{i}")).collect();
    want.sort();
    ensure!(redriven == want, "re-driven outbox rows: {redriven:?}");
    // The messages emitted in the gap are in no slot: not recoverable.
    ensure!(
        !records
            .iter()
            .any(|r| event_id(r).starts_with("meanwhile-")),
        "an emitted message of the gap reached Kafka"
    );
    Ok(())
}

/// A base backup taken before the first `walrelay setup` holds neither the
/// slot nor its row in `walrelay.slots`; the configured topics holding
/// records of this source tell `setup` that walrelay published from this
/// database before, and it refuses to create a slot that would skip what
/// was committed since (issue 36, item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_before_the_first_setup_is_refused_by_setup_from_what_kafka_holds(
) -> Result<()> {
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let backup = env.cluster.dir().join("backup-before-setup");
    env.cluster.base_backup(&backup)?;
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let log = env.cluster.dir().join("relay.log");
    // Far past the backup's end, so that the restored server's own WAL
    // (its end-of-recovery records) stays below the keys published.
    write_wal(&env, 3).await?;
    emit(&env, "before", 50).await?;
    relay_to_the_end(&env, &bootstrap, &log, &[]).await?;
    restore(&mut env, &backup).await?;

    let refusal = walrelay::commands::setup::setup(&config)
        .await
        .expect_err("setup refuses: Kafka holds records of this source")
        .to_string();
    ensure!(
        refusal.contains("walrelay.slots has no record of it")
            && refusal.contains(&format!("topic \"{TOPIC}\""))
            && refusal.contains("--accept-slot-loss"),
        "{refusal}"
    );
    // The keys went back: accepting the gap needs a new source too.
    let accept = walrelay::commands::setup::SetupOptions {
        accept_slot_loss: true,
    };
    let refusal = walrelay::commands::setup::setup_with(&config, accept)
        .await
        .expect_err("the keys went back")
        .to_string();
    ensure!(
        refusal.contains("set relay.source_id to a new value"),
        "{refusal}"
    );
    let mut renamed = config.clone();
    renamed.relay.source_id = Some("restored-1".to_owned());
    walrelay::commands::setup::setup_with(&renamed, accept).await?;
    ensure!(
        env.client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'walrelay'",
                &[]
            )
            .await?
            .is_some(),
        "the slot exists once the gap was accepted under a new source"
    );
    Ok(())
}

/// The source record's topic (the default).
const SOURCES: &str = "walrelay.sources";

/// A database restored from a volume snapshot (slot and `walrelay.slots`
/// back as they were): relays 50 events, takes the snapshot, relays 300
/// more (a clean stop records the last of them in the source record), and
/// puts the snapshot back. Returns the highest key's LSN in Kafka; the
/// server is behind it.
async fn relay_then_restore_snapshot(env: &mut Env, bootstrap: &str, log: &Path) -> Result<Lsn> {
    env.create_topics(&[TOPIC])?;
    walrelay::commands::setup::setup(&env.config(bootstrap)).await?;
    emit(env, "early", 50).await?;
    relay_to_the_end(env, bootstrap, log, &[]).await?;
    let snapshot = env.cluster.dir().join("snapshot");
    env.cluster.volume_snapshot(&snapshot)?;
    env.client = env.cluster.client().await?;
    emit(env, "published", 300).await?;
    relay_to_the_end(env, bootstrap, log, &[]).await?;
    let records = read_until_quiet(bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    ensure!(records.len() == 350, "{} records", records.len());
    let highest = records.iter().map(key_of).max().context("records")?;
    let source = format!("{}/postgres/walrelay", env.system_identifier().await?);
    let recorded = walrelay::source::source_record::kafka::read(
        &env.config(bootstrap).kafka,
        SOURCES,
        &source,
        WAIT,
    )
    .await?
    .and_then(|r| r.event)
    .context(std::fs::read_to_string(log).unwrap_or_default())?;
    ensure!(
        recorded.key == highest,
        "a clean stop records the last event: {} against {highest}",
        recorded.key
    );
    restore(env, &snapshot).await?;
    let slot = env.confirmed_flush_lsn("walrelay").await?;
    ensure!(
        slot < Lsn(highest.high()),
        "the snapshot's slot is behind what was published: {slot}"
    );
    Ok(Lsn(highest.high()))
}

/// After a snapshot restore and `after` new events: `setup` (whose own
/// WAL may carry the server past the recorded key) either refuses or says
/// the replay must reproduce the recorded event, and `run` refuses with
/// the source record's error (naming the recorded position, the slot's and
/// the fix) and confirms nothing; under a new source every new event is
/// delivered and applied once.
async fn snapshot_refused_then_delivered(
    env: &Env,
    bootstrap: &str,
    log: &Path,
    tails_kept: bool,
) -> Result<()> {
    let after = emit(env, "after", 100).await?;
    let expect = [
        "according to its record in Kafka",
        "the slot replays from",
        "set relay.source_id to a new value",
        "Restoring the database or failing over",
    ];
    match walrelay::commands::setup::setup(&env.config(bootstrap)).await {
        Err(refusal) => {
            let refusal = refusal.to_string();
            for e in expect {
                ensure!(refusal.contains(e), "setup says {e:?}: {refusal}");
            }
        }
        Ok(steps) => ensure!(
            steps.iter().any(|s| s
                .to_string()
                .contains("confirms nothing until its replay reproduces")),
            "{steps:?}"
        ),
    }
    let start = env.confirmed_flush_lsn("walrelay").await?;
    let mut relay = spawn_relay(env, bootstrap, log, &args(&[]))?;
    if tails_kept {
        // Whichever evidence the replay contradicts first: a tail's key
        // below the recorded one, or the recorded event.
        let text = expect_refusal(&mut relay, log, &["set relay.source_id to a new value"])?;
        ensure!(
            text.contains("according to its record in Kafka")
                || text.contains("of topic \"orders\" ends with key"),
            "{text}"
        );
    } else {
        let mut all = expect.to_vec();
        let start_text = format!("the slot replays from {start}");
        all.push(&start_text);
        expect_refusal(&mut relay, log, &all)?;
    }
    ensure!(
        env.confirmed_flush_lsn("walrelay").await? == start,
        "nothing is confirmed"
    );
    let mut renamed = env.config(bootstrap);
    renamed.relay.source_id = Some("restored-1".to_owned());
    walrelay::commands::setup::setup(&renamed).await?;
    relay_to_the_end(env, bootstrap, log, &["--source-id", "restored-1"]).await?;
    check_delivered_after_snapshot(bootstrap, "restored-1", &after).await
}

/// [`check_delivered`] after a snapshot restore: PostgreSQL 15 and 16
/// keep a slot's confirmed position on disk only at some checkpoints, so
/// the restored slot may replay events from before the snapshot too; under
/// the new source those are new events as well, each once.
async fn check_delivered_after_snapshot(
    bootstrap: &str,
    source: &str,
    ids: &[String],
) -> Result<()> {
    let records = read_until_quiet(bootstrap, &[TOPIC], Duration::from_secs(1), WAIT).await?;
    let new: Vec<ConsumedRecord> = records
        .into_iter()
        .filter(|r| r.header_str("walrelay-source") == Some(source))
        .collect();
    let mut got: Vec<String> = new
        .iter()
        .map(event_id)
        .filter(|id| !id.starts_with("early-"))
        .collect();
    got.sort();
    let mut want = ids.to_vec();
    want.sort();
    ensure!(got == want, "under source {source}: {got:?}");
    let (_, duplicates) = apply_high_water_marks(&new)?;
    ensure!(duplicates == 0, "{duplicates} duplicates under {source}");
    Ok(())
}

/// Apache Kafka only: the records are expired with DeleteRecords, which
/// Tansu does not serve.
/// On Apache Kafka: an environment after [`relay_then_restore_snapshot`]
/// (the environment, its bootstrap, the relay's log, the highest key's
/// LSN); `None` elsewhere.
async fn restored_snapshot() -> Result<Option<(Env, String, PathBuf, Lsn)>> {
    if !on_apache_kafka()? {
        return Ok(None);
    }
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let log = env.cluster.dir().join("relay.log");
    let highest = relay_then_restore_snapshot(&mut env, &bootstrap, &log).await?;
    Ok(Some((env, bootstrap, log, highest)))
}

fn on_apache_kafka() -> Result<bool> {
    let kafka = walrelay_testkit::BrokerKind::from_env()? == walrelay_testkit::BrokerKind::Kafka;
    if !kafka {
        eprintln!("the snapshot restores run on Apache Kafka (the Apache Kafka stage)");
    }
    Ok(kafka)
}

/// A volume snapshot restored while the topic still holds what was
/// published after it: refused (by the source record first; the tails
/// would refuse too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_snapshot_restored_with_the_records_kept_is_refused() -> Result<()> {
    let Some((env, bootstrap, log, _)) = restored_snapshot().await? else {
        return Ok(());
    };
    snapshot_refused_then_delivered(&env, &bootstrap, &log, true).await
}

/// The same with every record of the topic expired (retention, here
/// DeleteRecords up to each partition's end): the data topics hold no
/// evidence, the source record does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_snapshot_restored_after_the_records_expired_is_refused_by_the_source_record(
) -> Result<()> {
    let Some((env, bootstrap, log, _)) = restored_snapshot().await? else {
        return Ok(());
    };
    env.broker().delete_records_to_end(TOPIC)?;
    snapshot_refused_then_delivered(&env, &bootstrap, &log, false).await
}

/// Expired records and a restored server that wrote more WAL than was
/// published after the snapshot before walrelay runs again: the server is
/// past the recorded key, so the replay must reproduce the recorded event,
/// and gives that position to other events instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_snapshot_that_wrote_past_the_recorded_key_must_reproduce_its_event(
) -> Result<()> {
    let Some((env, bootstrap, log, highest)) = restored_snapshot().await? else {
        return Ok(());
    };
    env.broker().delete_records_to_end(TOPIC)?;
    write_wal(&env, 1).await?;
    ensure!(
        env.current_wal_lsn().await? > highest,
        "past the recorded key"
    );
    snapshot_refused_then_delivered(&env, &bootstrap, &log, false).await
}

/// The source record deleted by hand (a tombstone) before the restore:
/// the relay warns, the gauge's reason is in the log, and the data topics'
/// tails, which still hold the keys, refuse the restore as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restore_with_the_source_record_deleted_warns_and_the_tails_refuse_it(
) -> Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let Some((env, bootstrap, log, _)) = restored_snapshot().await? else {
        return Ok(());
    };
    let source = format!("{}/postgres/walrelay", env.system_identifier().await?);
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    producer
        .send(
            FutureRecord::<str, [u8]>::to(SOURCES).key(source.as_str()),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    emit(&env, "after", 100).await?;
    walrelay::commands::setup::setup(&env.config(&bootstrap)).await?;
    let mut relay = spawn_relay(&env, &bootstrap, &log, &args(&[]))?;
    expect_refusal(
        &mut relay,
        &log,
        &[
            "holds no record of this source",
            "of topic \"orders\" ends with key",
            "set relay.source_id to a new value",
        ],
    )?;
    Ok(())
}

/// `--accept-slot-loss` under the old source after a restored base backup
/// whose topic records expired: the tails hold nothing, the source record
/// shows the keys would go back, and setup refuses until the source is
/// new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepting_a_lost_slot_under_the_old_source_is_refused_when_the_source_record_shows_keys_going_back(
) -> Result<()> {
    if !on_apache_kafka()? {
        return Ok(());
    }
    let mut env = Env::start().await?;
    let bootstrap = env.bootstrap();
    env.create_topics(&[TOPIC])?;
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let log = env.cluster.dir().join("relay.log");
    let highest = relay_then_restore(&mut env, &bootstrap, &log).await?;
    env.broker().delete_records_to_end(TOPIC)?;
    ensure!(env.current_wal_lsn().await? < highest, "the WAL went back");
    let accept = walrelay::commands::setup::SetupOptions {
        accept_slot_loss: true,
    };
    let refusal = walrelay::commands::setup::setup_with(&config, accept)
        .await
        .expect_err("the keys would go back")
        .to_string();
    ensure!(
        refusal.contains("according to its record in Kafka")
            && refusal.contains("set relay.source_id to a new value"),
        "{refusal}"
    );
    let mut renamed = config.clone();
    renamed.relay.source_id = Some("restored-1".to_owned());
    walrelay::commands::setup::setup_with(&renamed, accept).await?;
    Ok(())
}
