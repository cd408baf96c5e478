//! Keeps [`LoopMetrics::parked_records`] at the count of the group's rows
//! in `walrelay_consumer_parked`: read when the loop starts and every
//! [`PARKED_REFRESH`] while it runs, on a connection of its own (one more
//! than the pool's), so that records re-driven by another process leave
//! the gauge too.

use std::convert::Infallible;
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_postgres::Client;

use crate::metrics::LoopMetrics;
use crate::pool::Database;

/// How often the loop reads the parked records' count.
pub const PARKED_REFRESH: Duration = Duration::from_secs(10);

/// Refreshes the gauge until dropped (the loop drops it when it ends).
/// A failed read keeps the last value, logs at DEBUG and reconnects at
/// the next tick: the batches report database outages.
pub(super) async fn refresh(database: Database, group: String, metrics: LoopMetrics) -> Infallible {
    let mut client: Option<Client> = None;
    let mut ticker = tokio::time::interval(PARKED_REFRESH);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if client.as_ref().is_none_or(Client::is_closed) {
            client = match database.connect().await {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::debug!("cannot read the parked records' count: {e}");
                    continue;
                }
            };
        }
        let Some(c) = &client else { continue };
        match crate::parked::count(c, &group).await {
            Ok(n) => {
                metrics.parked_records.set(n);
            }
            Err(e) => {
                tracing::debug!("cannot read the parked records' count: {e}");
                client = None;
            }
        }
    }
}
