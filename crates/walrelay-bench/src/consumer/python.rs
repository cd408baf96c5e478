//! The Python consumers of the bench: the package's own
//! (`python/`, `walrelay_consumer.ConsumerLoop`, `python_consumer.py`) and
//! the Python reference peers (`python_reference.py`: a careful inbox and
//! the apply limit on plain confluent-kafka and psycopg), each a child
//! process from the pinned virtualenv that applies the topic into
//! `applied_events` and reports its progress on stdout.
//!
//! Its CPU is the child's own (`/proc/PID/stat`: the interpreter,
//! librdkafka's threads), from its start (interpreter start-up and group
//! join included, like the other consumers' join) to the last record.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::watch;

use super::Applied;

/// The children's programs, run with `python -c`.
const PACKAGE: &str = include_str!("python_consumer.py");
const REFERENCE: &str = include_str!("python_reference.py");

/// Which Python consumer, and how it applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The package's loop with its batch handler.
    PackageBatch,
    /// The package's loop with its per-record handler.
    PackageRecord,
    /// The careful inbox on a plain loop.
    InboxCareful,
    /// The apply limit on a plain loop.
    ApplyLimit,
}

impl Mode {
    fn script_and_arg(self) -> (&'static str, &'static str) {
        match self {
            Mode::PackageBatch => (PACKAGE, "batch"),
            Mode::PackageRecord => (PACKAGE, "record"),
            Mode::InboxCareful => (REFERENCE, "careful"),
            Mode::ApplyLimit => (REFERENCE, "limit"),
        }
    }
}

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The pinned virtualenv's interpreter, with the working tree's package
/// installed: runs scripts/install-python-venv.sh (quick when the venv is
/// current; it reinstalls only the package).
pub(crate) async fn venv_python() -> Result<PathBuf> {
    let script = Path::new(WORKSPACE).join("scripts/install-python-venv.sh");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "the Python consumer rows (py_batch, py_record) need the pinned virtualenv, and \
             scripts/install-python-venv.sh failed ({}): {}\nRun it by hand to see why, or leave \
             the Python rows out with --consumers",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let python = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    if !python.is_file() {
        bail!(
            "scripts/install-python-venv.sh printed {:?}, which is not a file",
            python.display()
        );
    }
    Ok(python)
}

/// What the child says on stdout.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    First,
    Processed(u64),
    Stopped(u64),
}

fn parse(line: &str) -> Option<Line> {
    match line.split_once(' ') {
        None if line == "first" => Some(Line::First),
        Some(("processed", n)) => n.parse().ok().map(Line::Processed),
        Some(("stopped", n)) => n.parse().ok().map(Line::Stopped),
        _ => None,
    }
}

pub(crate) struct Target<'a> {
    pub python: &'a Path,
    pub bootstrap: String,
    pub topic: &'a str,
    pub dsn: &'a str,
    pub group: &'a str,
    pub mode: Mode,
}

/// Starts the child; the task follows its progress into `applied` and, once
/// `stop` is set, stops it with SIGTERM and checks that it stopped cleanly.
pub(crate) fn start(
    target: Target<'_>,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let (script, mode) = target.mode.script_and_arg();
    let mut cmd = Command::new(target.python);
    cmd.arg("-c").arg(script).args([
        target.bootstrap.as_str(),
        target.topic,
        target.dsn,
        target.group,
        mode,
    ]);
    follow(cmd, "the Python consumer", applied, stop)
}

/// Starts a child consumer (`cmd`) that speaks the protocol above on its
/// stdout; the task follows its progress into `applied` and, once `stop` is
/// set, stops it with SIGTERM and checks that it stopped cleanly.
pub(crate) fn follow(
    mut cmd: Command,
    name: &'static str,
    applied: Applied,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let pid = child
        .id()
        .with_context(|| format!("{name} exited at once"))?;
    let _ = applied.pid.set(pid);
    let stdout = child.stdout.take().context("no stdout of the child")?;
    Ok(tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        let mut stopping = false;
        loop {
            tokio::select! {
                changed = stop.changed(), if !stopping => {
                    if changed.is_err() || *stop.borrow() {
                        stopping = true;
                        terminate(pid).await?;
                    }
                }
                line = lines.next_line() => {
                    let Some(line) = line? else { break };
                    match parse(&line) {
                        Some(Line::First) => applied.observe(),
                        Some(Line::Processed(n)) | Some(Line::Stopped(n)) => {
                            applied.count.store(n, Ordering::Relaxed);
                        }
                        None => tracing::info!("{name}: {line}"),
                    }
                }
            }
        }
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .with_context(|| format!("{name} did not exit within 60 s of closing its stdout"))??;
        if !stopping || !status.success() {
            bail!("{name} ended with {status} (stopped by the bench: {stopping})");
        }
        Ok(())
    }))
}

async fn terminate(pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await?;
    if !status.success() {
        bail!("kill -TERM {pid} failed: {status}");
    }
    Ok(())
}

/// Keeps `Applied` cheap to clone for every consumer.
pub(crate) type Pid = Arc<std::sync::OnceLock<u32>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_lines_parse() {
        assert_eq!(parse("first"), Some(Line::First));
        assert_eq!(parse("processed 42"), Some(Line::Processed(42)));
        assert_eq!(parse("stopped 7"), Some(Line::Stopped(7)));
        assert_eq!(parse("processed x"), None);
        assert_eq!(parse("INFO something"), None);
    }
}
