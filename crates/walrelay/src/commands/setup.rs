//! `walrelay setup`: the SQL helpers, the publication and the slot.
//!
//! Idempotent: running it again changes nothing and says what already
//! existed. Order matters: the publication is created before the slot,
//! because pgoutput reads publications through the catalog as of each
//! change; a change decoded from before the publication existed fails with
//! "publication does not exist".

use walrelay_pg::commands::{quote_identifier, quote_literal};
use walrelay_pg::{Config as PgConfig, ReplicationConnection, SlotStatus};
use walrelay_pgoutput::Lsn;

use crate::config::Config;
use crate::engine::pipeline::default_source_id;
use crate::error::RelayError;
use crate::source::slot_record;
use crate::source::source_record;

/// The SQL helpers (`walrelay.emit`), from `sql/walrelay.sql`.
pub const HELPERS_SQL: &str = include_str!("../../../../sql/walrelay.sql");

/// One line of the setup report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Created(String),
    Existed(String),
    Changed(String),
    Warning(String),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Created(s) => write!(f, "created:  {s}"),
            Step::Existed(s) => write!(f, "existed:  {s}"),
            Step::Changed(s) => write!(f, "changed:  {s}"),
            Step::Warning(s) => write!(f, "warning:  {s}"),
        }
    }
}

/// How `setup` treats a slot it created that is gone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetupOptions {
    /// Create the slot anyway, accepting that what was committed since the
    /// old one was lost is not relayed (`--accept-slot-loss`; see
    /// [`crate::source::slot_record`]).
    pub accept_slot_loss: bool,
}

/// Run the set-up and report what was done.
pub async fn setup(config: &Config) -> Result<Vec<Step>, RelayError> {
    setup_with(config, SetupOptions::default()).await
}

/// [`setup`] with its options.
pub async fn setup_with(config: &Config, options: SetupOptions) -> Result<Vec<Step>, RelayError> {
    let pg = PgConfig::from_env_and_str(&config.postgres.url).map_err(walrelay_pg::Error::from)?;
    let mut conn = ReplicationConnection::connect(&pg).await?;
    conn.check_wal_level().await?;
    let mut steps = Vec::new();
    // 1. SQL helpers.
    steps.push(helpers_step(&mut conn).await?);
    // 2. Publication.
    publication_step(&mut conn, config, &mut steps).await?;
    // Whatever setup does not change itself (a row filter, INSERTs not
    // published) would still skip rows: `run` refuses it, so say it now.
    let facts = crate::source::publication::fetch(&mut conn, config).await?;
    let problems = crate::source::publication::assess(&config.postgres.publication, &facts);
    if !problems.is_empty() {
        return Err(crate::source::publication::PublicationError { problems }.into());
    }
    // 3. Slot (after the publication), unless one it created is gone.
    slot_step(&mut conn, config, &pg, options, &mut steps).await?;
    let _ = conn.close().await;
    Ok(steps)
}

/// Installs (or re-installs) the SQL helpers, `walrelay.emit` and
/// `walrelay.slots`.
async fn helpers_step(conn: &mut ReplicationConnection) -> Result<Step, RelayError> {
    let had_helpers = !conn
        .simple_query("SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'walrelay' AND p.proname = 'emit'")
        .await?
        .is_empty();
    conn.simple_query(&format!("BEGIN; {HELPERS_SQL}; COMMIT;"))
        .await?;
    Ok(if had_helpers {
        Step::Existed("SQL helpers walrelay.emit(topic, key, payload, headers) (re-installed, same definition)".into())
    } else {
        Step::Created("SQL helpers walrelay.emit(topic, key, payload, headers)".into())
    })
}

/// The configured outbox tables, and those of them that are partitioned.
type Tables = Vec<(String, String)>;

/// The outbox tables the publication must hold; an error for one that
/// does not exist.
async fn outbox_tables(
    conn: &mut ReplicationConnection,
    config: &Config,
) -> Result<(Tables, Tables), RelayError> {
    let mut wanted = Vec::new();
    // A partitioned outbox needs publish_via_partition_root: without it
    // pgoutput names each change after its partition, which is not the
    // configured table.
    let mut partitioned = Vec::new();
    for o in &config.outbox {
        let (schema, table) = o.qualified_name();
        match crate::source::publication::relkind(conn, &schema, &table).await? {
            Some('r') => {}
            Some('p') => partitioned.push((schema.clone(), table.clone())),
            _ => {
                return Err(RelayError::Setup {
                    problem: format!("outbox table {schema}.{table} does not exist"),
                    fix: "create it first (columns id, aggregatetype, aggregateid, type, payload jsonb and an optional headers jsonb; see docs/relay.md) or fix [[outbox]] table".into(),
                })
            }
        }
        wanted.push((schema, table));
    }
    Ok((wanted, partitioned))
}

