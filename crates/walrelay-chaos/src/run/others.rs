//! The consumers besides the Rust one: the Python package's
//! (`--python`) and the Java library's (`--java`), each in a group of its
//! own, applying every record to a table of its own (no unique
//! constraint, so a double application shows), killed -9 on every
//! consumer fault and restarted, then checked like the Rust consumer
//! (lost, double-processed, order) with a row of its own in the report.

use std::path::PathBuf;

use anyhow::Result;

use super::consumer_args;
use crate::checker::Verdict;
use crate::services::{Services, Supervised};
use crate::{history, Options, JAVA_CONSUMER, JAVA_GROUP, PYTHON_CONSUMER, PYTHON_GROUP};

/// One of the other consumers.
pub(crate) struct Other {
    /// "Python" or "Java".
    pub label: &'static str,
    /// The table it applies to.
    pub table: &'static str,
    pub proc: Supervised,
}

/// The other consumers `o` asks for, not started yet.
pub(super) fn others(o: &Options, s: &Services) -> Vec<Other> {
    let mut others = Vec::new();
    if let Some(interpreter) = &o.python {
        others.push(Other {
            label: "Python",
            table: "chaos_applied_py",
            proc: Supervised::new(
                "Python consumer",
                interpreter.clone(),
                consumer_args(PYTHON_CONSUMER, s, PYTHON_GROUP),
                s.path("consumer-py.log"),
            ),
        });
    }
    if let Some(classpath) = &o.java {
        // A small heap, one GC thread and the quick compiler: it shares
        // two cores with everything else and restarts on every fault.
        let jvm = [
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            classpath,
        ];
        others.push(Other {
            label: "Java",
            table: "chaos_applied_java",
            proc: Supervised::new(
                "Java consumer",
                PathBuf::from("java"),
                jvm.iter()
                    .map(|a| a.to_string())
                    .chain(consumer_args(JAVA_CONSUMER, s, JAVA_GROUP))
                    .collect(),
                s.path("consumer-java.log"),
            ),
        });
    }
    others
}

/// Each other consumer's applications, checked like the Rust one's
/// against the same wire (which is the Rust check's alone); a failure for
/// each that lost, doubled, misordered or applied what it should not.
pub(super) async fn check(
    others: &[Other],
    dsn: &str,
    fence: bool,
    mut verdict_of: impl FnMut(&[history::Applied]) -> Verdict,
    failures: &mut Vec<String>,
) -> Result<Vec<(&'static str, Verdict)>> {
    let mut verdicts = Vec::new();
    for other in others {
        let applied = history::applied(dsn, other.table).await?;
        let mut v = verdict_of(&applied);
        v.duplicates_allowed = !fence;
        if v.lost
            + v.double_processed
            + v.rolled_back_applied
            + v.unexpected_applied
            + v.order_violations
            > 0
        {
            failures.push(format!(
                "history check of the {} consumer failed; examples:\n  {}",
                other.label,
                v.examples.join("\n  ")
            ));
        }
        verdicts.push((other.label, v));
    }
    Ok(verdicts)
}

/// The report's rows for each other consumer: its verdict, and how many
/// processes it took (one more than the kills).
pub(super) fn rows(
    others: &[Other],
    verdicts: &[(&'static str, Verdict)],
) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    for (label, v) in verdicts {
        rows.push((
            format!("{label} consumer: applications / lost / double-processed / order violations"),
            format!(
                "{} / {} / {} / {}",
                v.applications, v.lost, v.double_processed, v.order_violations
            ),
        ));
    }
    for o in others {
        rows.push((
            format!("{} consumer processes started", o.label),
            o.proc.starts.to_string(),
        ));
    }
    rows
}
