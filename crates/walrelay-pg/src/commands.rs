//! Text of the replication commands walrelay sends, and the typed results.
//!
//! Building the command strings is pure so the quoting rules are tested
//! byte for byte: slot names are identifiers (`"..."`, `"` doubled),
//! option values are string literals (`'...'`, `'` doubled; the walsender's
//! grammar has no backslash escapes), and the publication names inside the
//! `publication_names` literal are themselves identifiers, because the
//! server splits that list with identifier rules (so `MyPub` or a name
//! containing a comma must be double-quoted inside the literal).

use walrelay_pgoutput::Lsn;

use crate::error::Error;

/// Quote an SQL identifier: always quoted, so case and special characters
/// are preserved exactly.
pub fn quote_identifier(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    s.push('"');
    for c in name.chars() {
        if c == '"' {
            s.push('"');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// Quote a string literal for the replication grammar and for SQL with
/// `standard_conforming_strings=on` (the default since 9.1, and what
/// walrelay's simple queries assume).
pub fn quote_literal(value: &str) -> String {
    let mut s = String::with_capacity(value.len() + 2);
    s.push('\'');
    for c in value.chars() {
        if c == '\'' {
            s.push('\'');
        }
        s.push(c);
    }
    s.push('\'');
    s
}

/// Reject names the server cannot hold rather than let it truncate them
/// silently (NAMEDATALEN - 1 = 63 bytes) or choke on a NUL.
pub fn check_name(kind: &'static str, name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > 63 || name.contains('\0') {
        return Err(Error::Precondition {
            problem: format!("invalid {kind} name {name:?}"),
            fix: format!("use a {kind} name of 1 to 63 bytes without NUL characters"),
        });
    }
    Ok(())
}

/// Slot names are stricter: lower-case letters, digits and underscores.
pub fn check_slot_name(name: &str) -> Result<(), Error> {
    check_name("slot", name)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(Error::Precondition {
            problem: format!("invalid slot name {name:?}"),
            fix:
                "replication slot names may contain only lower-case letters, digits and underscores"
                    .into(),
        });
    }
    Ok(())
}

/// Options of `START_REPLICATION ... LOGICAL` for pgoutput.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOutputOptions {
    /// pgoutput protocol version. 1 is what walrelay decodes in production
    /// (no streaming of in-progress transactions).
    pub proto_version: u32,
    pub publication_names: Vec<String>,
    /// Ask for `pg_logical_emit_message` messages.
    pub messages: bool,
    /// Stream large in-progress transactions (needs proto_version >= 2).
    pub streaming: bool,
    /// Binary column values instead of text.
    pub binary: bool,
}

impl PgOutputOptions {
    pub fn new(publication_names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        PgOutputOptions {
            proto_version: 1,
            publication_names: publication_names.into_iter().map(Into::into).collect(),
            messages: true,
            streaming: false,
            binary: false,
        }
    }
}

/// `CREATE_REPLICATION_SLOT "name" LOGICAL pgoutput NOEXPORT_SNAPSHOT`.
///
/// The legacy `NOEXPORT_SNAPSHOT` spelling is accepted by every supported
/// server version (10 to 18); walrelay never needs the snapshot because it
/// relays only changes made after the slot exists.
pub fn create_slot_command(slot: &str) -> Result<String, Error> {
    check_slot_name(slot)?;
    Ok(format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput NOEXPORT_SNAPSHOT",
        quote_identifier(slot)
    ))
}

/// `CREATE_REPLICATION_SLOT "name" LOGICAL pgoutput (SNAPSHOT 'nothing',
/// FAILOVER true)`: a slot that PostgreSQL 17 and later synchronize to
/// standbys (`sync_replication_slots`). The option list is the only
/// spelling that takes FAILOVER; `SNAPSHOT 'nothing'` is what
/// `NOEXPORT_SNAPSHOT` says in it.
pub fn create_failover_slot_command(slot: &str) -> Result<String, Error> {
    check_slot_name(slot)?;
    Ok(format!(
        "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)",
        quote_identifier(slot)
    ))
}

/// `ALTER_REPLICATION_SLOT "name" (FAILOVER true)` (PostgreSQL 17+; it
/// fails while a walsender streams from the slot).
pub fn enable_failover_command(slot: &str) -> Result<String, Error> {
    check_slot_name(slot)?;
    Ok(format!(
        "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
        quote_identifier(slot)
    ))
}

/// `START_REPLICATION SLOT "name" LOGICAL <lsn> (options)`.
pub fn start_replication_command(
    slot: &str,
    start: Lsn,
    options: &PgOutputOptions,
) -> Result<String, Error> {
    check_slot_name(slot)?;
    if options.publication_names.is_empty() {
        return Err(Error::Precondition {
            problem: "no publication given".into(),
            fix: "pgoutput needs at least one publication name (a publication with no tables is fine for messages only)".into(),
        });
    }
    for p in &options.publication_names {
        check_name("publication", p)?;
    }
    let pubs = options
        .publication_names
        .iter()
        .map(|p| quote_identifier(p))
        .collect::<Vec<_>>()
        .join(",");
    let mut opts = vec![
        format!(
            "\"proto_version\" {}",
            quote_literal(&options.proto_version.to_string())
        ),
        format!("\"publication_names\" {}", quote_literal(&pubs)),
    ];
    if options.messages {
        opts.push("\"messages\" 'true'".into());
    }
    if options.streaming {
        opts.push("\"streaming\" 'true'".into());
    }
    if options.binary {
        opts.push("\"binary\" 'true'".into());
    }
    Ok(format!(
        "START_REPLICATION SLOT {} LOGICAL {} ({})",
        quote_identifier(slot),
        start,
        opts.join(", ")
    ))
}

