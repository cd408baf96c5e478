//! An outbox table the publication does not cover loses its rows without
//! a word from PostgreSQL: `run` must refuse to start on such a
//! configuration, stop when the publication changes that way while it
//! runs, without confirming anything after the change, and `status` must
//! say so. Real PostgreSQL and Tansu.

mod support;

use anyhow::{ensure, Context, Result};
use support::{Env, WAIT};
use tokio::sync::watch;
use walrelay::config::{Config, OutboxConfig};
use walrelay::engine::pipeline::{self, RelayError};
use walrelay_testkit::read_topics;

fn outbox(table: &str) -> OutboxConfig {
    OutboxConfig {
        table: table.into(),
        topic: "outbox.event.{aggregatetype}".into(),
        columns: Default::default(),
    }
}

/// The relay's result, which must come (an error) within `WAIT`.
async fn run_until_it_stops(config: Config) -> Result<Result<(), RelayError>> {
    let (_stop, stop_rx) = watch::channel(false);
    tokio::time::timeout(WAIT, pipeline::run(config, stop_rx, None))
        .await
        .context("the relay kept running on a publication that skips outbox rows")
}

/// `walrelay status` with `extra` flags before the command: exit code and
/// text.
fn status(env: &Env, extra: &[&str]) -> Result<(i32, String)> {
    support::walrelay_status(env, extra, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_outbox_tables_the_publication_does_not_cover() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    env.client
        .batch_execute(
            "CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL);
             CREATE TABLE outbox_p (LIKE outbox) PARTITION BY LIST (aggregatetype);
             CREATE TABLE outbox_p_a PARTITION OF outbox_p FOR VALUES IN ('a');
             ALTER PUBLICATION walrelay ADD TABLE outbox_p;",
        )
        .await?;

    // A table added to the configuration without `walrelay setup`.
    let mut added = config.clone();
    added.outbox.push(outbox("public.outbox2"));
    let e = run_until_it_stops(added)
        .await?
        .expect_err("refuses to start")
        .to_string();
    assert!(
        e.contains("public.outbox2")
            && e.contains("walrelay setup")
            && e.contains("ALTER PUBLICATION \"walrelay\" ADD TABLE public.outbox2"),
        "{e}"
    );

    // A table that does not exist.
    let mut nosuch = config.clone();
    nosuch.outbox.push(outbox("public.nosuch"));
    let e = run_until_it_stops(nosuch)
        .await?
        .expect_err("refuses to start")
        .to_string();
    assert!(
        e.contains("public.nosuch") && e.contains("does not exist"),
        "{e}"
    );

    // A partitioned table published without publish_via_partition_root:
    // its rows would arrive under the partitions' names.
    let mut leaves = config.clone();
    leaves.outbox.push(outbox("public.outbox_p"));
    let e = run_until_it_stops(leaves)
        .await?
        .expect_err("refuses to start")
        .to_string();
    assert!(
        e.contains("public.outbox_p") && e.contains("publish_via_partition_root = true"),
        "{e}"
    );

    // `status` reports the same, with exit code 2; the configuration as
    // `setup` made it is fine.
    let (code, text) = status(&env, &["--outbox-table", "public.outbox"])?;
    assert_eq!(code, 0, "{text}");
    let (code, text) = status(
        &env,
        &[
            "--outbox-table",
            "public.outbox",
            "--outbox-table",
            "public.outbox2",
        ],
    )?;
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("public.outbox2 is not in publication"),
        "{text}"
    );
    Ok(())
}

