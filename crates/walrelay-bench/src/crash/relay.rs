//! The relays a crash run kills: the `walrelay` binary (a child process
//! on a slot of its own) and Debezium's Kafka Connect worker (the test
//! kit's [`DebeziumWorker`]), behind one handle with the same (re)start,
//! `kill -9` and stop, and their cost summed over every process.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tokio_postgres::Client;
use walrelay_testkit::DebeziumWorker;

use crate::debezium::spawn_walrelay;
use crate::procstat;

/// How long a walrelay start may take to hold its slot.
const WALRELAY_START_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(50);

/// The `walrelay` binary run as a child process on `slot`.
pub struct WalrelayProcess {
    pub bin: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    pub slot: String,
    child: Option<Child>,
    walsender: Option<i32>,
}

impl WalrelayProcess {
    pub fn new(bin: PathBuf, config: PathBuf, log: PathBuf, slot: String) -> WalrelayProcess {
        WalrelayProcess {
            bin,
            config,
            log,
            slot,
            child: None,
            walsender: None,
        }
    }

    /// Spawns it and waits until a new walsender holds its slot.
    async fn start(&mut self, db: &Client) -> Result<()> {
        if self.child.is_some() {
            bail!("walrelay is still running");
        }
        let child = spawn_walrelay(&self.bin, &self.config, &self.log)?;
        self.child = Some(child);
        let deadline = Instant::now() + WALRELAY_START_TIMEOUT;
        loop {
            if let Some(status) = self.exited()? {
                bail!(
                    "walrelay exited ({status}) before it streamed; its log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                );
            }
            let pid: Option<i32> = db
                .query_opt(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                    &[&self.slot],
                )
                .await?
                .and_then(|r| r.get(0));
            if pid.is_some() && pid != self.walsender {
                self.walsender = pid;
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "walrelay did not hold slot {} within {WALRELAY_START_TIMEOUT:?}; its log:\n{}",
                    self.slot,
                    self.log_tail()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(c) => Ok(c.try_wait()?),
            None => Ok(None),
        }
    }

    fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?; // SIGKILL
            c.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then waits up to 30 s (then SIGKILL): whether it exited 0.
    fn stop(&mut self) -> Result<bool> {
        let Some(mut c) = self.child.take() else {
            return Ok(true);
        };
        Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.try_wait()? {
                return Ok(status.success());
            }
            if Instant::now() >= deadline {
                c.kill()?;
                c.wait()?;
                return Ok(false);
            }
            std::thread::sleep(POLL);
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// A relay under test.
pub enum Relay {
    Walrelay(WalrelayProcess),
    /// Started by [`DebeziumWorker::start`] (the first start) before it
    /// becomes a `Relay`.
    Debezium(Box<DebeziumWorker>),
}

/// What the relay's processes used, summed over every (re)start.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Cost {
    /// CPU seconds of every process of the relay (read just before each
    /// kill and the final stop).
    pub cpu_seconds: f64,
    /// The largest peak RSS of one process, bytes.
    pub peak_rss_bytes: u64,
}

impl Relay {
    /// Starts it again after a kill and waits until it streams (its
    /// walsender holds the slot): the seconds that took.
    pub async fn restart(&mut self, db: &Client) -> Result<f64> {
        let t0 = Instant::now();
        match self {
            Relay::Walrelay(w) => w.start(db).await?,
            Relay::Debezium(d) => {
                d.restart().await?;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    pub fn pid(&self) -> Option<u32> {
        match self {
            Relay::Walrelay(w) => w.child.as_ref().map(Child::id),
            Relay::Debezium(d) => d.pid(),
        }
    }

    /// Adds the running process's CPU and peak RSS to `cost`.
    pub fn sample(&self, cost: &mut Cost) {
        if let Some(pid) = self.pid() {
            cost.cpu_seconds += procstat::cpu_seconds(pid).unwrap_or(0.0);
            let rss = procstat::peak_rss_bytes(pid).unwrap_or(0);
            cost.peak_rss_bytes = cost.peak_rss_bytes.max(rss);
        }
    }

    /// `kill -9`, after adding its cost so far to `cost`.
    pub fn kill(&mut self, cost: &mut Cost) -> Result<()> {
        self.sample(cost);
        match self {
            Relay::Walrelay(w) => w.kill(),
            Relay::Debezium(d) => d.kill(),
        }
    }

    /// A clean stop (SIGTERM) after adding its cost: whether it exited by
    /// itself.
    pub fn stop(&mut self, cost: &mut Cost) -> Result<bool> {
        self.sample(cost);
        match self {
            Relay::Walrelay(w) => w.stop(),
            Relay::Debezium(d) => d.stop(),
        }
    }

    /// Fails when the relay exited by itself (it should only die when
    /// killed).
    pub fn check_alive(&mut self) -> Result<()> {
        let exited = match self {
            Relay::Walrelay(w) => w.exited()?,
            Relay::Debezium(d) => d.exited()?,
        };
        if let Some(status) = exited {
            bail!(
                "the relay exited by itself ({status}):\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        match self {
            Relay::Walrelay(w) => w.log_tail(),
            Relay::Debezium(d) => d.log_tail(30),
        }
    }
}
