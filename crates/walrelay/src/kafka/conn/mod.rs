//! walrelay's own connections to one Kafka broker, for the two requests
//! librdkafka cannot send for it (the ApiVersions probe of
//! [`super::requests::api_versions`], the log-end ListOffsets of
//! [`super::requests::log_end`]).
//!
//! Such a connection goes where the producer goes and as the producer
//! does: over TLS when the producer's listener is `SSL` or `SASL_SSL`,
//! with the same certificate checks and client certificate, and
//! authenticated with the producer's SASL user (`PLAIN`, `SCRAM-SHA-256`,
//! `SCRAM-SHA-512`) or, for `OAUTHBEARER`, with a token from the relay's
//! token provider ([`Settings::from_client_config_with_tokens`]). Without this the fence would be off on every secured
//! cluster, the recommended production set-up, and each crash there would
//! write its replayed tail to the wire twice.
//!
//! Blocking: each step bounded by a timeout; async callers run it on a
//! blocking thread.
//!
//! * [`settings`]: the client's properties read into a plan (pure);
//! * [`tls`]: the plan's TLS half as a rustls configuration;
//! * [`sasl`]: Kafka's SASL framing (pure);
//! * [`scram`]: the SCRAM exchange (pure).

pub mod sasl;
pub mod scram;
pub mod settings;
mod tls;

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use settings::{Login, SaslPlan};

use super::RequestError;
use walrelay_oauth::TokenSource;

/// The largest response walrelay reads (its requests' answers are a few
/// hundred bytes to a few kilobytes).
const MAX_RESPONSE: usize = 1 << 20;

/// How walrelay's own connections reach the brokers of one client
/// configuration. Cheap to clone. `Debug` shows no secret.
#[derive(Clone)]
pub struct Settings {
    tls: Option<Arc<rustls::ClientConfig>>,
    sasl: Option<Arc<SaslPlan>>,
    /// Where an `OAUTHBEARER` login's token comes from.
    tokens: Option<Arc<dyn TokenSource>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tls", &self.tls.is_some())
            .field("sasl", &self.sasl.as_ref().map(|s| s.mechanism))
            .field("tokens", &self.tokens.is_some())
            .finish()
    }
}

impl Settings {
    /// Plain TCP, no authentication.
    #[must_use]
    pub fn plaintext() -> Settings {
        Settings {
            tls: None,
            sasl: None,
            tokens: None,
        }
    }

    /// The settings of a client made from `config` (resolved: secrets
    /// already read), or why walrelay cannot connect as it would. An
    /// `OAUTHBEARER` client needs its token provider: see
    /// [`from_client_config_with_tokens`](Self::from_client_config_with_tokens).
    pub fn from_client_config(config: &rdkafka::ClientConfig) -> Result<Settings, RequestError> {
        Settings::from_client_config_with_tokens(config, None)
    }

    /// [`from_client_config`](Self::from_client_config), an `OAUTHBEARER`
    /// login taking its tokens from `tokens` (the relay's
    /// [`TokenCache`](walrelay_oauth::TokenCache), shared with every other
    /// user so that a connection does not fetch a token of its own).
    pub fn from_client_config_with_tokens(
        config: &rdkafka::ClientConfig,
        tokens: Option<Arc<dyn TokenSource>>,
    ) -> Result<Settings, RequestError> {
        let plan = settings::plan(|key| config.get(key)).map_err(RequestError::Unsupported)?;
        if plan
            .sasl
            .as_ref()
            .is_some_and(|s| s.login == Login::Token && tokens.is_none())
        {
            return Err(RequestError::Unsupported(
                "SASL mechanism OAUTHBEARER without walrelay's token provider".to_owned(),
            ));
        }
        Ok(Settings {
            tls: plan
                .tls
                .as_ref()
                .map(tls::client_config)
                .transpose()
                .map_err(RequestError::Unsupported)?,
            sasl: plan.sasl.map(Arc::new),
            tokens,
        })
    }

    /// The same, without authenticating: brokers answer ApiVersions
    /// before SASL (KIP-35), so a probe needs no credentials.
    #[must_use]
    pub fn without_sasl(&self) -> Settings {
        Settings {
            tls: self.tls.clone(),
            sasl: None,
            tokens: None,
        }
    }
}

/// A connected (and, with SASL, authenticated) broker connection.
pub struct Connection {
    stream: Transport,
    server: String,
}

