//! Running the server process: `pg_ctl` start, stop and reload, finding a
//! free port (and retrying when another process takes it), and reading the
//! server log for error messages. Everything here blocks.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

use super::options::upsert;
use super::{PgCluster, HOST};

/// How often a start is retried when another process took the chosen port.
const PORT_ATTEMPTS: usize = 8;
/// `pg_ctl -t`: seconds to wait for start/stop.
const PG_CTL_WAIT_SECS: &str = "90";

impl PgCluster {
    /// First start: pick a free port, retrying with another one when some
    /// other process grabs it first.
    pub(super) fn start_fresh(mut self) -> anyhow::Result<PgCluster> {
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

    pub(super) fn pg_ctl_stop(&self, mode: &str) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", mode, "-w", "-t", PG_CTL_WAIT_SECS]);
        run(cmd, "pg_ctl stop")
    }

    /// A command for the server tool `tool`, run as the server user, in the
    /// cluster directory, without `PG*` variables that could redirect it.
    pub(super) fn command(&self, tool: &str) -> Command {
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

    pub(super) fn with_log(&self, err: anyhow::Error) -> anyhow::Error {
        anyhow!(
            "{err:#}\n--- last lines of the server log {} ---\n{}",
            self.log.display(),
            self.log_tail(40)
        )
    }

    /// Stops the server with `pg_ctl stop -m fast` (clean shutdown).
    pub fn stop_fast(&self) -> anyhow::Result<()> {
        self.stop("fast")
    }

    /// Stops the server with `pg_ctl stop -m smart`: new connections are
    /// refused and the server waits until every client session has ended
    /// by itself (replication connections, and clients that hold one
    /// open, included).
    pub fn stop_smart(&self) -> anyhow::Result<()> {
        self.stop("smart")
    }

    /// Stops the server with `pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, the next start runs crash recovery — a simulated crash.
    pub fn stop_immediate(&self) -> anyhow::Result<()> {
        self.stop("immediate")
    }

    /// `kill -9` of the postmaster: the primary's host dying, as a
    /// failover meets it (no shutdown at all; the backends notice the
    /// postmaster's death and exit by themselves, the walsenders
    /// included). Returns once the postmaster is gone; a later start runs
    /// crash recovery.
    pub fn kill_postmaster(&self) -> anyhow::Result<()> {
        let pid_file = self.data.join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("reading {}", pid_file.display()))?;
        let pid = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
            .with_context(|| format!("no pid in {}", pid_file.display()))?;
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()?;
        anyhow::ensure!(killed.success(), "kill -9 {pid} failed: {killed}");
        self.state().running = false;
        let gone = std::path::Path::new("/proc").join(pid.to_string());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while gone.exists() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the postmaster {pid} is still there 30 s after kill -9"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
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

pub(super) fn run(mut cmd: Command, what: &str) -> anyhow::Result<()> {
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
