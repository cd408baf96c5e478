//! Throwaway PostgreSQL clusters: `initdb` into a fresh temporary directory,
//! start on a free port, stop and remove on drop.

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use crate::bin::PgBin;
use crate::tls::write_private_file;
use crate::user::ServerUser;

mod options;

pub use options::{Auth, ClusterOptions, PasswordMethod};

/// Set to `1` to keep a cluster's directory (data, configuration, log)
/// after its [`PgCluster`] is dropped; the path is printed to stderr.
pub const KEEP_CLUSTER_ENV: &str = "WALRELAY_KEEP_CLUSTER";

/// The bootstrap superuser of every cluster.
pub const SUPERUSER: &str = "postgres";

/// The address every cluster listens on.
pub const HOST: &str = "127.0.0.1";

/// How often a start is retried when another process took the chosen port.
const PORT_ATTEMPTS: usize = 8;
/// `pg_ctl -t`: seconds to wait for start/stop.
const PG_CTL_WAIT_SECS: &str = "90";

/// Mutable part of a cluster: its settings and whether it runs.
#[derive(Debug)]
struct State {
    settings: Vec<(String, String)>,
    hba_prepend: Vec<String>,
    running: bool,
}

/// A running throwaway PostgreSQL cluster.
///
/// Layout of its directory (`walrelay-pg-XXXXXX` under the system temp
/// dir): `data/` (the data directory, 0700), `log` (server log), and the Unix
/// socket. All configuration made here lives in `data/walrelay.conf`,
/// included at the end of `postgresql.conf`.
///
/// Dropping it stops the server with `pg_ctl stop -m immediate` and removes
/// the directory (unless `WALRELAY_KEEP_CLUSTER=1`).
///
/// All methods that run `pg_ctl` block; call them from async code only
/// where blocking for a second or two is acceptable (tests).
pub struct PgCluster {
    bin: PgBin,
    user: ServerUser,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    auth: Auth,
    state: Mutex<State>,
}

impl fmt::Debug for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgCluster")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .field("version", &self.bin.version())
            .finish_non_exhaustive()
    }
}

impl PgCluster {
    /// Creates, configures and starts a new cluster (blocking). Errors carry
    /// the tail of the server log.
    pub fn start(opts: ClusterOptions) -> anyhow::Result<PgCluster> {
        let bin = match opts.pg_bin.clone() {
            Some(bin) => bin,
            None => PgBin::discover()?,
        };
        let user = ServerUser::detect()?;
        let dir = tempfile::Builder::new()
            .prefix("walrelay-pg-")
            .tempdir()
            .context("creating the cluster directory")?
            .keep();
        // From here on, `Drop` of `cluster` cleans up after failures.
        let cluster = PgCluster {
            data: dir.join("data"),
            log: dir.join("log"),
            dir,
            bin,
            user,
            port: 0,
            auth: opts.auth.clone(),
            state: Mutex::new(State {
                settings: Vec::new(),
                hba_prepend: opts.hba_prepend.clone(),
                running: false,
            }),
        };
        cluster.init(&opts)?;
        cluster.start_fresh()
    }

    fn init(&self, opts: &ClusterOptions) -> anyhow::Result<()> {
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        }
        self.user.chown(&self.dir)?;

        let mut initdb = self.command("initdb");
        initdb
            .arg("-D")
            .arg(&self.data)
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync");
        let pwfile = self.dir.join("pwfile");
        if let Some(password) = self.auth.superuser_password() {
            write_private_file(&pwfile, format!("{password}\n").as_bytes())?;
            self.user.chown(&pwfile)?;
            initdb.arg(format!("--pwfile={}", pwfile.display()));
        }
        let result = run(initdb, "initdb");
        let _ = std::fs::remove_file(&pwfile);
        if let (Err(e), ServerUser::Switch { .. }) = (&result, self.user) {
            bail!(
                "{e:#}\n(running as root, so the server tools run as the {} user, which must be \
                 able to reach and execute {} and write {})",
                crate::user::SERVER_ACCOUNT,
                self.bin.dir().display(),
                self.dir.display()
            );
        }
        result?;

        if let Some(tls) = &opts.tls {
            let crt = self.data.join("server.crt");
            let key = self.data.join("server.key");
            tls.write(&crt, &key)?;
            self.user.chown(&crt)?;
            self.user.chown(&key)?;
        }

