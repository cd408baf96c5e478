//! What the publication must contain for this configuration.
//!
//! pgoutput sends a table's rows only if the publication covers the table
//! as of the change. A configured outbox that the publication lacks is not
//! an error PostgreSQL reports: its rows are simply never sent, keepalives
//! move the slot past them, and they are gone (PostgreSQL 18 even skips a
//! dropped publication with only a server-side WARNING). So walrelay checks
//! the catalog itself: `run` before it streams and then every
//! `postgres.publication_check_interval` on a plain SQL connection, `setup`
//! after its changes, and `status`.
//!
//! [`assess`] is the rule, pure over [`Facts`] read from the catalog;
//! [`fetch`] reads them. A check also samples `pg_current_wal_lsn()`
//! *before* reading the catalog: every publication change committed before
//! that position is visible to the catalog reads that follow, so a clean
//! check vouches that WAL up to that position was decoded with a
//! publication that covers every outbox. The relay confirms nothing past
//! the last vouched position (see `pipeline.rs`).

use std::fmt;

use walrelay_pg::commands::{quote_identifier, quote_literal};
use walrelay_pg::ReplicationConnection;
use walrelay_pgoutput::Lsn;

use crate::config::Config;

/// The catalog facts the rule needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The publication's row, `None` when it does not exist.
    pub publication: Option<PublicationFacts>,
    /// One entry per configured outbox, in configuration order.
    pub outboxes: Vec<OutboxFacts>,
}

/// `pg_publication` and `pg_publication_tables` for the publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationFacts {
    /// `pubviaroot`: changes of a partition are published under the
    /// partitioned root's name (and schema).
    pub via_root: bool,
    /// `pubinsert`: INSERTs are published.
    pub inserts: bool,
    /// What `pg_publication_tables` lists: tables named directly, through
    /// `FOR ALL TABLES` or `FOR TABLES IN SCHEMA`, with leaf partitions or
    /// roots depending on `via_root`.
    pub published: Vec<PublishedTable>,
}

/// A row of `pg_publication_tables`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedTable {
    pub schema: String,
    pub table: String,
    /// The row filter (`WHERE ...`, PostgreSQL 15+), if any.
    pub row_filter: Option<String>,
}

/// A configured outbox as `pg_class` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxFacts {
    pub schema: String,
    pub table: String,
    /// `pg_class.relkind`, `None` when no such relation exists.
    pub relkind: Option<char>,
}

/// One way the publication would let rows of a configured outbox go
/// unsent, each with its fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    PublicationMissing {
        publication: String,
    },
    InsertsNotPublished {
        publication: String,
    },
    TableMissing {
        table: String,
    },
    NotATable {
        table: String,
        relkind: char,
    },
    NotPublished {
        table: String,
        publication: String,
    },
    PartitionedWithoutRoot {
        table: String,
        publication: String,
    },
    RowFilter {
        table: String,
        publication: String,
        filter: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::PublicationMissing { publication } => write!(
                f,
                "publication \"{publication}\" does not exist, so PostgreSQL sends no outbox rows \
                 (PostgreSQL 18 skips them with only a server-side WARNING); fix: run `walrelay \
                 setup` (it creates the publication for the configured outbox tables), or CREATE \
                 PUBLICATION {} FOR TABLE <outbox tables>",
                quote_identifier(publication)
            ),
            Problem::InsertsNotPublished { publication } => write!(
                f,
                "publication \"{publication}\" does not publish INSERTs, so outbox rows are not \
                 sent; fix: ALTER PUBLICATION {} SET (publish = 'insert, update, delete, truncate')",
                quote_identifier(publication)
            ),
            Problem::TableMissing { table } => write!(
                f,
                "outbox table {table} does not exist; fix: create it (columns id, aggregatetype, \
                 aggregateid, type, payload jsonb, optional headers jsonb; docs/relay.md) and run \
                 `walrelay setup`, or remove it from [[outbox]] / --outbox-table"
            ),
            Problem::NotATable { table, relkind } => write!(
                f,
                "outbox {table} is not a table (pg_class.relkind '{relkind}'), and PostgreSQL \
                 publishes only tables; fix: point [[outbox]] table / --outbox-table at the table \
                 the application inserts into"
            ),
            Problem::NotPublished { table, publication } => write!(
                f,
                "outbox table {table} is not in publication \"{publication}\", so PostgreSQL \
                 would not send its rows and the slot would move past them; fix: run `walrelay \
                 setup`, or ALTER PUBLICATION {} ADD TABLE {table}",
                quote_identifier(publication)
            ),
            Problem::PartitionedWithoutRoot { table, publication } => write!(
                f,
                "outbox table {table} is partitioned and publication \"{publication}\" is not \
                 publish_via_partition_root, so its rows would arrive under the partitions' \
                 names; fix: run `walrelay setup`, or ALTER PUBLICATION {} SET \
                 (publish_via_partition_root = true)",
                quote_identifier(publication)
            ),
            Problem::RowFilter {
                table,
                publication,
                filter,
            } => write!(
                f,
                "publication \"{publication}\" publishes outbox table {table} with a row filter \
                 (WHERE {filter}), so rows that do not match are never sent; fix, in one \
                 transaction so that no row is committed while the table is out of the \
                 publication: BEGIN; ALTER PUBLICATION {pb} DROP TABLE {table}; ALTER PUBLICATION \
                 {pb} ADD TABLE {table}; COMMIT;",
                pb = quote_identifier(publication)
            ),
        }
    }
}

