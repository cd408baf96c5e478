//! The REST calls the runner needs on the worker's loopback listener:
//! `GET /connectors/<name>/status`, and for a distributed worker
//! `PUT /connectors/<name>/config` (creates the connector). HTTP/1.0
//! over a plain socket (the response is then never chunked and ends with
//! the connection), so the testkit needs no HTTP client.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one status request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The states Kafka Connect reports for a connector and its tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorStatus {
    /// `UNASSIGNED`, `RUNNING`, `PAUSED`, `FAILED`, `RESTARTING`, `STOPPED`.
    pub connector: String,
    /// Each task's state, by task id.
    pub tasks: Vec<TaskStatus>,
}

/// One task's state and, when it failed, Connect's trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskStatus {
    pub id: i64,
    pub state: String,
    pub trace: Option<String>,
}

impl ConnectorStatus {
    /// Whether the connector and all its tasks (at least one) run.
    pub fn running(&self) -> bool {
        self.connector == "RUNNING"
            && !self.tasks.is_empty()
            && self.tasks.iter().all(|t| t.state == "RUNNING")
    }

    /// The trace of the first failed task, or a note that the connector
    /// itself failed.
    pub fn failure(&self) -> Option<String> {
        if let Some(t) = self.tasks.iter().find(|t| t.state == "FAILED") {
            return Some(format!(
                "task {} FAILED: {}",
                t.id,
                t.trace.as_deref().unwrap_or("(no trace)")
            ));
        }
        (self.connector == "FAILED").then(|| "the connector FAILED".to_owned())
    }
}

/// The connector's status, `None` while the worker does not know it yet
/// (404: the connector is still being created) .
pub async fn connector_status(port: u16, name: &str) -> anyhow::Result<Option<ConnectorStatus>> {
    let (code, body) = tokio::time::timeout(
        REQUEST_TIMEOUT,
        get(port, &format!("/connectors/{name}/status")),
    )
    .await
    .context("the worker's REST API did not answer in time")??;
    match code {
        200 => parse_status(&body).map(Some),
        404 => Ok(None),
        other => bail!("GET /connectors/{name}/status: HTTP {other}: {body}"),
    }
}

/// Creates (or updates) connector `name` with `config` on a distributed
/// worker. Connect answers 201 (created) or 200 (updated); while the JVM
/// starts it does not listen, and while the worker joins its group it
/// answers 409 or 500: `Ok(Err(why))`, for the caller to retry. A
/// refused configuration (400) is an error.
pub async fn put_connector_config(
    port: u16,
    name: &str,
    config: &BTreeMap<String, String>,
) -> anyhow::Result<Result<(), String>> {
    let body = serde_json::to_string(config)?;
    let path = format!("/connectors/{name}/config");
    let answer = tokio::time::timeout(REQUEST_TIMEOUT, request(port, "PUT", &path, Some(&body)))
        .await
        .context("the worker's REST API did not answer in time")
        .and_then(|r| r);
    // Not listening yet, or no answer: the JVM is still starting.
    let (code, answer) = match answer {
        Ok(a) => a,
        Err(e) => return Ok(Err(format!("PUT {path}: {e:#}"))),
    };
    match code {
        200 | 201 => Ok(Ok(())),
        // 400: the configuration is refused (exactly.once.support=required
        // and a connector that does not support it): retrying cannot help.
        400 => bail!("PUT {path}: HTTP 400: {answer}"),
        other => Ok(Err(format!("PUT {path}: HTTP {other}: {answer}"))),
    }
}

async fn get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    request(port, "GET", path, None).await
}

async fn request(
    port: u16,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect((crate::HOST, port))
        .await
        .with_context(|| format!("connecting to the worker's REST API on port {port}"))?;
    let mut request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {}:{port}\r\nAccept: application/json\r\n",
        crate::HOST
    );
    if let Some(body) = json {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        request.push_str("\r\n");
    }
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("a malformed HTTP response: {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status code in {head:?}"))?;
    Ok((code, body.to_owned()))
}

fn parse_status(body: &str) -> anyhow::Result<ConnectorStatus> {
    let v: serde_json::Value =
        serde_json::from_str(body).with_context(|| format!("status is not JSON: {body}"))?;
    let connector = v["connector"]["state"]
        .as_str()
        .with_context(|| format!("no connector.state in {body}"))?
        .to_owned();
    let tasks = v["tasks"]
        .as_array()
        .map(|tasks| {
            tasks
                .iter()
                .map(|t| TaskStatus {
                    id: t["id"].as_i64().unwrap_or(-1),
                    state: t["state"].as_str().unwrap_or("?").to_owned(),
                    trace: t["trace"].as_str().map(str::to_owned),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(ConnectorStatus { connector, tasks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_connects_status() {
        let s = parse_status(
            r#"{"name":"dbz","connector":{"state":"RUNNING","worker_id":"127.0.0.1:8083"},
               "tasks":[{"id":0,"state":"RUNNING","worker_id":"127.0.0.1:8083"}],"type":"source"}"#,
        )
        .unwrap();
        assert!(s.running());
        assert_eq!(s.failure(), None);

        let s = parse_status(
            r#"{"name":"dbz","connector":{"state":"RUNNING"},
               "tasks":[{"id":0,"state":"FAILED","trace":"org.postgresql.util.PSQLException: boom"}]}"#,
        )
        .unwrap();
        assert!(!s.running());
        assert!(s.failure().unwrap().contains("PSQLException: boom"));

        let s = parse_status(r#"{"connector":{"state":"RUNNING"},"tasks":[]}"#).unwrap();
        assert!(!s.running(), "a connector without tasks is not streaming");
    }
}
