//! `walrelay status` against a real PostgreSQL: output, JSON and exit codes.

mod support;

use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay_testkit::{await_condition, ClusterOptions};

fn status(env: &Env, extra: &[&str]) -> Result<(i32, String)> {
    support::walrelay_status(env, &[], extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_slot_with_script_friendly_exit_codes() -> Result<()> {
    let env = Env::postgres_only(Default::default()).await?;
    let (code, text) = status(&env, &[])?;
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("does not exist (run `walrelay setup`)"),
        "{text}"
    );

    let mut config = env.config("127.0.0.1:9");
    config.outbox.clear();
    walrelay::commands::setup::setup(&config).await?;
    let (code, json) = status(&env, &["--json"])?;
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(v["slot_exists"], true);
    assert_eq!(v["plugin"], "pgoutput");
    assert_eq!(v["active"], false);
    assert_eq!(v["wal_status"], "reserved");
    assert_eq!(v["publication_tables"], serde_json::json!([]));
    assert_eq!(v["health"], "ok");

    // WAL written while nothing confirms it: lag grows past a limit.
    env.client
        .batch_execute("INSERT INTO busy (v) SELECT 'x' FROM generate_series(1, 1000)")
        .await?;
    let (code, text) = status(&env, &["--max-lag-bytes", "0"])?;
    assert_eq!(code, 4, "{text}");
    assert!(text.contains("AT RISK"), "{text}");

    // A connected relay shows up as the slot's active walsender. (Kafka is
    // unreachable here; the replication connection is what status sees.)
    let (_stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(walrelay::engine::pipeline::run(config, stop_rx, None));
    await_condition(WAIT, Duration::from_millis(100), || async {
        let (_, json) = status(&env, &["--json"])?;
        let v: serde_json::Value = serde_json::from_str(&json)?;
        Ok(v["active"] == true && v["active_pid"].is_number())
    })
    .await?;
    // A relay connected: --require-active is satisfied.
    let (code, text) = status(&env, &["--require-active"])?;
    assert_eq!(code, 0, "{text}");
    relay.abort();
    let _ = relay.await;
    // No relay connected: exit 0 by default, 5 when one is required.
    await_condition(WAIT, Duration::from_millis(100), || async {
        let (code, text) = status(&env, &["--require-active"])?;
        Ok(code == 5 && text.contains("INACTIVE: the slot is fine but no relay is connected"))
    })
    .await?;
    let (code, text) = status(&env, &[])?;
    assert_eq!(code, 0, "{text}");

    // Usage errors are not verdicts: 64, not 2 ("missing").
    let (code, _) = status(&env, &["--max-lag-bytes", "lots"])?;
    assert_eq!(code, 64);
    let (code, _) = status(&env, &["--no-such-flag"])?;
    assert_eq!(code, 64);
    Ok(())
}

/// On a `wal_level = replica` server there can be no logical slot:
/// `status` says so instead of blaming the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_wal_level_on_a_replica_level_server() -> Result<()> {
    let env = Env::postgres_only(ClusterOptions::default().wal_level("replica")).await?;
    let (code, text) = status(&env, &[])?;
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("wal_level            replica: logical decoding is off")
            && text.contains("set wal_level=logical")
            && text.contains("WAL_LEVEL"),
        "{text}"
    );
    let (_, json) = status(&env, &["--json"])?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(v["wal_level"], "replica");
    assert_eq!(v["health"], "wal_level");
    Ok(())
}

/// `--source-id ''` and `WALRELAY_SOURCE_ID=` would give every record
/// `walrelay-source: ""`: refused before anything connects.
#[test]
fn an_empty_source_id_is_refused() {
    for (args, env) in [
        (&["--source-id", "", "config"][..], None),
        (&["config"][..], Some("")),
        (&["--source-id", "  ", "run"][..], None),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_walrelay"));
        cmd.args(args).env_remove("WALRELAY_CONFIG");
        match env {
            Some(v) => cmd.env("WALRELAY_SOURCE_ID", v),
            None => cmd.env_remove("WALRELAY_SOURCE_ID"),
        };
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("relay.source_id") && stderr.contains("must not be empty"),
            "{args:?} {env:?}: {stderr}"
        );
    }
}
