//! `walrelay run --trace-file PATH` (hidden): the audit trace
//! ([`walrelay::engine::pipeline::Trace`]) appended to a file as JSON lines, for
//! fault-injection tests that run the real binary and kill it
//! (`crates/walrelay-chaos`).
//!
//! Lines are written in trace order, each batch with one `write` call and
//! no user-space buffering, so the file is always a prefix of the trace:
//! a `kill -9` loses at most the lines not yet written and a partial last
//! line. Every process starts with a newline and a `start` line, so a
//! partial line left by a killed process never merges with the next one.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::thread::JoinHandle;

use anyhow::Context;
use tokio::sync::mpsc;
use walrelay::engine::pipeline::{Trace, TraceSender};

/// Opens `path` for appending and starts the writer thread. The thread
/// ends when every sender is dropped, after writing what they sent.
pub fn spawn(path: &Path) -> anyhow::Result<(TraceSender, JoinHandle<()>)> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening the trace file {}", path.display()))?;
    file.write_all(format!("\n{{\"t\":\"start\",\"pid\":{}}}\n", std::process::id()).as_bytes())?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Trace>();
    let writer = std::thread::Builder::new()
        .name("trace-file".into())
        .spawn(move || {
            let mut buf = String::new();
            while let Some(t) = rx.blocking_recv() {
                line(&mut buf, &t);
                while buf.len() < 1 << 16 {
                    match rx.try_recv() {
                        Ok(t) => line(&mut buf, &t),
                        Err(_) => break,
                    }
                }
                if let Err(e) = file.write_all(buf.as_bytes()) {
                    tracing::error!("writing the trace file failed: {e}");
                    return;
                }
                buf.clear();
            }
        })?;
    Ok((tx, writer))
}

fn line(buf: &mut String, t: &Trace) {
    use std::fmt::Write as _;
    let _ = match t {
        Trace::SessionStarted {
            confirmed_flush_lsn,
        } => writeln!(
            buf,
            r#"{{"t":"session_started","confirmed":{}}}"#,
            confirmed_flush_lsn.0
        ),
        Trace::Produced {
            seq,
            key,
            topic,
            partition,
        } => writeln!(
            buf,
            r#"{{"t":"produced","seq":{seq},"key":"{}","topic":{},"partition":{partition}}}"#,
            key.to_hex(),
            serde_json::Value::from(topic.as_str())
        ),
        Trace::Acked {
            seq,
            key,
            partition,
            offset,
        } => writeln!(
            buf,
            r#"{{"t":"acked","seq":{seq},"key":"{}","partition":{partition},"offset":{offset}}}"#,
            key.to_hex()
        ),
        Trace::Confirmed { lsn } => writeln!(buf, r#"{{"t":"confirmed","lsn":{}}}"#, lsn.0),
        Trace::SessionEnded { error } => writeln!(
            buf,
            r#"{{"t":"session_ended","error":{}}}"#,
            error
                .as_deref()
                .map_or(serde_json::Value::Null, serde_json::Value::from)
        ),
    };
}
