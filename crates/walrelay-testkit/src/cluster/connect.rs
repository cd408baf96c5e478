//! Talking to a running cluster: connection strings (keyword/value and
//! URL), `tokio_postgres` clients over TCP, and blocking SQL over the Unix
//! socket for setup code that is not async.

use std::time::Duration;

use anyhow::{anyhow, Context};

use super::{PgCluster, HOST, SUPERUSER};

impl PgCluster {
    /// Keyword/value connection string over TCP:
    /// `host=127.0.0.1 port=N user=U dbname=D` (no password).
    pub fn conninfo(&self, user: &str, dbname: &str) -> String {
        format!(
            "host={HOST} port={} user={} dbname={}",
            self.port,
            quote_conninfo(user),
            quote_conninfo(dbname)
        )
    }

    /// URL connection string over TCP: `postgresql://U@127.0.0.1:N/D`
    /// (no password).
    pub fn url(&self, user: &str, dbname: &str) -> String {
        format!(
            "postgresql://{}@{HOST}:{}/{}",
            percent_encode(user),
            self.port,
            percent_encode(dbname)
        )
    }

    /// A `tokio_postgres::Config` for a TCP connection to this cluster.
    pub fn client_config(
        &self,
        user: &str,
        password: Option<&str>,
        dbname: &str,
    ) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config
            .host(HOST)
            .port(self.port)
            .user(user)
            .dbname(dbname)
            .connect_timeout(Duration::from_secs(10));
        if let Some(password) = password {
            config.password(password);
        }
        config
    }

    /// Connects over TCP without TLS as the superuser `postgres` to the
    /// database `postgres` (with the superuser password when the cluster
    /// uses password auth). The connection task is spawned on the current
    /// tokio runtime.
    pub async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        self.client_as(SUPERUSER, self.superuser_password(), "postgres")
            .await
    }

    /// Connects over TCP without TLS as `user` to `dbname`. The connection
    /// task is spawned on the current tokio runtime.
    pub async fn client_as(
        &self,
        user: &str,
        password: Option<&str>,
        dbname: &str,
    ) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = self
            .client_config(user, password, dbname)
            .connect(tokio_postgres::NoTls)
            .await
            .with_context(|| {
                format!(
                    "connecting to the test cluster as {user} to {dbname} ({})",
                    self.conninfo(user, dbname)
                )
            })?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("test cluster connection ended: {e}");
            }
        });
        Ok(client)
    }

    /// Runs `sql` (one or more statements) as the superuser over the Unix
    /// socket, blocking. Usable from sync code and from inside a tokio
    /// runtime (it runs on its own thread).
    pub fn batch_execute_blocking(&self, sql: &str) -> anyhow::Result<()> {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(&self.dir)
            .port(self.port)
            .user(SUPERUSER)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(10));
        if let Some(password) = self.superuser_password() {
            config.password(password);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let (client, connection) = config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .context("connecting over the Unix socket")?;
                    let conn = tokio::spawn(connection);
                    client.batch_execute(sql).await?;
                    drop(client);
                    let _ = conn.await;
                    anyhow::Ok(())
                })
            })
            .join()
            .map_err(|_| anyhow!("SQL thread panicked"))?
        })
    }
}

/// Quotes a keyword/value conninfo value when needed.
pub(super) fn quote_conninfo(value: &str) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\')
    {
        return value.to_string();
    }
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

pub(super) fn percent_encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
