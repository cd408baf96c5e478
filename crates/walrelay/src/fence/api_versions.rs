//! Whether the brokers hold the high watermark while a partition is under
//! its minimum in-sync set ([`StrictMinIsr`]): Kafka 3.7 and later do
//! (KAFKA-15583). A client learns a broker's release only from the API
//! versions it supports: 3.7 added Produce v10 (KIP-951), so a broker
//! whose Produce goes to v10 or beyond is 3.7 or later. librdkafka reads
//! the ApiVersions response but does not expose it, so walrelay sends its
//! own ApiVersions request (v3) to a bootstrap server.
//!
//! Kafka answers ApiVersions before authentication, so a plaintext
//! connection is enough on `PLAINTEXT` and `SASL_PLAINTEXT` listeners. On
//! TLS listeners walrelay does not probe and the answer is
//! [`StrictMinIsr::Unknown`], treated as no: a replicated topic with
//! `min.insync.replicas` >= 2 stays unfenced there (duplicates after a
//! crash, never a loss). A broker that is not Apache Kafka may report API
//! versions that say nothing of its high watermark; for the rule that
//! errs towards "no" unless it reports Produce v10.
//!
//! The encoding and decoding are pure functions ([`request`],
//! [`parse_response`]), tested byte for byte below.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::durability::StrictMinIsr;
use super::kafka_wire::Reader;

const PRODUCE: i16 = 0;
/// The first Produce version of Kafka 3.7, the first release with a strict
/// high watermark.
const PRODUCE_OF_3_7: i16 = 10;
const API_VERSIONS: i16 = 18;
const UNSUPPORTED_VERSION: i16 = 35;
/// The largest response walrelay reads (a broker's is about 1 KB).
const MAX_RESPONSE: usize = 1 << 20;

/// An ApiVersions v3 request with `correlation_id`, length-prefixed.
#[must_use]
pub fn request(correlation_id: i32) -> Vec<u8> {
    let mut body = Vec::with_capacity(48);
    body.extend_from_slice(&API_VERSIONS.to_be_bytes());
    body.extend_from_slice(&3i16.to_be_bytes());
    body.extend_from_slice(&correlation_id.to_be_bytes());
    // Header v2: client_id (a nullable string with an int16 length), then
    // no tagged fields.
    let client_id = b"walrelay";
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.push(0);
    // Body: client_software_name, client_software_version (compact
    // strings: length + 1 as an unsigned varint), no tagged fields.
    for s in ["walrelay", env!("CARGO_PKG_VERSION")] {
        put_uvarint(&mut body, s.len() as u64 + 1);
        body.extend_from_slice(s.as_bytes());
    }
    body.push(0);
    let mut framed = Vec::with_capacity(body.len() + 4);
    framed.extend_from_slice(&(body.len() as i32).to_be_bytes());
    framed.extend_from_slice(&body);
    framed
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// What an ApiVersions v3 response (without its length prefix) says: the
/// Produce API's version range tells the release. A broker too old for v3
/// (before 2.4) answers `UNSUPPORTED_VERSION`.
pub fn parse_response(bytes: &[u8], correlation_id: i32) -> Result<StrictMinIsr, String> {
    let mut r = Reader::new(bytes);
    let got = r.i32()?;
    if got != correlation_id {
        return Err(format!("correlation id {got}, expected {correlation_id}"));
    }
    let error = r.i16()?;
    if error == UNSUPPORTED_VERSION {
        return Ok(StrictMinIsr::No);
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
    r.skip_tags()?;
    match produce_max {
        Some(max) if max >= PRODUCE_OF_3_7 => Ok(StrictMinIsr::Yes),
        Some(_) => Ok(StrictMinIsr::No),
        None => Err("the broker lists no Produce API".to_owned()),
    }
}

/// Asks the bootstrap servers, one after the other, until one answers.
/// `Unknown`, with the reason, on a TLS listener or when none answered
/// within `timeout` (each).
pub async fn strict_min_isr(
    bootstrap_servers: &str,
    security_protocol: &str,
    timeout: Duration,
) -> (StrictMinIsr, Option<String>) {
    let protocol = security_protocol.to_ascii_lowercase();
    if protocol == "ssl" || protocol == "sasl_ssl" {
        return (
            StrictMinIsr::Unknown,
            Some(format!(
                "not asked over {security_protocol}: walrelay asks only plaintext listeners"
            )),
        );
    }
    let mut last = None;
    for server in bootstrap_servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let server = server
            .split_once("://")
            .map_or(server, |(_, address)| address);
        match tokio::time::timeout(timeout, ask(server)).await {
            Ok(Ok(strict)) => return (strict, None),
            Ok(Err(e)) => last = Some(format!("{server}: {e}")),
            Err(_) => last = Some(format!("{server}: no answer within {timeout:?}")),
        }
    }
    (
        StrictMinIsr::Unknown,
        Some(last.unwrap_or_else(|| "no bootstrap server".to_owned())),
    )
}

async fn ask(server: &str) -> Result<StrictMinIsr, String> {
    const CORRELATION_ID: i32 = 0x5752_4c59;
    let mut stream = TcpStream::connect(server)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    stream
        .write_all(&request(CORRELATION_ID))
        .await
        .map_err(|e| format!("sending ApiVersions: {e}"))?;
    let len = stream
        .read_i32()
        .await
        .map_err(|e| format!("reading the response: {e}"))?;
    let len = usize::try_from(len)
        .ok()
        .filter(|n| *n <= MAX_RESPONSE)
        .ok_or_else(|| format!("a response of {len} bytes"))?;
    let mut body = vec![0; len];
    stream
        .read_exact(&mut body)
        .await
        .map_err(|e| format!("reading the response: {e}"))?;
    parse_response(&body, CORRELATION_ID)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    /// with tagged fields (finalized features) after them.
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

    #[test]
    fn produce_v10_means_kafka_3_7_or_later() {
        assert_eq!(parse_response(&response(7, 9), 7), Ok(StrictMinIsr::No));
        assert_eq!(parse_response(&response(7, 10), 7), Ok(StrictMinIsr::Yes));
        assert_eq!(parse_response(&response(7, 13), 7), Ok(StrictMinIsr::Yes));
    }

    #[test]
    fn an_old_broker_is_not_strict_and_garbage_is_an_error() {
        let mut old = 7i32.to_be_bytes().to_vec();
        old.extend_from_slice(&35i16.to_be_bytes());
        assert_eq!(parse_response(&old, 7), Ok(StrictMinIsr::No));
        let ok = response(7, 11);
        assert!(parse_response(&ok, 8).unwrap_err().contains("correlation"));
        for cut in 4..ok.len() {
            assert!(parse_response(&ok[..cut], 7).is_err(), "cut at {cut}");
        }
    }

    #[tokio::test]
    async fn tls_listeners_are_not_asked() {
        let (strict, why) =
            strict_min_isr("127.0.0.1:1", "SASL_SSL", Duration::from_millis(10)).await;
        assert_eq!(strict, StrictMinIsr::Unknown);
        assert!(why.unwrap().contains("SASL_SSL"));
    }
}
