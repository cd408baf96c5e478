//! The Java consumers of the bench: the JVM library's batch handler
//! (`java/walrelay-consumer`'s `ConsumerLoop`) and the Java reference
//! peers (the apply limit and the careful inbox on plain kafka-clients and
//! JDBC), all in `java/bench`'s `io.walrelay.bench.BenchConsumer`, each a
//! child process (`java -cp ...`) that applies the topic into
//! `applied_events` and reports its progress on stdout as the Python
//! children do ([`super::python::follow`]). Its CPU is the JVM's own (JIT
//! and GC threads included), from its start.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};
use tokio::process::Command;
use tokio::sync::watch;

use super::Applied;

const WORKSPACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Which Java consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The library's loop with its batch handler.
    Batch,
    /// The careful inbox on a plain loop.
    InboxCareful,
    /// The apply limit on a plain loop.
    ApplyLimit,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Batch => "batch",
            Mode::InboxCareful => "careful",
            Mode::ApplyLimit => "limit",
        }
    }
}

/// Builds `java/bench` (and the library) with Maven and returns its
/// classpath; `Err` says why the Java rows cannot run (no JDK, no Maven, a
/// failed build), for the report's notes.
pub(crate) async fn classpath() -> Result<String, String> {
    let java = Path::new(WORKSPACE).join("java");
    for tool in ["java", "javac", "mvn"] {
        let ok = Command::new(tool)
            .arg("-version")
            .stdin(Stdio::null())
            .output()
            .await
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Err(format!(
                "no `{tool}` on PATH (a JDK 17 and Maven; see docs/consumer.md, In Java)"
            ));
        }
    }
    let repo = Path::new(WORKSPACE).join("target/tools/m2");
    let out = Command::new("mvn")
        .current_dir(&java)
        .args([
            "-q",
            "-B",
            "-T",
            "1",
            "-pl",
            "bench",
            "-am",
            "-DskipTests",
            "package",
        ])
        .arg(format!("-Dmaven.repo.local={}", repo.display()))
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("running mvn: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mvn package of java/bench failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    let target = java.join("bench/target");
    let jars = std::fs::read_to_string(target.join("classpath.txt"))
        .map_err(|e| format!("java/bench/target/classpath.txt: {e}"))?;
    Ok(format!(
        "{}:{}",
        target.join("classes").display(),
        jars.trim()
    ))
}

pub(crate) struct Target<'a> {
    pub classpath: &'a str,
    pub bootstrap: String,
    pub topic: &'a str,
    /// The run's database, as a JDBC URL.
    pub jdbc_url: String,
    pub group: &'a str,
    pub mode: Mode,
    /// How many loops the plain references run (one per partition); the
    /// library decides its own parallelism.
    pub loops: i32,
}

/// The JDBC URL of a `postgres://user@host:port/db?...` DSN.
pub(crate) fn jdbc_url(dsn: &str) -> Result<String> {
    let rest = dsn
        .strip_prefix("postgres://")
        .or_else(|| dsn.strip_prefix("postgresql://"))
        .context("the bench's DSN is a postgres:// URL")?;
    let (user, rest) = rest.split_once('@').context("a user in the DSN")?;
    let (hostdb, _) = rest.split_once('?').unwrap_or((rest, ""));
    Ok(format!(
        "jdbc:postgresql://{hostdb}?user={user}&sslmode=disable"
    ))
}

/// Starts the child; see [`super::python::follow`].
pub(crate) fn start(
    target: Target<'_>,
    applied: Applied,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Result<()>>> {
    let mut cmd = Command::new("java");
    cmd.args(["-cp", target.classpath, "io.walrelay.bench.BenchConsumer"])
        .args([
            target.bootstrap.as_str(),
            target.topic,
            &target.jdbc_url,
            target.group,
            target.mode.arg(),
            &target.loops.max(1).to_string(),
        ]);
    super::python::follow(cmd, "the Java consumer", applied, stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_becomes_a_jdbc_url() {
        assert_eq!(
            jdbc_url("postgres://postgres@127.0.0.1:5433/cons_java_batch_1?sslmode=disable")
                .unwrap(),
            "jdbc:postgresql://127.0.0.1:5433/cons_java_batch_1?user=postgres&sslmode=disable"
        );
    }
}
