//! `walrelay status`: the slot and publication as PostgreSQL sees them,
//! for operators and scripts; with `--kafka`, the relay topics'
//! durability settings and the tail fence's verdict on each ([`kafka`]),
//! and this source's record ([`crate::source::source_record::status`]).
//!
//! Exit codes (see [`Health::exit_code`]):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the slot exists, is a pgoutput slot, keeps its WAL, and lag is within `--max-lag-bytes` |
//! | 1 | walrelay could not check (connection or configuration error) |
//! | 2 | the slot or the publication is missing, the slot is not a logical pgoutput slot, or the publication does not cover the configured outbox tables (rows would be skipped) |
//! | 3 | the slot is invalidated (`wal_status = lost`): events were lost, recreate it |
//! | 2 | also: `wal_level` is not `logical` (named as such, not blamed on the slot) |
//! | 4 | the slot is at risk (`wal_status = unreserved`) or lags more than `--max-lag-bytes` |
//! | 5 | with `--require-active`: the slot is fine but no relay streams from it |
//! | 64 | the command line is invalid (see [`USAGE`]) |

pub mod kafka;

use serde::Serialize;
use walrelay_pg::commands::quote_literal;
use walrelay_pg::{Config as PgConfig, ReplicationConnection};

use crate::config::Config;
use crate::error::RelayError;

/// Exit code of `walrelay status` for an invalid command line (EX_USAGE),
/// so that it cannot be mistaken for a verdict: clap's own code, 2, is
/// "missing" here.
pub const USAGE: i32 = 64;

/// What `walrelay status` reports.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Status {
    pub slot: String,
    pub slot_exists: bool,
    pub plugin: Option<String>,
    pub slot_type: Option<String>,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub confirmed_flush_lsn: Option<String>,
    pub current_wal_lsn: Option<String>,
    /// `pg_current_wal_lsn() - confirmed_flush_lsn`: WAL the slot holds
    /// back and walrelay has yet to confirm.
    pub lag_bytes: Option<i64>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Bytes of WAL that can still be written before the slot is in danger
    /// of invalidation (NULL when `max_slot_wal_keep_size` is -1).
    pub safe_wal_size: Option<i64>,
    /// Whether the slot is a failover slot (`None`: no slot, or a server
    /// before PostgreSQL 17).
    pub slot_failover: Option<bool>,
    /// The primary's `synchronized_standby_slots` (`None` before 17).
    pub synchronized_standby_slots: Option<Vec<String>>,
    /// What could make a PostgreSQL failover contradict what walrelay
    /// published, or lose the slot, each with its fix (`RISK:` lines).
    pub failover_risks: Vec<String>,
    /// Why logical decoding waits for a standby (nothing lost).
    pub failover_waits: Vec<String>,
    pub publication: String,
    pub publication_exists: bool,
    /// `schema.table` of every published table.
    pub publication_tables: Vec<String>,
    /// The server's `wal_level`; walrelay needs `logical`.
    pub wal_level: Option<String>,
    /// Why the publication would let outbox rows go unsent, each with its
    /// fix (the check `run` makes at start and periodically).
    pub publication_problems: Vec<String>,
    pub health: Health,
    /// With `--kafka`: the topics' durability settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka: Option<kafka::KafkaDurability>,
    /// With `--kafka`: this source's record ([`crate::source::source_record`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_record: Option<crate::source::source_record::status::SourceRecordStatus>,
    /// The `walrelay-source` of the relay's records (`relay.source_id`,
    /// or the default from the server's system identifier, database and
    /// slot): whose records `--kafka` reads at the partitions' tails.
    pub source_id: String,
}

/// The verdict, with its exit code.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ok,
    /// `wal_level` is not `logical`: no logical slot can work, whatever
    /// the slot's state (a set-up problem, exit 2 like `Missing`).
    WalLevel,
    Missing,
    Lost,
    AtRisk,
    /// Asked for with `--require-active`: the slot is fine, but no relay
    /// streams from it, so nothing is being published.
    Inactive,
}

