//! Whether a PostgreSQL failover keeps what walrelay published.
//!
//! From PostgreSQL 17 a logical slot created with `FAILOVER true` is
//! copied to standbys that run with `sync_replication_slots = on`, so a
//! relay continues on the promoted standby. That is only sound if the
//! standby had every transaction walrelay published: the primary's
//! `synchronized_standby_slots` makes logical decoding wait until the
//! listed standbys' physical slots have received the WAL. Without it,
//! walrelay can publish a transaction that the promoted standby never
//! had; the new primary then writes other transactions at those WAL
//! positions, with keys consumers already passed (a phantom event, and
//! real ones skipped). The same holds for a standby the setting does not
//! list: decoding never waited for it, so promoting it can contradict
//! what walrelay published even though the list protects the others. And
//! a listed standby that is down makes decoding wait: nothing is lost,
//! but nothing is published either.
//!
//! [`fetch`] reads the facts on a plain SQL connection (with the
//! periodic publication check, and in `walrelay status`); [`assess`]
//! turns them into findings (pure, tested below).

use std::fmt;
use std::time::{Duration, Instant};

use walrelay_pg::commands::quote_literal;
use walrelay_pg::ReplicationConnection;

/// What the server says about the slot and the standbys it waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// `postgres.slot_failover`: the slot is meant to be a failover slot.
    pub wanted: bool,
    /// The slot's `failover` flag (`None`: no such slot, or a server
    /// before PostgreSQL 17).
    pub slot_failover: Option<bool>,
    /// `synchronized_standby_slots`, split (`None` before PostgreSQL 17).
    pub standby_slots: Option<Vec<String>>,
    /// Those of [`Facts::standby_slots`] that no standby streams from
    /// (the standby is down or not yet connected), or that do not exist.
    pub standby_slots_down: Vec<String>,
    /// Persistent physical slots that something streams from (`active`)
    /// and that [`Facts::standby_slots`] does not name: standbys that
    /// logical decoding does not wait for.
    pub unlisted_standby_slots: Vec<String>,
    /// Standbys that stream without a persistent physical slot (see
    /// [`Finding::SlotlessStandbys`]), each as `application_name from
    /// client_addr`.
    pub slotless_standbys: Vec<String>,
}

/// One thing an operator must know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A failover slot with `synchronized_standby_slots` empty: a
    /// failover can publish phantoms.
    Unprotected,
    /// `postgres.slot_failover` is on and the slot is not a failover slot
    /// (setup was not run again): a failover loses the slot.
    NotAFailoverSlot,
    /// Standbys stream through physical slots that
    /// `synchronized_standby_slots` does not name (`slots`; `listed` is
    /// the setting, for the fix): decoding does not wait for them, so a
    /// promoted one may lack what walrelay published (phantoms), although
    /// the list protects the others. Only for a failover slot with a
    /// non-empty list: an empty one is [`Finding::Unprotected`].
    UnlistedStandbys {
        slots: Vec<String>,
        listed: Vec<String>,
    },
    /// Standbys stream without a physical slot of their own (no slot, or
    /// a temporary one from `wal_receiver_create_temp_slot`), named by
    /// `application_name` and address.
    ///
    /// A risk, like [`Finding::UnlistedStandbys`], though it cannot be
    /// fixed by listing: such a standby can be promoted as well as any
    /// other, but `sync_replication_slots` needs `primary_slot_name` on
    /// the standby, so it holds no synchronized copy of the failover
    /// slot, and promoting it loses the slot (as
    /// [`Finding::NotAFailoverSlot`] does, also a risk); decoding never
    /// waited for it either. Staying silent would let an operator who
    /// listed the other standbys believe every failover is covered. The
    /// fix is a physical slot for it, listed; a standby that must never
    /// be promoted is the operator's to keep from being promoted.
    ///
    /// Seen only where the role may read `pg_stat_replication`'s details
    /// (`pg_read_all_stats`, `pg_monitor`, or a superuser): for other
    /// roles PostgreSQL shows a walsender's pid alone, which cannot tell
    /// a streaming standby from an idle replication connection (a
    /// standby's slot sync worker, `walrelay status` itself), so nothing
    /// is reported rather than a guess. Base backups (`pg_basebackup`'s
    /// WAL stream, on a temporary slot) are not standbys and are left
    /// out.
    SlotlessStandbys(Vec<String>),
    /// Listed standbys are down: decoding waits for them.
    StandbysDown(Vec<String>),
}

