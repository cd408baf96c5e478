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
//!
//! And, whatever the mode, [`Proxy::hold_open_connections`] stalls the
//! connections open now while new ones flow, until
//! [`Proxy::release_held`]: what a session's requests stuck on a dying
//! network path look like, delivered after the next session started.

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
    /// Connections numbered below it are held (0: none).
    held_below: watch::Sender<u64>,
    /// The number the next accepted connection gets.
    accepted: Arc<std::sync::atomic::AtomicU64>,
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
        let (held_below, held_rx) = watch::channel(0);
        let accepted = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let (upstream, upstream_rx) = watch::channel(None);
        let task = tokio::spawn(accept_loop(
            listener,
            Gates {
                mode: mode_rx,
                held_below: held_rx,
                id: 0,
            },
            Arc::clone(&accepted),
            upstream_rx,
        ));
        Ok(Proxy {
            addr,
            mode,
            held_below,
            accepted,
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

    /// Stalls every connection open now, in both directions (their bytes
    /// wait, unread, in the sockets), while connections accepted from now
    /// on flow as the mode says.
    pub fn hold_open_connections(&self) {
        let next = self.accepted.load(std::sync::atomic::Ordering::SeqCst);
        self.held_below.send_replace(next);
    }

    /// Lets the held connections go on: what their clients sent meanwhile
    /// (before closing them, too) reaches the broker now.
    pub fn release_held(&self) {
        self.held_below.send_replace(0);
    }
}

/// What a connection's pumps obey: the mode, and the hold.
#[derive(Clone)]
struct Gates {
    mode: watch::Receiver<ProxyMode>,
    held_below: watch::Receiver<u64>,
    /// This connection's number.
    id: u64,
}

impl Gates {
    /// The mode, or `Stall` while this connection is held.
    fn current(&mut self) -> ProxyMode {
        let held = self.id < *self.held_below.borrow_and_update();
        match *self.mode.borrow_and_update() {
            ProxyMode::Up if held => ProxyMode::Stall,
            mode => mode,
        }
    }

    /// Resolves when the mode or the hold changes; `false` once the proxy
    /// is gone.
    async fn changed(&mut self) -> bool {
        tokio::select! {
            m = self.mode.changed() => m.is_ok(),
            h = self.held_below.changed() => h.is_ok(),
        }
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
    gates: Gates,
    accepted: Arc<std::sync::atomic::AtomicU64>,
    upstream: watch::Receiver<Option<SocketAddr>>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *gates.mode.borrow() == ProxyMode::Refuse {
            drop(client);
            continue;
        }
        let mut gates = gates.clone();
        gates.id = accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
                _ = pump(cr, sw, gates.clone()) => {}
                _ = pump(sr, cw, gates) => {}
            }
        });
    }
}

/// Copies `from` to `to` while the mode allows; returns (closing the
/// connection) on EOF, an error, or [`ProxyMode::Refuse`].
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gates: Gates,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match gates.current() {
            ProxyMode::Refuse => return,
            ProxyMode::Stall => {
                if !gates.changed().await {
                    return;
                }
                continue;
            }
            ProxyMode::Up => {}
        }
        tokio::select! {
            changed = gates.changed() => {
                if !changed {
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
