//! The other hosts of `postgres.url`, asked at every session start
//! whether one of them is a primary of the same database system on a
//! higher timeline than the server this session connected to. If one
//! is, this server is an old primary back as a primary after a promotion
//! (a split brain): what it writes reuses WAL positions, and so keys, of
//! the promoted server, and walrelay refuses it.
//!
//! [`Seen`](super::seen::Seen) remembers the highest timeline for the
//! life of the process only; this check also holds for a relay started
//! afresh (a restart, a new pod), as long as the promoted server answers.
//! What neither catches (the promoted server unreachable too) is left to
//! restore detection: keys in Kafka past the old primary's WAL.
//!
//! Hosts that do not answer, refuse, or are standbys are skipped: each is
//! asked on a connection of its own, at most [`PROBE_TIMEOUT`] (or
//! `connect_timeout`, if shorter), all at once, so a dead host delays a
//! session start by that much at most.

use std::time::Duration;

use walrelay_pg::{Config as PgConfig, ReplicationConnection, TargetSessionAttrs};

use crate::error::RelayError;

/// The longest a host is asked for its timeline.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A primary among the other hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Primary {
    pub server: String,
    pub system_id: String,
    pub timeline: u32,
}

/// Refuses the server this session connected to (`server`, on
/// `timeline` of `system_id`) when another host is a primary of the same
/// system on a higher timeline.
pub(super) fn check(
    system_id: &str,
    timeline: u32,
    server: &str,
    others: &[Primary],
) -> Result<(), RelayError> {
    let Some(newer) = others
        .iter()
        .filter(|p| p.system_id == system_id && p.timeline > timeline)
        .max_by_key(|p| p.timeline)
    else {
        return Ok(());
    };
    Err(RelayError::Setup {
        problem: format!(
            "{server} is a primary on timeline {timeline} of database system {system_id}, but \
             {} is a primary of the same system on timeline {}: {server} is the old primary, \
             back as a primary after a promotion (a split brain), and what it writes would \
             reuse WAL positions, and so keys, of the promoted server",
            newer.server, newer.timeline
        ),
        fix: format!(
            "stop {server} or rebuild it as a standby of {} (and take it out of postgres.url \
             until then), then start walrelay again; walrelay refuses it rather than publish \
             from it",
            newer.server
        ),
    })
}

/// Asks every host of `pg` but `connected` whether it is a primary, and
/// if so of which system and on which timeline. A single-host list asks
/// nobody.
pub(super) async fn other_primaries(pg: &PgConfig, connected: &str) -> Vec<Primary> {
    let hosts = pg.host_ports();
    if hosts.len() < 2 {
        return Vec::new();
    }
    let limit = pg
        .get_connect_timeout()
        .map_or(PROBE_TIMEOUT, |t| t.min(PROBE_TIMEOUT));
    let mut probes = tokio::task::JoinSet::new();
    for (host, port) in hosts {
        if format!("{host}:{port}") == connected {
            continue;
        }
        let config = pg.for_host(host, port, TargetSessionAttrs::ReadWrite);
        let host = host.to_owned();
        probes.spawn(async move {
            match tokio::time::timeout(limit, probe(&config)).await {
                Ok(Ok(primary)) => Some(primary),
                Ok(Err(e)) => {
                    tracing::debug!(%host, port, error = %e, "split-brain probe: skipped");
                    None
                }
                Err(_) => {
                    tracing::debug!(%host, port, "split-brain probe: no answer in {limit:?}");
                    None
                }
            }
        });
    }
    probes.join_all().await.into_iter().flatten().collect()
}

/// One host, as a primary (anything else is an error and skipped): its
/// system and the timeline it writes on now. The timeline is read from
/// the name of the WAL file being written: the control file's last
/// checkpoint may still show the old one for a while after a promotion.
async fn probe(config: &PgConfig) -> Result<Primary, walrelay_pg::Error> {
    let mut conn = ReplicationConnection::connect_sql(config).await?;
    let rows = conn
        .simple_query(
            "SELECT (SELECT system_identifier FROM pg_catalog.pg_control_system())::text AS system, \
             ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))\
             ::bit(32)::bigint::text AS timeline",
        )
        .await;
    let server = conn.peer().to_owned();
    let _ = conn.close().await;
    let rows = rows?;
    let row = rows.first().ok_or_else(|| {
        walrelay_pg::Error::Protocol("the split-brain probe returned no row".into())
    })?;
    let timeline = row.get_required("timeline")?;
    Ok(Primary {
        server,
        system_id: row.get_required("system")?.to_owned(),
        timeline: timeline.parse().map_err(|_| {
            walrelay_pg::Error::Protocol(format!("a timeline that is no number: {timeline:?}"))
        })?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn primary(server: &str, system: &str, timeline: u32) -> Primary {
        Primary {
            server: server.into(),
            system_id: system.into(),
            timeline,
        }
    }

    #[test]
    fn a_primary_of_the_same_system_on_a_higher_timeline_refuses_this_one() {
        let others = [primary("db2:5432", "7", 2), primary("db3:5432", "7", 3)];
        let e = check("7", 1, "db1:5432", &others).unwrap_err().to_string();
        assert!(
            e.contains("db1:5432 is a primary on timeline 1")
                && e.contains("db3:5432 is a primary of the same system on timeline 3")
                && e.contains("split brain")
                && e.contains("rebuild it as a standby of db3:5432"),
            "{e}"
        );
    }

    #[test]
    fn the_same_or_a_lower_timeline_or_another_system_is_no_reason() {
        // The promoted server itself, with the old primary back beside it
        // (that one is refused when a relay lands on it).
        check("7", 2, "db2:5432", &[primary("db1:5432", "7", 1)]).unwrap();
        check("7", 2, "db2:5432", &[primary("db1:5432", "7", 2)]).unwrap();
        // A restored copy is another system: restore detection decides.
        check("7", 1, "db1:5432", &[primary("db9:5432", "8", 5)]).unwrap();
        check("7", 1, "db1:5432", &[]).unwrap();
    }
}