/// The publication does not cover the configuration: running would skip
/// events. Never transient: someone must change the publication or the
/// configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PublicationError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for PublicationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; and ")?;
            }
            write!(f, "{p}")?;
        }
        f.write_str(" (docs/troubleshooting.md, \"An outbox table is not in the publication\")")
    }
}

/// `pg_class.relkind` of an ordinary table.
const TABLE: char = 'r';
/// `pg_class.relkind` of a partitioned table.
const PARTITIONED: char = 'p';

/// The problems, in configuration order; empty when every configured
/// outbox's rows reach walrelay under the configured name.
pub fn assess(publication: &str, facts: &Facts) -> Vec<Problem> {
    let mut problems = Vec::new();
    let name = || publication.to_owned();
    let Some(p) = &facts.publication else {
        problems.push(Problem::PublicationMissing {
            publication: name(),
        });
        return problems;
    };
    if !p.inserts && !facts.outboxes.is_empty() {
        problems.push(Problem::InsertsNotPublished {
            publication: name(),
        });
    }
    for o in &facts.outboxes {
        let table = format!("{}.{}", o.schema, o.table);
        let relkind = match o.relkind {
            None => {
                problems.push(Problem::TableMissing { table });
                continue;
            }
            Some(k) if k != TABLE && k != PARTITIONED => {
                problems.push(Problem::NotATable { table, relkind: k });
                continue;
            }
            Some(k) => k,
        };
        if relkind == PARTITIONED && !p.via_root {
            // pg_publication_tables then lists the leaves, never the root:
            // adding the root again would not help, the option does.
            problems.push(Problem::PartitionedWithoutRoot {
                table,
                publication: name(),
            });
            continue;
        }
        match p
            .published
            .iter()
            .find(|t| t.schema == o.schema && t.table == o.table)
        {
            None => problems.push(Problem::NotPublished {
                table,
                publication: name(),
            }),
            Some(PublishedTable {
                row_filter: Some(filter),
                ..
            }) => problems.push(Problem::RowFilter {
                table,
                publication: name(),
                filter: filter.clone(),
            }),
            Some(_) => {}
        }
    }
    problems
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// `pg_current_wal_lsn()`, sampled before the catalog was read.
    pub wal_lsn: Lsn,
    /// The slot's `confirmed_flush_lsn` in the same statement (`None`:
    /// no such slot, or none confirmed yet).
    pub slot_confirmed: Option<Lsn>,
    /// The slot's `wal_status` and `safe_wal_size` in the same statement
    /// (`None`: no such slot).
    pub slot_wal: Option<crate::metrics::SlotWal>,
    pub problems: Vec<Problem>,
    /// Whether a PostgreSQL failover keeps what walrelay publishes
    /// (reported, never a reason to stop: see [`crate::source::slot_failover`]).
    pub failover: Vec<crate::source::slot_failover::Finding>,
}

impl Checked {
    /// `Ok(wal_lsn)` when nothing is wrong: WAL up to it may be confirmed.
    pub fn verdict(self) -> Result<Lsn, PublicationError> {
        if self.problems.is_empty() {
            Ok(self.wal_lsn)
        } else {
            Err(PublicationError {
                problems: self.problems,
            })
        }
    }
}

