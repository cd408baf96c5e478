//! `walrelay status --kafka`: this source's record, or why there is none
//! (the relay then warns at each session start and restore detection
//! rests on the data topics' tails alone).

use std::time::Duration;

use serde::Serialize;
use walrelay_pgoutput::Lsn;

use super::kafka::{read, Unavailable};
use crate::config::Config;

/// How long the read may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The source record as `status` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SourceRecordStatus {
    pub topic: String,
    /// `recorded`, `no_event_yet`, `missing` (the topic holds no record
    /// of this source) or `unavailable` (the topic is missing or cannot
    /// be read).
    pub state: &'static str,
    /// The recorded event's key, and its WAL position.
    pub key: Option<String>,
    pub key_lsn: Option<String>,
    pub written_at: Option<String>,
    /// What is wrong, with the fix.
    pub problem: Option<String>,
}

/// Reads the record of `source`.
pub async fn read_status(config: &Config, source: &str) -> SourceRecordStatus {
    let topic = config.relay.source_record_topic.clone();
    let mut s = SourceRecordStatus {
        topic: topic.clone(),
        state: "recorded",
        key: None,
        key_lsn: None,
        written_at: None,
        problem: None,
    };
    match read(&config.kafka, &topic, source, TIMEOUT).await {
        Ok(Some(record)) => {
            s.written_at = Some(record.written_at);
            match record.event {
                Some(e) => {
                    s.key = Some(e.key.to_hex());
                    s.key_lsn = Some(Lsn(e.key.high()).to_string());
                }
                None => s.state = "no_event_yet",
            }
        }
        Ok(None) => {
            s.state = "missing";
            s.problem = Some(format!(
                "topic {topic} holds no record of source {source:?}: it was deleted, or walrelay \
                 setup has not run since this walrelay introduced it; run walrelay setup (the \
                 next session of walrelay run writes it too)"
            ));
        }
        Err(e @ Unavailable::TopicMissing(_)) | Err(e @ Unavailable::Other(_)) => {
            s.state = "unavailable";
            s.problem = Some(e.to_string());
        }
    }
    s
}

/// The line of `walrelay status`.
#[must_use]
pub fn render(s: &SourceRecordStatus) -> String {
    let what = match (&s.key, &s.key_lsn, &s.problem) {
        (_, _, Some(problem)) => format!(
            "{}: {problem}; restore detection relies on the data topics' tails alone \
             (docs/operations.md, \"The source record\")",
            s.state.to_uppercase()
        ),
        (Some(key), Some(lsn), None) => format!(
            "key {key} (WAL position {lsn}), written {}",
            s.written_at.as_deref().unwrap_or("-")
        ),
        _ => format!(
            "no event confirmed yet (written {})",
            s.written_at.as_deref().unwrap_or("-")
        ),
    };
    format!("source record        topic {}: {what}\n", s.topic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_state_renders_what_an_operator_needs() {
        let mut s = SourceRecordStatus {
            topic: "walrelay.sources".into(),
            state: "recorded",
            key: Some("00000000000050000000000000005010".into()),
            key_lsn: Some("0/5000".into()),
            written_at: Some("2026-11-29T04:00:00Z".into()),
            problem: None,
        };
        let line = render(&s);
        assert!(line.contains("topic walrelay.sources: key 0000"), "{line}");
        assert!(
            line.contains("(WAL position 0/5000), written 2026"),
            "{line}"
        );
        s.state = "missing";
        s.problem = Some("topic walrelay.sources holds no record".into());
        let line = render(&s);
        assert!(
            line.contains("MISSING: topic walrelay.sources holds no record"),
            "{line}"
        );
        assert!(line.contains("data topics' tails alone"), "{line}");
    }
}
