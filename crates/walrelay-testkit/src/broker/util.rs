//! Small helpers every broker backend uses: free ports, the workspace
//! root, killing a child, keeping a broker's directory, and blocking on
//! rdkafka's admin futures.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use anyhow::Context;

use crate::cluster::HOST;

/// Set to `1` to keep a broker's directory (its log and data) after it is
/// dropped; the path is printed to stderr.
pub const KEEP_BROKER_ENV: &str = "WALRELAY_KEEP_BROKER";

/// Whether [`KEEP_BROKER_ENV`] asks to keep brokers' directories.
pub(crate) fn keep_broker() -> bool {
    std::env::var(KEEP_BROKER_ENV)
        .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
        .unwrap_or(false)
}

/// The workspace root, from this crate's manifest directory.
pub(crate) fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Kills `child` (SIGKILL) unless it already exited, and reaps it.
pub(crate) fn kill_child(child: &mut Child) -> anyhow::Result<()> {
    if child.try_wait()?.is_none() {
        // Fails only if it exited in between; `wait` below reaps it anyway.
        let _ = child.kill();
    }
    child.wait().context("waiting for the broker to exit")?;
    Ok(())
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind((HOST, 0)).context("binding 127.0.0.1:0 to find a port")?;
    Ok(listener.local_addr()?.port())
}

/// The last `n` lines of `text`.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs a future to completion on the current thread. Enough for rdkafka's
/// admin futures, which are completed by the admin client's own thread and
/// need no runtime; usable whether or not a Tokio runtime is running.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
        }
    }
}
