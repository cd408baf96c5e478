//! A replication connection (`replication=database`) before streaming:
//! startup, authentication, simple queries and replication commands.
//!
//! [`ReplicationConnection::start_replication`] consumes the connection and
//! turns it into a [`ReplicationStream`](crate::stream::ReplicationStream): once the server is in CopyBoth mode
//! no other command can be sent on it, and the type system says so.
//!
//! Opening the connection (hosts, TLS, startup, authentication) is in
//! `startup.rs`; the replication commands and slot and publication checks
//! in `replication.rs`; the connection itself and simple queries here.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncWriteExt, ReadHalf, WriteHalf};
use tracing::{debug, warn};

use crate::backend::{self, BackendMessage};
use crate::commands::SlotInfo;
use crate::error::Error;
use crate::framing::FrameReader;
use crate::tls::Stream;

mod replication;
mod startup;

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
