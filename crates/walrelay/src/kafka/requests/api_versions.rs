//! Whether the brokers hold the high watermark while a partition is under
//! its minimum in-sync set ([`StrictMinIsr`]): Kafka 3.7 and later do
//! (KAFKA-15583). A client learns a broker's release only from the API
//! versions it supports: 3.7 added Produce v10 (KIP-951), so a broker
//! whose Produce goes to v10 or beyond is 3.7 or later. librdkafka reads
//! the ApiVersions response but does not expose it, so walrelay sends its
//! own ApiVersions request (v3) to every broker.
//!
//! Kafka answers ApiVersions before authentication (KIP-35), so the
//! probe connects as the producer does ([`crate::kafka::conn`]: TLS with
//! its certificate checks on `SSL` and `SASL_SSL` listeners) without
//! logging in. Where walrelay cannot connect as the producer would (a
//! setting [`crate::kafka::conn::settings`] refuses), the answer is
//! [`StrictMinIsr::Unknown`], treated as no: a replicated topic with
//! `min.insync.replicas` >= 2 stays unfenced there (duplicates after a
//! crash, never a loss). A broker that is not Apache Kafka may report API
//! versions that say nothing of its high watermark; for the rule that
//! errs towards "no" unless it reports Produce v10.
//!
//! Every broker of the cluster is asked, not just the first bootstrap
//! server that answers: during a rolling upgrade, or behind a proxy, that
//! one may run 3.7 while a partition's leader still runs 3.6. The cluster
//! is strict only when every broker is ([`combine`]).
//!
//! A broker the metadata lists may not answer: one just killed stays
//! listed until the controller notices (`broker.session.timeout.ms`), and
//! a relay restarted in that window would leave every replicated topic
//! unfenced for its session. The response also carries the cluster's
//! finalized `metadata.version` (a tagged field, KIP-584): once it is at
//! 3.7-IV0 or later, the controller registers no broker whose release
//! cannot run it, so no broker of the cluster runs a release before 3.7,
//! answering or not. One broker that answers with such a level then
//! vouches for those that do not.
//!
//! The encoding and decoding are pure functions ([`request`],
//! [`parse_response`]), tested byte for byte below.

use std::fmt;
use std::time::Duration;

use crate::kafka::client::ClientSetup;
use crate::kafka::conn::{Connection, Settings};
use crate::kafka::wire::{Reader, Request};
use crate::kafka::RequestError;

/// Whether the brokers keep the high watermark still while a partition's
/// in-sync set is below `min.insync.replicas` (Kafka 3.7 and later): what
/// the brokers' ApiVersions answers tell, and one input of the tail
/// fence's durability rule (`fence::durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrictMinIsr {
    /// Kafka 3.7 or later.
    Yes,
    /// An older Kafka.
    No,
    /// Not learned (a TLS listener, no answer): treated as no.
    Unknown,
}

impl fmt::Display for StrictMinIsr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StrictMinIsr::Yes => "yes (Kafka 3.7 or later)",
            StrictMinIsr::No => "no (older than Kafka 3.7)",
            StrictMinIsr::Unknown => "unknown",
        })
    }
}

const PRODUCE: i16 = 0;
/// The first Produce version of Kafka 3.7, the first release with a strict
/// high watermark.
const PRODUCE_OF_3_7: i16 = 10;
const API_VERSIONS: i16 = 18;
const UNSUPPORTED_VERSION: i16 = 35;
/// The response's tagged field with the cluster's finalized features.
const FINALIZED_FEATURES_TAG: u64 = 2;
/// The `metadata.version` feature level of Kafka 3.7-IV0
/// (`MetadataVersion.IBP_3_7_IV0`).
pub const METADATA_VERSION_OF_3_7: i16 = 15;

/// What one broker's ApiVersions response tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// Whether this broker's release holds the high watermark under min
    /// ISR.
    pub strict: StrictMinIsr,
    /// The cluster's finalized `metadata.version` level as this broker
    /// knows it; `None` where it reports none (ZooKeeper mode, brokers
    /// before 3.3).
    pub metadata_version: Option<i16>,
}

