//! Replication commands and catalog checks before streaming: identify the
//! system, the slot and the publications, then start replication.

use postgres_protocol::message::frontend;
use tracing::{debug, info};
use walrelay_pgoutput::Lsn;

use crate::backend::BackendMessage;
use crate::commands::{self, IdentifySystem, PgOutputOptions, SlotInfo};
use crate::error::{sqlstate, Error};
use crate::stream::{ReplicationStream, StreamOptions};

use super::{ReplicationConnection, SlotStatus};

/// How long `ALTER_REPLICATION_SLOT` may wait for the slot to be released.
const ALTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl ReplicationConnection {
    /// `IDENTIFY_SYSTEM`.
    pub async fn identify_system(&mut self) -> Result<IdentifySystem, Error> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Protocol("IDENTIFY_SYSTEM returned no row".into()))?;
        let timeline = row.get_required("timeline")?;
        Ok(IdentifySystem {
            system_id: row.get_required("systemid")?.to_owned(),
            timeline: timeline.parse().map_err(|_| {
                Error::Protocol(format!("IDENTIFY_SYSTEM returned timeline {timeline:?}"))
            })?,
            xlogpos: commands::parse_lsn_field(
                "IDENTIFY_SYSTEM",
                "xlogpos",
                row.get_required("xlogpos")?,
            )?,
            dbname: row.get("dbname")?.map(str::to_owned),
        })
    }

    /// The value of a server setting (`SHOW name`).
    pub async fn show(&mut self, setting: &str) -> Result<String, Error> {
        let rows = self
            .simple_query(&format!("SHOW {}", commands::quote_identifier(setting)))
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Protocol(format!("SHOW {setting} returned no row")))?;
        let column = row.columns().first().cloned().unwrap_or_default();
        Ok(row.get_required(&column)?.to_owned())
    }

    /// Fail early, with the fix, when the server cannot decode logically.
    pub async fn check_wal_level(&mut self) -> Result<(), Error> {
        let level = self.show("wal_level").await?;
        if level != "logical" {
            return Err(Error::Precondition {
                problem: format!("wal_level is '{level}' on {}", self.peer),
                fix: "set wal_level=logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL".into(),
            });
        }
        Ok(())
    }

    /// The slot's row in `pg_replication_slots`, if the slot exists.
    pub async fn slot_info(&mut self, slot: &str) -> Result<Option<SlotInfo>, Error> {
        let rows = self.simple_query(&commands::slot_info_query(slot)).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let lsn = |field: &str| -> Result<Option<Lsn>, Error> {
            row.get(field)?
                .map(|v| commands::parse_lsn_field("pg_replication_slots", field, v))
                .transpose()
        };
        Ok(Some(SlotInfo {
            slot_name: row.get_required("slot_name")?.to_owned(),
            plugin: row.get("plugin")?.map(str::to_owned),
            slot_type: row.get_required("slot_type")?.to_owned(),
            database: row.get("database")?.map(str::to_owned),
            active: row.get("active")? == Some("t"),
            active_pid: row.get("active_pid")?.and_then(|p| p.parse().ok()),
            restart_lsn: lsn("restart_lsn")?,
            confirmed_flush_lsn: lsn("confirmed_flush_lsn")?,
            wal_status: row.get("wal_status")?.map(str::to_owned),
            failover: row.get("failover")?.map(|v| v == "true"),
            synced: row.get("synced")?.map(|v| v == "true"),
        }))
    }

    /// Create the pgoutput slot unless it exists; check that an existing one
    /// is a logical pgoutput slot of this database.
    pub async fn ensure_slot(&mut self, slot: &str) -> Result<SlotStatus, Error> {
        self.ensure_slot_with(slot, false).await
    }

    /// [`Self::ensure_slot`], and with `failover` a failover slot
    /// (PostgreSQL 17 and later): created with `FAILOVER true`, or an
    /// existing slot turned into one. An existing failover slot is never
    /// turned back.
    pub async fn ensure_slot_with(
        &mut self,
        slot: &str,
        failover: bool,
    ) -> Result<SlotStatus, Error> {
        if let Some(info) = self.slot_info(slot).await? {
            self.check_slot(&info)?;
            if failover && info.failover != Some(true) {
                self.enable_failover(&info).await?;
                let info = self.slot_info(slot).await?.ok_or_else(|| {
                    Error::Protocol(format!(
                        "slot \"{slot}\" is missing right after ALTER_REPLICATION_SLOT"
                    ))
                })?;
                return Ok(SlotStatus::Existed(info));
            }
            return Ok(SlotStatus::Existed(info));
        }
        let command = if failover {
            commands::create_failover_slot_command(slot)?
        } else {
            commands::create_slot_command(slot)?
        };
        let created = self.simple_query(&command).await;
        match created {
            Ok(_) => {}
            // Lost a race with another creator: fine, check what is there.
            Err(e) if e.code() == Some(sqlstate::DUPLICATE_OBJECT) => {}
            Err(e) => return Err(e),
        }
        let info = self.slot_info(slot).await?.ok_or_else(|| {
            Error::Protocol(format!(
                "slot \"{slot}\" is missing right after CREATE_REPLICATION_SLOT"
            ))
        })?;
        self.check_slot(&info)?;
        info!(slot, confirmed_flush_lsn = ?info.confirmed_flush_lsn, "created replication slot");
        Ok(SlotStatus::Created(info))
    }

    /// `ALTER_REPLICATION_SLOT ... (FAILOVER true)`. PostgreSQL cannot
    /// alter a slot a walsender streams from, and does not refuse: the
    /// command waits until the slot is released. So an active slot is
    /// refused here with what to do, and the command is bounded by
    /// [`ALTER_TIMEOUT`] for a relay that starts in between.
    async fn enable_failover(&mut self, info: &SlotInfo) -> Result<(), Error> {
        let name = &info.slot_name;
        let in_use = |detail: String| Error::Precondition {
            problem: format!(
                "slot \"{name}\" cannot become a failover slot while a relay streams from it \
                 ({detail})"
            ),
            fix: "stop every walrelay run that reads this slot, run walrelay setup again, then \
                  start walrelay run: the slot keeps its position, nothing is lost"
                .into(),
        };
        if info.active {
            return Err(in_use(match info.active_pid {
                Some(pid) => format!("walsender PID {pid}"),
                None => "it is active".into(),
            }));
        }
        let command = commands::enable_failover_command(name)?;
        match tokio::time::timeout(ALTER_TIMEOUT, self.simple_query(&command)).await {
            Ok(altered) => {
                altered?;
                info!(slot = %name, "turned the slot into a failover slot");
                Ok(())
            }
            Err(_) => Err(in_use(format!(
                "it became active: ALTER_REPLICATION_SLOT waited {ALTER_TIMEOUT:?}"
            ))),
        }
    }

    fn check_slot(&self, info: &SlotInfo) -> Result<(), Error> {
        let name = &info.slot_name;
        if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
            return Err(Error::Precondition {
                problem: format!(
                    "slot \"{name}\" exists but is a {} slot with plugin {:?}, not a logical pgoutput slot",
                    info.slot_type, info.plugin
                ),
                fix: format!("choose another slot name, or drop it with SELECT pg_drop_replication_slot('{name}') if it is unused"),
            });
        }
        if info.wal_status.as_deref() == Some("lost") {
            return Err(Error::Precondition {
                problem: format!("slot \"{name}\" is invalidated (wal_status = lost): the WAL it needed was removed"),
                fix: "events in the lost WAL cannot be recovered; drop and recreate the slot (consumers must treat it as a new source), and raise max_slot_wal_keep_size".into(),
            });
        }
        Ok(())
    }

    /// Check that every publication exists in this database. pgoutput only
    /// notices a missing publication when it decodes the first change, which
    /// on a quiet database may be much later; checking up front turns that
    /// into an immediate, explained error.
    pub async fn check_publications(&mut self, names: &[String]) -> Result<(), Error> {
        let list = names
            .iter()
            .map(|n| commands::quote_literal(n))
            .collect::<Vec<_>>()
            .join(",");
        if list.is_empty() {
            return Ok(());
        }
        let rows = self
            .simple_query(&format!(
                "SELECT pubname FROM pg_catalog.pg_publication WHERE pubname IN ({list})"
            ))
            .await?;
        let found: Vec<&str> = rows
            .iter()
            .filter_map(|r| r.get("pubname").ok().flatten())
            .collect();
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !found.contains(&n.as_str()))
            .collect();
        if !missing.is_empty() {
            let db = self
                .parameter("database")
                .unwrap_or("this database")
                .to_owned();
            return Err(Error::Precondition {
                problem: format!("publication {missing:?} does not exist in {db}"),
                fix: "create it (`walrelay setup` does, or CREATE PUBLICATION <name> FOR TABLE <outbox table>; a publication with no tables is enough for messages), or fix publication_names".into(),
            });
        }
        Ok(())
    }

    /// Start logical replication and hand the connection to a
    /// [`ReplicationStream`]. `start` should be `0/0`: the server then
    /// starts at the slot's confirmed position, and never at a position the
    /// client invented.
    pub async fn start_replication(
        mut self,
        slot: &str,
        start: Lsn,
        pgoutput: &PgOutputOptions,
        options: StreamOptions,
    ) -> Result<ReplicationStream, Error> {
        if !self.replication {
            return Err(Error::Precondition {
                problem: "START_REPLICATION on a plain SQL connection".into(),
                fix: "open the connection with ReplicationConnection::connect".into(),
            });
        }
        let cmd = commands::start_replication_command(slot, start, pgoutput)?;
        debug!(peer = %self.peer, %cmd, "starting replication");
        frontend::query(&cmd, &mut self.out).map_err(Error::io("encoding START_REPLICATION"))?;
        self.flush_out("sending START_REPLICATION").await?;
        // next_message already skips notices and parameter changes.
        match self.next_message("starting replication").await? {
            BackendMessage::CopyBothResponse => {}
            BackendMessage::ErrorResponse(e) => {
                // The server follows an error with ReadyForQuery; the
                // connection is dropped anyway.
                return Err(Error::server(
                    format!("START_REPLICATION on slot \"{slot}\""),
                    e,
                ));
            }
            other => return Err(other.unexpected("START_REPLICATION")),
        }
        info!(peer = %self.peer, slot, %start, "replication started");
        Ok(ReplicationStream::spawn(
            self.reader,
            self.writer,
            self.peer,
            slot.to_owned(),
            options,
        ))
    }
}
