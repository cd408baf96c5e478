//! A replication connection (`replication=database`) before streaming:
//! startup, authentication, simple queries and replication commands.
//!
//! [`ReplicationConnection::start_replication`] consumes the connection and
//! turns it into a [`ReplicationStream`]: once the server is in CopyBoth mode
//! no other command can be sent on it, and the type system says so.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tracing::{debug, info, warn};
use walrelay_pgoutput::Lsn;

use crate::auth::{Authenticator, Step};
use crate::backend::{self, BackendMessage};
use crate::commands::{self, IdentifySystem, PgOutputOptions, SlotInfo};
use crate::config::Config;
use crate::error::{sqlstate, Error};
use crate::framing::{FrameReader, DEFAULT_MAX_FRAME_LEN};
use crate::log_limit::LogLimit;
use crate::stream::{ReplicationStream, StreamOptions};
use crate::tls::{self, Stream};

/// A row of a simple-query result: text values by column.
#[derive(Debug, Clone)]
pub struct Row {
    columns: Arc<[String]>,
    values: Vec<Option<Bytes>>,
}

impl Row {
    /// The text value of a column, `None` for NULL; an error for an unknown
    /// column or a value that is not UTF-8.
    pub fn get(&self, column: &str) -> Result<Option<&str>, Error> {
        let idx = self
            .columns
            .iter()
            .position(|c| c == column)
            .ok_or_else(|| {
                Error::Protocol(format!(
                    "result has no column {column:?} (columns: {:?})",
                    self.columns
                ))
            })?;
        match &self.values[idx] {
            None => Ok(None),
            Some(v) => std::str::from_utf8(v)
                .map(Some)
                .map_err(|_| Error::Protocol(format!("column {column:?} is not valid UTF-8"))),
        }
    }

    /// Like [`Row::get`] but NULL is an error.
    pub fn get_required(&self, column: &str) -> Result<&str, Error> {
        self.get(column)?
            .ok_or_else(|| Error::Protocol(format!("column {column:?} is unexpectedly NULL")))
    }

    pub fn columns(&self) -> &[String] {
        &self.columns
    }
}

/// Whether [`ReplicationConnection::ensure_slot`] created the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotStatus {
    Created(SlotInfo),
    Existed(SlotInfo),
}

impl SlotStatus {
    pub fn info(&self) -> &SlotInfo {
        match self {
            SlotStatus::Created(i) | SlotStatus::Existed(i) => i,
        }
    }
}

/// An authenticated replication connection in the idle state.
pub struct ReplicationConnection {
    pub(crate) reader: FrameReader<ReadHalf<Stream>>,
    pub(crate) writer: WriteHalf<Stream>,
    out: BytesMut,
    parameters: HashMap<String, String>,
    process_id: i32,
    /// `host:port` for messages and spans; never contains secrets.
    peer: String,
    is_tls: bool,
    max_frame_len: usize,
    /// Opened with `replication=database` (a walsender); `false` for a
    /// plain SQL connection from [`ReplicationConnection::connect_sql`].
    replication: bool,
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationConnection")
            .field("peer", &self.peer)
            .field("process_id", &self.process_id)
            .field("tls", &self.is_tls)
            .finish_non_exhaustive()
    }
}

impl ReplicationConnection {
    /// Connect, trying each configured host in order (libpq semantics), and
    /// authenticate. The whole exchange is bounded by `connect_timeout` when
    /// one is set.
    pub async fn connect(config: &Config) -> Result<Self, Error> {
        Self::connect_with_limit(config, DEFAULT_MAX_FRAME_LEN).await
    }

    /// [`Self::connect`] with a limit on the size of one server message
    /// (a guard against corrupt length fields; events larger than this
    /// cannot be received).
    pub async fn connect_with_limit(config: &Config, max_frame_len: usize) -> Result<Self, Error> {
        Self::connect_mode(config, max_frame_len, true).await
    }

    /// A plain SQL connection (no `replication` parameter) with the same
    /// settings, TLS and authentication: for catalog checks beside a
    /// stream. It occupies an ordinary backend, not one of
    /// `max_wal_senders`, and simple queries are all it can do (no
    /// replication commands, no [`Self::start_replication`]).
    pub async fn connect_sql(config: &Config) -> Result<Self, Error> {
        Self::connect_mode(config, DEFAULT_MAX_FRAME_LEN, false).await
    }

