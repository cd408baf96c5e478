//! `walrelay status --kafka`: each relay topic's durability settings as the
//! cluster reports them (replication factor, `min.insync.replicas`,
//! `unclean.leader.election.enable`), whether the brokers hold the high
//! watermark under min ISR, and what the tail fence's rule
//! ([`crate::engine::fence::durability`]) concludes: fenced, or unfenced and why,
//! with the settings under which Kafka itself may lose an acknowledged
//! record. The same reads `walrelay run` makes when a session first
//! writes to a topic, so an operator sees the verdict before the relay
//! runs.
//!
//! A topic the rule allows is then checked as the relay would open it: its
//! partitions' tails are read for this source's last records, and a
//! partition whose last record was routed with another layout (the topic
//! has more partitions now, or another routing configuration wrote it)
//! turns the fence off for the topic, as it does in `walrelay run`
//! ([`crate::engine::fence::TopicFence::decide`]).
//!
//! Which topics: those named with `--topic`, else the topics the
//! configuration names (message routes, the dead-letter topic) and the
//! cluster's topics an outbox topic template matches. Topics the
//! application names in `walrelay.emit(...)` are known only to it: name
//! them with `--topic`.
//!
//! It lives with the status command rather than in the Kafka wing: it is
//! a report that puts the fence's rule and decisions ([`crate::engine::fence`])
//! next to the cluster's answers, and the Kafka wing imports neither the
//! fence nor the commands.

use std::time::Duration;

use serde::Serialize;
use walrelay_pgoutput::Lsn;

use crate::config::Config;
use crate::engine::fence::durability;
use crate::kafka::client::{client_config, KafkaClient};
use crate::kafka::requests::api_versions::StrictMinIsr;

/// How long each Kafka request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The Kafka part of `walrelay status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KafkaDurability {
    /// Whether the brokers hold the high watermark while a partition is
    /// under `min.insync.replicas` (Kafka 3.7+): `yes`, `no` or `unknown`.
    pub strict_min_isr: String,
    /// Why it is unknown, if it is.
    pub strict_min_isr_unknown: Option<String>,
    pub topics: Vec<TopicDurability>,
    /// Why the cluster could not be asked at all.
    pub error: Option<String>,
}

/// One topic's settings and the fence's verdict.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct TopicDurability {
    pub topic: String,
    /// `false`: the cluster has no such topic (yet).
    pub exists: bool,
    pub replication_factor: Option<u32>,
    pub min_insync_replicas: Option<u32>,
    /// Why `min_insync_replicas` could not be read (e.g. a denied
    /// DescribeConfigs), for a replicated topic.
    pub min_insync_replicas_unknown: Option<String>,
    pub unclean_leader_election: Option<bool>,
    /// Whether the tail fence skips what it reads in this topic.
    pub fenced: bool,
    /// Why not, with the fix.
    pub unfenced_because: Option<String>,
    /// Settings under which Kafka may lose records it acknowledged.
    pub risks: Vec<String>,
    /// Why the partitions' tails could not be read to check the layout,
    /// if they could not (the verdict then rests on the settings alone).
    pub layout_unchecked: Option<String>,
}

/// The topics to report: `requested`, else those the configuration names
/// and the `existing` ones an outbox template matches (sorted, unique).
#[must_use]
pub fn topics_to_report(config: &Config, requested: &[String], existing: &[String]) -> Vec<String> {
    let mut topics: Vec<String> = if requested.is_empty() {
        let mut named: Vec<String> = config.messages.iter().map(|r| r.topic.clone()).collect();
        named.extend(config.dead_letter.topic.clone());
        for outbox in &config.outbox {
            named.extend(
                existing
                    .iter()
                    .filter(|t| template_matches(&outbox.topic, t))
                    .cloned(),
            );
        }
        named
    } else {
        requested.to_vec()
    };
    topics.sort();
    topics.dedup();
    topics
}

