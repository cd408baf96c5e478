//! One Apache Kafka node shared by the tests of a test binary, leased to
//! one test at a time.
//!
//! A JVM start costs seconds, a test often less. [`SharedKafka::lease`]
//! hands out an idle node of this process, or starts one when all are
//! leased (tests on two threads: two nodes). Tests use fixed topic names,
//! so a lease is exclusive: when it ends, every topic the test made is
//! deleted and the node goes back to the pool. A node whose cleanup failed
//! is killed instead. Nodes still pooled when the process ends are killed
//! by their watchdogs ([`super::node`]).

use std::ops::Deref;
use std::sync::Mutex;

use anyhow::Context;

use super::{KafkaCluster, KafkaOptions};
use crate::broker::admin;

static IDLE: Mutex<Vec<KafkaCluster>> = Mutex::new(Vec::new());

/// How many log lines a lease prints when it ends (test output is shown
/// only for failing tests).
const LOG_LINES: usize = 40;

/// An exclusive lease of a single-node Apache Kafka cluster; derefs to it.
#[derive(Debug)]
pub struct SharedKafka {
    cluster: Option<KafkaCluster>,
    /// Where each node's log stood when the lease began.
    log_starts: Vec<u64>,
}

impl SharedKafka {
    /// An idle pooled node, or a new one. Blocking.
    pub fn lease() -> anyhow::Result<SharedKafka> {
        let pooled = {
            let mut idle = IDLE.lock().unwrap_or_else(|e| e.into_inner());
            // A node that died while idle is dropped (and cleaned up).
            std::iter::from_fn(|| idle.pop()).find_map(|mut c| c.all_running().then_some(c))
        };
        let cluster = match pooled {
            Some(cluster) => cluster,
            None => KafkaCluster::start(KafkaOptions::default())?,
        };
        let log_starts = cluster
            .nodes()
            .iter()
            .map(|n| std::fs::metadata(n.log_path()).map_or(0, |m| m.len()))
            .collect();
        Ok(SharedKafka {
            cluster: Some(cluster),
            log_starts,
        })
    }

    fn cluster(&self) -> &KafkaCluster {
        self.cluster.as_ref().expect("leased until dropped")
    }

    /// What the nodes logged during this lease, its INFO and DEBUG lines
    /// left out (a node logs hundreds for each topic it makes or deletes):
    /// the last `n` other lines of each.
    pub fn lease_log_tail(&self, n: usize) -> String {
        let cluster = self.cluster();
        cluster
            .nodes()
            .iter()
            .zip(&self.log_starts)
            .map(|(node, &start)| {
                let bytes = std::fs::read(node.log_path()).unwrap_or_default();
                let from = usize::try_from(start).unwrap_or(0).min(bytes.len());
                format!(
                    "--- Kafka node {} at {} ({}, during this test) ---\n{}",
                    node.id(),
                    cluster.bootstrap_servers(),
                    node.log_path().display(),
                    crate::broker::util::last_lines(
                        &without_info(&String::from_utf8_lossy(&bytes[from..])),
                        n
                    )
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Deletes every topic but the internal ones.
    fn clean(&self) -> anyhow::Result<()> {
        let bootstrap = self.cluster().bootstrap_servers();
        let topics = admin::user_topics(&bootstrap)?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        admin::delete_topics(&bootstrap, &names).context("deleting the test's topics")
    }
}

impl Deref for SharedKafka {
    type Target = KafkaCluster;

    fn deref(&self) -> &KafkaCluster {
        self.cluster()
    }
}

impl Drop for SharedKafka {
    fn drop(&mut self) {
        // Captured by the test harness: shown only when the test fails.
        eprintln!("{}", self.lease_log_tail(LOG_LINES));
        let reusable = !std::thread::panicking()
            && match self.clean() {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("walrelay-testkit: not reusing the Kafka node: {e:#}");
                    false
                }
            };
        if let Some(cluster) = self.cluster.take() {
            if reusable {
                IDLE.lock().unwrap_or_else(|e| e.into_inner()).push(cluster);
            }
        }
    }
}

/// `text` without the lines of INFO and DEBUG entries (log4j's
/// `[time] LEVEL message` layout; a WARN or ERROR entry's stack trace
/// lines are kept).
fn without_info(text: &str) -> String {
    let mut keep = true;
    let mut out = String::new();
    for line in text.lines() {
        if line.starts_with('[') {
            keep = !(line.contains("] INFO ")
                || line.contains("] DEBUG ")
                || line.contains("] TRACE "));
        }
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::without_info;

    #[test]
    fn info_entries_are_left_out_with_their_continuation_lines() {
        let log = "[2026-11-26 17:17:59,791] INFO [GroupCoordinator id=1] loaded (x)\n\
                   [2026-11-26 17:18:00,001] WARN [Producer] slow (y)\n\
                   java.lang.Exception: why\n\
                   \tat a.b(C.java:1)\n\
                   [2026-11-26 17:18:00,002] DEBUG detail\n\
                   more detail\n\
                   [2026-11-26 17:18:00,003] ERROR [Log] failed (z)\n";
        assert_eq!(
            without_info(log),
            "[2026-11-26 17:18:00,001] WARN [Producer] slow (y)\n\
             java.lang.Exception: why\n\
             \tat a.b(C.java:1)\n\
             [2026-11-26 17:18:00,003] ERROR [Log] failed (z)\n"
        );
    }
}