impl Finding {
    /// A risk of publishing what a failover then contradicts, or of
    /// losing the slot (a `RISK:` line in `walrelay status`), as opposed
    /// to a wait that loses nothing.
    pub fn is_risk(&self) -> bool {
        !matches!(self, Finding::StandbysDown(_))
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Unprotected => f.write_str(
                "the slot is a failover slot but synchronized_standby_slots is empty: walrelay may \
                 publish a transaction that a promoted standby never received, whose WAL \
                 positions the new primary then reuses for other events; on the primary, set \
                 synchronized_standby_slots to the physical slots of the standbys that may be \
                 promoted (ALTER SYSTEM SET synchronized_standby_slots = 'standby1_slot'; \
                 SELECT pg_reload_conf())",
            ),
            Finding::NotAFailoverSlot => f.write_str(
                "postgres.slot_failover is on but the slot is not a failover slot, so a failover \
                 to a standby loses it; stop walrelay run and run walrelay setup, which turns it \
                 into one",
            ),
            Finding::StandbysDown(names) => write!(
                f,
                "no standby streams from {} (named in synchronized_standby_slots): PostgreSQL \
                 holds logical decoding until it is back, so walrelay publishes nothing newer \
                 (nothing is lost; the slot's lag grows); bring the standby back, or remove its \
                 slot from synchronized_standby_slots if it is gone for good",
                names.join(", ")
            ),
            Finding::UnlistedStandbys { slots, listed } => {
                let all: Vec<&str> = listed.iter().chain(slots).map(String::as_str).collect();
                write!(
                    f,
                    "standbys stream from the primary through physical slots that \
                     synchronized_standby_slots does not name ({}): logical decoding does not \
                     wait for them, so walrelay may publish a transaction such a standby never \
                     received, and if it is promoted the new primary reuses those WAL positions \
                     for other events (phantoms in Kafka); on the primary, add them \
                     (ALTER SYSTEM SET synchronized_standby_slots = '{}'; SELECT pg_reload_conf()), \
                     on each such standby turn on sync_replication_slots; a standby that must \
                     never be promoted (a delayed standby, a WAL archiver) may stay unlisted, and \
                     keeping it from being promoted is then the operator's responsibility",
                    slots.join(", "),
                    all.join(", ")
                )
            }
            Finding::SlotlessStandbys(names) => write!(
                f,
                "standbys stream from the primary without a physical slot ({}, in \
                 pg_stat_replication): such a standby holds no synchronized copy of the failover \
                 slot (sync_replication_slots needs primary_slot_name), so promoting it loses \
                 the slot, and logical decoding does not wait for it, so it may lack what \
                 walrelay published; give it a physical slot (on the primary SELECT \
                 pg_create_physical_replication_slot('standby_slot'); on the standby \
                 primary_slot_name = 'standby_slot' and sync_replication_slots = on) and add \
                 that slot to synchronized_standby_slots; if it must never be promoted, keeping \
                 it from being promoted is the operator's responsibility",
                names.join(", ")
            ),
        }
    }
}

