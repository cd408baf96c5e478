//! The scenario file `conformance/scenarios.json` (shared with the Python
//! suite) as types, and the pure bookkeeping of what a scenario produced.
//!
//! Every struct refuses unknown fields and the step enum unknown actions:
//! a scenario written for a newer runner fails here instead of being run
//! halfway.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// The scenario file, compiled in so that editing it rebuilds this suite.
pub const FILE: &str = include_str!("../../../../conformance/scenarios.json");

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    #[allow(dead_code)]
    pub about: Vec<String>,
    pub key_format: String,
    pub defaults: Defaults,
    pub scenarios: Vec<Scenario>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub partitions: i32,
    pub max_batch_records: usize,
    pub commit_interval_ms: u64,
    pub retry: Retry,
    pub on_poison: Poison,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    pub attempts: u32,
    pub base_ms: u64,
    pub cap_ms: u64,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Poison {
    Park,
    Stop,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[allow(dead_code)]
    pub doc: String,
    /// The brokers it is played on (every broker without it): `kafka`,
    /// `tansu`.
    #[serde(default)]
    pub brokers: Option<Vec<String>>,
    pub steps: Vec<Step>,
    pub expect: Expect,
}

impl Scenario {
    /// Whether it is played on `broker` (`kafka` or `tansu`).
    pub fn runs_on(&self, broker: &str) -> bool {
        self.brokers
            .as_ref()
            .is_none_or(|b| b.iter().any(|name| name == broker))
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum HandlerKind {
    Batch,
    Record,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RedriveHandler {
    /// Still fails on poison records.
    Broken,
    /// Applies every record.
    Fixed,
}

/// A count, or `"all"`: every distinct key produced so far that is not
/// expected to stay parked.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Count {
    N(i64),
    All(AllTag),
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AllTag {
    All,
}

/// A sequence number, or `"last"`: the highest one produced for that
/// (source, partition).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Seq {
    N(i64),
    Last(LastTag),
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LastTag {
    Last,
}

/// Which of the relay's header sets a `produce` step writes: `full` has
/// the previous key as `walrelay-prev-key` (32 hex digits), `lean` as
/// `walrelay-prev` (`HIGH/LOW`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderSet {
    #[default]
    Full,
    Lean,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    Produce {
        source: String,
        partitions: Vec<i32>,
        seqs: [i64; 2],
        #[serde(default)]
        prev_seq: Option<i64>,
        #[serde(default)]
        poison: bool,
        #[serde(default)]
        poison_at_commit: bool,
        #[serde(default)]
        fails: u32,
        /// `lean` or `full` (the default): the header set of the records.
        #[serde(default)]
        headers: HeaderSet,
        /// How the handler misbehaves on the records.
        #[serde(default)]
        behaviour: Option<Behaviour>,
        /// For the behaviours with a count: on the first `times` calls.
        #[serde(default = "one")]
        times: u32,
        /// The payload padded to this many bytes.
        #[serde(default)]
        payload_bytes: Option<usize>,
    },
    RestartRelay {
        source: String,
    },
    ReplayLast {
        source: String,
        partitions: Vec<i32>,
        count: usize,
    },
    ProduceMore {
        source: String,
        partitions: Vec<i32>,
        count: i64,
    },
    ProduceUntilAppliedBy {
        consumer: String,
        source: String,
        partitions: Vec<i32>,
        per_round: i64,
    },
    Start {
        consumer: String,
        handler: HandlerKind,
        #[serde(default)]
        batch_delay_ms: u64,
        #[serde(default)]
        max_batch_records: Option<usize>,
        #[serde(default)]
        max_batch_bytes: Option<usize>,
        #[serde(default)]
        handler_timeout_ms: Option<u64>,
        #[serde(default)]
        on_poison: Option<Poison>,
    },
    Stop {
        consumer: String,
        /// The partitions the loop must report stopped (none without it).
        #[serde(default)]
        stopped: Vec<Stopped>,
    },
    StartProcess {
        consumer: String,
        commit_interval_ms: u64,
        /// Static group membership under this `group.instance.id`, with
        /// Kafka's default session timeout (45 s).
        #[serde(default)]
        instance_id: Option<String>,
    },
    KillProcess {
        consumer: String,
    },
    Await {
        #[serde(default)]
        effects: Option<Count>,
        #[serde(default)]
        parked: Option<i64>,
        #[serde(default)]
        seen: Option<u64>,
        #[serde(default)]
        stopped: Option<u64>,
        /// Fails unless reached within this many milliseconds (60 s
        /// without it).
        #[serde(default)]
        within_ms: Option<u64>,
    },
    ExpectCounters {
        processed: u64,
        duplicates: u64,
        gaps: u64,
        parked: u64,
    },
    ParkRow {
        source: String,
        partition: i32,
        offset: i64,
        seq: i64,
    },
    Redrive {
        handler: RedriveHandler,
        applied: u64,
        failed: u64,
        unusable: u64,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub effects: Count,
    /// `null`: not checked (a handler broke the batch's atomicity).
    pub marks: Option<Vec<Mark>>,
    pub parked: Vec<Parked>,
    /// Produced, but not expected among the effects.
    #[serde(default)]
    pub not_applied: Vec<Unapplied>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unapplied {
    pub partition: i32,
    pub seq: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stopped {
    pub partition: i32,
    pub error_contains: String,
}

/// How a handler misbehaves on a record (conformance/README.md).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Behaviour {
    Swallow,
    Savepoint,
    Raise,
    Noop,
    Slow,
    SelfCommit,
    SelfRollback,
    Contend,
}

impl Behaviour {
    /// The payload's first word.
    pub fn word(self) -> &'static str {
        match self {
            Behaviour::Swallow => "swallow",
            Behaviour::Savepoint => "savepoint",
            Behaviour::Raise => "raise",
            Behaviour::Noop => "noop",
            Behaviour::Slow => "slow",
            Behaviour::SelfCommit => "self-commit",
            Behaviour::SelfRollback => "self-rollback",
            Behaviour::Contend => "contend",
        }
    }
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mark {
    pub partition: i32,
    pub source: String,
    pub seq: Seq,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parked {
    pub partition: i32,
    pub seq: i64,
    #[serde(default)]
    pub attempts: Option<i32>,
}

pub fn load() -> anyhow::Result<File> {
    let file: File = serde_json::from_str(FILE)
        .map_err(|e| anyhow::anyhow!("conformance/scenarios.json does not parse: {e}"))?;
    anyhow::ensure!(
        file.key_format == "{0x100 + seq:016x}{partition:016x}",
        "conformance/scenarios.json has key_format {:?}, which this runner does not implement",
        file.key_format
    );
    Ok(file)
}

/// Key `seq` of `partition`: 32 lowercase hex digits, increasing in `seq`.
pub fn key(partition: i32, seq: i64) -> String {
    format!("{:016x}{:016x}", 0x100 + seq, partition)
}

/// One record to produce.
#[derive(Debug, PartialEq, Eq)]
pub struct Planned {
    pub partition: i32,
    pub key: String,
    pub prev: String,
    pub source: String,
    pub poison: bool,
    /// The handler's statements for it succeed, its transaction's commit
    /// fails (a deferred constraint).
    pub at_commit: bool,
    /// The handler fails on it this many times, then applies it.
    pub fails: u32,
    /// The header set it is written with.
    pub headers: HeaderSet,
    /// A behaviour of the handler, and on how many calls.
    pub behaviour: Option<(Behaviour, u32)>,
    /// The payload padded to this many bytes.
    pub payload_bytes: Option<usize>,
}

impl Planned {
    pub fn payload(&self) -> String {
        let kind = match (self.poison, self.at_commit, self.fails, self.behaviour) {
            (true, ..) => "poison".to_owned(),
            (false, true, ..) => "commit-poison".to_owned(),
            (false, false, 0, None) => "event".to_owned(),
            (false, false, 0, Some((b, times))) => format!("{} {times}", b.word()),
            (false, false, n, _) => format!("flaky {n}"),
        };
        let mut payload = format!("{kind} {}", self.key);
        if let Some(n) = self.payload_bytes.filter(|&n| n > payload.len() + 1) {
            payload.push(' ');
            payload.extend(std::iter::repeat_n('x', n - payload.len()));
        }
        payload
    }
}

/// What a scenario's relays produced so far, and what a relay remembers
/// for `walrelay-prev-key` (the last key per source and partition in the
/// current session).
#[derive(Debug, Default)]
pub struct Ledger {
    prev: BTreeMap<(String, i32), String>,
    /// Sequence numbers produced per (source, partition).
    pub seqs: BTreeMap<(String, i32), BTreeSet<i64>>,
    /// Every distinct key produced.
    pub keys: BTreeSet<String>,
    /// Keys of `noop` records: applied without an effect.
    pub noop: BTreeSet<String>,
}

impl Ledger {
    /// Records `seqs` (in order, each on every partition) and returns what
    /// to send.
    pub fn plan(
        &mut self,
        source: &str,
        partitions: &[i32],
        seqs: impl IntoIterator<Item = i64>,
        prev_seq: Option<i64>,
        poison: bool,
    ) -> Vec<Planned> {
        let mut out = Vec::new();
        let mut first = true;
        for seq in seqs {
            for &partition in partitions {
                let key = key(partition, seq);
                let slot = (source.to_owned(), partition);
                let mut prev = self
                    .prev
                    .insert(slot.clone(), key.clone())
                    .unwrap_or_default();
                if first {
                    if let Some(p) = prev_seq {
                        prev = self::key(partition, p);
                    }
                }
                self.seqs.entry(slot).or_default().insert(seq);
                self.keys.insert(key.clone());
                out.push(Planned {
                    partition,
                    key,
                    prev,
                    source: source.to_owned(),
                    poison,
                    at_commit: false,
                    fails: 0,
                    headers: HeaderSet::Full,
                    behaviour: None,
                    payload_bytes: None,
                });
            }
            first = false;
        }
        out
    }

    pub fn restart(&mut self, source: &str) {
        self.prev.retain(|(s, _), _| s != source);
    }

    pub fn last(&self, source: &str, partition: i32) -> Option<i64> {
        self.seqs
            .get(&(source.to_owned(), partition))
            .and_then(|s| s.last().copied())
    }

    /// The last `count` sequence numbers of (source, partition), ascending.
    pub fn tail(&self, source: &str, partition: i32, count: usize) -> Vec<i64> {
        let all: Vec<i64> = self
            .seqs
            .get(&(source.to_owned(), partition))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        all[all.len().saturating_sub(count)..].to_vec()
    }

    /// The keys that must end up in the effects table exactly once:
    /// everything produced but the records expected to stay parked, the
    /// `noop` ones and those the scenario says are not applied.
    pub fn expected_effects(
        &self,
        parked: &[Parked],
        not_applied: &[Unapplied],
    ) -> BTreeSet<String> {
        let left_out: BTreeSet<String> = parked
            .iter()
            .map(|p| key(p.partition, p.seq))
            .chain(not_applied.iter().map(|u| key(u.partition, u.seq)))
            .chain(self.noop.iter().cloned())
            .collect();
        self.keys.difference(&left_out).cloned().collect()
    }

    pub fn resolve(&self, count: Count, parked: &[Parked], not_applied: &[Unapplied]) -> i64 {
        match count {
            Count::N(n) => n,
            Count::All(_) => {
                i64::try_from(self.expected_effects(parked, not_applied).len()).unwrap_or(i64::MAX)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_like_their_sequence_numbers() {
        assert_eq!(key(1, 5), "00000000000001050000000000000001");
        assert!(key(0, -200) < key(0, -191));
        assert!(key(0, 9) < key(0, 10));
    }

    #[test]
    fn the_ledger_chains_prev_keys_per_source_and_partition_and_session() {
        let mut l = Ledger::default();
        let a = l.plan("s", &[0, 1], 1..=2, None, false);
        assert_eq!(
            a.iter().map(|p| p.prev.as_str()).collect::<Vec<_>>(),
            ["", "", &key(0, 1), &key(1, 1)]
        );
        let gap = l.plan("s", &[0], 4..=5, Some(3), false);
        assert_eq!(
            (gap[0].prev.clone(), gap[1].prev.clone()),
            (key(0, 3), key(0, 4))
        );
        let other = l.plan("t", &[0], [7], None, true);
        assert_eq!(other[0].prev, "");
        assert_eq!(other[0].payload(), format!("poison {}", key(0, 7)));
        l.restart("s");
        assert_eq!(l.plan("s", &[1], [2], None, false)[0].prev, "");
        assert_eq!(l.last("s", 0), Some(5));
        assert_eq!(l.tail("s", 0, 3), [2, 4, 5]);
        let parked = [Parked {
            partition: 0,
            seq: 7,
            attempts: None,
        }];
        assert_eq!(l.resolve(Count::All(AllTag::All), &parked, &[]), 6);
        let not_applied = [Unapplied {
            partition: 0,
            seq: 5,
        }];
        assert_eq!(l.resolve(Count::All(AllTag::All), &parked, &not_applied), 5);
    }

    #[test]
    fn the_shared_file_parses_and_refuses_unknown_actions() {
        let file = load().expect("scenarios.json");
        assert!(file.scenarios.len() >= 6);
        let bad = r#"{"do": "teleport", "consumer": "a"}"#;
        let err = serde_json::from_str::<Step>(bad).unwrap_err().to_string();
        assert!(err.contains("teleport"), "{err}");
        let extra = r#"{"do": "stop", "consumer": "a", "gently": true}"#;
        assert!(serde_json::from_str::<Step>(extra).is_err());
    }
}
