//! What `walrelay setup` remembers of the replication slot it created, in
//! the database itself (`walrelay.slots`), and the decision it makes from
//! it before creating a slot.
//!
//! A base backup holds no replication slots, a standby promoted before
//! PostgreSQL 17 has none (nor one of 17+ that was not synchronized), and
//! a major upgrade drops them; every one of them keeps the tables. So a
//! row naming a slot that no longer exists means "this slot existed and
//! is gone": the events committed since it was lost are in no slot, and a
//! new slot at the current WAL position would skip them in silence.
//! `setup` refuses, names what it knows, and creates the slot only when
//! the operator accepts the gap explicitly (`--accept-slot-loss`), with a
//! new `relay.source_id` where the WAL position went back (the new keys
//! would be at or below keys already in Kafka, which every consumer's
//! high-water mark would drop). docs/operations.md, "A lost replication
//! slot", is the procedure.

use walrelay_pg::commands::quote_literal;
use walrelay_pgoutput::Lsn;

/// The row of a slot that `setup` created (or found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub slot: String,
    pub system_identifier: String,
    pub database: String,
    pub source_id: String,
    pub created_lsn: Lsn,
    pub created_at: String,
    /// The slot's confirmed position when `setup` last saw it.
    pub last_lsn: Lsn,
    pub last_seen_at: String,
}

/// What the server is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now<'a> {
    pub slot: &'a str,
    pub slot_exists: bool,
    pub system_identifier: &'a str,
    pub source_id: &'a str,
    /// The server's current WAL position.
    pub wal: Lsn,
    /// The highest key of this source found in the configured topics, when
    /// it was looked for ([`crate::source::published`]: only when neither the slot
    /// nor its row exists).
    pub published: Option<&'a crate::source::published::Published>,
}

/// Why `setup` does not create the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub problem: String,
    pub fix: String,
}

/// Whether `setup` may go on to ensure the slot. `accept`: the operator
/// accepted the loss (`--accept-slot-loss`).
pub fn decide(now: &Now<'_>, recorded: Option<&Recorded>, accept: bool) -> Result<(), Refusal> {
    let Some(r) = recorded else {
        return match (now.slot_exists, now.published) {
            (false, Some(p)) => published_without_a_slot(now, p, accept),
            _ => Ok(()),
        };
    };
    if now.slot_exists {
        return Ok(());
    }
    let went_back = now.wal < r.last_lsn;
    let same_system = now.system_identifier == r.system_identifier;
    let keys_went_back = went_back && same_system && now.source_id == r.source_id;
    if accept && !keys_went_back {
        return Ok(());
    }
    let mut problem = format!(
        "replication slot {slot:?} no longer exists, but walrelay setup created it at {created} \
         ({created_at}) and last saw it at {last} ({last_seen}) under source {source:?}: the \
         database was restored from a backup, failed over to a standby without a synchronized \
         slot, or upgraded. Whatever was committed after the slot was lost is in no slot: \
         creating a new one at the server's current position {wal} would skip it in silence",
        slot = r.slot,
        created = r.created_lsn,
        created_at = r.created_at,
        last = r.last_lsn,
        last_seen = r.last_seen_at,
        source = r.source_id,
        wal = now.wal,
    );
    if !same_system {
        problem.push_str(&format!(
            ". The server's system identifier is {} now, {} then (another cluster: an upgrade, \
             or a copy of the database)",
            now.system_identifier, r.system_identifier
        ));
    }
    if went_back && same_system {
        problem.push_str(&format!(
            ". The WAL position went back ({} < {}): new events would get keys at or below keys \
             already in Kafka",
            now.wal, r.last_lsn
        ));
    }
    Err(Refusal {
        problem,
        fix: fix(now, went_back && same_system, accept),
    })
}

/// Neither the slot nor its row exists, yet Kafka holds records of this
/// source: a restore from a backup taken before the first `setup`.
fn published_without_a_slot(
    now: &Now<'_>,
    p: &crate::source::published::Published,
    accept: bool,
) -> Result<(), Refusal> {
    let went_back = p.key.high() >= now.wal.0;
    if accept && !went_back {
        return Ok(());
    }
    let mut problem = format!(
        "replication slot {slot:?} does not exist and walrelay.slots has no record of it, but \
         topic {topic:?} partition {partition} already holds records of source {source:?} up to \
         key {key} (WAL position {lsn}): walrelay published from this database before, and the \
         database was restored from a backup taken before the first walrelay setup (or the \
         walrelay schema was dropped). Whatever was committed after the old slot was lost is in \
         no slot: creating a new one at the server's current position {wal} would skip it in \
         silence",
        slot = now.slot,
        topic = p.topic,
        partition = p.partition,
        source = now.source_id,
        key = p.key,
        lsn = Lsn(p.key.high()),
        wal = now.wal,
    );
    if went_back {
        problem.push_str(&format!(
            ". The WAL position went back ({} <= {}): new events would get keys at or below keys \
             already in Kafka",
            now.wal,
            Lsn(p.key.high())
        ));
    }
    Err(Refusal {
        problem,
        fix: fix(now, went_back, accept),
    })
}

