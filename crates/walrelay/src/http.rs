//! The observability endpoint of `walrelay run` (`--metrics-addr`):
//!
//! - `GET /metrics`: [`Metrics`] in the OpenMetrics text format;
//! - `GET /healthz`: 200 while the process runs;
//! - `GET /readyz`: 200 while the relay streams from the slot and Kafka is
//!   reachable, otherwise 503 with the reason ([`Metrics::readiness`]).
//!
//! Anything else is 404 (405 for another method on these paths). The
//! server is a small hyper HTTP/1.1 server on its own tasks: a slow or
//! stuck client never blocks the relay. [`KafkaProbe`] fetches Kafka's
//! metadata every few seconds on its own thread, so that an idle relay
//! still knows whether Kafka is reachable. See `docs/metrics.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rdkafka::producer::{BaseProducer, Producer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::kafka::client::{self as kafka_client, KafkaClient};
use crate::kafka::login::PlainContext;
use crate::kafka::properties::KafkaConfig;
use crate::metrics::{self, Metrics};

/// How often [`KafkaProbe`] asks Kafka for metadata.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one probe waits for Kafka's answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A running HTTP server (and its Kafka probe, if any).
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    probe: Option<KafkaProbe>,
}

impl HttpServer {
    /// Binds `addr` (port 0 picks a free port, see
    /// [`local_addr`](Self::local_addr)) and serves in the background. With
    /// a Kafka configuration, also starts a [`KafkaProbe`] reporting into
    /// `metrics`.
    pub async fn start(
        addr: SocketAddr,
        metrics: Metrics,
        kafka: Option<&KafkaConfig>,
    ) -> std::io::Result<HttpServer> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let probe = kafka.map(|k| KafkaProbe::start(k, metrics.clone()));
        let task = tokio::spawn(serve(listener, metrics, stop_rx));
        info!(%local_addr, "serving /metrics, /healthz and /readyz");
        Ok(HttpServer {
            local_addr,
            stop,
            task,
            probe,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, closes open connections and stops the probe.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        if let Some(p) = self.probe {
            p.stop().await;
        }
    }
}

async fn serve(listener: TcpListener, metrics: Metrics, mut stop: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.changed() => break,
            a = listener.accept() => a,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // E.g. too many open files: keep serving the others.
                warn!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| {
                let metrics = metrics.clone();
                async move { Ok::<_, Infallible>(respond(&metrics, &req)) }
            });
            let result = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = result {
                debug!(%peer, error = %e, "metrics endpoint: connection ended with an error");
            }
        });
    }
    // Dropping the set aborts the open connections.
    connections.shutdown().await;
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one request.
fn respond(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: use GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => {
            let mut r = text(StatusCode::OK, metrics.encode());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(metrics::CONTENT_TYPE),
            );
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        _ => match metrics.readiness() {
            Ok(()) => text(StatusCode::OK, "ready\n"),
            Err(reason) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}\n"),
            ),
        },
    }
}