/// The findings, risks first.
pub fn assess(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    match f.slot_failover {
        Some(true) if f.standby_slots.as_ref().is_some_and(Vec::is_empty) => {
            out.push(Finding::Unprotected)
        }
        Some(false) if f.wanted => out.push(Finding::NotAFailoverSlot),
        _ => {}
    }
    let listed = match (f.slot_failover, &f.standby_slots) {
        (Some(true), Some(names)) if !names.is_empty() => Some(names),
        _ => None,
    };
    if let Some(listed) = listed {
        if !f.unlisted_standby_slots.is_empty() {
            out.push(Finding::UnlistedStandbys {
                slots: f.unlisted_standby_slots.clone(),
                listed: listed.clone(),
            });
        }
        if !f.slotless_standbys.is_empty() {
            out.push(Finding::SlotlessStandbys(f.slotless_standbys.clone()));
        }
    }
    if f.slot_failover == Some(true) && !f.standby_slots_down.is_empty() {
        out.push(Finding::StandbysDown(f.standby_slots_down.clone()));
    }
    out
}

/// How often a finding that lasts is logged again.
pub const LOG_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// What to log after a check: findings are checked every
/// `publication_check_interval`, and logged when they appear or change,
/// again every [`LOG_AGAIN_AFTER`] while they last, and once when they
/// are gone.
#[derive(Debug, Default)]
pub struct FindingsLog {
    last: Vec<Finding>,
    logged_at: Option<Instant>,
}

/// [`FindingsLog::observe`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogAction {
    Nothing,
    /// Warn about every finding.
    Warn,
    /// The findings logged before are gone.
    Cleared,
}

impl FindingsLog {
    pub fn observe(&mut self, found: &[Finding], now: Instant) -> LogAction {
        let changed = found != self.last.as_slice();
        let due = self
            .logged_at
            .is_some_and(|at| now.duration_since(at) >= LOG_AGAIN_AFTER);
        self.last = found.to_vec();
        match (found.is_empty(), changed || due) {
            (true, true) => {
                self.logged_at = None;
                LogAction::Cleared
            }
            (false, true) => {
                self.logged_at = Some(now);
                LogAction::Warn
            }
            (_, false) => LogAction::Nothing,
        }
    }
}