/// Sample the WAL position, then read the facts and assess them.
///
/// Only on a plain SQL connection ([`crate::source::monitor::check_once`]), never
/// on the walsender that streams: reading the outbox tables' catalog rows
/// there caches their current shape in the walsender, which PostgreSQL 18's
/// pgoutput then used for rows written before a later ALTER TABLE.
pub async fn check(
    conn: &mut ReplicationConnection,
    config: &Config,
) -> Result<Checked, walrelay_pg::Error> {
    // Its own statement, before the catalog reads: each of those takes a
    // snapshot after this position was read (see the module comment).
    // The slot's confirmed position in the same statement, so that the
    // lag PostgreSQL itself sees is read consistently.
    // Its WAL retention too (`wal_status`, `safe_wal_size`), for the
    // metrics.
    let rows = conn
        .simple_query(&format!(
            "SELECT pg_catalog.pg_current_wal_lsn()::text AS l, s.c, s.w, s.s \
             FROM (SELECT 1) AS one LEFT JOIN \
             (SELECT confirmed_flush_lsn::text AS c, wal_status AS w, safe_wal_size::text AS s \
              FROM pg_catalog.pg_replication_slots WHERE slot_name = {}) AS s ON true",
            quote_literal(&config.postgres.slot)
        ))
        .await?;
    let (lsn_text, slot_confirmed, slot_wal) = match rows.first() {
        Some(r) => (
            r.get_required("l")?.to_owned(),
            r.get("c")?.and_then(|c| c.parse::<Lsn>().ok()),
            r.get("w")?.map(|status| crate::metrics::SlotWal {
                status: status.to_owned(),
                safe_wal_size: r.get("s").ok().flatten().and_then(|s| s.parse().ok()),
            }),
        ),
        None => (String::new(), None, None),
    };
    let wal_lsn: Lsn = lsn_text.parse().map_err(|_| {
        walrelay_pg::Error::Protocol(format!(
            "pg_current_wal_lsn() returned {lsn_text:?}, not an LSN"
        ))
    })?;
    let facts = fetch(conn, config).await?;
    let failover = crate::source::slot_failover::fetch(
        conn,
        &config.postgres.slot,
        config.postgres.slot_failover,
    )
    .await?;
    Ok(Checked {
        wal_lsn,
        slot_confirmed,
        slot_wal,
        problems: assess(&config.postgres.publication, &facts),
        failover: crate::source::slot_failover::assess(&failover),
    })
}

/// Read the facts for `config` from the catalog.
pub async fn fetch(
    conn: &mut ReplicationConnection,
    config: &Config,
) -> Result<Facts, walrelay_pg::Error> {
    let name = quote_literal(&config.postgres.publication);
    let rows = conn
        .simple_query(&format!(
            "SELECT pubviaroot::text AS via_root, pubinsert::text AS inserts \
             FROM pg_catalog.pg_publication WHERE pubname = {name}"
        ))
        .await?;
    let publication = match rows.first() {
        None => None,
        Some(r) => {
            let via_root = r.get_required("via_root")? == "true";
            let inserts = r.get_required("inserts")? == "true";
            let tables = conn
                .simple_query(&format!(
                    "SELECT schemaname, tablename, rowfilter \
                     FROM pg_catalog.pg_publication_tables WHERE pubname = {name}"
                ))
                .await?;
            let mut published = Vec::with_capacity(tables.len());
            for t in &tables {
                published.push(PublishedTable {
                    schema: t.get_required("schemaname")?.to_owned(),
                    table: t.get_required("tablename")?.to_owned(),
                    row_filter: t.get("rowfilter")?.map(str::to_owned),
                });
            }
            Some(PublicationFacts {
                via_root,
                inserts,
                published,
            })
        }
    };
    let mut outboxes = Vec::with_capacity(config.outbox.len());
    for o in &config.outbox {
        let (schema, table) = o.qualified_name();
        let relkind = relkind(conn, &schema, &table).await?;
        outboxes.push(OutboxFacts {
            schema,
            table,
            relkind,
        });
    }
    Ok(Facts {
        publication,
        outboxes,
    })
}

