//! Draining a committed backlog from a slot: the `walrelay` binary as a
//! subprocess (so its CPU and RSS are its own), `pg_recvlogical`
//! streaming the same pgoutput stream to a file (the decode limit), and
//! the plain Python relay (`python_relay.py`, the reference for what a
//! relay costs per event).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::env::BenchEnv;
use crate::procstat;
use crate::runs::FenceCost;
use crate::workload::{OUTBOX_TABLE, PREFIX, PUBLICATION};

/// How often the bench looks at the slot's confirmed position, and the
/// status interval walrelay runs with in the drain (it reports its
/// confirmed position that often: the drain's end is seen at most this
/// late). Also its publication check interval: walrelay confirms nothing
/// past the last check, so the default 2 s would add up to 2 s to each
/// drain.
pub const STATUS_INTERVAL: Duration = Duration::from_millis(100);
const POLL: Duration = Duration::from_millis(20);

/// What one drain measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct DrainRun {
    pub seconds: f64,
    /// CPU seconds of the tool itself.
    pub cpu_seconds: f64,
    /// CPU seconds of the whole PostgreSQL server during the drain (the
    /// walsender, plus background processes).
    pub db_cpu_seconds: f64,
    /// Peak RSS of the tool, when measured.
    pub peak_rss_bytes: Option<u64>,
    /// walrelay's tail fence read at its first record (from its log).
    pub fence: Option<FenceCost>,
    /// CPU seconds of the broker during the drain, when measured.
    pub broker_cpu_seconds: Option<f64>,
    /// Bytes the broker stores for the drain's topic, when measured.
    pub kafka_bytes: Option<u64>,
}

/// A configuration file for `walrelay run` against the bench: the slot,
/// the bench publication, the raw route `bench` → `msg_topic`, the
/// outbox table → `outbox_topic`, and the tail fence on or off.
pub fn write_walrelay_config(
    path: &Path,
    env: &BenchEnv,
    slot: &str,
    msg_topic: &str,
    outbox_topic: &str,
    kafka_properties: &[(String, String)],
    fence: bool,
) -> Result<()> {
    let mut props = String::new();
    for (k, v) in kafka_properties {
        props.push_str(&format!("{k:?} = {v:?}\n"));
    }
    let text = format!(
        r#"[postgres]
url = "{url}"
slot = "{slot}"
publication = "{PUBLICATION}"
status_interval = "{status}ms"
publication_check_interval = "{status}ms"

[kafka]
bootstrap_servers = "{bootstrap}"

[relay]
fence = {fence}

[kafka.properties]
{props}
[[messages]]
prefix = "{PREFIX}"
topic = "{msg_topic}"

[[outbox]]
table = "{OUTBOX_TABLE}"
topic = "{outbox_topic}"
"#,
        url = env.url(),
        status = STATUS_INTERVAL.as_millis(),
        bootstrap = env.bootstrap(),
    );
    std::fs::write(path, text).with_context(|| format!("writing {path:?}"))
}