/// An ApiVersions v3 request with `correlation_id`, length-prefixed.
#[must_use]
pub fn request(correlation_id: i32) -> Vec<u8> {
    // Header v2: header v1, then no tagged fields.
    let mut request = Request::new(API_VERSIONS, 3, correlation_id, "walrelay");
    request.no_tags();
    // Body: client_software_name, client_software_version, no tagged
    // fields.
    request
        .compact_string("walrelay")
        .compact_string(env!("CARGO_PKG_VERSION"))
        .no_tags();
    request.framed()
}

/// What an ApiVersions v3 response (without its length prefix) says: the
/// Produce API's version range tells the release, the finalized features
/// the cluster's `metadata.version`. A broker too old for v3 (before 2.4)
/// answers `UNSUPPORTED_VERSION`.
pub fn parse_response(bytes: &[u8], correlation_id: i32) -> Result<Release, RequestError> {
    read_response(bytes, correlation_id).map_err(RequestError::Response)
}

fn read_response(bytes: &[u8], correlation_id: i32) -> Result<Release, String> {
    let mut r = Reader::new(bytes);
    let got = r.i32()?;
    if got != correlation_id {
        return Err(format!("correlation id {got}, expected {correlation_id}"));
    }
    let error = r.i16()?;
    if error == UNSUPPORTED_VERSION {
        return Ok(Release {
            strict: StrictMinIsr::No,
            metadata_version: None,
        });
    }
    if error != 0 {
        return Err(format!("ApiVersions error code {error}"));
    }
    // A compact array: its length + 1.
    let keys = r.uvarint()?.saturating_sub(1);
    let mut produce_max = None;
    for _ in 0..keys {
        let key = r.i16()?;
        let _min = r.i16()?;
        let max = r.i16()?;
        r.skip_tags()?;
        if key == PRODUCE {
            produce_max = Some(max);
        }
    }
    let _throttle_ms = r.i32()?;
    let mut metadata_version = None;
    for _ in 0..r.uvarint()? {
        let tag = r.uvarint()?;
        let size = usize::try_from(r.uvarint()?).map_err(|e| e.to_string())?;
        let field = r.take(size)?;
        if tag == FINALIZED_FEATURES_TAG {
            metadata_version = finalized_metadata_version(field)?;
        }
    }
    let strict = match produce_max {
        Some(max) if max >= PRODUCE_OF_3_7 => StrictMinIsr::Yes,
        Some(_) => StrictMinIsr::No,
        None => return Err("the broker lists no Produce API".to_owned()),
    };
    Ok(Release {
        strict,
        metadata_version,
    })
}

/// The `metadata.version` level in a FinalizedFeatures field (a compact
/// array of name, max level, min level, tagged fields).
fn finalized_metadata_version(field: &[u8]) -> Result<Option<i16>, String> {
    let mut r = Reader::new(field);
    let mut found = None;
    for _ in 0..r.uvarint()?.saturating_sub(1) {
        let name_len =
            usize::try_from(r.uvarint()?.saturating_sub(1)).map_err(|e| e.to_string())?;
        let name = r.take(name_len)?;
        let max = r.i16()?;
        let _min = r.i16()?;
        r.skip_tags()?;
        if name == b"metadata.version" {
            found = Some(max);
        }
    }
    Ok(found)
}

/// The `host:port` of every broker in the cluster's metadata, asked
/// through a client made from `config` (blocking: run it on a blocking
/// thread).
pub fn cluster_brokers(
    config: &ClientSetup,
    timeout: Duration,
) -> Result<Vec<String>, RequestError> {
    use rdkafka::consumer::Consumer;
    let client = config
        .consumer()
        .map_err(|e| RequestError::Metadata(format!("creating a client for the metadata: {e}")))?;
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| RequestError::Metadata(format!("fetching the cluster's metadata: {e}")))?;
    Ok(metadata
        .brokers()
        .iter()
        .map(|b| format!("{}:{}", b.host(), b.port()))
        .collect())
}

