//! Fault injection: what can go wrong, when it goes wrong (a seeded
//! schedule), and how each fault is applied to the running system.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::proxy::ProxyMode;
use crate::services::{Services, Supervised, GROUP, MESSAGE_TIMEOUT, SLOT, TOPICS};
use crate::workload::connect;

pub use crate::fault_kind::FaultKind;

/// When faults happen and which.
pub struct Schedule {
    rng: StdRng,
    /// Short mode: a fixed multiset of faults in random order.
    queue: Vec<FaultKind>,
    /// Long mode: draw by weight until the relay was killed enough.
    weights: Vec<(FaultKind, u32)>,
    pub min_relay_kills: u32,
    pub gap: (Duration, Duration),
}

impl Schedule {
    /// Every kind `counts` times, shuffled.
    pub fn fixed(seed: u64, counts: &[(FaultKind, u32)], gap: (Duration, Duration)) -> Schedule {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0046_4155_4c54);
        let mut queue: Vec<FaultKind> = counts
            .iter()
            .flat_map(|(k, n)| std::iter::repeat_n(*k, *n as usize))
            .collect();
        queue.shuffle(&mut rng);
        Schedule {
            rng,
            queue,
            weights: Vec::new(),
            min_relay_kills: 0,
            gap,
        }
    }

    /// Weighted random faults until at least `min_relay_kills` kill -9.
    pub fn weighted(
        seed: u64,
        weights: &[(FaultKind, u32)],
        min_relay_kills: u32,
        gap: (Duration, Duration),
    ) -> Schedule {
        Schedule {
            rng: StdRng::seed_from_u64(seed ^ 0x0046_4155_4c54),
            queue: Vec::new(),
            weights: weights.to_vec(),
            min_relay_kills,
            gap,
        }
    }

    /// Adds `kind`: `n` more times to a fixed schedule (reshuffled), or
    /// with weight `n` to a weighted one.
    pub fn add(&mut self, kind: FaultKind, n: u32) {
        if self.weights.is_empty() {
            self.queue.extend(std::iter::repeat_n(kind, n as usize));
            self.queue.shuffle(&mut self.rng);
        } else {
            self.weights.push((kind, n));
        }
    }

    /// The pause before the next fault.
    pub fn next_gap(&mut self) -> Duration {
        let (lo, hi) = self.gap;
        Duration::from_millis(
            self.rng
                .random_range(lo.as_millis() as u64..=hi.as_millis() as u64),
        )
    }

    /// The next fault, or `None` when the schedule is done.
    pub fn next(&mut self, done: &FaultLog) -> Option<FaultKind> {
        if self.weights.is_empty() {
            return self.queue.pop();
        }
        if done.count(FaultKind::RelayKill9) >= self.min_relay_kills {
            // Every kind at least once: a kind the draw never picked runs
            // before the schedule ends (a light weight over a few dozen
            // draws can miss, e.g. 1 in 25 over 82 faults: 3.5 %).
            return self
                .weights
                .iter()
                .map(|(k, _)| *k)
                .find(|k| done.count(*k) == 0);
        }
        let total: u32 = self.weights.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.random_range(0..total);
        for (k, w) in &self.weights {
            if pick < *w {
                return Some(*k);
            }
            pick -= w;
        }
        None
    }

    pub fn remaining(&self) -> usize {
        self.queue.len()
    }

    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// What was injected, and what it showed.
#[derive(Debug, Default)]
pub struct FaultLog {
    pub counts: BTreeMap<FaultKind, u32>,
    /// Graceful relay stops that did not exit 0.
    pub sigterm_failures: Vec<String>,
    /// Walsender terminations that found no walsender (relay reconnecting).
    pub walsender_absent: u32,
    /// Consumer kills shown to have happened with applied records whose
    /// offsets were not committed.
    pub consumer_in_window: u32,
    /// Consumer kills where no new record came, so the harness used kill -9.
    pub consumer_idle_kills: u32,
}

