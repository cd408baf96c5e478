//! Debezium beside walrelay (issue 24): its PostgreSQL connector with the
//! Outbox Event Router on a Kafka Connect standalone worker (the
//! testkit's [`DebeziumWorker`], configured by `bench/debezium/`), draining
//! the same committed backlogs on the same broker, and relaying the same
//! live load in the latency runs.
//!
//! * A drain run gets a slot of its own, made with walrelay's before the
//!   backlog is written, and the publication [`PUBLICATION`], made before
//!   any slot (pgoutput looks publications up in the catalog as of the
//!   WAL it decodes, so one created after the backlog would fail it). With
//!   `snapshot.mode=no_data`, no offsets and an existing slot, Debezium
//!   streams from the slot's confirmed position: the whole backlog.
//! * Messages go to `<topic.prefix>.message` (a prefix per run), outbox
//!   rows through the Event Router to [`OUTBOX_TOPIC`] (the bench's
//!   aggregatetype is `bench`); the bench creates both with the bench's
//!   partition count before the worker starts (Connect leaves existing
//!   topics alone), so the partitioning is walrelay's.
//! * The drain ends when the records of every event are in Kafka (see
//!   [`watch`] for why not the slot's position) and is timed from the
//!   moment the connector streams: the worker's start (a JVM, Connect,
//!   the connector) is its own row ([`Startup`], and a restart
//!   [`RestartRun`]).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use walrelay_testkit::{ConnectDelivery, DebeziumOptions, Variant};

use crate::env::BenchEnv;
use crate::runs::Tool;
use crate::workload::{OUTBOX_TABLE, PREFIX};

mod drain;
mod drain_once;
pub mod readback;
mod walrelay_start;
pub mod watch;

pub use drain::{drain_workload, LatencyWorker};
pub(crate) use walrelay_start::spawn_walrelay;
pub use walrelay_start::WalrelayStart;

/// The publication of every Debezium run (its own, not walrelay's
/// `bench`): the outbox table.
pub const PUBLICATION: &str = "dbz_bench";
/// Where the Event Router sends the bench's outbox rows:
/// `outbox.event.<aggregatetype>`.
pub const OUTBOX_TOPIC: &str = "outbox.event.bench";

/// What the bench appends to the connector's properties (its outbox
/// payload is text, not JSON; the file says why).
const OVERLAY: &str = include_str!("../../../../bench/debezium/connector-bench.properties");

/// The row a variant's drains fill.
pub fn tool(variant: Variant) -> Tool {
    match variant {
        Variant::Defaults => Tool::Debezium,
        Variant::Tuned => Tool::DebeziumTuned,
    }
}

/// The short tag of a variant in slot and topic names.
fn tag(variant: Variant) -> &'static str {
    match variant {
        Variant::Defaults => "dz",
        Variant::Tuned => "dt",
    }
}

/// The slot of a variant's drain of workload `id`, repeat `r`.
pub fn slot(variant: Variant, id: &str, r: u32) -> String {
    format!("{}_{}_{r}", tag(variant), id.replace('-', "_"))
}

/// The worker's options for the bench: the bench's publication, outbox
/// table and message prefix, and [`OVERLAY`].
pub fn options(variant: Variant, name: &str, slot: &str, topic_prefix: &str) -> DebeziumOptions {
    DebeziumOptions {
        variant,
        delivery: ConnectDelivery::AtLeastOnce,
        name: name.to_owned(),
        topic_prefix: topic_prefix.to_owned(),
        slot: slot.to_owned(),
        publication: PUBLICATION.to_owned(),
        outbox_table: OUTBOX_TABLE.to_owned(),
        message_prefixes: vec![PREFIX.to_owned()],
        dbname: "postgres".to_owned(),
        // The defaults variant scans every plugin class at start: up to a
        // minute on two cores shared with a build.
        start_timeout: Duration::from_secs(300),
        connector_overlay: Some((
            "bench/debezium/connector-bench.properties".to_owned(),
            OVERLAY.to_owned(),
        )),
    }
}

/// Creates [`PUBLICATION`] for the outbox table if it is missing (before
/// any slot of Debezium's: see the module's doc).
pub async fn ensure_publication(env: &BenchEnv) -> Result<()> {
    env.client
        .batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = '{PUBLICATION}') THEN
                     CREATE PUBLICATION {PUBLICATION} FOR TABLE {OUTBOX_TABLE};
                 END IF;
             END $$;"
        ))
        .await?;
    Ok(())
}

/// Drops `slot` once no walsender holds it (a stopped worker's may hold
/// it for a moment).
pub async fn drop_slot_when_free(env: &BenchEnv, slot: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let active: Option<bool> = env
            .client
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await?
            .map(|r| r.get(0));
        match active {
            None => return Ok(()),
            Some(false) => return env.drop_slot(slot).await,
            Some(true) if Instant::now() >= deadline => {
                bail!("slot {slot} still active 30 s after its worker stopped")
            }
            Some(true) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// `--debezium-variants`: parsed names.
pub fn parse_variants(names: &[String]) -> Result<Vec<Variant>> {
    let mut out = Vec::new();
    for n in names {
        let v: Variant = n.trim().parse()?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_variants() {
        assert_eq!(slot(Variant::Tuned, "msg-1tx-200b", 2), "dt_msg_1tx_200b_2");
        assert_eq!(tool(Variant::Defaults), Tool::Debezium);
        assert_eq!(
            parse_variants(&["tuned".into(), "defaults".into(), "tuned".into()]).unwrap(),
            [Variant::Tuned, Variant::Defaults]
        );
        assert!(parse_variants(&["fast".into()]).is_err());
        let o = options(Variant::Tuned, "n", "s", "bench.x.dt0");
        assert!(o
            .connector_overlay
            .as_ref()
            .is_some_and(|(_, t)| t.contains("table.expand.json.payload=false")));
    }
}
