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
//! real ones skipped). And a listed standby that is down makes decoding
//! wait: nothing is lost, but nothing is published either.
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
    if let (Some(true), Some(names)) = (slot_failover, &standby_slots) {
        if !names.is_empty() {
            // One statement for every listed slot: this runs at every
            // publication check.
            let list: Vec<String> = names.iter().map(|n| quote_literal(n)).collect();
            let rows = conn
                .simple_query(&format!(
                    "SELECT slot_name FROM pg_catalog.pg_replication_slots \
                     WHERE slot_type = 'physical' AND active AND slot_name IN ({})",
                    list.join(", ")
                ))
                .await?;
            let mut up = Vec::new();
            for row in &rows {
                up.push(row.get_required("slot_name")?.to_owned());
            }
            standby_slots_down = names.iter().filter(|n| !up.contains(n)).cloned().collect();
        }
    }
    Ok(Facts {
        wanted,
        slot_failover,
        standby_slots,
        standby_slots_down,
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