/// The result of `IDENTIFY_SYSTEM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifySystem {
    /// The cluster's unique system identifier (a 64-bit number printed in
    /// decimal); part of walrelay's default source id.
    pub system_id: String,
    pub timeline: u32,
    /// The server's current WAL flush position.
    pub xlogpos: Lsn,
    /// The database the connection is bound to (`replication=database`).
    pub dbname: Option<String>,
}

/// A row of `pg_replication_slots` for one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    pub slot_name: String,
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub restart_lsn: Option<Lsn>,
    /// The checkpoint: everything before it has been confirmed.
    pub confirmed_flush_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost` (NULL on old servers).
    pub wal_status: Option<String>,
    /// Whether PostgreSQL synchronizes the slot to standbys that may be
    /// promoted (`None` before PostgreSQL 17, which has no failover slots).
    pub failover: Option<bool>,
    /// On a standby: the slot is a synchronized copy of the primary's
    /// (`None` before PostgreSQL 17).
    pub synced: Option<bool>,
}

/// The SQL that reads one slot, usable on a replication connection
/// (`replication=database` accepts simple SQL queries).
pub fn slot_info_query(slot: &str) -> String {
    format!(
        "SELECT slot_name, plugin, slot_type, database, active, active_pid, restart_lsn, \
         confirmed_flush_lsn, wal_status, pg_catalog.to_jsonb(s) ->> 'failover' AS failover, \
         pg_catalog.to_jsonb(s) ->> 'synced' AS synced \
         FROM pg_catalog.pg_replication_slots s WHERE slot_name = {}",
        quote_literal(slot)
    )
}

pub(crate) fn parse_lsn_field(command: &str, field: &str, value: &str) -> Result<Lsn, Error> {
    value.parse().map_err(|_| {
        Error::Protocol(format!(
            "{command} returned an invalid LSN {value:?} in column {field}"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_identifier("slot"), "\"slot\"");
        assert_eq!(quote_identifier("My\"Pub"), "\"My\"\"Pub\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "'a\\b'");
    }

    #[test]
    fn start_replication_text() {
        let opts = PgOutputOptions::new(["walrelay", "My,Pub's"]);
        let cmd = start_replication_command("walrelay_slot", Lsn(0), &opts).unwrap();
        assert_eq!(
            cmd,
            "START_REPLICATION SLOT \"walrelay_slot\" LOGICAL 0/0 (\"proto_version\" '1', \
             \"publication_names\" '\"walrelay\",\"My,Pub''s\"', \"messages\" 'true')"
        );
    }

    #[test]
    fn start_replication_with_position_and_streaming() {
        let mut opts = PgOutputOptions::new(["p"]);
        opts.proto_version = 2;
        opts.streaming = true;
        opts.messages = false;
        let cmd = start_replication_command("s", Lsn(0x16_B374_D848), &opts).unwrap();
        assert_eq!(
            cmd,
            "START_REPLICATION SLOT \"s\" LOGICAL 16/B374D848 (\"proto_version\" '2', \
             \"publication_names\" '\"p\"', \"streaming\" 'true')"
        );
    }

    #[test]
    fn bad_names_are_rejected_with_a_fix() {
        assert!(create_slot_command("Upper").is_err());
        assert!(create_slot_command("has space").is_err());
        assert!(create_slot_command(&"a".repeat(64)).is_err());
        assert!(create_slot_command("").is_err());
        let err =
            start_replication_command("s", Lsn(0), &PgOutputOptions::new(Vec::<String>::new()))
                .unwrap_err();
        assert!(err.to_string().contains("publication"), "{err}");
        assert_eq!(
            create_slot_command("ok_1").unwrap(),
            "CREATE_REPLICATION_SLOT \"ok_1\" LOGICAL pgoutput NOEXPORT_SNAPSHOT"
        );
    }

    #[test]
    fn failover_slot_commands() {
        assert_eq!(
            create_failover_slot_command("ok_1").unwrap(),
            "CREATE_REPLICATION_SLOT \"ok_1\" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"
        );
        assert_eq!(
            enable_failover_command("ok_1").unwrap(),
            "ALTER_REPLICATION_SLOT \"ok_1\" (FAILOVER true)"
        );
        assert!(create_failover_slot_command("Bad Name").is_err());
        assert!(enable_failover_command("x;y").is_err());
    }

    #[test]
    fn slot_query_quotes_the_name() {
        assert!(slot_info_query("x'y").ends_with("WHERE slot_name = 'x''y'"));
    }
}
