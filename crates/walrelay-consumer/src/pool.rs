//! Database connections: how to open one ([`Database`]) and the loop's
//! small pool of them (`Pool`).
//!
//! The loop applies one batch per partition at a time, each on a
//! connection of its own, so a slow or blocked partition holds only its
//! connection. A connection that failed is dropped, and the next batch
//! opens a new one: that is the reconnect after a database outage.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls, Socket};

use crate::statements::{Prepared, Statements};

/// A future that opens a connection.
pub type ConnectFuture =
    Pin<Box<dyn Future<Output = Result<Client, tokio_postgres::Error>> + Send>>;

/// How to open a connection to the service's database. Cheap to clone.
#[derive(Clone)]
pub struct Database {
    connect: Arc<dyn Fn() -> ConnectFuture + Send + Sync>,
}

impl std::fmt::Debug for Database {
    // The configuration may hold a password: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").finish_non_exhaustive()
    }
}

impl Database {
    /// Connections from a libpq-style connection string or URL, without
    /// TLS.
    pub fn from_dsn(dsn: &str) -> Result<Database, tokio_postgres::Error> {
        Ok(Database::new(dsn.parse::<Config>()?, NoTls))
    }

    /// Connections with `config`, through `tls` (`NoTls`, or a
    /// `tokio-postgres-rustls` / `postgres-native-tls` connector).
    pub fn new<T>(config: Config, tls: T) -> Database
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let config = Arc::new(config);
        Database::from_fn(move || {
            let config = Arc::clone(&config);
            let tls = tls.clone();
            Box::pin(async move {
                let (client, connection) = config.connect(tls).await?;
                tokio::spawn(async move {
                    // The client's next request reports the failure.
                    if let Err(e) = connection.await {
                        tracing::debug!("database connection closed: {e}");
                    }
                });
                Ok(client)
            })
        })
    }

    /// Connections opened by `connect` (which must drive the connection,
    /// e.g. by spawning it).
    pub fn from_fn<F>(connect: F) -> Database
    where
        F: Fn() -> ConnectFuture + Send + Sync + 'static,
    {
        Database {
            connect: Arc::new(connect),
        }
    }

    /// Opens a connection.
    pub async fn connect(&self) -> Result<Client, tokio_postgres::Error> {
        (self.connect)().await
    }
}

/// One of the loop's connections, and the batch statements once prepared
/// on it (they live as long as the connection's session).
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Whether batches use prepared statements on this connection.
    prepare: bool,
    prepared: Option<Prepared>,
}

impl Conn {
    /// Prepares the batch statements, if batches use them and that was not
    /// done already: before any batch's transaction, so that a batch's
    /// statements go out in the order it sends them (a statement prepared
    /// on first use would let the handler's overtake the marks' update).
    pub(crate) async fn prepare(&mut self) -> Result<(), tokio_postgres::Error> {
        if self.prepare && self.prepared.is_none() {
            self.prepared = Some(Prepared::prepare(&self.client).await?);
        }
        Ok(())
    }

    /// The client, and how batches send their statements on it.
    pub(crate) fn parts(&mut self) -> (&mut Client, Statements<'_>) {
        (&mut self.client, Statements::of(self.prepared.as_ref()))
    }
}

/// A connection lent by the pool: an open one, or the right to open one.
pub(crate) enum Lease {
    Open(Conn),
    /// Open one; whether to prepare the batch statements on it.
    New(Database, bool),
}

impl Lease {
    /// The connection, opening it if needed.
    pub(crate) async fn conn(self) -> Result<Conn, tokio_postgres::Error> {
        match self {
            Lease::Open(conn) => Ok(conn),
            Lease::New(db, prepare) => Ok(Conn {
                client: db.connect().await?,
                prepare,
                prepared: None,
            }),
        }
    }
}

/// At most `size` connections, used from the loop's task only.
pub(crate) struct Pool {
    db: Database,
    prepare: bool,
    idle: Vec<Conn>,
    lent: usize,
    size: usize,
}

impl Pool {
    /// `prepare`: whether batches use prepared statements
    /// ([`crate::Settings::prepared_statements`]).
    pub(crate) fn new(db: Database, size: usize, prepare: bool) -> Pool {
        Pool {
            db,
            prepare,
            idle: Vec::new(),
            lent: 0,
            size: size.max(1),
        }
    }

    /// A connection, or `None` when all are lent.
    pub(crate) fn lease(&mut self) -> Option<Lease> {
        if self.lent >= self.size {
            return None;
        }
        self.lent += 1;
        Some(match self.idle.pop() {
            Some(conn) => Lease::Open(conn),
            None => Lease::New(self.db.clone(), self.prepare),
        })
    }

    /// Returns a lease: the connection if it still works, or nothing.
    pub(crate) fn give_back(&mut self, conn: Option<Conn>) {
        self.lent = self.lent.saturating_sub(1);
        if let Some(conn) = conn.filter(|c| !c.client.is_closed()) {
            self.idle.push(conn);
        }
    }

    /// New connections send the batch statements unnamed from now on;
    /// whether they were prepared until now.
    pub(crate) fn stop_preparing(&mut self) -> bool {
        std::mem::replace(&mut self.prepare, false)
    }

    /// Whether a lease is available.
    pub(crate) fn has_room(&self) -> bool {
        self.lent < self.size
    }

    /// Drops every idle connection (after a database error, the others may
    /// be broken too; they would fail one batch each).
    pub(crate) fn drop_idle(&mut self) {
        self.idle.clear();
    }
}