fn qualified((s, t): &(String, String)) -> String {
    format!("{}.{}", quote_identifier(s), quote_identifier(t))
}

/// Creates the publication, or brings an existing one up to the
/// configuration.
async fn publication_step(
    conn: &mut ReplicationConnection,
    config: &Config,
    steps: &mut Vec<Step>,
) -> Result<(), RelayError> {
    let publication = &config.postgres.publication;
    let (wanted, partitioned) = outbox_tables(conn, config).await?;
    let pub_exists = !conn
        .simple_query(&format!(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}",
            quote_literal(publication)
        ))
        .await?
        .is_empty();
    if pub_exists {
        return update_publication(conn, publication, &wanted, &partitioned, steps).await;
    }
    let tables = if wanted.is_empty() {
        String::new()
    } else {
        format!(
            " FOR TABLE {}",
            wanted.iter().map(qualified).collect::<Vec<_>>().join(", ")
        )
    };
    let with = if partitioned.is_empty() {
        ""
    } else {
        " WITH (publish_via_partition_root = true)"
    };
    conn.simple_query(&format!(
        "CREATE PUBLICATION {}{tables}{with}",
        quote_identifier(publication)
    ))
    .await?;
    steps.push(Step::Created(if wanted.is_empty() {
        format!("publication {publication} (no tables: logical messages only)")
    } else {
        format!("publication {publication} for {}{with}", describe(&wanted))
    }));
    Ok(())
}

/// An existing publication: publish via the partition root where a table
/// is partitioned, add the missing tables, warn about the others.
async fn update_publication(
    conn: &mut ReplicationConnection,
    publication: &str,
    wanted: &Tables,
    partitioned: &Tables,
    steps: &mut Vec<Step>,
) -> Result<(), RelayError> {
    let via_root = conn
        .simple_query(&format!(
            "SELECT pubviaroot::text AS v FROM pg_catalog.pg_publication WHERE pubname = {}",
            quote_literal(publication)
        ))
        .await?
        .first()
        .map(|r| r.get_required("v").map(|v| v == "true"))
        .transpose()?
        .unwrap_or(false);
    if !partitioned.is_empty() && !via_root {
        // Set first: until then pg_publication_tables lists the
        // partitions instead of the root.
        conn.simple_query(&format!(
            "ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
            quote_identifier(publication)
        ))
        .await?;
        steps.push(Step::Changed(format!(
            "publication {publication}: publish_via_partition_root = true, for partitioned {} (changes already in the slot from before this still name the partitions: see docs/troubleshooting.md)",
            describe(partitioned)
        )));
    }
    let rows = conn
        .simple_query(&format!(
            "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = {}",
            quote_literal(publication)
        ))
        .await?;
    let mut present = Vec::new();
    for r in &rows {
        present.push((
            r.get_required("schemaname")?.to_owned(),
            r.get_required("tablename")?.to_owned(),
        ));
    }
    let missing: Vec<_> = wanted
        .iter()
        .filter(|w| !present.contains(w))
        .cloned()
        .collect();
    if !missing.is_empty() {
        conn.simple_query(&format!(
            "ALTER PUBLICATION {} ADD TABLE {}",
            quote_identifier(publication),
            missing.iter().map(qualified).collect::<Vec<_>>().join(", ")
        ))
        .await?;
        steps.push(Step::Changed(format!(
            "publication {publication}: added {}",
            describe(&missing)
        )));
    } else {
        steps.push(Step::Existed(format!("publication {publication}")));
    }
    let extra: Vec<_> = present
        .iter()
        .filter(|p| !wanted.contains(p))
        .cloned()
        .collect();
    if !extra.is_empty() {
        steps.push(Step::Warning(format!(
            "publication {publication} also publishes {}, which is not an [[outbox]] table: `walrelay run` stops at its first change; remove it with ALTER PUBLICATION {} DROP TABLE ... or configure it",
            describe(&extra),
            quote_identifier(publication)
        )));
    }
    Ok(())
}