/// What to do about a lost slot; `went_back`: the source's keys went back.
fn fix(now: &Now<'_>, went_back: bool, accept: bool) -> String {
    if accept {
        format!(
            "the keys of source {:?} went back, so consumers' high-water marks would drop the \
             new events: set relay.source_id to a new value (for example {:?}) and run setup \
             --accept-slot-loss again",
            now.source_id,
            format!("{}-restored-1", now.source_id)
        )
    } else {
        format!(
            "follow docs/operations.md, \"A lost replication slot\": stop the applications' \
             writes if you can; run `walrelay setup --accept-slot-loss` to create the slot at the \
             current position and accept the gap, with a new relay.source_id ({}); re-drive the \
             outbox rows committed since the loss (events emitted with walrelay.emit cannot be \
             recovered); then start walrelay",
            if went_back {
                "required: the keys went back"
            } else {
                "after a restore or failover the WAL usually went back behind what walrelay \
                 published, and walrelay run refuses the old source id then"
            }
        )
    }
}

/// The row of `slot`, if `setup` recorded one.
pub(crate) async fn fetch(
    conn: &mut walrelay_pg::ReplicationConnection,
    slot: &str,
) -> Result<Option<Recorded>, walrelay_pg::Error> {
    let rows = conn
        .simple_query(&format!(
            "SELECT slot_name, system_identifier, database, source_id, created_lsn::text AS c, \
             created_at::text AS ca, last_lsn::text AS l, last_seen_at::text AS la \
             FROM walrelay.slots WHERE slot_name = {}",
            quote_literal(slot)
        ))
        .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let lsn = |column: &str| -> Result<Lsn, walrelay_pg::Error> {
        let text = row.get_required(column)?;
        text.parse::<Lsn>().map_err(|_| {
            walrelay_pg::Error::Protocol(format!("walrelay.slots.{column} is not an LSN: {text}"))
        })
    };
    Ok(Some(Recorded {
        slot: row.get_required("slot_name")?.to_owned(),
        system_identifier: row.get_required("system_identifier")?.to_owned(),
        database: row.get_required("database")?.to_owned(),
        source_id: row.get_required("source_id")?.to_owned(),
        created_lsn: lsn("c")?,
        created_at: row.get_required("ca")?.to_owned(),
        last_lsn: lsn("l")?,
        last_seen_at: row.get_required("la")?.to_owned(),
    }))
}

