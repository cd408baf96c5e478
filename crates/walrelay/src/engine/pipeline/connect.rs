//! Setting a session up: connect, check the server, the publication and
//! the slot, create the producer, and start streaming from the slot's
//! confirmed position. Every check that fails here fails before anything
//! is read or produced, with the fix in the error.

use tokio::time::Instant;
use walrelay_pg::{
    Config as PgConfig, PgOutputOptions, ReplicationConnection, ReplicationStream, StreamOptions,
};
use walrelay_pgoutput::Lsn;

use super::default_source_id;
use super::peers;
use super::seen::Seen;
use crate::config::Config;
use crate::engine::sink::KafkaSink;
use crate::error::RelayError;
use crate::kafka::client::ClientSetup;
use crate::metrics::Metrics;
use crate::source::monitor::{self, Reports};
use crate::source::source_record::start::{at_session_start, read_early, AtStart};
use crate::source::source_record::Identity;

/// A session's connections and starting point.
pub(super) struct Connected {
    pub stream: ReplicationStream,
    pub sink: KafkaSink,
    /// The tail fence's reader configuration (read for restore
    /// detection even with the fence off).
    pub fence_reader: Option<ClientSetup>,
    /// For the fence's reading of the topics' durability settings.
    pub fence_admin: Option<ClientSetup>,
    /// The `walrelay-source` of this session's records.
    pub source: String,
    /// The slot's confirmed position: where the stream starts.
    pub confirmed: Lsn,
    /// The server's WAL position once the slot was ours: no key of this
    /// source in Kafka can be at or past it ([`wal_position_now`]).
    pub server_wal: Lsn,
    pub checks: Reports,
    /// When the start-up publication check began.
    pub checked_since: Instant,
    /// The WAL position the start-up check vouched for.
    pub vouched: Lsn,
    /// What the source record asks of the session, and its writer.
    pub source_record: AtStart,
}