        let mut settings: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: &str| upsert(&mut settings, k, v);
        set("listen_addresses", HOST);
        set("port", "0"); // replaced before every start
        set("unix_socket_directories", &self.dir.to_string_lossy());
        set("wal_level", &opts.wal_level);
        set("max_replication_slots", "10");
        set("max_wal_senders", "10");
        set("max_connections", "30");
        set("shared_buffers", "32MB");
        set("fsync", if opts.fsync { "on" } else { "off" });
        set("logging_collector", "off");
        if opts.tls.is_some() {
            set("ssl", "on");
            set("ssl_cert_file", "server.crt");
            set("ssl_key_file", "server.key");
        }
        if let Auth::Password {
            method: PasswordMethod::Md5,
            ..
        } = &self.auth
        {
            set("password_encryption", "md5");
        }
        for (k, v) in &opts.extra_conf {
            set(k, v);
        }
        self.state().settings = settings;

        let conf = self.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)
            .with_context(|| format!("reading {}", conf.display()))?;
        text.push_str("\n# Added by walrelay-testkit; its settings live in walrelay.conf.\n");
        text.push_str("include 'walrelay.conf'\n");
        std::fs::write(&conf, text).with_context(|| format!("writing {}", conf.display()))?;
        self.write_conf()?;
        self.write_hba()
    }

    /// First start: pick a free port, retrying with another one when some
    /// other process grabs it first.
    fn start_fresh(mut self) -> anyhow::Result<PgCluster> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port()?;
            upsert(&mut self.state().settings, "port", &self.port.to_string());
            self.write_conf()?;
            match self.pg_ctl_start()? {
                StartOutcome::Started => {
                    self.after_first_start()?;
                    tracing::info!(
                        dir = %self.dir.display(),
                        port = self.port,
                        version = self.bin.version(),
                        "started PostgreSQL test cluster"
                    );
                    return Ok(self);
                }
                StartOutcome::PortInUse(e) => {
                    tracing::debug!(port = self.port, "port taken, retrying: {e:#}");
                    last_err = Some(e);
                }
            }
        }
        Err(last_err
            .unwrap_or_else(|| anyhow!("no start attempt made"))
            .context(format!("no free port after {PORT_ATTEMPTS} attempts")))
    }

    fn after_first_start(&self) -> anyhow::Result<()> {
        if let Auth::Password {
            method: PasswordMethod::Md5,
            superuser_password,
        } = &self.auth
        {
            // initdb stored a SCRAM verifier; store an MD5 hash instead
            // (password_encryption = md5 is set) so md5 auth is real MD5.
            self.batch_execute_blocking(&format!(
                "ALTER ROLE {SUPERUSER} PASSWORD {}",
                quote_literal(superuser_password)
            ))
            .context("re-setting the superuser password as MD5")?;
        }
        Ok(())
    }

    /// `pg_ctl start`; `Ok(PortInUse)` when the server could not bind.
    fn pg_ctl_start(&self) -> anyhow::Result<StartOutcome> {
        let log_offset = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.command("pg_ctl");
        cmd.arg("start")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", PG_CTL_WAIT_SECS]);
        let out = cmd.output().context("running pg_ctl start")?;
        if out.status.success() {
            self.state().running = true;
            return Ok(StartOutcome::Started);
        }
        let new_log = read_from(&self.log, log_offset);
        let err = anyhow!(
            "pg_ctl start failed ({}) for the cluster in {} on port {}: {}",
            out.status,
            self.dir.display(),
            self.port,
            output_text(&out)
        );
        if new_log.contains("Address already in use") || new_log.contains("could not bind") {
            // The postmaster may have died; make sure nothing is left.
            let _ = self.pg_ctl_stop("immediate");
            return Ok(StartOutcome::PortInUse(err));
        }
        Err(self.with_log(err))
    }

    fn pg_ctl_stop(&self, mode: &str) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "-t", PG_CTL_WAIT_SECS]);
        run(cmd, "pg_ctl stop")
    }

    /// A command for the server tool `tool`, run as the server user, in the
    /// cluster directory, without `PG*` variables that could redirect it.
    fn command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(self.bin.tool(tool));
        cmd.current_dir(&self.dir);
        for var in [
            "PGDATA",
            "PGPORT",
            "PGHOST",
            "PGHOSTADDR",
            "PGUSER",
            "PGDATABASE",
            "PGOPTIONS",
            "PGPASSWORD",
            "PGPASSFILE",
            "PGSERVICE",
            "PGSSLMODE",
            "PGCTLTIMEOUT",
        ] {
            cmd.env_remove(var);
        }
        self.user.apply(&mut cmd);
        cmd
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write_conf(&self) -> anyhow::Result<()> {
        let mut text = String::from("# Generated by walrelay-testkit.\n");
        for (k, v) in &self.state().settings {
            text.push_str(&format!("{k} = {}\n", quote_conf(v)));
        }
        self.write_data_file("walrelay.conf", &text)
    }

    fn write_hba(&self) -> anyhow::Result<()> {
        let method = self.auth.host_method();
        let mut text = String::from("# Generated by walrelay-testkit.\n");
        for line in &self.state().hba_prepend {
            text.push_str(line);
            text.push('\n');
        }
        text.push_str("local all all trust\n");
        text.push_str(&format!("host all all 127.0.0.1/32 {method}\n"));
        text.push_str(&format!("host replication all 127.0.0.1/32 {method}\n"));
        self.write_data_file("pg_hba.conf", &text)
    }

    fn write_data_file(&self, name: &str, text: &str) -> anyhow::Result<()> {
        let path = self.data.join(name);
        write_private_file(&path, text.as_bytes())?;
        self.user.chown(&path)
    }

    fn with_log(&self, err: anyhow::Error) -> anyhow::Error {
        anyhow!(
            "{err:#}\n--- last lines of the server log {} ---\n{}",
            self.log.display(),
            self.log_tail(40)
        )
    }

    /// The TCP port the server listens on (fixed for the cluster's life).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TCP host: `"127.0.0.1"`.
    pub fn host(&self) -> &'static str {
        HOST
    }

    /// The cluster directory (holds `data/`, `log` and the socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The Unix socket directory (the cluster directory).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The output of `postgres --version`.
    pub fn version(&self) -> &str {
        self.bin.version()
    }

    /// The server's major version, e.g. 15.
    pub fn major_version(&self) -> u32 {
        self.bin.major()
    }

    /// The binaries this cluster runs.
    pub fn pg_bin(&self) -> &PgBin {
        &self.bin
    }

    /// The authentication setup the cluster was made with.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// The superuser's password, if the cluster uses password auth.
    pub fn superuser_password(&self) -> Option<&str> {
        self.auth.superuser_password()
    }

    /// Whether the server was started and not stopped since (as far as
    /// this handle knows).
    pub fn is_running(&self) -> bool {
        self.state().running
    }

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

    /// Stops the server with `pg_ctl stop -m fast` (clean shutdown).
    pub fn stop_fast(&self) -> anyhow::Result<()> {
        self.stop("fast")
    }

    /// Stops the server with `pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, the next start runs crash recovery — a simulated crash.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        self.stop("immediate")
    }

    fn stop(&self, mode: &str) -> anyhow::Result<()> {
        let result = self.pg_ctl_stop(mode).map_err(|e| self.with_log(e));
        self.state().running = false;
        result
    }

    /// Starts the server again with the same data directory and port. A
    /// running server is stopped (`fast`) first. When another process holds
    /// the port for a moment, the start is retried for a few seconds.
    pub fn restart(&self) -> anyhow::Result<()> {
        if self.is_running() {
            if let Err(e) = self.stop_fast() {
                // Fine if the server is gone already (e.g. killed from outside).
                if self.data.join("postmaster.pid").exists() {
                    return Err(e);
                }
            }
        }
        self.start_again()
    }

    /// Starts a stopped server (same as [`PgCluster::restart`] on a stopped
    /// server; an error if it is running).
    pub fn start_stopped(&self) -> anyhow::Result<()> {
        if self.is_running() {
            bail!("the cluster in {} is already running", self.dir.display());
        }
        self.start_again()
    }

    fn start_again(&self) -> anyhow::Result<()> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.pg_ctl_start()? {
                StartOutcome::Started => return Ok(()),
                StartOutcome::PortInUse(e) if attempt >= 25 => {
                    return Err(self.with_log(e.context(format!(
                        "port {} stayed in use; cannot restart on the same port",
                        self.port
                    ))))
                }
                StartOutcome::PortInUse(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Changes settings in `walrelay.conf` (replacing earlier values of the
    /// same name) without telling the server; follow with
    /// [`PgCluster::reload`] or [`PgCluster::restart`]. `port` cannot be
    /// changed.
    pub fn set_conf(&self, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        {
            let mut state = self.state();
            for (k, v) in settings {
                if k.eq_ignore_ascii_case("port") {
                    bail!("the port of a test cluster cannot be changed");
                }
                upsert(&mut state.settings, k, v);
            }
        }
        self.write_conf()
    }

    /// [`PgCluster::set_conf`] then [`PgCluster::restart`], e.g.
    /// `set_conf_and_restart(&[("wal_level", "replica")])`.
    pub fn set_conf_and_restart(&self, settings: &[(&str, &str)]) -> anyhow::Result<()> {
        self.set_conf(settings)?;
        self.restart()
    }

    /// Replaces the lines placed before the default `pg_hba.conf` lines and
    /// rewrites the file; follow with [`PgCluster::reload`].
    pub fn set_hba_prepend(&self, lines: &[&str]) -> anyhow::Result<()> {
        self.state().hba_prepend = lines.iter().map(|l| l.to_string()).collect();
        self.write_hba()
    }

    /// `pg_ctl reload`: the server re-reads its configuration files. The
    /// signal is asynchronous; await the effect (e.g. with
    /// [`crate::await_condition`]) rather than assuming it.
    pub fn reload(&self) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("reload").arg("-D").arg(&self.data);
        run(cmd, "pg_ctl reload").map_err(|e| self.with_log(e))
    }

    /// The last `n` lines of the server log (empty if there is none yet).
    pub fn log_tail(&self, n: usize) -> String {
        let text = read_from(&self.log, 0);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.data.join("postmaster.pid").exists() {
            if let Err(e) = self.pg_ctl_stop("immediate") {
                tracing::debug!("stopping the test cluster on drop: {e:#}");
            }
        }
        let keep = std::env::var(KEEP_CLUSTER_ENV)
            .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
            .unwrap_or(false);
        if keep {
            eprintln!(
                "walrelay-testkit: keeping the PostgreSQL test cluster directory {} \
                 (port {}; {KEEP_CLUSTER_ENV} is set)",
                self.dir.display(),
                self.port
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!("removing {}: {e}", self.dir.display());
        }
    }
}

enum StartOutcome {
    Started,
    PortInUse(anyhow::Error),
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind((HOST, 0)).context("binding 127.0.0.1:0 to find a port")?;
    Ok(listener.local_addr()?.port())
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<()> {
    tracing::debug!("running {cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("running {what} ({:?})", cmd.get_program()))?;
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, output_text(&out));
    }
    Ok(())
}

fn output_text(out: &Output) -> String {
    let mut text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(stdout.trim());
    }
    text
}

/// The contents of `path` from byte `offset` on (lossy UTF-8; empty when
/// unreadable).
fn read_from(path: &Path, offset: u64) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.read_to_end(&mut buf);
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn upsert(settings: &mut Vec<(String, String)>, name: &str, value: &str) {
    match settings
        .iter_mut()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
    {
        Some(entry) => entry.1 = value.to_string(),
        None => settings.push((name.to_string(), value.to_string())),
    }
}

/// Quotes a value for postgresql.conf.
fn quote_conf(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

/// Quotes an SQL string literal (standard_conforming_strings is on).
fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// Quotes a keyword/value conninfo value when needed.
fn quote_conninfo(value: &str) -> String {
    if !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\')
    {
        return value.to_string();
    }
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn percent_encode(value: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote_conf("it's"), "'it''s'");
        assert_eq!(quote_conf(r"a\b"), r"'a\\b'");
        assert_eq!(quote_conninfo("plain"), "plain");
        assert_eq!(quote_conninfo("a b"), "'a b'");
        assert_eq!(quote_conninfo(""), "''");
        assert_eq!(quote_conninfo("o'k"), r"'o\'k'");
        assert_eq!(percent_encode("us er@x"), "us%20er%40x");
        assert_eq!(quote_literal("p'w"), "'p''w'");
    }

    #[test]
    fn upsert_replaces_case_insensitively() {
        let mut s = vec![("wal_level".to_string(), "logical".to_string())];
        upsert(&mut s, "WAL_LEVEL", "replica");
        upsert(&mut s, "port", "5");
        assert_eq!(
            s,
            vec![
                ("wal_level".to_string(), "replica".to_string()),
                ("port".to_string(), "5".to_string())
            ]
        );
    }

    #[test]
    fn password_methods_round_trip() {
        for m in [
            PasswordMethod::ScramSha256,
            PasswordMethod::Md5,
            PasswordMethod::Password,
        ] {
            assert_eq!(m.as_str().parse::<PasswordMethod>().unwrap(), m);
        }
        assert!("trust".parse::<PasswordMethod>().is_err());
    }
}