/// Records the slot as it is now: a new row (or a replaced one, after an
/// accepted loss) when `created`, else its last position.
pub(crate) async fn record(
    conn: &mut walrelay_pg::ReplicationConnection,
    slot: &str,
    system_identifier: &str,
    database: &str,
    source_id: &str,
    position: Lsn,
    created: bool,
) -> Result<(), walrelay_pg::Error> {
    let values = format!(
        "{}, {}, {}, {}, {}::pg_lsn, {}::pg_lsn",
        quote_literal(slot),
        quote_literal(system_identifier),
        quote_literal(database),
        quote_literal(source_id),
        quote_literal(&position.to_string()),
        quote_literal(&position.to_string()),
    );
    let on_conflict = if created {
        "DO UPDATE SET system_identifier = EXCLUDED.system_identifier, \
         database = EXCLUDED.database, source_id = EXCLUDED.source_id, \
         created_lsn = EXCLUDED.created_lsn, created_at = now(), \
         last_lsn = EXCLUDED.last_lsn, last_seen_at = now()"
    } else {
        "DO UPDATE SET source_id = EXCLUDED.source_id, last_lsn = EXCLUDED.last_lsn, \
         last_seen_at = now()"
    };
    conn.simple_query(&format!(
        "INSERT INTO walrelay.slots (slot_name, system_identifier, database, source_id, \
         created_lsn, last_lsn) VALUES ({values}) ON CONFLICT (slot_name) {on_conflict}"
    ))
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded() -> Recorded {
        Recorded {
            slot: "walrelay".into(),
            system_identifier: "7312".into(),
            database: "app".into(),
            source_id: "7312/app/walrelay".into(),
            created_lsn: Lsn(0x100),
            created_at: "2026-11-01 10:00:00+00".into(),
            last_lsn: Lsn(0x5000),
            last_seen_at: "2026-11-20 10:00:00+00".into(),
        }
    }

    fn now(slot_exists: bool, wal: u64) -> Now<'static> {
        Now {
            slot: "walrelay",
            slot_exists,
            system_identifier: "7312",
            source_id: "7312/app/walrelay",
            wal: Lsn(wal),
            published: None,
        }
    }

    #[test]
    fn a_first_setup_and_an_existing_slot_go_on() {
        assert_eq!(decide(&now(false, 0x10), None, false), Ok(()));
        assert_eq!(decide(&now(true, 0x9000), Some(&recorded()), false), Ok(()));
    }

    #[test]
    fn a_recorded_slot_that_is_gone_is_refused_with_what_is_known() {
        let refusal = decide(&now(false, 0x9000), Some(&recorded()), false).unwrap_err();
        for part in [
            "\"walrelay\" no longer exists",
            "0/100",
            "0/5000",
            "0/9000",
            "skip it in silence",
        ] {
            assert!(
                refusal.problem.contains(part),
                "{part}: {}",
                refusal.problem
            );
        }
        assert!(
            !refusal.problem.contains("went back"),
            "{}",
            refusal.problem
        );
        assert!(
            refusal.fix.contains("--accept-slot-loss"),
            "{}",
            refusal.fix
        );
        assert!(
            refusal.fix.contains("A lost replication slot"),
            "{}",
            refusal.fix
        );
        // Accepted: the slot is created at the current position.
        assert_eq!(decide(&now(false, 0x9000), Some(&recorded()), true), Ok(()));
    }

    #[test]
    fn keys_that_went_back_need_a_new_source_even_when_accepted() {
        let refusal = decide(&now(false, 0x4000), Some(&recorded()), false).unwrap_err();
        assert!(
            refusal.problem.contains("went back (0/4000 < 0/5000)"),
            "{}",
            refusal.problem
        );
        assert!(
            refusal.fix.contains("required: the keys went back"),
            "{}",
            refusal.fix
        );
        let refusal = decide(&now(false, 0x4000), Some(&recorded()), true).unwrap_err();
        assert!(
            refusal.fix.contains("set relay.source_id to a new value"),
            "{}",
            refusal.fix
        );
        let renamed = Now {
            source_id: "7312/app/walrelay-restored-1",
            ..now(false, 0x4000)
        };
        assert_eq!(decide(&renamed, Some(&recorded()), true), Ok(()));
    }

    #[test]
    fn another_cluster_is_named() {
        let other = Now {
            system_identifier: "9999",
            source_id: "9999/app/walrelay",
            ..now(false, 0x10)
        };
        let refusal = decide(&other, Some(&recorded()), false).unwrap_err();
        assert!(
            refusal.problem.contains("9999 now, 7312 then"),
            "{}",
            refusal.problem
        );
        assert!(
            !refusal.problem.contains("went back"),
            "{}",
            refusal.problem
        );
        assert_eq!(decide(&other, Some(&recorded()), true), Ok(()));
    }

    #[test]
    fn records_of_this_source_in_kafka_without_a_slot_or_row_are_refused() {
        use crate::engine::key::EventKey;
        let published = crate::source::published::Published {
            topic: "orders".into(),
            partition: 2,
            key: EventKey::new(0x3000, 0x3010),
        };
        // The server is past the keys: accepted with the flag.
        let ahead = Now {
            published: Some(&published),
            ..now(false, 0x5000)
        };
        let refusal = decide(&ahead, None, false).unwrap_err();
        assert!(
            refusal
                .problem
                .contains("walrelay.slots has no record of it")
                && refusal.problem.contains("topic \"orders\" partition 2")
                && refusal.problem.contains("before the first walrelay setup"),
            "{}",
            refusal.problem
        );
        assert!(
            refusal.fix.contains("--accept-slot-loss"),
            "{}",
            refusal.fix
        );
        assert_eq!(decide(&ahead, None, true), Ok(()));
        // The server is behind them: the keys went back, a new source is
        // required even with the flag.
        let behind = Now {
            published: Some(&published),
            ..now(false, 0x2000)
        };
        let refusal = decide(&behind, None, true).unwrap_err();
        assert!(refusal.problem.contains("went back"), "{}", refusal.problem);
        assert!(refusal.fix.contains("relay.source_id"), "{}", refusal.fix);
        // A slot that exists, or nothing in Kafka: a first setup.
        let exists = Now {
            published: Some(&published),
            ..now(true, 0x2000)
        };
        assert_eq!(decide(&exists, None, false), Ok(()));
        assert_eq!(decide(&now(false, 0x2000), None, false), Ok(()));
    }
}
