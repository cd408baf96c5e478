//! Topic administration through the Kafka admin API, for brokers that
//! implement it (Apache Kafka): create, add partitions, delete, and wait
//! until metadata shows the result. Blocking.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use super::util::block_on;
use crate::kafka::client_config;

/// How long an operation waits for metadata to show its result.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

fn admin(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    client_config(bootstrap)
        .create()
        .context("creating an admin client")
}

fn options() -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(Duration::from_secs(10)))
        .operation_timeout(Some(Duration::from_secs(10)))
}

/// Creates `name` with `partitions` partitions and the given replication
/// factor, then waits until metadata shows them all with a leader. An
/// existing topic with that many partitions is fine.
pub(crate) fn create_topic(
    bootstrap: &str,
    name: &str,
    partitions: i32,
    replication: i32,
) -> anyhow::Result<()> {
    create_topic_with(bootstrap, name, partitions, replication, &[])
}

/// [`create_topic`] with topic configurations (`min.insync.replicas`...).
pub(crate) fn create_topic_with(
    bootstrap: &str,
    name: &str,
    partitions: i32,
    replication: i32,
    configs: &[(&str, &str)],
) -> anyhow::Result<()> {
    if partitions < 1 {
        bail!("topic {name:?}: partitions must be at least 1, not {partitions}");
    }
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
    for (key, value) in configs {
        topic = topic.set(key, value);
    }
    let client = admin(bootstrap)?;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        match create_once(&client, &topic) {
            Ok(()) => return await_partitions(bootstrap, name, partitions),
            // A loaded machine: a cluster that just started may time the
            // request out or not have every broker registered yet.
            Err(Attempt::Transient(e)) if Instant::now() < deadline => {
                tracing::debug!("creating topic {name:?}, retrying: {e:#}");
                std::thread::sleep(POLL * 4);
            }
            Err(Attempt::Transient(e) | Attempt::Final(e)) => {
                return Err(e.context(format!("creating topic {name:?} on {bootstrap}")))
            }
        }
    }
}

/// How one creation attempt failed: worth retrying or not.
enum Attempt {
    Transient(anyhow::Error),
    Final(anyhow::Error),
}

fn create_once(
    client: &AdminClient<DefaultClientContext>,
    topic: &NewTopic<'_>,
) -> Result<(), Attempt> {
    let results = block_on(client.create_topics([topic], &options()))
        .map_err(|e| Attempt::Transient(e.into()))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((
                name,
                code @ (RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::InvalidReplicationFactor
                | RDKafkaErrorCode::NotController
                | RDKafkaErrorCode::BrokerNotAvailable),
            )) => return Err(Attempt::Transient(anyhow::anyhow!("{name:?}: {code}"))),
            Err((name, code)) => return Err(Attempt::Final(anyhow::anyhow!("{name:?}: {code}"))),
        }
    }
    Ok(())
}

/// Deletes every record of `name` up to each partition's end (the
/// DeleteRecords API, what `retention.ms` does to a quiet topic), then
/// checks each partition's low watermark reached its end.
pub(crate) fn delete_records_to_end(bootstrap: &str, name: &str) -> anyhow::Result<()> {
    let reader: BaseConsumer = client_config(bootstrap)
        .create()
        .context("creating a reader")?;
    let metadata = reader
        .fetch_metadata(Some(name), Duration::from_secs(10))
        .with_context(|| format!("reading the metadata of {name:?}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut offsets = rdkafka::TopicPartitionList::new();
    for p in &partitions {
        offsets.add_partition_offset(name, *p, rdkafka::Offset::End)?;
    }
    let result = block_on(admin(bootstrap)?.delete_records(&offsets, &options()))
        .with_context(|| format!("deleting the records of {name:?}"))?;
    for e in result.elements() {
        if let Err(err) = e.error() {
            bail!(
                "deleting the records of {name:?} partition {}: {err}",
                e.partition()
            );
        }
    }
    for p in partitions {
        let (low, high) = reader.fetch_watermarks(name, p, Duration::from_secs(10))?;
        if low != high {
            bail!("{name:?} partition {p} still holds offsets {low}..{high}");
        }
    }
    Ok(())
}

/// Raises `name`'s partition count to `total`; waits until metadata shows
/// them all with a leader.
pub(crate) fn add_partitions(bootstrap: &str, name: &str, total: i32) -> anyhow::Result<()> {
    let total_usize = usize::try_from(total)?;
    let new = NewPartitions::new(name, total_usize);
    let results = block_on(admin(bootstrap)?.create_partitions([&new], &options()))
        .with_context(|| format!("adding partitions to {name:?}"))?;
    for result in results {
        if let Err((topic, code)) = result {
            bail!("adding partitions to {topic:?} (to {total}): {code}");
        }
    }
    await_partitions(bootstrap, name, total)
}

/// Deletes the given topics and waits until metadata no longer lists them.
pub(crate) fn delete_topics(bootstrap: &str, names: &[&str]) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let results = block_on(admin(bootstrap)?.delete_topics(names, &options()))
        .with_context(|| format!("deleting topics {names:?}"))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => bail!("deleting topic {topic:?}: {code}"),
        }
    }
    let wanted: BTreeSet<&str> = names.iter().copied().collect();
    settle(bootstrap, "deleted topics to disappear", |client| {
        let md = client.fetch_metadata(None, Duration::from_secs(5))?;
        Ok(!md.topics().iter().any(|t| wanted.contains(t.name())))
    })
}

/// The names of every topic but the broker's internal ones (`__...`).
pub(crate) fn user_topics(bootstrap: &str) -> anyhow::Result<Vec<String>> {
    let client: BaseConsumer = client_config(bootstrap).create()?;
    let md = client
        .fetch_metadata(None, Duration::from_secs(5))
        .with_context(|| format!("fetching metadata from {bootstrap}"))?;
    Ok(md
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|n| !n.starts_with("__"))
        .collect())
}

/// Waits until metadata shows `name` with exactly `partitions` partitions,
/// each with a leader.
fn await_partitions(bootstrap: &str, name: &str, partitions: i32) -> anyhow::Result<()> {
    let expected = usize::try_from(partitions)?;
    settle(
        bootstrap,
        &format!("{name:?} to show {partitions} partitions with leaders"),
        |client| {
            let md = client.fetch_metadata(Some(name), Duration::from_secs(5))?;
            Ok(md.topics().iter().any(|t| {
                t.name() == name
                    && t.error().is_none()
                    && t.partitions().len() == expected
                    && t.partitions()
                        .iter()
                        .all(|p| p.leader() >= 0 && p.error().is_none())
            }))
        },
    )
}

fn settle(
    bootstrap: &str,
    what: &str,
    mut done: impl FnMut(&BaseConsumer) -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let client: BaseConsumer = client_config(bootstrap)
        .set("allow.auto.create.topics", "false")
        .create()?;
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let last = done(&client);
        if matches!(last, Ok(true)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let state = match last {
                Ok(_) => "not yet".to_owned(),
                Err(e) => format!("{e:#}"),
            };
            bail!("waited {SETTLE_TIMEOUT:?} for {what} on {bootstrap} ({state})");
        }
        std::thread::sleep(POLL);
    }
}
