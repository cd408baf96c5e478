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

/// A connection lent by the pool: an open one, or the right to open one.
pub(crate) enum Lease {
    Open(Client),
    New(Database),
}

impl Lease {
    /// The connection, opening it if needed.
    pub(crate) async fn client(self) -> Result<Client, tokio_postgres::Error> {
        match self {
            Lease::Open(client) => Ok(client),
            Lease::New(db) => db.connect().await,
        }
    }
}

/// At most `size` connections, used from the loop's task only.
pub(crate) struct Pool {
    db: Database,
    idle: Vec<Client>,
    lent: usize,
    size: usize,
}

impl Pool {
    pub(crate) fn new(db: Database, size: usize) -> Pool {
        Pool {
            db,
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
            Some(client) => Lease::Open(client),
            None => Lease::New(self.db.clone()),
        })
    }

    /// Returns a lease: the connection if it still works, or nothing.
    pub(crate) fn give_back(&mut self, client: Option<Client>) {
        self.lent = self.lent.saturating_sub(1);
        if let Some(client) = client.filter(|c| !c.is_closed()) {
            self.idle.push(client);
        }
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