impl Health {
    pub fn exit_code(self) -> i32 {
        match self {
            Health::Ok => 0,
            Health::WalLevel | Health::Missing => 2,
            Health::Lost => 3,
            Health::AtRisk => 4,
            Health::Inactive => 5,
        }
    }
}

/// What `walrelay status` checks beyond the slot's own state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `--max-lag-bytes`: more lag is [`Health::AtRisk`].
    pub max_lag_bytes: Option<i64>,
    /// `--require-active`: no relay connected is [`Health::Inactive`].
    pub require_active: bool,
}

/// Decide the health from the facts (pure, unit-tested). The most severe
/// finding wins; a wrong `wal_level` comes first, as it explains a
/// missing slot.
pub fn assess(s: &Status, limits: Limits) -> Health {
    if s.wal_level.as_deref().is_some_and(|l| l != "logical") {
        return Health::WalLevel;
    }
    if !s.slot_exists
        || !s.publication_exists
        || s.plugin.as_deref() != Some("pgoutput")
        || !s.publication_problems.is_empty()
    {
        return Health::Missing;
    }
    match s.wal_status.as_deref() {
        Some("lost") => Health::Lost,
        Some("unreserved") => Health::AtRisk,
        _ => match (limits.max_lag_bytes, s.lag_bytes) {
            (Some(max), Some(lag)) if lag > max => Health::AtRisk,
            _ if limits.require_active && !s.active => Health::Inactive,
            _ => Health::Ok,
        },
    }
}

/// Query the server.
pub async fn status(config: &Config, limits: Limits) -> Result<Status, RelayError> {
    let pg = PgConfig::from_env_and_str(&config.postgres.url).map_err(walrelay_pg::Error::from)?;
    let mut conn = ReplicationConnection::connect(&pg).await?;
    let wal_level = Some(conn.show("wal_level").await?);
    let slot = &config.postgres.slot;
    let system = conn.identify_system().await?;
    let source_id = config.relay.source_id.clone().unwrap_or_else(|| {
        crate::engine::pipeline::default_source_id(
            &system.system_id,
            system.dbname.as_deref().unwrap_or(pg.get_dbname()),
            slot,
        )
    });
    let publication = &config.postgres.publication;
    let rows = conn
        .simple_query(&format!(
            "SELECT plugin, slot_type, database, active::text, active_pid::text, confirmed_flush_lsn::text, \
             pg_current_wal_lsn()::text AS current_wal_lsn, \
             pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint::text AS lag_bytes, \
             wal_status, safe_wal_size::text \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            quote_literal(slot)
        ))
        .await?;
    let publication_exists = !conn
        .simple_query(&format!(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}",
            quote_literal(publication)
        ))
        .await?
        .is_empty();
    let tables = conn
        .simple_query(&format!(
            "SELECT schemaname || '.' || tablename AS t FROM pg_catalog.pg_publication_tables WHERE pubname = {} ORDER BY 1",
            quote_literal(publication)
        ))
        .await?;
    let mut publication_tables = Vec::new();
    for t in &tables {
        publication_tables.push(t.get_required("t")?.to_owned());
    }
    let publication_problems = crate::source::publication::assess(
        publication,
        &crate::source::publication::fetch(&mut conn, config).await?,
    )
    .iter()
    .map(ToString::to_string)
    .collect();
    let failover =
        crate::source::slot_failover::fetch(&mut conn, slot, config.postgres.slot_failover).await?;
    let (risks, waits): (Vec<_>, Vec<_>) = crate::source::slot_failover::assess(&failover)
        .into_iter()
        .partition(crate::source::slot_failover::Finding::is_risk);
    let current: Option<String> = if rows.is_empty() {
        let r = conn
            .simple_query("SELECT pg_current_wal_lsn()::text AS l")
            .await?;
        r.first()
            .and_then(|r| r.get("l").ok().flatten().map(str::to_owned))
    } else {
        None
    };
    let _ = conn.close().await;

    let text = |c: &str| -> Result<Option<String>, RelayError> {
        Ok(match rows.first() {
            Some(r) => r.get(c)?.map(str::to_owned),
            None => None,
        })
    };
    let int =
        |c: &str| -> Result<Option<i64>, RelayError> { Ok(text(c)?.and_then(|v| v.parse().ok())) };
    let mut s = Status {
        slot: slot.clone(),
        slot_exists: !rows.is_empty(),
        plugin: text("plugin")?,
        slot_type: text("slot_type")?,
        database: text("database")?,
        active: text("active")?.as_deref() == Some("true"),
        active_pid: int("active_pid")?.and_then(|p| i32::try_from(p).ok()),
        confirmed_flush_lsn: text("confirmed_flush_lsn")?,
        current_wal_lsn: text("current_wal_lsn")?.or(current),
        lag_bytes: int("lag_bytes")?,
        wal_status: text("wal_status")?,
        safe_wal_size: int("safe_wal_size")?,
        slot_failover: failover.slot_failover,
        synchronized_standby_slots: failover.standby_slots,
        failover_risks: risks.iter().map(ToString::to_string).collect(),
        failover_waits: waits.iter().map(ToString::to_string).collect(),
        publication: publication.clone(),
        publication_exists,
        publication_tables,
        wal_level,
        publication_problems,
        health: Health::Ok,
        kafka: None,
        source_record: None,
        source_id,
    };
    s.health = assess(&s, limits);
    Ok(s)
}