/// `pg_class.relkind` of `schema.table` (`r` a table, `p` a partitioned
/// table, ...), or `None` when there is no such relation.
pub(crate) async fn relkind(
    conn: &mut ReplicationConnection,
    schema: &str,
    table: &str,
) -> Result<Option<char>, walrelay_pg::Error> {
    let rows = conn
        .simple_query(&format!(
            "SELECT c.relkind::text AS relkind FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(schema),
            quote_literal(table)
        ))
        .await?;
    Ok(match rows.first() {
        Some(r) => r.get_required("relkind")?.chars().next(),
        None => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outbox(table: &str, relkind: Option<char>) -> OutboxFacts {
        OutboxFacts {
            schema: "public".into(),
            table: table.into(),
            relkind,
        }
    }

    fn published(table: &str) -> PublishedTable {
        PublishedTable {
            schema: "public".into(),
            table: table.into(),
            row_filter: None,
        }
    }

    fn facts(via_root: bool, published: Vec<PublishedTable>, outboxes: Vec<OutboxFacts>) -> Facts {
        Facts {
            publication: Some(PublicationFacts {
                via_root,
                inserts: true,
                published,
            }),
            outboxes,
        }
    }

    #[test]
    fn a_publication_covering_every_outbox_is_fine() {
        let f = facts(
            false,
            vec![published("outbox"), published("other")],
            vec![outbox("outbox", Some('r'))],
        );
        assert_eq!(assess("walrelay", &f), vec![]);
        // Messages only: no tables needed, but the publication must exist.
        assert_eq!(assess("walrelay", &facts(false, vec![], vec![])), vec![]);
    }

    #[test]
    fn a_missing_publication_is_a_problem_even_without_outboxes() {
        let f = Facts {
            publication: None,
            outboxes: vec![],
        };
        let problems = assess("walrelay", &f);
        assert_eq!(
            problems,
            vec![Problem::PublicationMissing {
                publication: "walrelay".into()
            }]
        );
        assert!(problems[0].to_string().contains("walrelay setup"));
    }

    #[test]
    fn an_outbox_missing_from_the_publication_names_both_fixes() {
        let f = facts(
            false,
            vec![published("outbox")],
            vec![outbox("outbox", Some('r')), outbox("outbox2", Some('r'))],
        );
        let problems = assess("walrelay", &f);
        assert_eq!(
            problems,
            vec![Problem::NotPublished {
                table: "public.outbox2".into(),
                publication: "walrelay".into()
            }]
        );
        let text = PublicationError { problems }.to_string();
        assert!(
            text.contains("public.outbox2")
                && text.contains("walrelay setup")
                && text.contains("ALTER PUBLICATION \"walrelay\" ADD TABLE public.outbox2"),
            "{text}"
        );
    }

    #[test]
    fn missing_tables_and_non_tables_are_problems() {
        let f = facts(
            false,
            vec![published("v")],
            vec![outbox("nosuch", None), outbox("v", Some('v'))],
        );
        assert_eq!(
            assess("walrelay", &f),
            vec![
                Problem::TableMissing {
                    table: "public.nosuch".into()
                },
                Problem::NotATable {
                    table: "public.v".into(),
                    relkind: 'v'
                }
            ]
        );
    }

    #[test]
    fn a_partitioned_outbox_needs_publish_via_partition_root() {
        // Without the option pg_publication_tables lists the leaves.
        let leaves = facts(
            false,
            vec![published("outbox_p_2026"), published("outbox_p_2027")],
            vec![outbox("outbox_p", Some('p'))],
        );
        assert_eq!(
            assess("walrelay", &leaves),
            vec![Problem::PartitionedWithoutRoot {
                table: "public.outbox_p".into(),
                publication: "walrelay".into()
            }]
        );
        let root = facts(
            true,
            vec![published("outbox_p")],
            vec![outbox("outbox_p", Some('p'))],
        );
        assert_eq!(assess("walrelay", &root), vec![]);
        // Only a partition published (via root on): the root's rows from
        // the other partitions would be skipped.
        let one_leaf = facts(
            true,
            vec![published("outbox_p_2026")],
            vec![outbox("outbox_p", Some('p'))],
        );
        assert!(matches!(
            assess("walrelay", &one_leaf)[..],
            [Problem::NotPublished { .. }]
        ));
    }

    #[test]
    fn row_filters_and_unpublished_inserts_skip_rows() {
        let mut f = facts(
            false,
            vec![PublishedTable {
                row_filter: Some("(aggregatetype <> 'x'::text)".into()),
                ..published("outbox")
            }],
            vec![outbox("outbox", Some('r'))],
        );
        assert!(matches!(
            assess("walrelay", &f)[..],
            [Problem::RowFilter { .. }]
        ));
        f.publication.as_mut().unwrap().published[0].row_filter = None;
        f.publication.as_mut().unwrap().inserts = false;
        assert_eq!(
            assess("walrelay", &f),
            vec![Problem::InsertsNotPublished {
                publication: "walrelay".into()
            }]
        );
        // Without outboxes, what the publication publishes does not matter.
        f.outboxes.clear();
        assert_eq!(assess("walrelay", &f), vec![]);
    }

    #[test]
    fn a_clean_check_vouches_for_its_wal_position() {
        let ok = Checked {
            wal_lsn: Lsn(42),
            slot_confirmed: None,
            slot_wal: None,
            problems: vec![],
            failover: vec![],
        };
        assert_eq!(ok.verdict(), Ok(Lsn(42)));
        let bad = Checked {
            wal_lsn: Lsn(42),
            slot_confirmed: None,
            slot_wal: None,
            problems: vec![Problem::TableMissing {
                table: "public.x".into(),
            }],
            failover: vec![],
        };
        assert!(bad.verdict().is_err());
    }
}
