//! Opening a connection: trying each host, TLS, startup and authentication.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tracing::{debug, info};

use crate::auth::{Authenticator, Step};
use crate::backend::BackendMessage;
use crate::config::{verdict, Config, ServerState, Verdict};
use crate::error::Error;
use crate::framing::{FrameReader, DEFAULT_MAX_FRAME_LEN};
use crate::log_limit::LogLimit;
use crate::tls;

use super::ReplicationConnection;

/// Whether a host's server is one `target_session_attrs` asks for.
enum Fit {
    Yes(ReplicationConnection),
    /// Not wanted (a standby, or read-only by default), and why.
    No(&'static str),
}

impl ReplicationConnection {
    /// Connect, trying each configured host in order (libpq semantics), and
    /// authenticate. `connect_timeout` bounds each host's attempt; the
    /// first server that `target_session_attrs` accepts is kept (a standby
    /// reached with `any` is an error, see [`Error::Standby`]).
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
        let attrs = config.get_target_session_attrs();
        let mut last_err = None;
        let mut skipped = Vec::new();
        let mut unwanted = false;
        let mut going_away = false;
        for (host, port) in config.host_ports() {
            let attempt = Self::connect_host(config, host, port, max_frame_len, replication);
            // libpq applies connect_timeout to each host on its own: a host
            // that accepts TCP and never answers costs one timeout, and
            // the next host is tried.
            let result = match config.get_connect_timeout() {
                Some(after) => tokio::time::timeout(after, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::ConnectTimeout {
                            target: format!("{host}:{port}"),
                            after,
                        })
                    }),
                None => attempt.await,
            };
            match result {
                Ok(Fit::Yes(conn)) => return Ok(conn),
                Ok(Fit::No(why)) => {
                    unwanted = true;
                    skipped.push(format!("{host}:{port}: {why}"));
                }
                Err(e) => {
                    // Authentication and configuration errors will not get
                    // better on another host of the same cluster; nor does
                    // a standby reached with `any`.
                    if !e.is_transient() && !matches!(e, Error::Tls(_)) {
                        return Err(e);
                    }
                    debug!(%host, port, error = %e, "connection attempt failed");
                    going_away |= e.is_server_going_away();
                    skipped.push(format!("{host}:{port}: {e}"));
                    last_err = Some(e);
                }
            }
        }
        match last_err {
            // Every host failed to connect: the last failure, as before
            // target_session_attrs was taken into account.
            Some(e) if !unwanted => Err(e),
            None if skipped.is_empty() => Err(Error::Precondition {
                problem: "no host to connect to".into(),
                fix: "set host in the connection settings or PGHOST".into(),
            }),
            _ => Err(Error::NoSuitableHost {
                wanted: attrs,
                tried: skipped.join(", "),
                going_away,
            }),
        }
    }

    /// One host: connect, authenticate, and decide by
    /// `target_session_attrs` whether to keep the connection.
    async fn connect_host(
        config: &Config,
        host: &str,
        port: u16,
        max_frame_len: usize,
        replication: bool,
    ) -> Result<Fit, Error> {
        let password = config.resolve_password_for(host, port);
        let mut conn = Self::connect_one(
            config,
            host,
            port,
            password.as_ref().map(|p| p.as_bytes()),
            max_frame_len,
            replication,
        )
        .await?;
        let attrs = config.get_target_session_attrs();
        let mut state = ServerState::from_parameters(|n| conn.parameter(n).map(str::to_owned));
        loop {
            match verdict(attrs, state) {
                Verdict::Accept => return Ok(Fit::Yes(conn)),
                Verdict::Query => state = conn.query_server_state().await?,
                Verdict::Standby => return Err(Error::Standby { peer: conn.peer }),
                Verdict::Skip(why) => {
                    debug!(%host, port, why, %attrs, "skipping a server target_session_attrs does not want");
                    // Closing politely is a courtesy: the decision stands.
                    let _ = conn.close().await;
                    return Ok(Fit::No(why));
                }
            }
        }
    }

    /// What a server before PostgreSQL 14 does not report at startup:
    /// whether it is in recovery and read-only by default (libpq asks
    /// the same).
    async fn query_server_state(&mut self) -> Result<ServerState, Error> {
        let rows = self
            .simple_query(
                "SELECT pg_catalog.pg_is_in_recovery()::text AS in_recovery, \
                 pg_catalog.current_setting('default_transaction_read_only') AS read_only",
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Protocol("the recovery check returned no row".into()))?;
        Ok(ServerState {
            in_hot_standby: Some(row.get_required("in_recovery")? == "true"),
            default_read_only: Some(row.get_required("read_only")? == "on"),
        })
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
}
