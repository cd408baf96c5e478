//! PostgreSQL high availability (issue 38): failover slots made by
//! `setup`, and what `walrelay status` says about a failover, on the
//! PostgreSQL that `WALRELAY_PG_BIN` names. Failover slots came with
//! PostgreSQL 17: on older servers only the refusal runs, and the
//! PostgreSQL 18 stage of scripts/test.sh runs the rest.

mod support;

use anyhow::{ensure, Result};
use support::{walrelay_status, Env, WAIT};
use walrelay::config::Config;
use walrelay::setup::Step;
use walrelay_pg::{Config as PgConfig, PgOutputOptions, ReplicationConnection, StreamOptions};
use walrelay_testkit::{await_condition, ClusterOptions};

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
    let refused = walrelay::setup::setup(&failover_config(&env, "walrelay"))
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
/// copy (`synced` on the standby); a listed standby that is down is a
/// wait, said as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_makes_a_failover_slot_and_status_says_what_a_failover_would_do() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    if !has_failover_slots(&env) {
        return Ok(());
    }
    let steps = walrelay::setup::setup(&failover_config(&env, "walrelay")).await?;
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
    await_condition(WAIT, std::time::Duration::from_millis(200), || async {
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

    drop(standby_client);
    standby.stop_fast()?;
    await_condition(WAIT, std::time::Duration::from_millis(200), || async {
        let (_, out) = status(&[])?;
        Ok(out.contains("waiting              no standby streams from standby1"))
    })
    .await?;
    Ok(())
}

/// Item 1: an existing slot becomes a failover slot when setup runs with
/// `--slot-failover`, except while a relay streams from it: PostgreSQL
/// refuses to alter an active slot, and setup says what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_slot_becomes_a_failover_slot_unless_a_relay_streams_from_it() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default()).await?;
    if !has_failover_slots(&env) {
        return Ok(());
    }
    let mut plain = failover_config(&env, "plain");
    plain.postgres.slot_failover = false;
    let text = step_text(&walrelay::setup::setup(&plain).await?);
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
    let refused = walrelay::setup::setup(&failover_config(&env, "plain"))
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
    await_condition(WAIT, std::time::Duration::from_millis(100), || async {
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
    let text = step_text(&walrelay::setup::setup(&failover_config(&env, "plain")).await?);
    ensure!(
        text.contains("changed:  replication slot plain is now a failover slot"),
        "{text}"
    );
    let text = step_text(&walrelay::setup::setup(&failover_config(&env, "plain")).await?);
    ensure!(
        text.contains("existed:  replication slot plain (pgoutput, failover)"),
        "{text}"
    );
    Ok(())
}