/// Whether `topic` could come from `template` (`{name}` placeholders
/// match any non-empty text).
fn template_matches(template: &str, topic: &str) -> bool {
    let mut parts = template.split('{').map(|p| match p.split_once('}') {
        Some((_, literal)) => (true, literal),
        None => (false, p),
    });
    let Some((_, prefix)) = parts.next() else {
        return false;
    };
    let Some(mut rest) = topic.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<(bool, &str)> = parts.collect();
    for (i, (_, literal)) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        // A placeholder takes at least one character, then the literal.
        let found = if last {
            (rest.len() > literal.len() && rest.ends_with(literal)).then_some(rest.len())
        } else if literal.is_empty() {
            None
        } else {
            rest.get(1..)
                .and_then(|r| r.find(literal))
                .map(|at| at + 1 + literal.len())
        };
        match found {
            Some(end) => rest = &rest[end..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Asks the cluster of `config` about `requested` topics (see
/// [`topics_to_report`]); `source` is the relay's `walrelay-source`,
/// whose records the layout check reads, and `replay_from` the slot's
/// confirmed position, where the relay's next session replays from
/// (`None`: unknown, every record read counts as replayed).
pub async fn report(
    config: &Config,
    requested: &[String],
    source: &str,
    replay_from: Option<Lsn>,
) -> KafkaDurability {
    let kafka = &config.kafka;
    let admin = match client_config(kafka, KafkaClient::Admin) {
        Ok(admin) => admin,
        Err(e) => {
            return KafkaDurability {
                strict_min_isr: "unknown".to_owned(),
                strict_min_isr_unknown: None,
                topics: Vec::new(),
                error: Some(e.to_string()),
            }
        }
    };
    let (strict, strict_why) =
        crate::kafka::requests::api_versions::cluster_strict_min_isr(&admin, TIMEOUT).await;
    let mut out = KafkaDurability {
        strict_min_isr: match strict {
            StrictMinIsr::Yes => "yes",
            StrictMinIsr::No => "no",
            StrictMinIsr::Unknown => "unknown",
        }
        .to_owned(),
        strict_min_isr_unknown: strict_why,
        topics: Vec::new(),
        error: None,
    };
    // Replica counts from one metadata request.
    let metadata = {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || {
            let client = admin.admin().map_err(|e| e.to_string())?;
            let md = client
                .inner()
                .fetch_metadata(None, TIMEOUT)
                .map_err(|e| format!("fetching metadata: {e}"))?;
            Ok::<_, String>(
                md.topics()
                    .iter()
                    .map(|t| {
                        let rf = t
                            .partitions()
                            .iter()
                            .map(|p| u32::try_from(p.replicas().len()).unwrap_or(u32::MAX))
                            .max();
                        let partitions = u32::try_from(t.partitions().len()).unwrap_or(u32::MAX);
                        (t.name().to_owned(), rf.map(|rf| (rf, partitions)))
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .await
    };
    let metadata = match metadata {
        Ok(Ok(md)) => md,
        Ok(Err(e)) => {
            out.error = Some(e);
            return out;
        }
        Err(e) => {
            out.error = Some(e.to_string());
            return out;
        }
    };
    let existing: Vec<String> = metadata.iter().map(|(name, _)| name.clone()).collect();
    for topic in topics_to_report(config, requested, &existing) {
        let rf = metadata
            .iter()
            .find(|(name, _)| *name == topic)
            .and_then(|(_, rf)| *rf);
        out.topics.push(match rf {
            None => TopicDurability {
                topic,
                exists: false,
                replication_factor: None,
                min_insync_replicas: None,
                min_insync_replicas_unknown: None,
                unclean_leader_election: None,
                fenced: false,
                unfenced_because: Some("the cluster has no such topic".to_owned()),
                risks: Vec::new(),
                layout_unchecked: None,
            },
            Some((rf, partitions)) => {
                let settings =
                    crate::engine::fence::settings::read(&admin, &topic, rf, strict, TIMEOUT).await;
                let mut t = topic_durability(topic, &settings);
                if t.fenced && config.relay.fence {
                    match layout_verdict(config, &t.topic, partitions, source, replay_from).await {
                        Ok(None) => {}
                        Ok(Some(why)) => {
                            t.fenced = false;
                            t.unfenced_because = Some(why);
                        }
                        Err(e) => t.layout_unchecked = Some(e),
                    }
                }
                t
            }
        });
    }
    if !config.relay.fence {
        switched_off(&mut out.topics);
    }
    out
}

/// What the fence would decide from `topic`'s tails as the relay opens
/// it: `Some(why)` when a partition's last record of `source` was routed
/// with another layout than this configuration and partition count give.
async fn layout_verdict(
    config: &Config,
    topic: &str,
    partitions: u32,
    source: &str,
    replay_from: Option<Lsn>,
) -> Result<Option<String>, String> {
    use crate::engine::fence::{keyless, TopicFence, TopicLayout};
    let reader = client_config(&config.kafka, KafkaClient::Fence).map_err(|e| e.to_string())?;
    let now = TopicLayout {
        partitions,
        routing: crate::engine::fence::routing_fingerprint(config, topic),
    };
    let (name, source) = (topic.to_owned(), source.as_bytes().to_vec());
    let tails = tokio::task::spawn_blocking(move || {
        crate::engine::fence::tail::read(&reader, &name, partitions, &source, TIMEOUT)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    // The rule placing keyless records, as the relay's next session
    // chooses it (without the slot's position: as if every tail record
    // were replayed, the strictest reading).
    let start = replay_from.unwrap_or(Lsn(0));
    let rule = keyless::choose(&tails.partitions, config.relay.keyless_placement, start).rule;
    let placing = keyless::Placing { rule, start };
    Ok(
        match TopicFence::decide(&tails.partitions, now, placing).fence {
            TopicFence::Unfenced(why) => Some(format!(
            "{why}: the relay turns the fence off for this topic in its next session, and writes \
             its replay again (duplicates, never a loss); it is on again once every partition's \
             last record was written with today's layout"
        )),
            TopicFence::Fenced(_) => None,
        },
    )
}

/// With `relay.fence = false` the relay reads no tail: no topic is fenced,
/// whatever its settings would allow.
fn switched_off(topics: &mut [TopicDurability]) {
    for t in topics.iter_mut().filter(|t| t.exists) {
        t.fenced = false;
        t.unfenced_because = Some(
            "relay.fence = false: the relay reads no tail and fences nothing (every crash \
             writes the replayed events again, as duplicates on the wire)"
                .to_owned(),
        );
    }
}

/// The verdict on a topic whose settings were read.
fn topic_durability(topic: String, settings: &durability::TopicSettings) -> TopicDurability {
    let verdict = durability::readable_implies_acked(settings);
    TopicDurability {
        topic,
        exists: true,
        replication_factor: Some(settings.replication_factor),
        min_insync_replicas: settings.min_insync_replicas.as_ref().ok().copied(),
        min_insync_replicas_unknown: settings.min_insync_replicas.as_ref().err().cloned(),
        unclean_leader_election: settings.unclean_leader_election,
        fenced: verdict.is_ok(),
        unfenced_because: verdict.err().map(|why| why.to_string()),
        risks: durability::acknowledged_may_be_lost(settings),
        layout_unchecked: None,
    }
}

/// The human-readable section of `walrelay status`.
#[must_use]
pub fn render(k: &KafkaDurability) -> String {
    let mut out = String::from("kafka:\n");
    if let Some(e) = &k.error {
        out.push_str(&format!("  error: {e}\n"));
        return out;
    }
    out.push_str(&format!(
        "  brokers hold the high watermark under min ISR (Kafka 3.7 or later): {}{}\n",
        k.strict_min_isr,
        k.strict_min_isr_unknown
            .as_ref()
            .map(|why| format!(" ({why})"))
            .unwrap_or_default()
    ));
    if k.topics.is_empty() {
        out.push_str("  no topics to report (name them with --topic)\n");
    }
    for t in &k.topics {
        if !t.exists {
            out.push_str(&format!("  topic {}: does not exist\n", t.topic));
            continue;
        }
        let opt = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
        out.push_str(&format!(
            "  topic {}: replication factor {}, min.insync.replicas {}, unclean.leader.election.enable {}, tail fence {}\n",
            t.topic,
            opt(t.replication_factor.map(|v| v.to_string())),
            match (&t.min_insync_replicas, &t.min_insync_replicas_unknown) {
                (Some(v), _) => v.to_string(),
                (None, Some(why)) => format!("unknown ({why})"),
                (None, None) => "-".to_owned(),
            },
            opt(t.unclean_leader_election.map(|v| v.to_string())),
            if t.fenced { "on" } else { "off" }
        ));
        if let Some(why) = &t.unfenced_because {
            out.push_str(&format!("    fence off: {why}\n"));
        }
        if let Some(why) = &t.layout_unchecked {
            out.push_str(&format!(
                "    layout not checked (the partitions' tails could not be read: {why})\n"
            ));
        }
        for risk in &t.risks {
            out.push_str(&format!("    RISK: {risk}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbox_templates_match_the_topics_they_can_make() {
        let t = "outbox.event.{aggregatetype}";
        assert!(template_matches(t, "outbox.event.order"));
        assert!(!template_matches(t, "outbox.event."));
        assert!(!template_matches(t, "other.order"));
        let t = "{schema}.{table}.{aggregatetype}";
        assert!(template_matches(t, "public.outbox.order"));
        assert!(!template_matches(t, "public.outbox"));
        assert!(template_matches("fixed", "fixed"));
        assert!(!template_matches("fixed", "fixed2"));
    }

    #[test]
    fn the_verdict_follows_the_fence_rule() {
        let settings = |rf, min: Result<u32, String>, strict| durability::TopicSettings {
            replication_factor: rf,
            min_insync_replicas: min,
            unclean_leader_election: Some(false),
            strict_min_isr: strict,
        };
        let ok = topic_durability("t".into(), &settings(3, Ok(2), StrictMinIsr::Yes));
        assert!(ok.fenced && ok.unfenced_because.is_none() && ok.risks.is_empty());
        let old = topic_durability("t".into(), &settings(3, Ok(2), StrictMinIsr::No));
        assert!(!old.fenced);
        assert!(old.unfenced_because.unwrap().contains("3.7"));
        let denied = topic_durability(
            "t".into(),
            &settings(3, Err("DescribeConfigs: denied".into()), StrictMinIsr::Yes),
        );
        assert!(!denied.fenced);
        assert_eq!(
            denied.min_insync_replicas_unknown.as_deref(),
            Some("DescribeConfigs: denied")
        );
        assert!(denied.unfenced_because.unwrap().contains("DescribeConfigs"));
        let mut off = vec![topic_durability(
            "t".into(),
            &settings(3, Ok(2), StrictMinIsr::Yes),
        )];
        switched_off(&mut off);
        assert!(!off[0].fenced);
        assert!(off[0]
            .unfenced_because
            .as_deref()
            .is_some_and(|why| why.contains("relay.fence = false")));
        let risky = topic_durability("t".into(), &settings(3, Ok(1), StrictMinIsr::Yes));
        assert!(risky.fenced && risky.risks.len() == 1);
        let text = render(&KafkaDurability {
            strict_min_isr: "yes".into(),
            strict_min_isr_unknown: None,
            topics: vec![risky],
            error: None,
        });
        assert!(
            text.contains("min.insync.replicas 1") && text.contains("RISK:"),
            "{text}"
        );
    }
}
