//! walrelay's start and restart, timed as Debezium's are, for the start
//! table: the `walrelay` binary on a slot of its own made before one
//! committed event, from its spawn until that event's record is in Kafka;
//! then SIGTERM, one more event committed while it is down, and a spawn
//! on the same slot until that one is there.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::drain::{await_event, commit_one};
use super::drop_slot_when_free;
use super::readback::{Tally, Writer};
use super::watch::{current_end_offsets, TopicWatch};
use crate::env::BenchEnv;
use crate::runs::{RestartRun, Tool};
use crate::workload::Workload;

/// The walrelay binary the bench drains with, and where its files go.
#[derive(Debug, Clone)]
pub struct WalrelayStart {
    pub bin: PathBuf,
    pub scratch: PathBuf,
}

/// A slot made, a topic and a configuration written: ready for the
/// event that the start will wait for.
pub struct Prepared {
    bin: PathBuf,
    slot: String,
    topic: String,
    config: PathBuf,
    log: PathBuf,
}

impl WalrelayStart {
    /// Makes the slot (before the event is committed) and the topic.
    pub async fn prepare(&self, env: &BenchEnv, w: &Workload) -> Result<Prepared> {
        let slot = format!("ws_{}", w.id.replace('-', "_"));
        env.create_slot(&slot).await?;
        let topic = format!("bench.{}.ws", w.id);
        env.create_topic(&topic)?;
        let config = self.scratch.join(format!("walrelay-start-{}.toml", w.id));
        crate::drain::write_walrelay_config(&config, env, &slot, &topic, &topic, &[], true)?;
        Ok(Prepared {
            bin: self.bin.clone(),
            slot,
            topic,
            config,
            log: self.scratch.join(format!("walrelay-start-{}.log", w.id)),
        })
    }
}

impl Prepared {
    /// Times the start until event `seq` (committed since [`prepare`])
    /// is in Kafka, and the restart until `seq + 1` (committed while
    /// walrelay is down) is; drops the slot.
    ///
    /// [`prepare`]: WalrelayStart::prepare
    pub async fn measure(self, env: &BenchEnv, w: &Workload, seq: u64) -> Result<RestartRun> {
        let (_, start_s, clean1) = self.run_until(env, w, seq).await?;
        commit_one(env, w, seq + 1).await?;
        let (tally, restart_s, clean2) = self.run_until(env, w, seq + 1).await?;
        drop_slot_when_free(env, &self.slot).await?;
        Ok(RestartRun {
            tool: Tool::Walrelay,
            workload: w.id.clone(),
            stopped_cleanly: clean1 && clean2,
            running_s: None,
            streaming_s: None,
            first_new_record_s: restart_s,
            replayed_records: tally.records - tally.distinct,
            start_first_record_s: Some(start_s),
        })
    }

    /// Spawns walrelay, waits for event `seq` in the topic, stops it with
    /// SIGTERM: the tally of what it wrote, seconds from the spawn to the
    /// event, whether it exited 0.
    async fn run_until(
        &self,
        env: &BenchEnv,
        w: &Workload,
        seq: u64,
    ) -> Result<(Tally, f64, bool)> {
        let bootstrap = env.bootstrap();
        let base = {
            let (b, t) = (bootstrap.clone(), self.topic.clone());
            tokio::task::spawn_blocking(move || current_end_offsets(&b, &t)).await??
        };
        let watch = TopicWatch::start(&bootstrap, &self.topic, base.clone())?;
        let t0 = Instant::now();
        let mut child = spawn_walrelay(&self.bin, &self.config, &self.log)?;
        let log = &self.log;
        let result = await_event(
            &bootstrap,
            &self.topic,
            &base,
            &watch,
            Writer::Walrelay,
            w.kind,
            seq,
            || match child.try_wait()? {
                Some(status) => bail!(
                    "walrelay exited early ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                ),
                None => Ok(()),
            },
        )
        .await;
        drop(watch);
        let term = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let status = tokio::task::spawn_blocking(move || child.wait()).await??;
        let (tally, at) = result?;
        Ok((
            tally,
            at.saturating_duration_since(t0).as_secs_f64(),
            term.success() && status.success(),
        ))
    }
}

/// `walrelay --config CONFIG --log warn run`, its output appended to
/// `log`: the relay as a user runs it, for the start, restart and crash
/// runs.
pub(crate) fn spawn_walrelay(bin: &Path, config: &Path, log: &Path) -> Result<Child> {
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(["--log", "warn"])
        .arg("run")
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))
}