/// Checks every [`PROBE_INTERVAL`] that Kafka answers a metadata request,
/// with the relay's Kafka settings (brokers, security), and reports the
/// outcome to [`Metrics::kafka_ok`] / [`Metrics::kafka_unreachable`].
///
/// It runs on its own thread (librdkafka calls block) with its own client,
/// which never produces anything.
#[derive(Debug)]
pub struct KafkaProbe {
    stop: std_mpsc::Sender<()>,
    /// Joined by [`KafkaProbe::stop`]: the process must not exit while the
    /// thread still holds its client. librdkafka's threads (TLS
    /// connections included) would then run on while the process's exit
    /// handlers tear down OpenSSL: a SIGSEGV instead of exit code 0 after
    /// SIGTERM, seen once in `tests/kafka_security.rs` (SASL_SSL).
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KafkaProbe {
    /// Starts probing at once.
    pub fn start(kafka: &KafkaConfig, metrics: Metrics) -> KafkaProbe {
        let kafka = kafka.clone();
        let (stop, stop_rx) = std_mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("walrelay-kafka-probe".into())
            .spawn(move || probe_loop(&kafka, &metrics, &stop_rx));
        let thread = match spawned {
            Ok(thread) => Some(thread),
            Err(e) => {
                warn!(error = %e, "cannot start the Kafka readiness probe");
                None
            }
        };
        KafkaProbe { stop, thread }
    }

    /// Ends the probe thread after its current probe (at most
    /// [`PROBE_TIMEOUT`]) and waits until it has dropped its client.
    pub async fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

/// The probe's librdkafka properties: the relay's producer settings
/// (brokers, security, secrets resolved) under its own client id, from the
/// one place that builds them for every client ([`kafka_client`]).
fn probe_client(kafka: &KafkaConfig) -> Result<Arc<BaseProducer<PlainContext>>, String> {
    kafka_client::client_config(kafka, KafkaClient::Probe)
        .map_err(|e| format!("cannot configure the Kafka client: {e}"))?
        .base_producer()
        .map_err(|e| format!("cannot create a Kafka client: {e}"))
}

fn probe_loop(kafka: &KafkaConfig, metrics: &Metrics, stop: &std_mpsc::Receiver<()>) {
    let mut client: Option<Arc<BaseProducer<PlainContext>>> = None;
    let mut was_ok: Option<bool> = None;
    loop {
        let outcome = match &client {
            Some(c) => probe_once(c),
            // Resolved each time a client is created, like the producer's:
            // a secret file that appears or rotates later is picked up.
            None => match probe_client(kafka) {
                Ok(c) => {
                    let outcome = probe_once(&c);
                    client = Some(c);
                    outcome
                }
                Err(reason) => Err(reason),
            },
        };
        match outcome {
            Ok(brokers) => {
                metrics.kafka_ok();
                if was_ok != Some(true) {
                    info!(brokers, "Kafka probe: brokers answer");
                }
                was_ok = Some(true);
            }
            Err(reason) => {
                if was_ok != Some(false) {
                    warn!(%reason, "Kafka probe failed: /readyz reports not ready");
                }
                metrics.kafka_unreachable(reason);
                was_ok = Some(false);
            }
        }
        match stop.recv_timeout(PROBE_INTERVAL) {
            Err(std_mpsc::RecvTimeoutError::Timeout) => {}
            // Stopped, or the server (holding the sender) is gone.
            Ok(()) | Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Number of brokers in the metadata, or why there is none.
fn probe_once(client: &BaseProducer<PlainContext>) -> Result<usize, String> {
    let result = client.client().fetch_metadata(None, PROBE_TIMEOUT);
    // Drain the client's event queue (errors, statistics): nobody else
    // polls this client.
    client.poll(Duration::ZERO);
    match result {
        Ok(m) if !m.brokers().is_empty() => Ok(m.brokers().len()),
        Ok(_) => Err("the metadata lists no brokers".into()),
        // The probe needs no ACL (metadata lists the brokers to anyone
        // who logs in); what it can meet is a refused login.
        Err(e) => Err(e
            .rdkafka_error_code()
            .and_then(|code| crate::kafka::acl::denied(code, "a metadata request", &[]))
            .map_or_else(
                || format!("metadata request failed: {e}"),
                |m| format!("metadata request failed: {m}"),
            )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn probe_properties(kafka: &KafkaConfig) -> Result<BTreeMap<String, String>, String> {
        kafka_client::properties(kafka, KafkaClient::Probe).map_err(|e| e.to_string())
    }

    #[test]
    fn probe_uses_the_relays_brokers_and_its_own_client_id() {
        let mut k = KafkaConfig {
            bootstrap_servers: "b:9092".into(),
            ..KafkaConfig::default()
        };
        let p = probe_properties(&k).unwrap();
        assert_eq!(p["bootstrap.servers"], "b:9092");
        assert_eq!(p["client.id"], "walrelay-probe");
        k.properties.insert("client.id".into(), "app".into());
        k.properties
            .insert("security.protocol".into(), "ssl".into());
        let p = probe_properties(&k).unwrap();
        assert_eq!(p["client.id"], "app-probe");
        assert_eq!(p["security.protocol"], "ssl");
    }

    /// The probe used to send `env:NAME` / `file:/path` to the broker as
    /// the password, so `/readyz` never turned ready with secret
    /// references.
    #[test]
    fn probe_resolves_secret_references() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\n").unwrap();
        let mut k = KafkaConfig {
            bootstrap_servers: "b:9092".into(),
            ..KafkaConfig::default()
        };
        k.properties
            .insert("security.protocol".into(), "sasl_plaintext".into());
        k.properties
            .insert("sasl.mechanisms".into(), "PLAIN".into());
        k.properties.insert("sasl.username".into(), "relay".into());
        k.properties
            .insert("sasl.password".into(), format!("file:{}", path.display()));
        let p = probe_properties(&k).unwrap();
        assert_eq!(p["sasl.password"], "s3cret");
        std::fs::remove_file(&path).unwrap();
        let reason = probe_properties(&k).unwrap_err();
        assert!(
            reason.contains("sasl.password") && reason.contains("cannot read the secret file"),
            "{reason}"
        );
    }
}