/// [`strict_min_isr_of`] the brokers of the cluster that `config`
/// reaches, asked as a client made from `config` connects: `Unknown`,
/// with the reason, when the metadata cannot be read or walrelay cannot
/// connect that way.
pub async fn cluster_strict_min_isr(
    config: &ClientSetup,
    timeout: Duration,
) -> (StrictMinIsr, Option<String>) {
    let settings = match config.connections() {
        Ok(settings) => settings.without_sasl(),
        Err(why) => {
            return (
                StrictMinIsr::Unknown,
                Some(format!(
                    "walrelay cannot connect to the brokers as its Kafka client does: {why}"
                )),
            )
        }
    };
    let config = config.clone();
    let brokers = tokio::task::spawn_blocking(move || cluster_brokers(&config, timeout))
        .await
        .map_err(|e| RequestError::Metadata(e.to_string()))
        .and_then(|listed| listed);
    match brokers {
        Ok(brokers) => strict_min_isr_of(&brokers, &settings, timeout).await,
        Err(e) => (StrictMinIsr::Unknown, Some(e.to_string())),
    }
}

/// Asks every broker of the cluster (`brokers`: `host:port` from the
/// metadata) at once, each connection made as `settings` say; the
/// cluster is strict only if each of them is ([`combine`]).
pub async fn strict_min_isr_of(
    brokers: &[String],
    settings: &Settings,
    timeout: Duration,
) -> (StrictMinIsr, Option<String>) {
    let mut asking = tokio::task::JoinSet::new();
    for broker in brokers {
        let (broker, settings) = (broker.clone(), settings.clone());
        asking.spawn_blocking(move || {
            let answer = ask(&broker, &settings, timeout).map_err(|e| e.to_string());
            (broker, answer)
        });
    }
    let mut answers = Vec::with_capacity(brokers.len());
    while let Some(joined) = asking.join_next().await {
        match joined {
            Ok(answer) => answers.push(answer),
            Err(e) => answers.push(("?".to_owned(), Err(format!("the asking task failed: {e}")))),
        }
    }
    // In the metadata's order, so that the reason names brokers stably.
    answers.sort_by_key(|(broker, _)| brokers.iter().position(|b| b == broker));
    combine(&answers)
}

/// The cluster's answer from its brokers' answers: `No` as soon as one
/// broker runs a release before 3.7 (it may lead a partition), `Yes` when
/// every broker answered `Yes`, or when the others answered `Yes` and one
/// of them reports a finalized `metadata.version` of 3.7 or later (no
/// older release can be in the cluster), otherwise `Unknown` (treated as
/// no).
#[must_use]
pub fn combine(answers: &[(String, Result<Release, String>)]) -> (StrictMinIsr, Option<String>) {
    if answers.is_empty() {
        return (
            StrictMinIsr::Unknown,
            Some("the metadata listed no broker".to_owned()),
        );
    }
    let strict = |a: &Result<Release, String>| a.as_ref().ok().map(|r| r.strict);
    if let Some((broker, _)) = answers
        .iter()
        .find(|(_, a)| strict(a) == Some(StrictMinIsr::No))
    {
        return (
            StrictMinIsr::No,
            Some(format!(
                "broker {broker} runs a release before Kafka 3.7 (a rolling upgrade not \
                 finished?); it may lead a partition"
            )),
        );
    }
    let mut unanswered = Vec::new();
    // Whether a broker vouches for the silent ones, and whether all that
    // are not strict are silent.
    let (mut vouched, mut only_silent) = (false, true);
    for (broker, a) in answers {
        match a {
            Ok(r) if r.strict == StrictMinIsr::Yes => {
                vouched |= r.metadata_version >= Some(METADATA_VERSION_OF_3_7);
            }
            Ok(r) => {
                only_silent = false;
                unanswered.push(format!("{broker}: {}", r.strict));
            }
            Err(e) => unanswered.push(format!("{broker}: {e}")),
        }
    }
    if unanswered.is_empty() {
        (StrictMinIsr::Yes, None)
    } else if vouched && only_silent {
        tracing::info!(
            unanswered = %unanswered.join("; "),
            "brokers that did not answer run Kafka 3.7 or later: the cluster's finalized metadata.version is at 3.7 or later"
        );
        (StrictMinIsr::Yes, None)
    } else {
        (StrictMinIsr::Unknown, Some(unanswered.join("; ")))
    }
}

