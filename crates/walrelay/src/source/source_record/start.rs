//! A session's start: read this source's record, decide ([`super::assess`]),
//! and start the writer. A record that cannot be read is a WARN (once per
//! session) and the `walrelay_source_record_available` gauge at 0, never
//! a failed session: restore detection then rests on the data topics'
//! tails alone, as before the record existed.

use std::time::Duration;

use tracing::{info, warn};

use super::kafka::{self, Unavailable, Writer};
use super::{assess, Identity, Now, RecordedEvent, SourceRecord, Verdict, WentBack};
use crate::config::Config;
use crate::metrics::Metrics;
use walrelay_pgoutput::Lsn;

/// The longest a session start waits for the record.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What a session takes from the source record.
pub struct AtStart {
    /// The recorded event, when the replay passes it.
    pub expect: Option<RecordedEvent>,
    /// `None` when the topic does not exist (or no writer could be made).
    pub writer: Option<Writer>,
}

/// The read of a source's record, started early so that it overlaps the
/// rest of the session's set-up (START_REPLICATION, the server's WAL
/// position): a session start waits for the slower of the two only.
pub struct PendingRead(tokio::task::JoinHandle<Result<Option<SourceRecord>, Unavailable>>);

/// Starts reading the record of `source`.
pub fn read_early(config: &Config, source: &str) -> PendingRead {
    let (kafka, topic, source) = (
        config.kafka.clone(),
        config.relay.source_record_topic.clone(),
        source.to_owned(),
    );
    let timeout = config.relay.fence_timeout.min(READ_TIMEOUT);
    PendingRead(tokio::spawn(async move {
        kafka::read(&kafka, &topic, &source, timeout).await
    }))
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Checks the record [`read_early`] read for `identity.source_id`; an
/// error when the server went back behind it.
pub async fn at_session_start(
    config: &Config,
    identity: Identity,
    start: Lsn,
    server_wal: Lsn,
    metrics: Option<&Metrics>,
    mut pending: PendingRead,
) -> Result<AtStart, Box<WentBack>> {
    let topic = &config.relay.source_record_topic;
    let read = (&mut pending.0)
        .await
        .unwrap_or_else(|e| Err(Unavailable::Other(format!("the reading task: {e}"))));
    let (expect, available) = match &read {
        Ok(Some(record)) => {
            let now = Now {
                identity: &identity,
                start,
                server_wal,
            };
            let expect = match assess(record, &now)? {
                Verdict::Clear => None,
                Verdict::Reproduce(event) => Some(event),
            };
            match &record.event {
                Some(e) => {
                    info!(%topic, recorded_key = %e.key, recorded_at = %record.written_at, replay_must_reproduce = expect.is_some(), "source record: the server has the WAL of the last recorded event")
                }
                None => info!(%topic, "source record: no event recorded yet"),
            }
            (expect, true)
        }
        Ok(None) => {
            warn!(%topic, source = %identity.source_id, "source record: topic {topic:?} holds no record of this source (deleted, or walrelay setup has not run since this walrelay introduced it): a database restored from a snapshot is caught only while the data topics still hold the keys it would reuse; this session writes the record again (docs/operations.md, \"The source record\")");
            (None, false)
        }
        Err(e) => {
            warn!(%topic, source = %identity.source_id, error = %e, "source record unavailable: a database restored from a snapshot is caught only while the data topics still hold the keys it would reuse (docs/operations.md, \"The source record\")");
            (None, false)
        }
    };
    if let Some(m) = metrics {
        m.set_source_record_available(available);
    }
    let writer = match read {
        Err(Unavailable::TopicMissing(_)) => None,
        _ => match Writer::start(
            &config.kafka,
            topic,
            identity,
            config.postgres.status_interval,
            metrics.cloned(),
        ) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(%topic, error = %e, "cannot write the source record in this session");
                None
            }
        },
    };
    Ok(AtStart { expect, writer })
}