/// Ensures the slot and records it in `walrelay.slots`, after checking
/// that no slot `setup` created is gone ([`crate::source::slot_record::decide`]).
async fn slot_step(
    conn: &mut ReplicationConnection,
    config: &Config,
    pg: &PgConfig,
    options: SetupOptions,
    steps: &mut Vec<Step>,
) -> Result<(), RelayError> {
    let slot = &config.postgres.slot;
    let system = conn.identify_system().await?;
    let database = system
        .dbname
        .clone()
        .unwrap_or_else(|| pg.get_dbname().to_owned());
    let source = config
        .relay
        .source_id
        .clone()
        .unwrap_or_else(|| default_source_id(&system.system_id, &database, slot));
    let recorded = slot_record::fetch(conn, slot).await?;
    let before = conn.slot_info(slot).await?;
    let slot_exists = before.is_some();
    // What this source published, from the record no retention deletes:
    // refused here when the server is behind it, before a slot is made.
    let identity = source_record::Identity {
        source_id: source.clone(),
        system_identifier: system.system_id.clone(),
        timeline: system.timeline,
        slot: slot.clone(),
    };
    let (source_record, first_record) = source_record_step(config, &identity, steps).await;
    let published = if slot_exists || recorded.is_some() {
        None
    } else {
        let in_topics = published_before(config, &source, steps).await;
        // The record's event is evidence too, when the topics' records
        // expired.
        let in_record = source_record
            .as_ref()
            .and_then(|r| r.event.as_ref())
            .map(|e| crate::source::published::Published {
                topic: e.topic.clone(),
                partition: e.partition,
                key: e.key,
            });
        match (in_topics, in_record) {
            (Some(t), Some(r)) => Some(if r.key > t.key { r } else { t }),
            (t, r) => t.or(r),
        }
    };
    let now = slot_record::Now {
        slot,
        slot_exists,
        system_identifier: &system.system_id,
        source_id: &source,
        wal: system.xlogpos,
        published: published.as_ref(),
    };
    slot_record::decide(&now, recorded.as_ref(), options.accept_slot_loss).map_err(|r| {
        RelayError::Setup {
            problem: r.problem,
            fix: r.fix,
        }
    })?;
    if let Some(record) = &source_record {
        let start = before
            .as_ref()
            .and_then(|b| b.confirmed_flush_lsn)
            .unwrap_or(system.xlogpos);
        let verdict = source_record::assess(
            record,
            &source_record::Now {
                identity: &identity,
                start,
                server_wal: system.xlogpos,
            },
        )?;
        if let source_record::Verdict::Reproduce(e) = verdict {
            steps.push(Step::Existed(format!(
                "source record of {source:?}: key {} (WAL position {}); the slot replays from \
                 {start}, before it, so walrelay run confirms nothing until its replay \
                 reproduces that event, and stops if it does not (a restored database)",
                e.key,
                Lsn(e.key.high())
            )));
        }
    }
    let replaced = recorded.is_some() && !now.slot_exists;
    let failover = config.postgres.slot_failover;
    if failover {
        failover_supported(conn.server_version_num(), conn.parameter("server_version"))?;
    }
    let (info, created) = match conn.ensure_slot_with(slot, failover).await? {
        SlotStatus::Created(i) => (i, true),
        SlotStatus::Existed(i) => (i, false),
    };
    let kind = if info.failover == Some(true) {
        "pgoutput, failover"
    } else {
        "pgoutput"
    };
    let position = info.confirmed_flush_lsn.unwrap_or(system.xlogpos);
    slot_record::record(
        conn,
        slot,
        &system.system_id,
        &database,
        &source,
        position,
        created,
    )
    .await?;
    // A first record for a source that has none, so that a session that
    // later finds none knows it was deleted.
    if first_record && created {
        match source_record::kafka::write_first(
            &config.kafka,
            &config.relay.source_record_topic,
            &identity,
            position,
            EVIDENCE_TIMEOUT,
        )
        .await
        {
            Ok(()) => steps.push(Step::Created(format!(
                "source record of {source:?} in topic {}",
                config.relay.source_record_topic
            ))),
            Err(e) => steps.push(Step::Warning(format!(
                "could not write the source record of {source:?} ({e}); walrelay run writes it \
                 once it confirmed an event"
            ))),
        }
    }
    let turned = before.is_some_and(|b| b.failover != Some(true)) && info.failover == Some(true);
    steps.push(match (created, replaced, turned) {
        (true, true, _) => Step::Created(format!(
            "replication slot {} ({kind}), starting at {position}, replacing the lost one \
             (--accept-slot-loss: what was committed since it was lost is not relayed)",
            info.slot_name
        )),
        (true, false, _) => Step::Created(format!(
            "replication slot {} ({kind}), starting at {position}",
            info.slot_name
        )),
        (false, _, true) => Step::Changed(format!(
            "replication slot {} is now a failover slot (postgres.slot_failover), \
             confirmed_flush_lsn {position}",
            info.slot_name
        )),
        (false, _, false) => Step::Existed(format!(
            "replication slot {} ({kind}), confirmed_flush_lsn {position}",
            info.slot_name
        )),
    });
    Ok(())
}

