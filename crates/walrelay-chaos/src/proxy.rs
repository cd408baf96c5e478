//! A TCP proxy between every Kafka client and the broker, for broker
//! outages that keep the broker's data (Tansu's memory storage loses
//! everything on restart). The broker advertises the proxy's address, so
//! after bootstrapping every client connects through it.
//!
//! * [`ProxyMode::Up`]: bytes flow both ways.
//! * [`ProxyMode::Refuse`]: every open connection is closed, and new ones
//!   are closed as soon as they are accepted (clients see the broker
//!   disconnect, then fail to connect).
//! * [`ProxyMode::Stall`]: connections stay open but no byte moves, in
//!   either direction (a partition or a hung broker: requests time out).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Up,
    Refuse,
    Stall,
}

/// A running proxy; dropping it stops accepting (open connections end
/// with their peers).
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    upstream: UpstreamSetter,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1. Connections accepted before
    /// [`Proxy::upstream_setter`] sets the upstream wait for it.
    pub async fn bind() -> Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the broker proxy")?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(ProxyMode::Up);
        let (upstream, upstream_rx) = watch::channel(None);
        let task = tokio::spawn(accept_loop(listener, mode_rx, upstream_rx));
        Ok(Proxy {
            addr,
            mode,
            upstream: UpstreamSetter(Arc::new(upstream)),
            task,
        })
    }

    /// `127.0.0.1:PORT` of the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle that sets the upstream from another thread, e.g. from the
    /// broker's start-up, which must be forwarded to before it is ready.
    pub fn upstream_setter(&self) -> UpstreamSetter {
        self.upstream.clone()
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

/// Sets where a [`Proxy`] forwards to; connections accepted before the
/// first call wait for it.
#[derive(Clone)]
pub struct UpstreamSetter(Arc<watch::Sender<Option<SocketAddr>>>);

impl UpstreamSetter {
    pub fn set(&self, addr: SocketAddr) {
        self.0.send_replace(Some(addr));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    mode: watch::Receiver<ProxyMode>,
    upstream: watch::Receiver<Option<SocketAddr>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *mode.borrow() == ProxyMode::Refuse {
            drop(client);
            continue;
        }
        let mode = mode.clone();
        let mut upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(target) = upstream.wait_for(Option::is_some).await.map(|a| a.unwrap()) else {
                return;
            };
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            // When either direction ends, both sockets are dropped.
            tokio::select! {
                _ = pump(cr, sw, mode.clone()) => {}
                _ = pump(sr, cw, mode) => {}
            }
        });
    }
}

/// Copies `from` to `to` while the mode allows; returns (closing the
/// connection) on EOF, an error, or [`ProxyMode::Refuse`].
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Refuse => return,
            ProxyMode::Stall => {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            ProxyMode::Up => {}
        }
        tokio::select! {
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            read = from.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
