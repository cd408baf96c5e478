//! A throwaway Prometheus server for `tests/ops_kit.rs`: Debian's
//! `prometheus` binary (scripts/install-prometheus.sh) on a free loopback
//! port with a data directory of its own, and its HTTP API over plain
//! HTTP/1.0 (no chunked bodies to decode).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// A binary on `PATH`, or an error naming the script that installs it
/// (never a skip).
pub fn installed(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{name} is not installed: scripts/install-prometheus.sh (run by scripts/test.sh's \
                 install stage) installs Debian's prometheus package"
            )
        })
}

/// A free port on the loopback interface, released for a child to bind.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// One GET, the whole body (HTTP/1.0: the server closes after it).
pub async fn get(addr: SocketAddr, path_and_query: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path_and_query} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let raw = String::from_utf8(raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no end of headers")?;
    let status = head.split(' ').nth(1).context("no status code")?.parse()?;
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query parameter's value.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A running server, killed on drop.
pub struct Prometheus {
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Prometheus {
    /// Starts `prometheus` with `config` (YAML) in `dir`.
    pub fn start(dir: &Path, config: &str) -> Result<Prometheus> {
        let binary = installed("prometheus")?;
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config)?;
        let addr = free_addr()?;
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting prometheus")?;
        Ok(Prometheus { addr, child, log })
    }

    /// The end of the server's log, for an error message.
    pub fn log_tail(&self) -> String {
        tail(&self.log, 20)
    }

    /// An error if the server exited.
    pub fn exited(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("prometheus exited ({status}):\n{}", self.log_tail());
        }
        Ok(())
    }

    /// `GET /api/v1/<what>`: its `data`, or an error with the server's.
    pub async fn api(&mut self, what: &str) -> Result<Value> {
        self.exited()?;
        let (code, body) = get(self.addr, &format!("/api/v1/{what}")).await?;
        let v: Value = serde_json::from_str(&body)
            .with_context(|| format!("HTTP {code} from /api/v1/{what}: {body}"))?;
        ensure!(
            v["status"] == "success",
            "/api/v1/{what}: HTTP {code}: {body}"
        );
        Ok(v["data"].clone())
    }

    /// An instant query's samples (`data.result`).
    pub async fn query(&mut self, promql: &str) -> Result<Vec<Value>> {
        let data = self.api(&format!("query?query={}", encode(promql))).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether an instant vector's sample has a finite value.
pub fn finite(sample: &Value) -> bool {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(f64::is_finite)
}
