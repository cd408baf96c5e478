//! `walrelay status` against a real PostgreSQL: output, JSON and exit codes.

mod support;

use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay_testkit::await_condition;

fn status(env: &Env, extra: &[&str]) -> Result<(i32, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args([
            "--postgres-url",
            &format!(
                "{}?sslmode=disable",
                env.cluster.url("postgres", "postgres")
            ),
            "--log",
            "warn",
            "status",
        ])
        .args(extra)
        .output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
    ))
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
    walrelay::setup::setup(&config).await?;
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
    let relay = tokio::spawn(walrelay::pipeline::run(config, stop_rx, None));
    await_condition(WAIT, Duration::from_millis(100), || async {
        let (_, json) = status(&env, &["--json"])?;
        let v: serde_json::Value = serde_json::from_str(&json)?;
        Ok(v["active"] == true && v["active_pid"].is_number())
    })
    .await?;
    relay.abort();
    Ok(())
}