    async fn connect_mode(
        config: &Config,
        max_frame_len: usize,
        replication: bool,
    ) -> Result<Self, Error> {
        config.validate()?;
        let attempt = Self::connect_any(config, max_frame_len, replication);
        match config.get_connect_timeout() {
            Some(t) => {
                tokio::time::timeout(t, attempt)
                    .await
                    .map_err(|_| Error::ConnectTimeout {
                        target: config.redacted_url(),
                        after: t,
                    })?
            }
            None => attempt.await,
        }
    }

    async fn connect_any(
        config: &Config,
        max_frame_len: usize,
        replication: bool,
    ) -> Result<Self, Error> {
        let mut last_err = None;
        for (host, port) in config.host_ports() {
            let password = config.resolve_password_for(host, port);
            match Self::connect_one(
                config,
                host,
                port,
                password.as_ref().map(|p| p.as_bytes()),
                max_frame_len,
                replication,
            )
            .await
            {
                Ok(c) => return Ok(c),
                Err(e) => {
                    // Authentication and configuration errors will not get
                    // better on another host of the same cluster.
                    if !e.is_transient() && !matches!(e, Error::Tls(_)) {
                        return Err(e);
                    }
                    debug!(%host, port, error = %e, "connection attempt failed");
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| Error::Precondition {
            problem: "no host to connect to".into(),
            fix: "set host in the connection settings or PGHOST".into(),
        }))
    }

    async fn connect_one(
        config: &Config,
        host: &str,
        port: u16,
        password: Option<&[u8]>,
        max_frame_len: usize,
        replication: bool,
    ) -> Result<Self, Error> {
        let stream = tls::connect(config, host, port).await?;
        let is_tls = stream.is_tls();
        let channel_binding = stream.tls_server_end_point();
        let (read, write) = tokio::io::split(stream);
        let mut conn = ReplicationConnection {
            reader: FrameReader::new(read, max_frame_len),
            writer: write,
            out: BytesMut::with_capacity(1024),
            parameters: HashMap::new(),
            process_id: 0,
            peer: format!("{host}:{port}"),
            is_tls,
            max_frame_len,
            replication,
        };

        let mut params: Vec<(&str, &str)> = vec![
            ("user", config.get_user()),
            ("database", config.get_dbname()),
            ("application_name", config.get_application_name()),
            ("client_encoding", "UTF8"),
        ];
        if replication {
            params.push(("replication", "database"));
        }
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        frontend::startup_message(params, &mut conn.out)
            .map_err(Error::io("encoding the startup message"))?;
        conn.flush_out("sending the startup message").await?;

        let mut auth = Authenticator::new(
            config.get_user(),
            password,
            channel_binding,
            config.get_channel_binding(),
        );
        loop {
            match conn.next_message("authenticating").await? {
                BackendMessage::Authentication(a) => match auth.step(a)? {
                    Step::Send(bytes) => {
                        if !bytes.is_empty() {
                            conn.out.extend_from_slice(&bytes);
                            conn.flush_out("sending authentication data").await?;
                        }
                    }
                    Step::Done => break,
                },
                BackendMessage::ErrorResponse(e) => {
                    return Err(Error::server(
                        format!(
                            "connecting to {} as user \"{}\"",
                            conn.peer,
                            config.get_user()
                        ),
                        e,
                    ))
                }
                BackendMessage::NegotiateProtocolVersion { unrecognized, .. } => {
                    debug!(?unrecognized, "server negotiated the protocol version down");
                }
                other => return Err(other.unexpected("authentication")),
            }
        }
        // After AuthenticationOk: ParameterStatus*, BackendKeyData, then
        // ReadyForQuery (or an ErrorResponse, e.g. too many connections).
        loop {
            match conn.next_message("starting the session").await? {
                BackendMessage::ParameterStatus { name, value } => {
                    conn.parameters.insert(name, value);
                }
                BackendMessage::BackendKeyData { process_id, .. } => conn.process_id = process_id,
                BackendMessage::ReadyForQuery { .. } => break,
                BackendMessage::ErrorResponse(e) => {
                    return Err(Error::server(
                        format!(
                            "starting a session on {} as user \"{}\"",
                            conn.peer,
                            config.get_user()
                        ),
                        e,
                    ))
                }
                other => return Err(other.unexpected("session start")),
            }
        }
        // A standby connects every second or so: one line a minute, with
        // the number of connections not logged.
        static ESTABLISHED: LogLimit = LogLimit::new(Duration::from_secs(60));
        if !replication {
            debug!(peer = %conn.peer, tls = is_tls, pid = conn.process_id, "SQL connection established");
        } else if let Some(suppressed) = ESTABLISHED.check() {
            info!(peer = %conn.peer, tls = is_tls, pid = conn.process_id,
                  server_version = conn.parameter("server_version").unwrap_or("?"),
                  suppressed, "replication connection established");
        }
        Ok(conn)
    }

    /// A server parameter reported at startup (`server_version`, ...).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// `server_version_num`-style number (e.g. 150008), from the startup
    /// parameters.
    pub fn server_version_num(&self) -> Option<u32> {
        let v = self.parameter("server_version")?;
        let mut parts = v.split(|c: char| !c.is_ascii_digit());
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
        Some(major * 10000 + minor)
    }

    /// The walsender's backend process id.
    pub fn process_id(&self) -> i32 {
        self.process_id
    }

    pub fn is_tls(&self) -> bool {
        self.is_tls
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    async fn flush_out(&mut self, context: &'static str) -> Result<(), Error> {
        self.writer
            .write_all(&self.out)
            .await
            .map_err(Error::io(context))?;
        self.writer.flush().await.map_err(Error::io(context))?;
        self.out.clear();
        Ok(())
    }

    pub(crate) async fn next_message(
        &mut self,
        context: &'static str,
    ) -> Result<BackendMessage, Error> {
        loop {
            let frame = self
                .reader
                .read_frame()
                .await?
                .ok_or(Error::Closed(Some(context)))?;
            match backend::parse(frame)? {
                BackendMessage::NoticeResponse(n) => {
                    warn!(peer = %self.peer, code = %n.code, "server notice: {}", n.message);
                }
                // Can arrive at any time (e.g. after SIGHUP); keep it.
                BackendMessage::ParameterStatus { name, value }
                    if context != "starting the session" =>
                {
                    self.parameters.insert(name, value);
                }
                m => return Ok(m),
            }
        }
    }

    /// Run one command with the simple-query protocol and collect its rows
    /// (text format). Replication commands and, on a `replication=database`
    /// connection, ordinary SQL are both accepted.
    pub async fn simple_query(&mut self, sql: &str) -> Result<Vec<Row>, Error> {
        debug!(peer = %self.peer, %sql, "simple query");
        frontend::query(sql, &mut self.out).map_err(Error::io("encoding a query"))?;
        self.flush_out("sending a query").await?;
        let mut columns: Arc<[String]> = Arc::from(Vec::new());
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.next_message("running a query").await? {
                BackendMessage::RowDescription { columns: c } => columns = c.into(),
                BackendMessage::DataRow { values } => {
                    if values.len() != columns.len() {
                        return Err(Error::Protocol(format!(
                            "DataRow has {} values but RowDescription {} columns",
                            values.len(),
                            columns.len()
                        )));
                    }
                    rows.push(Row {
                        columns: columns.clone(),
                        values,
                    });
                }
                BackendMessage::CommandComplete { .. } | BackendMessage::EmptyQueryResponse => {}
                BackendMessage::ErrorResponse(e) => error = Some(e),
                BackendMessage::ReadyForQuery { .. } => break,
                other => return Err(other.unexpected("a simple query")),
            }
        }
        match error {
            Some(e) => Err(Error::server(command_name(sql), e)),
            None => Ok(rows),
        }
    }

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
        }))
    }

    /// Create the pgoutput slot unless it exists; check that an existing one
    /// is a logical pgoutput slot of this database.
    pub async fn ensure_slot(&mut self, slot: &str) -> Result<SlotStatus, Error> {
        if let Some(info) = self.slot_info(slot).await? {
            self.check_slot(&info)?;
            return Ok(SlotStatus::Existed(info));
        }
        let created = self
            .simple_query(&commands::create_slot_command(slot)?)
            .await;
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

    /// Close the connection politely.
    pub async fn close(mut self) -> Result<(), Error> {
        frontend::terminate(&mut self.out);
        self.flush_out("closing the connection").await?;
        let _ = self.writer.shutdown().await;
        Ok(())
    }

    /// The limit on one server message this connection enforces.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }
}

fn command_name(sql: &str) -> String {
    let word: String = sql.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    if word.len() > 40 {
        format!(
            "{}...",
            &word[..word.char_indices().nth(40).map_or(word.len(), |(i, _)| i)]
        )
    } else {
        word
    }
}
