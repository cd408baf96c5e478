//! How the relay learns that it should stop: SIGTERM (service managers,
//! `kill`) or SIGINT (Ctrl-C), turned into a stop channel that `run`'s
//! pipeline and HTTP server watch, or awaited directly (`verify`).
//!
//! Its own module so that the commands that stop on a signal do not import
//! each other (or the CLI) for it.

use tokio::sync::watch;

/// Resolves on SIGTERM or SIGINT: how `run` and `verify` learn that they
/// should stop.
pub async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The stop channel of `walrelay run`: becomes `true` on the first SIGTERM
/// or SIGINT (logged, so the drain that follows is explained). Spawns the
/// task that waits for the signal; call inside a tokio runtime.
pub fn stop_on_signal() -> watch::Receiver<bool> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_stop_signal().await;
        tracing::info!("stop requested: draining");
        let _ = stop.send(true);
    });
    stopped
}