/// One broker's answer; blocking, each step bounded by `timeout`.
fn ask(server: &str, settings: &Settings, timeout: Duration) -> Result<Release, RequestError> {
    const CORRELATION_ID: i32 = 0x5752_4c59;
    let answer =
        Connection::open(server, settings, timeout)?.round_trip(&request(CORRELATION_ID))?;
    parse_response(&answer, CORRELATION_ID)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_request_is_api_versions_v3_with_header_v2() {
        let r = request(7);
        let version = env!("CARGO_PKG_VERSION");
        let mut want = vec![0, 18, 0, 3, 0, 0, 0, 7, 0, 8];
        want.extend_from_slice(b"walrelay");
        want.push(0); // header tags
        want.push(9);
        want.extend_from_slice(b"walrelay");
        want.push(version.len() as u8 + 1);
        want.extend_from_slice(version.as_bytes());
        want.push(0); // body tags
        assert_eq!(&r[..4], &(want.len() as i32).to_be_bytes());
        assert_eq!(&r[4..], &want[..]);
    }

    /// A v3 response listing Produce up to `produce_max` and ApiVersions,
    /// with a tagged field (the finalized features epoch) after them.
    fn response(correlation: i32, produce_max: i16) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&correlation.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.push(3); // 2 api keys
        for (key, max) in [(0i16, produce_max), (18, 4)] {
            b.extend_from_slice(&key.to_be_bytes());
            b.extend_from_slice(&0i16.to_be_bytes());
            b.extend_from_slice(&max.to_be_bytes());
            b.push(0);
        }
        b.extend_from_slice(&0i32.to_be_bytes()); // throttle
        b.push(1); // one tagged field: the finalized features epoch
        b.push(1);
        b.push(8);
        b.extend_from_slice(&5i64.to_be_bytes());
        b
    }

    /// [`response`] with the finalized features too, as Kafka 4.1.1 sends
    /// them (tag 2 after the epoch's tag 1): `metadata.version` at
    /// `metadata_version`, and one other feature.
    fn response_with_features(
        correlation: i32,
        produce_max: i16,
        metadata_version: i16,
    ) -> Vec<u8> {
        let mut b = response(correlation, produce_max);
        let tags = b.len() - 11;
        assert_eq!(b[tags], 1);
        b[tags] = 2;
        let mut features = vec![3]; // two features
        for (name, max) in [
            ("kraft.version", 1i16),
            ("metadata.version", metadata_version),
        ] {
            features.push(name.len() as u8 + 1);
            features.extend_from_slice(name.as_bytes());
            features.extend_from_slice(&max.to_be_bytes());
            features.extend_from_slice(&1i16.to_be_bytes()); // min level
            features.push(0);
        }
        b.push(2);
        b.push(features.len() as u8);
        b.extend_from_slice(&features);
        b
    }

    fn release(strict: StrictMinIsr, metadata_version: Option<i16>) -> Release {
        Release {
            strict,
            metadata_version,
        }
    }

    #[test]
    fn produce_v10_means_kafka_3_7_or_later() {
        let parsed = |r: &[u8]| parse_response(r, 7).map(|r| r.strict);
        assert_eq!(parsed(&response(7, 9)), Ok(StrictMinIsr::No));
        assert_eq!(parsed(&response(7, 10)), Ok(StrictMinIsr::Yes));
        assert_eq!(parsed(&response(7, 13)), Ok(StrictMinIsr::Yes));
    }

    #[test]
    fn the_finalized_metadata_version_is_read_from_the_tagged_fields() {
        assert_eq!(
            parse_response(&response(7, 13), 7),
            Ok(release(StrictMinIsr::Yes, None))
        );
        assert_eq!(
            parse_response(&response_with_features(7, 13, 26), 7),
            Ok(release(StrictMinIsr::Yes, Some(26)))
        );
        let ok = response_with_features(7, 13, 26);
        for cut in 4..ok.len() {
            assert!(parse_response(&ok[..cut], 7).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn an_old_broker_is_not_strict_and_garbage_is_an_error() {
        let mut old = 7i32.to_be_bytes().to_vec();
        old.extend_from_slice(&35i16.to_be_bytes());
        assert_eq!(parse_response(&old, 7), Ok(release(StrictMinIsr::No, None)));
        let ok = response(7, 11);
        assert!(parse_response(&ok, 8)
            .unwrap_err()
            .to_string()
            .contains("correlation"));
        for cut in 4..ok.len() {
            assert!(parse_response(&ok[..cut], 7).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn the_cluster_is_strict_only_when_every_broker_is() {
        let yes = |b: &str| (b.to_owned(), Ok(release(StrictMinIsr::Yes, None)));
        let no = |b: &str| (b.to_owned(), Ok(release(StrictMinIsr::No, None)));
        let err = |b: &str| (b.to_owned(), Err("connecting: refused".to_owned()));
        assert_eq!(
            combine(&[yes("a:1"), yes("b:1")]),
            (StrictMinIsr::Yes, None)
        );
        let (strict, why) = combine(&[yes("a:1"), no("b:1"), err("c:1")]);
        assert_eq!(strict, StrictMinIsr::No);
        assert!(why.unwrap().contains("b:1"));
        let (strict, why) = combine(&[yes("a:1"), err("c:1")]);
        assert_eq!(strict, StrictMinIsr::Unknown);
        assert!(why.unwrap().contains("c:1: connecting: refused"));
        assert_eq!(combine(&[]).0, StrictMinIsr::Unknown);
    }

    /// The chaos run's case: a relay restarted right after a broker was
    /// killed finds it still listed. A broker that reports the cluster's
    /// metadata.version at 3.7-IV0 or later vouches for it; an older
    /// level, or none, does not, and a broker before 3.7 still says no.
    #[test]
    fn a_finalized_metadata_version_of_3_7_vouches_for_a_broker_that_does_not_answer() {
        let at = |b: &str, level| (b.to_owned(), Ok(release(StrictMinIsr::Yes, level)));
        let err = |b: &str| (b.to_owned(), Err("connecting: refused".to_owned()));
        assert_eq!(
            combine(&[at("a:1", Some(26)), err("b:1"), at("c:1", None)]),
            (StrictMinIsr::Yes, None)
        );
        assert_eq!(
            combine(&[at("a:1", Some(METADATA_VERSION_OF_3_7)), err("b:1")]).0,
            StrictMinIsr::Yes
        );
        let (strict, why) = combine(&[at("a:1", Some(14)), err("b:1")]);
        assert_eq!(strict, StrictMinIsr::Unknown);
        assert!(why.unwrap().contains("b:1: connecting: refused"));
        assert_eq!(
            combine(&[at("a:1", None), err("b:1")]).0,
            StrictMinIsr::Unknown
        );
        assert_eq!(combine(&[err("a:1"), err("b:1")]).0, StrictMinIsr::Unknown);
        let old = ("c:1".to_owned(), Ok(release(StrictMinIsr::No, Some(26))));
        assert_eq!(
            combine(&[at("a:1", Some(26)), err("b:1"), old]).0,
            StrictMinIsr::No
        );
    }

    /// A fake broker that answers one ApiVersions request with Produce up
    /// to `produce_max`.
    async fn fake_broker(produce_max: i16) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let len = socket.read_i32().await.unwrap();
            let mut request = vec![0; usize::try_from(len).unwrap()];
            socket.read_exact(&mut request).await.unwrap();
            let correlation = i32::from_be_bytes(request[4..8].try_into().unwrap());
            let body = response(correlation, produce_max);
            socket
                .write_all(&i32::try_from(body.len()).unwrap().to_be_bytes())
                .await
                .unwrap();
            socket.write_all(&body).await.unwrap();
        });
        address
    }

    #[tokio::test]
    async fn a_broker_still_on_3_6_makes_the_cluster_not_strict() {
        let brokers = vec![fake_broker(10).await, fake_broker(9).await];
        let (strict, why) =
            strict_min_isr_of(&brokers, &Settings::plaintext(), Duration::from_secs(5)).await;
        assert_eq!(strict, StrictMinIsr::No, "{why:?}");
        assert!(why.unwrap().contains(&brokers[1]));
        let brokers = vec![fake_broker(10).await, fake_broker(11).await];
        let (strict, why) =
            strict_min_isr_of(&brokers, &Settings::plaintext(), Duration::from_secs(5)).await;
        assert_eq!((strict, why), (StrictMinIsr::Yes, None));
    }

    #[tokio::test]
    async fn a_login_walrelay_cannot_reproduce_leaves_the_answer_unknown_and_says_why() {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "GSSAPI");
        let setup = ClientSetup {
            config,
            login: crate::kafka::login::Login::none(),
        };
        let (strict, why) = cluster_strict_min_isr(&setup, Duration::from_millis(10)).await;
        assert_eq!(strict, StrictMinIsr::Unknown);
        let why = why.unwrap();
        assert!(
            why.contains("cannot connect") && why.contains("GSSAPI"),
            "{why}"
        );
    }
}