/// Failover slots came with PostgreSQL 17: before it, refuse
/// `postgres.slot_failover` and say what protects the slot instead.
fn failover_supported(version_num: Option<u32>, version: Option<&str>) -> Result<(), RelayError> {
    match version_num {
        Some(v) if v >= 170000 => Ok(()),
        _ => Err(RelayError::Setup {
            problem: format!(
                "postgres.slot_failover needs PostgreSQL 17 or later (failover slots), and this \
                 server runs {}",
                version.unwrap_or("an unknown version")
            ),
            fix: "set postgres.slot_failover = false; before PostgreSQL 17 a failover or a major \
                  upgrade loses the slot, which walrelay then refuses to recreate in silence: \
                  follow \"A lost replication slot\" in docs/operations.md, or upgrade to 17 \
                  first"
                .into(),
        }),
    }
}

/// How long `setup` waits for Kafka when it looks for records of this
/// source (a cluster that does not answer is noted, not an error: setup
/// may run before Kafka is reachable).
const EVIDENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Creates the source record's topic (or checks the one that exists) and
/// reads this source's record. The record, and whether a first record
/// may be written (the topic is there and holds none); what went wrong is a warning step (setup may run
/// before Kafka is reachable, and `run` falls back on the data topics'
/// tails).
async fn source_record_step(
    config: &Config,
    identity: &source_record::Identity,
    steps: &mut Vec<Step>,
) -> (Option<source_record::SourceRecord>, bool) {
    let topic = &config.relay.source_record_topic;
    match source_record::kafka::ensure_topic(&config.kafka, topic, EVIDENCE_TIMEOUT).await {
        Ok(source_record::kafka::TopicSetup::Created) => steps.push(Step::Created(format!(
            "topic {topic} (cleanup.policy=compact): what each source published, for restore \
             detection"
        ))),
        Ok(source_record::kafka::TopicSetup::Existed(None)) => {
            steps.push(Step::Existed(format!(
                "topic {topic} (cleanup.policy=compact)"
            )));
        }
        Ok(source_record::kafka::TopicSetup::Existed(Some(policy))) => {
            steps.push(Step::Warning(format!(
                "topic {topic} has cleanup.policy={policy}, not compact: retention may delete the \
                 source record, and a restored database is then caught only while the data topics \
                 still hold its keys; set cleanup.policy=compact on it (docs/operations.md, \"The \
                 source record\")"
            )));
        }
        Err(e) => {
            steps.push(Step::Warning(format!(
                "could not create topic {topic} for the source record ({e}); without it a \
                 database restored from a snapshot is caught only while the data topics still \
                 hold its keys (docs/operations.md, \"The source record\")"
            )));
            return (None, false);
        }
    }
    match source_record::kafka::read(&config.kafka, topic, &identity.source_id, EVIDENCE_TIMEOUT)
        .await
    {
        Ok(record) => {
            let first = record.is_none();
            (record, first)
        }
        Err(e) => {
            steps.push(Step::Warning(format!(
                "could not read the source record of {:?} in topic {topic} ({e})",
                identity.source_id
            )));
            // Unknown, not absent: no first record over it.
            (None, false)
        }
    }
}

/// Records of `source` already in the configured topics
/// ([`crate::source::published`]); a Kafka that cannot be read is a warning step.
async fn published_before(
    config: &Config,
    source: &str,
    steps: &mut Vec<Step>,
) -> Option<crate::source::published::Published> {
    match crate::source::published::find(config, source, EVIDENCE_TIMEOUT).await {
        Ok(found) => found,
        Err(e) => {
            steps.push(Step::Warning(format!(
                "could not look for records of source {source:?} in the configured Kafka topics \
                 ({e}); if this database was restored from a backup taken before the first \
                 walrelay setup, see docs/operations.md, \"A lost replication slot\""
            )));
            None
        }
    }
}

fn describe(tables: &[(String, String)]) -> String {
    tables
        .iter()
        .map(|(s, t)| format!("{s}.{t}"))
        .collect::<Vec<_>>()
        .join(", ")
}