/// `synchronized_standby_slots` as PostgreSQL reads it: a comma-separated
/// list of slot names, each possibly double-quoted.
pub fn split_standby_slots(setting: &str) -> Vec<String> {
    setting
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Read the facts for `slot`.
pub async fn fetch(
    conn: &mut ReplicationConnection,
    slot: &str,
    wanted: bool,
) -> Result<Facts, walrelay_pg::Error> {
    // `to_jsonb(s) ->> 'failover'` and `current_setting(.., true)` read as
    // NULL on servers before 17 instead of failing.
    let rows = conn
        .simple_query(&format!(
            "SELECT (SELECT pg_catalog.to_jsonb(s) ->> 'failover' \
               FROM pg_catalog.pg_replication_slots s WHERE slot_name = {}) AS failover, \
             pg_catalog.current_setting('synchronized_standby_slots', true) AS standby_slots",
            quote_literal(slot)
        ))
        .await?;
    let Some(row) = rows.first() else {
        return Ok(Facts::default());
    };
    let slot_failover = row.get("failover")?.map(|v| v == "true");
    let standby_slots = row.get("standby_slots")?.map(split_standby_slots);
    let mut standby_slots_down = Vec::new();
    let mut unlisted_standby_slots = Vec::new();
    let mut slotless_standbys = Vec::new();
    if let (Some(true), Some(names)) = (slot_failover, &standby_slots) {
        if !names.is_empty() {
            // One statement for the standbys, listed or not: this runs at
            // every publication check. `slot`: every physical slot
            // something streams from; `slotless`: walsenders that stream
            // (`state`, hidden from roles without pg_read_all_stats, so
            // then none) holding neither a logical slot (a logical
            // client, walrelay itself) nor a persistent one, apart from
            // base backups. Idle replication connections (a standby's
            // slot sync worker, `walrelay status`) are in `startup`.
            let rows = conn
                .simple_query(
                    "SELECT 'slot' AS kind, slot_name AS name, temporary::text AS temporary \
                     FROM pg_catalog.pg_replication_slots \
                     WHERE slot_type = 'physical' AND active \
                     UNION ALL \
                     SELECT 'slotless', \
                       coalesce(nullif(r.application_name, ''), 'a walsender') || ' from ' || \
                       coalesce(pg_catalog.host(r.client_addr), 'a local socket'), NULL \
                     FROM pg_catalog.pg_stat_replication r \
                     WHERE r.state IN ('streaming', 'catchup') \
                       AND r.application_name IS DISTINCT FROM 'pg_basebackup' \
                       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s \
                         WHERE s.active_pid = r.pid \
                           AND (s.slot_type = 'logical' OR NOT s.temporary)) \
                     ORDER BY 1, 2",
                )
                .await?;
            let mut up = Vec::new();
            for row in &rows {
                let name = row.get_required("name")?.to_owned();
                match row.get_required("kind")? {
                    "slot" => {
                        if row.get("temporary")? == Some("false") && !names.contains(&name) {
                            unlisted_standby_slots.push(name.clone());
                        }
                        up.push(name);
                    }
                    _ => slotless_standbys.push(name),
                }
            }
            standby_slots_down = names.iter().filter(|n| !up.contains(n)).cloned().collect();
        }
    }
    Ok(Facts {
        wanted,
        slot_failover,
        standby_slots,
        standby_slots_down,
        unlisted_standby_slots,
        slotless_standbys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(failover: Option<bool>, standby_slots: Option<&[&str]>) -> Facts {
        Facts {
            wanted: false,
            slot_failover: failover,
            standby_slots: standby_slots.map(|s| s.iter().map(|n| (*n).to_owned()).collect()),
            standby_slots_down: Vec::new(),
            unlisted_standby_slots: Vec::new(),
            slotless_standbys: Vec::new(),
        }
    }

    #[test]
    fn a_failover_slot_without_synchronized_standby_slots_is_a_risk() {
        let found = assess(&facts(Some(true), Some(&[])));
        assert_eq!(found, vec![Finding::Unprotected]);
        assert!(found[0].is_risk());
        let text = found[0].to_string();
        assert!(
            text.contains("ALTER SYSTEM SET synchronized_standby_slots"),
            "{text}"
        );
        assert!(assess(&facts(Some(true), Some(&["s1"]))).is_empty());
    }

    #[test]
    fn no_failover_slot_and_no_wish_for_one_is_nothing_to_report() {
        assert!(assess(&facts(Some(false), Some(&[]))).is_empty());
        assert!(assess(&facts(None, None)).is_empty());
        // Before 17 a failover slot cannot exist; setup refuses the wish.
        let mut before_17 = facts(None, None);
        before_17.wanted = true;
        assert!(assess(&before_17).is_empty());
    }

    #[test]
    fn a_wished_failover_slot_that_is_not_one_is_a_risk() {
        let mut f = facts(Some(false), Some(&["s1"]));
        f.wanted = true;
        let found = assess(&f);
        assert_eq!(found, vec![Finding::NotAFailoverSlot]);
        assert!(found[0].to_string().contains("walrelay setup"));
    }

    #[test]
    fn a_standby_down_is_a_wait_not_a_risk() {
        let mut f = facts(Some(true), Some(&["s1", "s2"]));
        f.standby_slots_down = vec!["s2".into()];
        let found = assess(&f);
        assert_eq!(found, vec![Finding::StandbysDown(vec!["s2".into()])]);
        assert!(!found[0].is_risk());
        assert!(found[0].to_string().contains("nothing is lost"));
    }

    #[test]
    fn a_streaming_standby_whose_slot_is_not_listed_is_a_risk() {
        let mut f = facts(Some(true), Some(&["s1"]));
        f.unlisted_standby_slots = vec!["s2".into()];
        let found = assess(&f);
        assert_eq!(
            found,
            vec![Finding::UnlistedStandbys {
                slots: vec!["s2".into()],
                listed: vec!["s1".into()],
            }]
        );
        assert!(found[0].is_risk());
        let text = found[0].to_string();
        // The fix keeps the slots already listed: the setting replaces
        // the whole list.
        assert!(
            text.contains("does not name (s2)")
                && text.contains("ALTER SYSTEM SET synchronized_standby_slots = 's1, s2'")
                && text.contains("SELECT pg_reload_conf()")
                && text.contains("operator's responsibility"),
            "{text}"
        );
    }

    #[test]
    fn a_standby_streaming_without_a_slot_is_a_risk() {
        let mut f = facts(Some(true), Some(&["s1"]));
        f.slotless_standbys = vec!["walreceiver from 10.0.0.7".into()];
        let found = assess(&f);
        assert_eq!(
            found,
            vec![Finding::SlotlessStandbys(vec![
                "walreceiver from 10.0.0.7".into()
            ])]
        );
        assert!(found[0].is_risk());
        let text = found[0].to_string();
        assert!(
            text.contains("without a physical slot (walreceiver from 10.0.0.7")
                && text.contains("promoting it loses the slot")
                && text.contains("primary_slot_name"),
            "{text}"
        );
    }

    #[test]
    fn unlisted_standbys_are_reported_only_beside_a_non_empty_list_of_a_failover_slot() {
        let unlisted = |failover, list: Option<&[&str]>| {
            let mut f = facts(failover, list);
            f.unlisted_standby_slots = vec!["s2".into()];
            f.slotless_standbys = vec!["walreceiver from 10.0.0.7".into()];
            assess(&f)
        };
        // An empty list is already the risk, with its own fix.
        assert_eq!(unlisted(Some(true), Some(&[])), vec![Finding::Unprotected]);
        assert!(unlisted(Some(false), Some(&["s1"])).is_empty());
        assert!(unlisted(None, None).is_empty());
        // Risks first, then the wait; all of them at once.
        let mut f = facts(Some(true), Some(&["s1", "s3"]));
        f.unlisted_standby_slots = vec!["s2".into()];
        f.slotless_standbys = vec!["walreceiver from 10.0.0.7".into()];
        f.standby_slots_down = vec!["s3".into()];
        let found = assess(&f);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(matches!(found[0], Finding::UnlistedStandbys { .. }));
        assert!(matches!(found[1], Finding::SlotlessStandbys(_)));
        assert_eq!(found[2], Finding::StandbysDown(vec!["s3".into()]));
    }

    #[test]
    fn findings_are_logged_when_they_change_and_again_after_a_while() {
        let mut log = FindingsLog::default();
        let t0 = Instant::now();
        let risk = [Finding::Unprotected];
        assert_eq!(log.observe(&[], t0), LogAction::Nothing);
        assert_eq!(log.observe(&risk, t0), LogAction::Warn);
        assert_eq!(
            log.observe(&risk, t0 + Duration::from_secs(2)),
            LogAction::Nothing
        );
        assert_eq!(log.observe(&risk, t0 + LOG_AGAIN_AFTER), LogAction::Warn);
        let other = [Finding::StandbysDown(vec!["s1".into()])];
        assert_eq!(log.observe(&other, t0 + LOG_AGAIN_AFTER), LogAction::Warn);
        assert_eq!(log.observe(&[], t0 + LOG_AGAIN_AFTER), LogAction::Cleared);
        assert_eq!(
            log.observe(&[], t0 + LOG_AGAIN_AFTER * 3),
            LogAction::Nothing
        );
    }

    #[test]
    fn the_setting_is_split_as_postgresql_reads_it() {
        assert_eq!(
            split_standby_slots(" s1, \"S 2\" ,s3"),
            vec!["s1".to_owned(), "S 2".to_owned(), "s3".to_owned()]
        );
        assert!(split_standby_slots("").is_empty());
    }
}