/// The fix for a row filter takes the table out of the publication and
/// puts it back: two autocommit statements would leave a moment in which
/// committed rows are never decoded (and the next check is clean again),
/// so the printed fix is one transaction, and it works as printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_filter_fix_is_one_transaction_that_works_as_printed() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    env.client
        .batch_execute(
            "ALTER PUBLICATION walrelay SET TABLE outbox WHERE (aggregatetype <> 'audit');",
        )
        .await?;
    let e = run_until_it_stops(config.clone())
        .await?
        .expect_err("refuses to start")
        .to_string();
    let fix = e
        .split_once("fix, in one transaction")
        .and_then(|(_, rest)| rest.split_once(": "))
        .map(|(_, fix)| fix.to_owned())
        .with_context(|| format!("no fix in {e}"))?;
    // The error names its documentation after the statement.
    let fix = fix.split(" (docs/").next().unwrap_or_default().trim();
    ensure!(
        fix.starts_with("BEGIN;") && fix.ends_with("COMMIT;"),
        "the fix is one transaction: {fix}"
    );
    env.client.batch_execute(fix).await?;
    let (code, text) = status(&env, &["--outbox-table", "public.outbox"])?;
    ensure!(code == 0, "the printed fix removed the row filter: {text}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_change_while_running_stops_the_relay_before_it_confirms_past_it(
) -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let config = env.config(&bootstrap);
    walrelay::commands::setup::setup(&config).await?;
    let c = &env.client;

    let (stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run(config.clone(), stop_rx, None));
    c.batch_execute("INSERT INTO outbox VALUES ('e-1', 'order', 'o-1', 'Created', '{}', NULL)")
        .await?;
    read_topics(&bootstrap, &["outbox.event.order"], 1, WAIT).await?;

    // The outbox leaves the publication. Its next row is not sent by
    // PostgreSQL; a message after it is, and keepalives keep coming: the
    // relay must not confirm either past the row.
    c.batch_execute("ALTER PUBLICATION walrelay DROP TABLE outbox")
        .await?;
    let before_skipped_row = env.current_wal_lsn().await?;
    c.batch_execute(
        "INSERT INTO outbox VALUES ('e-2', 'order', 'o-2', 'Created', '{}', NULL);
         SELECT walrelay.emit('after', 'k', '{}'::jsonb);",
    )
    .await?;
    let result = tokio::time::timeout(WAIT, relay)
        .await
        .context("the relay kept running after its outbox left the publication")??;
    let e = result.expect_err("stops with an error").to_string();
    assert!(
        e.contains("public.outbox is not in publication \"walrelay\"")
            && e.contains("walrelay setup"),
        "{e}"
    );
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    ensure!(
        confirmed <= before_skipped_row,
        "the slot was confirmed to {confirmed}, past the skipped row at {before_skipped_row}"
    );
    drop(stop);

    // Fixed (`setup` adds it back), the relay runs again; then the
    // publication is dropped: PostgreSQL 18 would skip every outbox row
    // with only a server-side WARNING, so the relay stops by itself.
    walrelay::commands::setup::setup(&config).await?;
    let (stop, stop_rx) = watch::channel(false);
    let relay = tokio::spawn(pipeline::run(config.clone(), stop_rx, None));
    c.batch_execute("INSERT INTO outbox VALUES ('e-3', 'order', 'o-3', 'Created', '{}', NULL)")
        .await?;
    read_topics(&bootstrap, &["outbox.event.order"], 2, WAIT).await?;
    let running = env.confirmed_flush_lsn("walrelay").await?;
    c.batch_execute("DROP PUBLICATION walrelay").await?;
    let before_skipped_row = env.current_wal_lsn().await?;
    c.batch_execute("INSERT INTO outbox VALUES ('e-4', 'order', 'o-4', 'Created', '{}', NULL)")
        .await?;
    let result = tokio::time::timeout(WAIT, relay)
        .await
        .context("the relay kept running after its publication was dropped")??;
    let e = result.expect_err("stops with an error").to_string();
    assert!(
        e.contains("publication \"walrelay\" does not exist") && e.contains("walrelay setup"),
        "{e}"
    );
    let confirmed = env.confirmed_flush_lsn("walrelay").await?;
    ensure!(
        confirmed >= running && confirmed <= before_skipped_row,
        "the slot was confirmed to {confirmed}, past the skipped row at {before_skipped_row}"
    );
    drop(stop);
    Ok(())
}