enum Transport {
    Tcp(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Tcp(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

impl Connection {
    /// Connects to `server` (`host:port`), handshakes TLS and
    /// authenticates as `settings` say; each read and write bounded by
    /// `timeout`. Errors name the server and the step.
    pub fn open(
        server: &str,
        settings: &Settings,
        timeout: Duration,
    ) -> Result<Connection, RequestError> {
        Connection::establish(server, settings, timeout).map_err(RequestError::Connection)
    }

    fn establish(
        server: &str,
        settings: &Settings,
        timeout: Duration,
    ) -> Result<Connection, String> {
        let tcp = connect(server, timeout)?;
        let stream = match &settings.tls {
            None => Transport::Tcp(tcp),
            Some(config) => {
                let host = host_of(server);
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|_| format!("{server}: {host} is not a TLS server name"))?;
                let tls = rustls::ClientConnection::new(config.clone(), name)
                    .map_err(|e| format!("{server}: starting TLS: {e}"))?;
                Transport::Tls(Box::new(rustls::StreamOwned::new(tls, tcp)))
            }
        };
        let mut connection = Connection {
            stream,
            server: server.to_owned(),
        };
        if let Some(sasl) = &settings.sasl {
            connection
                .authenticate(sasl, settings.tokens.as_deref())
                .map_err(|e| format!("{server}: {e}"))?;
        }
        Ok(connection)
    }

    /// Sends `request` (length-prefixed) and returns the response without
    /// its length prefix.
    pub fn round_trip(&mut self, request: &[u8]) -> Result<Vec<u8>, RequestError> {
        self.send(request).map_err(RequestError::Connection)
    }

    /// [`round_trip`](Self::round_trip), its error as text (the SASL
    /// exchange prefixes it with the server).
    fn send(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        let server = &self.server;
        self.stream
            .write_all(request)
            .and_then(|()| self.stream.flush())
            .map_err(|e| format!("{server}: sending: {e}"))?;
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .map_err(|e| format!("{server}: reading the response: {e}"))?;
        let len = i32::from_be_bytes(len);
        let len = usize::try_from(len)
            .ok()
            .filter(|n| *n <= MAX_RESPONSE)
            .ok_or_else(|| format!("{server}: a response of {len} bytes"))?;
        let mut body = vec![0; len];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| format!("{server}: reading the response: {e}"))?;
        Ok(body)
    }

    fn authenticate(
        &mut self,
        sasl: &SaslPlan,
        tokens: Option<&dyn TokenSource>,
    ) -> Result<(), String> {
        use sasl::{authenticate_request, parse_authenticate, Mechanism};
        let handshake = self.send(&sasl::handshake_request(1, sasl.mechanism))?;
        sasl::parse_handshake(&handshake, 1, sasl.mechanism)?;
        let (username, password) = match &sasl.login {
            Login::Password { username, password } => (username, password),
            Login::Token => {
                let tokens = tokens.ok_or("SASL OAUTHBEARER without a token provider")?;
                return self.bearer(tokens);
            }
        };
        let hash = match sasl.mechanism {
            Mechanism::Plain => {
                let message = sasl::plain_message(username, password);
                let answer = self.send(&authenticate_request(2, &message))?;
                return parse_authenticate(&answer, 2).map(drop);
            }
            Mechanism::ScramSha256 => scram::Hash::Sha256,
            Mechanism::ScramSha512 => scram::Hash::Sha512,
            Mechanism::OAuthBearer => return Err("OAUTHBEARER with a password".to_owned()),
        };
        let mut exchange = scram::Scram::new(hash, username, password, scram::random_nonce()?);
        let answer = self.send(&authenticate_request(2, &exchange.client_first()))?;
        let server_first = parse_authenticate(&answer, 2)?;
        let client_final = exchange.client_final(&server_first)?;
        let answer = self.send(&authenticate_request(3, &client_final))?;
        exchange.verify_server_final(&parse_authenticate(&answer, 3)?)
    }

    /// The OAUTHBEARER exchange (RFC 7628): the token and its extensions
    /// in one message; an empty answer is success. A refusal carries the
    /// broker's error, which the client acknowledges with a lone
    /// separator (the broker then fails the exchange, saying nothing
    /// more), so the error reported is the broker's first answer.
    fn bearer(&mut self, tokens: &dyn TokenSource) -> Result<(), String> {
        use sasl::{authenticate_request, parse_authenticate};
        let token = tokens.token().map_err(|e| e.to_string())?;
        let message = sasl::oauthbearer_message(token.value.expose(), token.extensions.iter())?;
        let answer = self.send(&authenticate_request(2, &message))?;
        let challenge = parse_authenticate(&answer, 2)?;
        if let Err(refused) = sasl::parse_oauthbearer_answer(&challenge) {
            let _ = self.send(&authenticate_request(3, sasl::OAUTHBEARER_ABORT));
            return Err(refused);
        }
        Ok(())
    }
}

/// A TCP connection to the first of `server`'s addresses that accepts
/// within `timeout`, with read and write timeouts set.
fn connect(server: &str, timeout: Duration) -> Result<TcpStream, String> {
    let addrs = server
        .to_socket_addrs()
        .map_err(|e| format!("resolving {server}: {e}"))?;
    let mut last = format!("{server} resolves to no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream
                    .set_read_timeout(Some(timeout))
                    .and_then(|()| stream.set_write_timeout(Some(timeout)))
                    .and_then(|()| stream.set_nodelay(true))
                    .map_err(|e| format!("{server}: {e}"))?;
                return Ok(stream);
            }
            Err(e) => last = format!("connecting to {server}: {e}"),
        }
    }
    Err(last)
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host_of(server: &str) -> &str {
    let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod bearer_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_what_precedes_the_port() {
        assert_eq!(host_of("kafka-1.example.com:9093"), "kafka-1.example.com");
        assert_eq!(host_of("[::1]:9093"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }

    #[test]
    fn debug_shows_neither_the_user_nor_the_password() {
        let mut config = rdkafka::ClientConfig::new();
        config
            .set("security.protocol", "SASL_PLAINTEXT")
            .set("sasl.mechanism", "SCRAM-SHA-256")
            .set("sasl.username", "relay")
            .set("sasl.password", "pw-never-shown");
        let settings = Settings::from_client_config(&config).unwrap();
        let text = format!("{settings:?}");
        assert!(
            text.contains("ScramSha256") && !text.contains("pw-never-shown"),
            "{text}"
        );
        assert!(settings.without_sasl().sasl.is_none());
    }
}