/// The slot's failover line, and what a failover would do wrong.
fn render_failover(s: &Status) -> String {
    let mut out = format!(
        "failover             {}\n",
        match (s.slot_failover, &s.synchronized_standby_slots) {
            (Some(true), Some(names)) if !names.is_empty() => format!(
                "yes, synchronized to standbys with sync_replication_slots = on; decoding waits \
                 for {} (synchronized_standby_slots); on a standby, \
                 SELECT slot_name, synced FROM pg_replication_slots shows its copy",
                names.join(", ")
            ),
            (Some(true), _) =>
                "yes, synchronized to standbys with sync_replication_slots = on".into(),
            (Some(false), _) =>
                "no (postgres.slot_failover: a failover to a standby loses the slot)".into(),
            (None, _) => "- (PostgreSQL 16 or older: a failover loses the slot)".into(),
        }
    );
    for r in &s.failover_risks {
        out.push_str(&format!("RISK: {r}\n"));
    }
    for w in &s.failover_waits {
        out.push_str(&format!("waiting              {w}\n"));
    }
    out
}

/// Human-readable form.
pub fn render(s: &Status) -> String {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut out = String::new();
    if let Some(level) = s.wal_level.as_deref().filter(|l| *l != "logical") {
        out.push_str(&format!(
            "wal_level            {level}: logical decoding is off, so no logical slot can be \
             created or read; set wal_level=logical (ALTER SYSTEM SET wal_level = logical) and \
             restart PostgreSQL, then run `walrelay setup`\n"
        ));
    }
    if s.slot_exists {
        out.push_str(&format!(
            "slot                 {} ({} {}, database {})\n",
            s.slot,
            opt(&s.slot_type),
            opt(&s.plugin),
            opt(&s.database)
        ));
        out.push_str(&format!(
            "active               {}\n",
            match s.active_pid {
                Some(pid) if s.active => format!("yes, walsender pid {pid}"),
                _ => "no (no relay connected)".into(),
            }
        ));
        out.push_str(&format!(
            "confirmed_flush_lsn  {}\n",
            opt(&s.confirmed_flush_lsn)
        ));
        out.push_str(&format!(
            "current WAL          {}\n",
            opt(&s.current_wal_lsn)
        ));
        out.push_str(&format!(
            "lag                  {}\n",
            s.lag_bytes
                .map(|b| format!("{b} bytes"))
                .unwrap_or_else(|| "-".into())
        ));
        out.push_str(&format!("wal_status           {}\n", opt(&s.wal_status)));
        out.push_str(&format!(
            "safe_wal_size        {}\n",
            match (s.safe_wal_size, s.wal_status.as_deref()) {
                (Some(b), _) => format!("{b} bytes"),
                // PostgreSQL reports NULL for a lost slot too.
                (None, Some("lost")) => "- (the slot is lost)".into(),
                (None, _) => "unlimited (max_slot_wal_keep_size = -1)".into(),
            }
        ));
        out.push_str(&render_failover(s));
    } else {
        out.push_str(&format!(
            "slot                 {} does not exist (run `walrelay setup`)\n",
            s.slot
        ));
    }
    if s.publication_exists {
        out.push_str(&format!(
            "publication          {} ({})\n",
            s.publication,
            if s.publication_tables.is_empty() {
                "no tables: messages only".to_owned()
            } else {
                s.publication_tables.join(", ")
            }
        ));
    } else {
        out.push_str(&format!(
            "publication          {} does not exist (run `walrelay setup`)\n",
            s.publication
        ));
    }
    for p in &s.publication_problems {
        out.push_str(&format!("publication problem  {p}\n"));
    }
    out.push_str(&format!(
        "health               {}\n",
        match s.health {
            Health::Ok => "ok",
            Health::WalLevel => "WAL_LEVEL: wal_level is not logical: set wal_level=logical and restart PostgreSQL (exit 2)",
            Health::Inactive => "INACTIVE: the slot is fine but no relay is connected, so nothing is being published: start `walrelay run` or find out why it stopped (exit 5, --require-active)",
            Health::Missing => "MISSING: the slot or publication is missing or not pgoutput, or the publication does not cover the configured outbox tables (exit 2)",
            Health::Lost => "LOST: the slot was invalidated; WAL it needed is gone, and the events committed after confirmed_flush_lsn cannot be relayed: drop the slot, recreate it with `walrelay setup --accept-slot-loss` under a new relay.source_id, backfill or reconcile the lost events, raise max_slot_wal_keep_size (docs/operations.md) (exit 3)",
            Health::AtRisk => "AT RISK: WAL may be removed before walrelay confirms it, or lag is over the limit: find out why walrelay is not confirming before the slot is lost (exit 4)",
        }
    ));
    if let Some(record) = &s.source_record {
        out.push_str(&crate::source::source_record::status::render(record));
    }
    if let Some(kafka) = &s.kafka {
        out.push_str(&kafka::render(kafka));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Status {
        Status {
            slot: "walrelay".into(),
            slot_exists: true,
            plugin: Some("pgoutput".into()),
            slot_type: Some("logical".into()),
            database: Some("app".into()),
            active: true,
            active_pid: Some(42),
            confirmed_flush_lsn: Some("0/1000".into()),
            current_wal_lsn: Some("0/2000".into()),
            lag_bytes: Some(4096),
            wal_status: Some("reserved".into()),
            safe_wal_size: None,
            slot_failover: Some(false),
            synchronized_standby_slots: Some(vec![]),
            failover_risks: vec![],
            failover_waits: vec![],
            publication: "walrelay".into(),
            publication_exists: true,
            publication_tables: vec!["public.outbox".into()],
            wal_level: Some("logical".into()),
            publication_problems: vec![],
            health: Health::Ok,
            kafka: None,
            source_record: None,
            source_id: "1/app/walrelay".into(),
        }
    }

    fn lag(max: i64) -> Limits {
        Limits {
            max_lag_bytes: Some(max),
            ..Limits::default()
        }
    }

    #[test]
    fn wal_level_is_named_before_the_slot_and_inactive_only_on_request() {
        let replica = Status {
            wal_level: Some("replica".into()),
            slot_exists: false,
            ..healthy()
        };
        assert_eq!(assess(&replica, Limits::default()), Health::WalLevel);
        assert_eq!(Health::WalLevel.exit_code(), 2);
        let text = render(&Status {
            health: Health::WalLevel,
            ..replica
        });
        assert!(
            text.contains("wal_level            replica") && text.contains("set wal_level=logical"),
            "{text}"
        );
        let idle = Status {
            active: false,
            active_pid: None,
            ..healthy()
        };
        assert_eq!(assess(&idle, Limits::default()), Health::Ok);
        let required = Limits {
            require_active: true,
            ..Limits::default()
        };
        assert_eq!(assess(&idle, required), Health::Inactive);
        assert_eq!(Health::Inactive.exit_code(), 5);
        assert_eq!(assess(&healthy(), required), Health::Ok);
        // Worse findings still win.
        let lost = Status {
            wal_status: Some("lost".into()),
            ..idle
        };
        assert_eq!(assess(&lost, required), Health::Lost);
        let codes = [
            Health::Ok,
            Health::Missing,
            Health::Lost,
            Health::AtRisk,
            Health::Inactive,
        ]
        .map(Health::exit_code);
        assert!(!codes.contains(&USAGE) && !codes.contains(&1));
    }

    #[test]
    fn health_and_exit_codes() {
        let s = healthy();
        assert_eq!(assess(&s, Limits::default()), Health::Ok);
        assert_eq!(assess(&s, lag(4096)), Health::Ok);
        assert_eq!(assess(&s, lag(4095)), Health::AtRisk);
        let lost = Status {
            wal_status: Some("lost".into()),
            ..healthy()
        };
        assert_eq!(assess(&lost, Limits::default()).exit_code(), 3);
        let rendered = render(&Status {
            health: Health::Lost,
            safe_wal_size: None,
            ..lost.clone()
        });
        assert!(
            rendered.contains("the slot is lost") && rendered.contains("walrelay setup"),
            "{rendered}"
        );
        let unreserved = Status {
            wal_status: Some("unreserved".into()),
            ..healthy()
        };
        assert_eq!(assess(&unreserved, Limits::default()).exit_code(), 4);
        let missing = Status {
            slot_exists: false,
            ..healthy()
        };
        assert_eq!(assess(&missing, Limits::default()).exit_code(), 2);
        let wrong_plugin = Status {
            plugin: Some("wal2json".into()),
            ..healthy()
        };
        assert_eq!(assess(&wrong_plugin, Limits::default()), Health::Missing);
        let drift = Status {
            publication_problems: vec!["outbox table public.outbox2 is not in publication".into()],
            ..healthy()
        };
        assert_eq!(assess(&drift, Limits::default()).exit_code(), 2);
        assert!(render(&drift).contains("publication problem  outbox table public.outbox2"));
    }

    #[test]
    fn renders_and_serializes() {
        let s = healthy();
        let text = render(&s);
        assert!(
            text.contains("walsender pid 42")
                && text.contains("4096 bytes")
                && text.contains("public.outbox")
        );
        let json: serde_json::Value = serde_json::to_value(&s).unwrap();
        assert_eq!(json["lag_bytes"], 4096);
        assert_eq!(json["health"], "ok");
    }

    #[test]
    fn the_failover_line_and_its_risks() {
        let rendered = render(&healthy());
        assert!(
            rendered.contains("failover             no (postgres.slot_failover"),
            "{rendered}"
        );
        let unprotected = Status {
            slot_failover: Some(true),
            failover_risks: vec![crate::source::slot_failover::Finding::Unprotected.to_string()],
            ..healthy()
        };
        let rendered = render(&unprotected);
        assert!(
            rendered.contains("failover             yes")
                && rendered.contains(
                    "\nRISK: the slot is a failover slot but synchronized_standby_slots is empty"
                ),
            "{rendered}"
        );
        let protected = Status {
            slot_failover: Some(true),
            synchronized_standby_slots: Some(vec!["standby1".into()]),
            ..healthy()
        };
        let rendered = render(&protected);
        assert!(
            rendered.contains("decoding waits for standby1") && !rendered.contains("RISK"),
            "{rendered}"
        );
        let json = serde_json::to_value(&protected).unwrap();
        assert_eq!(json["slot_failover"], true);
        assert_eq!(json["synchronized_standby_slots"][0], "standby1");
        // A standby the list leaves out is a risk although the list is set.
        let partly = Status {
            failover_risks: vec![crate::source::slot_failover::Finding::UnlistedStandbys {
                slots: vec!["standby2".into()],
                listed: vec!["standby1".into()],
            }
            .to_string()],
            ..protected
        };
        let rendered = render(&partly);
        assert!(
            rendered.contains("decoding waits for standby1")
                && rendered.contains(
                    "\nRISK: standbys stream from the primary through physical slots that \
                     synchronized_standby_slots does not name (standby2)"
                ),
            "{rendered}"
        );
    }
}