/// Connect, check the server and the slot, create the producer and
/// start streaming from the slot's confirmed position.
pub(super) async fn connect(
    config: &Config,
    pg: &PgConfig,
    slot: &str,
    seen: &mut Seen,
    mut checks: Reports,
    metrics: Option<&Metrics>,
) -> Result<Connected, RelayError> {
    let mut conn = ReplicationConnection::connect(pg).await?;
    let system = conn.identify_system().await?;
    seen.check_timeline(&system.system_id, system.timeline, conn.peer())?;
    let others = peers::other_primaries(pg, conn.peer()).await;
    peers::check(&system.system_id, system.timeline, conn.peer(), &others)?;
    conn.check_wal_level().await?;
    // Refuse to start on a publication that would skip outbox rows
    // (pgoutput itself never says so). Reports of the periodic check
    // from before this point are superseded by this one.
    //
    // On a connection of its own, never on the walsender's: catalog
    // reads there load the outbox tables' *current* shape into the
    // walsender's relation cache, and PostgreSQL 18's pgoutput then
    // described rows written before an ALTER TABLE with the shape
    // after it (a row turned into a missing-column dead letter, and a
    // replay of the same WAL gave different records).
    let checked_since = tokio::time::Instant::now();
    checks.borrow_and_update();
    let vouched = monitor::check_once(pg, config).await?.verdict()?;
    let Some(info) = conn.slot_info(slot).await? else {
        // Never create the slot here: a new slot starts at the
        // current WAL position and would skip what was committed
        // since the old one's confirmed position.
        return Err(match seen.confirmed {
            Some(confirmed) => RelayError::SlotDropped { slot: slot.to_owned(), confirmed },
            None => RelayError::Setup {
                problem: format!("replication slot \"{slot}\" does not exist"),
                fix: "run `walrelay setup` first (it creates the publication, the slot and the SQL helpers); if walrelay used this slot before, it was dropped and events may be missing: see \"The slot was invalidated or dropped\" in docs/operations.md".into(),
            },
        });
    };
    let confirmed = info.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
    seen.confirmed(confirmed);
    if info.wal_status.as_deref() == Some("lost") {
        return Err(RelayError::SlotInvalidated {
            slot: slot.to_owned(),
            confirmed: info.confirmed_flush_lsn,
        });
    }
    if info.plugin.as_deref() != Some("pgoutput") {
        return Err(RelayError::Setup {
            problem: format!(
                "slot \"{slot}\" uses plugin {:?}, not pgoutput",
                info.plugin
            ),
            fix: "use a pgoutput slot: `walrelay setup` with another slot name creates one".into(),
        });
    }
    // A standby polls often: when another walsender holds the slot,
    // stop here, before a Kafka producer is created for nothing.
    // (If the slot frees up in between, START_REPLICATION decides.)
    if info.active {
        return Err(RelayError::SlotInUse {
            slot: slot.to_owned(),
            pid: info.active_pid,
        });
    }
    let source = config.relay.source_id.clone().unwrap_or_else(|| {
        default_source_id(
            &system.system_id,
            system.dbname.as_deref().unwrap_or(pg.get_dbname()),
            slot,
        )
    });
    // Read while the rest is set up; checked once the server's WAL
    // position is known (below).
    let record_read = read_early(config, &source);
    // An OAuth login's first token, fetched off the runtime: a wrong
    // secret or endpoint stops the session here, with the endpoint's
    // answer, rather than as refused Kafka logins later.
    let login = crate::kafka::client::login(&config.kafka)?;
    if login.is_token() {
        tokio::task::spawn_blocking(move || login.check())
            .await
            .map_err(|e| {
                crate::kafka::ClientError::Create(format!("fetching the Kafka OAuth token: {e}"))
            })?
            .map_err(crate::kafka::ClientError::Login)?;
    }
    let sink = KafkaSink::new(&crate::kafka::client::producer_config(&config.kafka))?;
    // Read even with relay.fence = false: the tails detect a restore.
    let fence_reader = Some(crate::kafka::client::client_config(
        &config.kafka,
        crate::kafka::client::KafkaClient::Fence,
    )?);
    let fence_admin = if config.relay.fence {
        Some(crate::kafka::client::client_config(
            &config.kafka,
            crate::kafka::client::KafkaClient::Admin,
        )?)
    } else {
        None
    };
    let options = StreamOptions {
        status_interval: config.postgres.status_interval,
        initial_flush: confirmed,
        ..StreamOptions::default()
    };
    let pgoutput = PgOutputOptions::new([config.postgres.publication.clone()]);
    let stream = conn
        .start_replication(slot, Lsn::ZERO, &pgoutput, options)
        .await?;
    let server_wal = wal_position_now(pg).await?.max(system.xlogpos);
    // Evidence the data topics cannot lose: refused here, before anything
    // is read or produced, when the server is behind what this source
    // published.
    let identity = Identity {
        source_id: source.clone(),
        system_identifier: system.system_id.clone(),
        timeline: system.timeline,
        slot: slot.to_owned(),
    };
    let source_record = at_session_start(
        config,
        identity,
        confirmed,
        server_wal,
        metrics,
        record_read,
    )
    .await?;
    Ok(Connected {
        stream,
        sink,
        fence_reader,
        fence_admin,
        source,
        confirmed,
        server_wal,
        checks,
        checked_since,
        vouched,
        source_record,
    })
}

/// The server's WAL position now, read on a connection of its own after
/// START_REPLICATION acquired the slot. Sampled earlier (IDENTIFY_SYSTEM
/// comes before the publication check and the slot's acquisition), a
/// relay that held the slot meanwhile could have written keys past it
/// and died, and a standby taking over would have taken its own
/// position for a WAL that went back (`FenceError::WalWentBack`), and
/// told the operator to start a new key sequence for nothing. Once the
/// slot is this session's, every key of this source in Kafka was
/// assigned from WAL at or before this position.
async fn wal_position_now(pg: &PgConfig) -> Result<Lsn, RelayError> {
    let mut conn = ReplicationConnection::connect_sql(pg).await?;
    let rows = conn
        .simple_query(
            "SELECT (CASE WHEN pg_catalog.pg_is_in_recovery() \
             THEN pg_catalog.pg_last_wal_replay_lsn() \
             ELSE pg_catalog.pg_current_wal_flush_lsn() END)::text AS lsn",
        )
        .await;
    let _ = conn.close().await;
    let rows = rows?;
    let text = rows
        .first()
        .map(|r| r.get_required("lsn").map(str::to_owned))
        .transpose()?
        .unwrap_or_default();
    text.parse::<Lsn>().map_err(|_| {
        RelayError::Postgres(walrelay_pg::Error::Protocol(format!(
            "the server's WAL position is not an LSN: {text:?}"
        )))
    })
}
