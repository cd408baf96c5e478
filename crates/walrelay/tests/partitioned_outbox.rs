//! A partitioned outbox table: teams drop old events by detaching and
//! dropping a partition. `setup` publishes it with
//! `publish_via_partition_root`, so every change arrives under the root's
//! name, whichever partition holds the row. Real PostgreSQL and Tansu.

mod support;

use anyhow::Result;
use support::{apply_high_water_marks, check_confirmations_follow_acks, Env, WAIT};
use tokio::sync::{mpsc, watch};
use walrelay::commands::setup::{self, Step};
use walrelay::config::OutboxConfig;
use walrelay::engine::pipeline;
use walrelay_testkit::read_topics;

const PARTITIONED: &str = "
    CREATE TABLE outbox_p (
        id text NOT NULL,
        aggregatetype text NOT NULL,
        aggregateid text,
        type text,
        payload jsonb,
        created date NOT NULL,
        PRIMARY KEY (id, created)
    ) PARTITION BY RANGE (created);
    CREATE TABLE outbox_p_2025 PARTITION OF outbox_p FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
    CREATE TABLE outbox_p_2026 PARTITION OF outbox_p FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
    CREATE TABLE outbox_p_2027 PARTITION OF outbox_p FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
";

fn insert(id: &str, created: &str) -> String {
    format!(
        "INSERT INTO outbox_p VALUES ('{id}', 'invoice', '{id}', 'Issued', '{{\"id\": \"{id}\"}}', '{created}');"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_outbox_relays_every_partition_and_survives_a_dropped_one() -> Result<()> {
    let env = Env::start().await?;
    let bootstrap = env.bootstrap();
    let c = &env.client;
    c.batch_execute(PARTITIONED).await?;

    // The publication exists already (for the plain outbox) when the
    // partitioned table is added to the configuration: `setup` turns
    // publish_via_partition_root on and adds the root.
    let mut config = env.config(&bootstrap);
    setup::setup(&config).await?;
    config.outbox.push(OutboxConfig {
        table: "public.outbox_p".into(),
        topic: "partitioned.{aggregatetype}".into(),
        columns: Default::default(),
    });
    let steps = setup::setup(&config).await?;
    assert!(
        steps.iter().any(
            |s| matches!(s, Step::Changed(t) if t.contains("publish_via_partition_root = true"))
        ),
        "{steps:?}"
    );
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, Step::Changed(t) if t.contains("added public.outbox_p"))),
        "{steps:?}"
    );

    let (stop, stop_rx) = watch::channel(false);
    let (trace_tx, mut trace_rx) = mpsc::unbounded_channel();
    let relay = tokio::spawn(pipeline::run(config.clone(), stop_rx, Some(trace_tx)));

    // Rows in every partition, through the root and straight into a
    // partition; then the oldest partition is detached and dropped, and
    // more rows follow.
    c.batch_execute(&format!(
        "BEGIN; {} {} {} COMMIT;",
        insert("a-2025", "2025-06-01"),
        insert("a-2026", "2026-06-01"),
        insert("a-2027", "2027-06-01")
    ))
    .await?;
    c.batch_execute(
        "INSERT INTO outbox_p_2026 VALUES ('direct-2026', 'invoice', 'direct-2026', 'Issued', '{}', '2026-02-02')",
    )
    .await?;
    c.batch_execute(
        "ALTER TABLE outbox_p DETACH PARTITION outbox_p_2025; DROP TABLE outbox_p_2025;",
    )
    .await?;
    c.batch_execute(&format!(
        "{} {}",
        insert("b-2026", "2026-07-01"),
        insert("b-2027", "2027-07-01")
    ))
    .await?;

    let records = read_topics(&bootstrap, &["partitioned.invoice"], 6, WAIT).await?;
    let mut ids: Vec<String> = records
        .iter()
        .filter_map(|r| r.key_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids,
        [
            "a-2025",
            "a-2026",
            "a-2027",
            "b-2026",
            "b-2027",
            "direct-2026"
        ],
        "every row once, under the root's topic"
    );
    let (fresh, _) = apply_high_water_marks(&records)?;
    assert_eq!(fresh.values().map(Vec::len).sum::<usize>(), 6);

    stop.send(true)?;
    relay.await??;
    let mut trace = Vec::new();
    while let Ok(t) = trace_rx.try_recv() {
        trace.push(t);
    }
    assert!(check_confirmations_follow_acks(&trace)? > 0);
    assert!(
        !trace
            .iter()
            .any(|t| matches!(t, pipeline::Trace::SessionEnded { error: Some(_) })),
        "{trace:?}"
    );

    // A fresh publication for a partitioned outbox is created with the
    // option from the start.
    let mut fresh_config = config.clone();
    fresh_config.postgres.publication = "walrelay_p".into();
    fresh_config.postgres.slot = "walrelay_p".into();
    fresh_config.outbox.retain(|o| o.table == "public.outbox_p");
    let steps = setup::setup(&fresh_config).await?;
    assert!(
        steps.iter().any(|s| matches!(s, Step::Created(t)
            if t.contains("publication walrelay_p for public.outbox_p WITH (publish_via_partition_root = true)"))),
        "{steps:?}"
    );
    let via_root: bool = c
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'walrelay_p'",
            &[],
        )
        .await?
        .get(0);
    assert!(via_root);
    Ok(())
}
