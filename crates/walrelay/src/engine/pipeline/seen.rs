//! What one `walrelay run` process saw of its source across sessions:
//! the highest position it confirmed (a slot missing later was dropped)
//! and the highest timeline of the database system it streamed from (a
//! server back on a lower one is an old primary: a split brain).

use walrelay_pgoutput::Lsn;

use crate::error::RelayError;

/// Lives for the process, across sessions.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The highest confirmed position seen for the slot: once set, the
    /// slot existed, and a missing slot means it was dropped.
    pub confirmed: Option<Lsn>,
    /// The highest timeline seen, with the system identifier it belongs
    /// to and the server that was on it.
    timeline: Option<(String, u32, String)>,
}

impl Seen {
    /// A session confirmed up to `confirmed`.
    pub fn confirmed(&mut self, confirmed: Lsn) {
        self.confirmed = Some(self.confirmed.map_or(confirmed, |k| k.max(confirmed)));
    }

    /// A session connected to `server` (its peer), on `timeline` of the
    /// system `system_id` (`IDENTIFY_SYSTEM`). A promotion moves a
    /// system to a higher timeline; a primary still on a lower one is the
    /// old primary come back (a split brain): what it writes from then on
    /// is not what the promoted server writes at the same WAL positions,
    /// so walrelay refuses it.
    pub fn check_timeline(
        &mut self,
        system_id: &str,
        timeline: u32,
        server: &str,
    ) -> Result<(), RelayError> {
        match &self.timeline {
            Some((system, seen, on)) if system == system_id && timeline < *seen => {
                Err(RelayError::Setup {
                    problem: format!(
                        "{server} is a primary on timeline {timeline} of database system \
                         {system_id}, but this relay already streamed from timeline {seen} \
                         ({on}): it is the old primary, back as a primary after a promotion (a \
                         split brain), and what it writes would reuse WAL positions, and so \
                         keys, of the promoted server"
                    ),
                    fix: "stop the old primary or rebuild it as a standby of the new one (and \
                          take it out of postgres.url until then), then start walrelay again; \
                          walrelay refuses it rather than publish from it"
                        .into(),
                })
            }
            Some((system, seen, _)) if system == system_id && timeline <= *seen => Ok(()),
            _ => {
                self.timeline = Some((system_id.to_owned(), timeline, server.to_owned()));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_timeline_of_the_same_system_is_refused() {
        let mut seen = Seen::default();
        seen.check_timeline("7", 1, "db1:5432").unwrap();
        seen.check_timeline("7", 2, "db2:5432").unwrap();
        let e = seen
            .check_timeline("7", 1, "db1:5432")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("db1:5432 is a primary on timeline 1")
                && e.contains("already streamed from timeline 2 (db2:5432)")
                && e.contains("split brain"),
            "{e}"
        );
        seen.check_timeline("7", 2, "db2:5432").unwrap();
    }

    #[test]
    fn another_system_starts_over() {
        // A restored or rebuilt system has another identifier: restore
        // detection decides there, not the timeline.
        let mut seen = Seen::default();
        seen.check_timeline("7", 3, "a").unwrap();
        seen.check_timeline("8", 1, "b").unwrap();
        seen.check_timeline("8", 1, "b").unwrap();
    }

    #[test]
    fn the_highest_confirmed_position_is_kept() {
        let mut seen = Seen::default();
        seen.confirmed(Lsn(5));
        seen.confirmed(Lsn(3));
        assert_eq!(seen.confirmed, Some(Lsn(5)));
    }
}
