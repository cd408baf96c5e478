//! Creating topics on a running broker: the admin API, `tansu topic create`
//! as the fallback, and waiting until metadata shows the topic.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use super::TansuBroker;
use crate::broker::util::block_on;
use crate::cluster::HOST;
use crate::kafka::client_config;

/// How long [`TansuBroker::create_topic`] waits for the topic to show up.
const TOPIC_TIMEOUT: Duration = Duration::from_secs(10);

impl TansuBroker {
    /// Creates a topic with `partitions` partitions (replication factor 1)
    /// through the Kafka admin API, falling back to `tansu topic create` if
    /// the admin API fails, and waits (at most ~10 s) until metadata shows
    /// it with that many partitions. Blocking. An existing topic with the
    /// same partition count is fine; one with another count is an error
    /// (Tansu cannot add partitions).
    pub fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        if partitions < 1 {
            bail!("topic {name:?}: partitions must be at least 1, not {partitions}");
        }
        let expected = usize::try_from(partitions)?;
        if let Err(admin_error) = self.create_topic_admin(name, partitions) {
            match self.topic_partitions(name) {
                // It is there after all (e.g. the request timed out late).
                Ok(n) if n == expected => {}
                Ok(n) => {
                    return Err(admin_error.context(format!(
                        "topic {name:?} exists with {n} partitions, not {partitions}"
                    )))
                }
                Err(_) => {
                    tracing::debug!("creating topic {name:?} with the admin API: {admin_error:#}");
                    self.create_topic_cli(name, partitions)
                        .with_context(|| format!("the admin API failed too: {admin_error:#}"))?;
                }
            }
        }
        let deadline = Instant::now() + TOPIC_TIMEOUT;
        loop {
            let seen = self.topic_partitions(name);
            match &seen {
                Ok(n) if *n == expected => return Ok(()),
                Ok(n) if *n > 0 && *n != expected => {
                    bail!("topic {name:?} has {n} partitions, not {partitions}")
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                let state = match seen {
                    Ok(n) => format!("{n} partitions"),
                    Err(e) => format!("{e:#}"),
                };
                bail!(
                    "topic {name:?} did not show up with {partitions} partitions within \
                     {TOPIC_TIMEOUT:?} (last seen: {state})"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn create_topic_admin(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.bootstrap_servers())
            .create()
            .context("creating an admin client")?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let opts = AdminOptions::new()
            .request_timeout(Some(Duration::from_secs(5)))
            .operation_timeout(Some(Duration::from_secs(5)));
        let results = block_on(admin.create_topics([&topic], &opts))
            .with_context(|| format!("creating topic {name:?}"))?;
        for result in results {
            match result {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                    let n = self.topic_partitions(name)?;
                    if n != usize::try_from(partitions)? {
                        bail!("topic {name:?} already exists with {n} partitions");
                    }
                }
                Err((topic, code)) => bail!("creating topic {topic:?}: {code}"),
            }
        }
        Ok(())
    }

    fn create_topic_cli(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        let out = Command::new(&self.bin)
            .args(["topic", "create", "--broker"])
            .arg(format!("tcp://{HOST}:{}", self.port))
            .arg("--partitions")
            .arg(partitions.to_string())
            .arg(name)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .context("running tansu topic create")?;
        if !out.status.success() {
            bail!(
                "tansu topic create {name} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The partition count of `name` per cluster-wide metadata (a request
    /// for all topics, so it never auto-creates the topic).
    fn topic_partitions(&self, name: &str) -> anyhow::Result<usize> {
        crate::kafka::partition_count(&self.bootstrap_servers(), name)
    }
}