impl FaultLog {
    pub fn count(&self, k: FaultKind) -> u32 {
        self.counts.get(&k).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u32 {
        self.counts.values().sum()
    }
}

/// Applies `kind`. Returns once the fault is over and the harness has
/// started what it stopped (recovery itself is the system's job).
pub async fn inject(
    kind: FaultKind,
    services: &Services,
    relay: &mut Supervised,
    consumer: &mut Supervised,
    others: impl Iterator<Item = &mut Supervised>,
    rng: &mut StdRng,
    log: &mut FaultLog,
) -> Result<()> {
    tracing::info!("fault: {kind}");
    match kind {
        FaultKind::LeaderKill
        | FaultKind::RollingRestart
        | FaultKind::Reassignment
        | FaultKind::ControllerRestart
        | FaultKind::CoordinatorKill
        | FaultKind::RelayKillInElection
        | FaultKind::BelowMinIsr => {
            let cluster = services
                .cluster()
                .with_context(|| format!("{kind} needs three brokers (--brokers 3)"))?;
            let hit = crate::broker_faults::inject(kind, &cluster, relay, rng).await?;
            tracing::info!("fault: {kind}: {hit}");
        }
        FaultKind::RelayKill9 => {
            relay.kill9().await?;
            relay.start()?;
        }
        FaultKind::RelaySigterm => {
            match relay.signal_and_wait("TERM", Duration::from_secs(45)).await {
                Ok(status) if status.success() => {}
                Ok(status) => log.sigterm_failures.push(format!(
                    "exit {status}:\n{}",
                    crate::services::tail(relay.log_path(), 15)
                )),
                Err(e) => log.sigterm_failures.push(format!("{e:#}")),
            }
            relay.start()?;
        }
        FaultKind::PgFailover => {
            let done = services.source.fail_over().await?;
            tracing::info!(
                "fault: {kind}: the primary is now the server on port {} (timeline {}), {:.1} s",
                done.primary_port,
                done.timeline,
                done.took.as_secs_f64()
            );
        }
        FaultKind::TerminateWalsender => {
            let client = connect(&services.source_url()).await?;
            let row = client
                .query_one(
                    "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
                     WHERE slot_name = $1 AND active_pid IS NOT NULL",
                    &[&SLOT],
                )
                .await?;
            if row.get::<_, i64>(0) == 0 {
                log.walsender_absent += 1;
            }
        }
        FaultKind::PgImmediateRestart => {
            let source = services.source.primary();
            let down = Duration::from_millis(rng.random_range(0..1500));
            tokio::task::spawn_blocking(move || -> Result<()> {
                source.stop_immediate()?;
                std::thread::sleep(down);
                source.start_stopped()
            })
            .await??;
        }
        FaultKind::BrokerRefuse | FaultKind::BrokerStall => {
            let mode = if kind == FaultKind::BrokerRefuse {
                ProxyMode::Refuse
            } else {
                ProxyMode::Stall
            };
            let extra = Duration::from_millis(rng.random_range(500..3000));
            let proxy = services
                .proxy()
                .with_context(|| format!("{kind} needs the proxied broker (--brokers 1)"))?;
            proxy.set_mode(mode);
            tokio::time::sleep(MESSAGE_TIMEOUT + extra).await;
            proxy.set_mode(ProxyMode::Up);
        }
        FaultKind::ConsumerKill => {
            consumer.ensure_running()?;
            // A consumer restarted by the previous kill may still be
            // joining the group: arm it once it applies records again.
            let consuming = applying(services, CONSUMER_ARM_WAIT).await;
            let pid = consumer.pid().context("consumer pid")?;
            crate::services::signal(pid, "USR1").await?;
            if consumer.wait_exit(CONSUMER_KILL_WAIT).await?.is_none() {
                // No batch committed: kill it anyway.
                tracing::warn!(
                    consuming,
                    "the armed consumer applied no batch within {CONSUMER_KILL_WAIT:?}: kill -9"
                );
                log.consumer_idle_kills += 1;
                consumer.kill9().await?;
            } else {
                match offsets_behind(services).await {
                    Ok(true) => log.consumer_in_window += 1,
                    Ok(false) => {
                        tracing::warn!("the consumer kill landed after its offsets were committed")
                    }
                    Err(e) => tracing::warn!("reading the group's committed offsets: {e:#}"),
                }
            }
            consumer.start()?;
            // The other consumers (Python, Java): a plain kill -9 each.
            for other in others {
                other.kill9().await?;
                other.start()?;
            }
        }
    }
    *log.counts.entry(kind).or_default() += 1;
    Ok(())
}

/// How long a consumer kill waits for the consumer to apply records
/// before arming it anyway.
const CONSUMER_ARM_WAIT: Duration = Duration::from_secs(20);

/// How long an armed consumer has to commit a batch before the harness
/// falls back to kill -9.
const CONSUMER_KILL_WAIT: Duration = Duration::from_secs(15);

/// Waits until the consumer commits a new row to `chaos_applied`, up to
/// `limit`; whether it did.
async fn applying(services: &Services, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    let mut first: Option<i64> = None;
    let mut client = None;
    while tokio::time::Instant::now() < deadline {
        if client.is_none() {
            client = connect(&services.service_dsn()).await.ok();
        }
        let mut max = None;
        if let Some(c) = &client {
            match c
                .query_one("SELECT coalesce(max(seq), 0) FROM chaos_applied", &[])
                .await
            {
                Ok(r) => max = Some(r.get::<_, i64>(0)),
                Err(_) => client = None,
            }
        }
        match (first, max) {
            (None, Some(m)) => first = Some(m),
            (Some(f), Some(m)) if m > f => return true,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Whether, for some partition, the consumer applied a record at or
/// beyond the group's committed offset: it died with a database commit
/// that Kafka's offsets do not reflect.
async fn offsets_behind(services: &Services) -> Result<bool> {
    let applied: BTreeMap<(String, i32), i64> = connect(&services.service_dsn())
        .await?
        .query(
            "SELECT topic, kafka_partition, max(kafka_offset) FROM chaos_applied GROUP BY 1, 2",
            &[],
        )
        .await?
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    let bootstrap = services.bootstrap();
    let committed = tokio::task::spawn_blocking(move || -> Result<Vec<(String, i32, i64)>> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", GROUP)
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for (t, n) in TOPICS {
            for p in 0..n {
                tpl.add_partition(t, p);
            }
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(5))?;
        Ok(got
            .elements()
            .iter()
            .map(|e| {
                let o = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                };
                (e.topic().to_owned(), e.partition(), o)
            })
            .collect())
    })
    .await??;
    Ok(committed.iter().any(|(t, p, o)| {
        applied
            .get(&(t.clone(), *p))
            .is_some_and(|max_applied| max_applied >= o)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weighted_schedule_ends_only_after_every_kind_ran_once() {
        let mut s = Schedule::weighted(
            7,
            &[
                (FaultKind::RelayKill9, 100),
                (FaultKind::PgImmediateRestart, 1),
            ],
            1,
            (Duration::ZERO, Duration::ZERO),
        );
        let mut log = FaultLog::default();
        log.counts.insert(FaultKind::RelayKill9, 3);
        assert_eq!(s.next(&log), Some(FaultKind::PgImmediateRestart));
        log.counts.insert(FaultKind::PgImmediateRestart, 1);
        assert_eq!(s.next(&log), None);
    }
}