/// Runs `walrelay --config CONFIG [EXTRA...] run` until the slot's confirmed flush
/// LSN reaches `end`, samples its CPU and peak RSS, then stops it with
/// SIGTERM (it must exit 0).
#[allow(clippy::too_many_arguments)]
pub async fn walrelay(
    env: &BenchEnv,
    bin: &Path,
    extra_args: &[String],
    config: &Path,
    slot: &str,
    end: u64,
    log: &Path,
    timeout: Duration,
) -> Result<DrainRun> {
    let logf = std::fs::File::create(log)?;
    let db = env.db_cpu_window()?;
    let t0 = Instant::now();
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        // The tail fence's cost line, and warnings.
        .args(["--log", "warn,walrelay::engine::fence=info"])
        .args(extra_args)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let pid = child.id();
    let result = async {
        loop {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "walrelay exited early ({status}): {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            if env.confirmed_flush(slot).await? >= end {
                break;
            }
            if t0.elapsed() > timeout {
                bail!("walrelay did not drain the slot within {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
        let seconds = t0.elapsed().as_secs_f64();
        let db_cpu_seconds = db.finish().await?;
        let cpu_seconds = procstat::cpu_seconds(pid)?;
        let peak = procstat::peak_rss_bytes(pid)?;
        Ok(DrainRun {
            seconds,
            cpu_seconds,
            db_cpu_seconds,
            peak_rss_bytes: Some(peak),
            fence: FenceCost::from_log(&std::fs::read_to_string(log).unwrap_or_default()),
            ..Default::default()
        })
    }
    .await;
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    let status = tokio::task::spawn_blocking(move || child.wait()).await??;
    let run = result?;
    if !term.success() || !status.success() {
        bail!(
            "walrelay did not stop cleanly ({status}): {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    Ok(run)
}

/// Streams the slot with `pg_recvlogical` and pgoutput options identical
/// to walrelay's (`proto_version=1`, the bench publication,
/// `messages=true`) into `file` until `end_lsn`, where it exits by itself.
pub async fn pg_recvlogical(
    env: &BenchEnv,
    slot: &str,
    end_lsn: &str,
    file: &Path,
    timeout: Duration,
) -> Result<DrainRun> {
    let mut cmd = Command::new(env.pg_tool("pg_recvlogical"));
    cmd.args(["-h", env.cluster.host()])
        .args(["-p", &env.cluster.port().to_string()])
        .args(["-U", walrelay_testkit::SUPERUSER, "-d", "postgres"])
        .args(["--slot", slot, "--start", "--no-loop"])
        .args(["--endpos", end_lsn])
        .args(["-o", "proto_version=1"])
        .args(["-o", &format!("publication_names={PUBLICATION}")])
        .args(["-o", "messages=true"])
        .arg("-f")
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let db = env.db_cpu_window()?;
    let children0 = procstat::reaped_children_cpu_seconds()?;
    let t0 = Instant::now();
    let child = cmd.spawn().context("starting pg_recvlogical")?;
    let out = tokio::time::timeout(
        timeout,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .context("pg_recvlogical did not reach the end position in time")???;
    let seconds = t0.elapsed().as_secs_f64();
    let db_cpu_seconds = db.finish().await?;
    let cpu_seconds = procstat::reaped_children_cpu_seconds()? - children0;
    if !out.status.success() {
        bail!(
            "pg_recvlogical failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(DrainRun {
        seconds,
        cpu_seconds,
        db_cpu_seconds,
        ..Default::default()
    })
}

/// The plain Python relay's program, run with `python -c`.
const PYTHON_RELAY: &str = include_str!("python_relay.py");

/// Drains the slot with the plain Python relay (`python_relay.py`) into
/// `topic`, with walrelay's producer properties, until the slot's
/// confirmed position reaches `end`, where it exits by itself (0).
pub async fn python_relay(
    env: &BenchEnv,
    python: &Path,
    slot: &str,
    end: u64,
    topic: &str,
    log: &Path,
    timeout: Duration,
) -> Result<DrainRun> {
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(PYTHON_RELAY)
        .args(["--dsn", &env.url()])
        .args(["--slot", slot, "--publication", PUBLICATION])
        .args(["--bootstrap", &env.bootstrap(), "--topic", topic])
        .args(["--prefix", PREFIX, "--outbox", OUTBOX_TABLE])
        .args(["--end-lsn", &end.to_string()]);
    let props = crate::kafka::walrelay_producer_properties(&env.bootstrap())?;
    for (k, v) in props
        .iter()
        .filter(|(k, _)| k.as_str() != "bootstrap.servers")
    {
        cmd.arg("--property").arg(format!("{k}={v}"));
    }
    let logf = std::fs::File::create(log)?;
    cmd.stdin(Stdio::null())
        .stdout(logf.try_clone()?)
        .stderr(logf);
    let db = env.db_cpu_window()?;
    let children0 = procstat::reaped_children_cpu_seconds()?;
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("starting the Python relay")?;
    let status = tokio::time::timeout(timeout, tokio::task::spawn_blocking(move || child.wait()))
        .await
        .context("the Python relay did not drain the slot in time")???;
    let seconds = t0.elapsed().as_secs_f64();
    let db_cpu_seconds = db.finish().await?;
    let cpu_seconds = procstat::reaped_children_cpu_seconds()? - children0;
    if !status.success() || !slot_confirmed(env, slot, end).await? {
        bail!(
            "the Python relay failed ({status}): {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    Ok(DrainRun {
        seconds,
        cpu_seconds,
        db_cpu_seconds,
        ..Default::default()
    })
}

/// Whether the slot's confirmed position reaches `end` within a few
/// seconds. The Python relay exits right after sending its last status
/// update; the walsender applies it when it next reads the socket, which
/// on a busy machine can be after the relay's exit.
async fn slot_confirmed(env: &BenchEnv, slot: &str, end: u64) -> Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if env.confirmed_flush(slot).await? >= end {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A scratch file path under `dir` that is removed when dropped.
pub struct ScratchFile(pub PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_cost_comes_from_the_relays_log_line() {
        let log = "2026-11-25T02:00:00.000000Z  INFO session{slot=wr_a_0}: walrelay::engine::fence::session: read the partition tails of the topic topic=bench.a.wr0 partitions=4 records_read=12 elapsed_ms=37 fenced=true\n";
        assert_eq!(
            FenceCost::from_log(log),
            Some(FenceCost {
                elapsed_ms: 37,
                records_read: 12
            })
        );
        assert_eq!(FenceCost::from_log("nothing here"), None);
    }
}
