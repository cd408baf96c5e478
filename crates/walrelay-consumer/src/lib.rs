//! Exactly-once processing of walrelay records with one high-water mark per
//! partition instead of a table of every processed id.
//!
//! # The pattern
//!
//! The classic idempotent consumer ("inbox") stores the id of every message
//! it has processed and skips ids it has seen. walrelay's records make that
//! table unnecessary: every record carries a 128-bit idempotency key
//! (`idempotency-key` header) that strictly increases within each partition
//! in stream order, and a relay that replays after a crash repeats earlier
//! keys but never skips one. So a consumer only needs to remember the
//! highest key it has processed, its **high-water mark (HWM)**, one per
//! (consumer group, topic, partition, source), and:
//!
//! * processes a record only when its key is above the HWM, and
//! * stores the new HWM **in the same database transaction** as the
//!   record's side effects.
//!
//! Either both the side effects and the new HWM commit, or neither does.
//! A record redelivered later (after a relay replay, a consumer crash
//! between the database commit and the Kafka offset commit, or a
//! rebalance) has a key at or below the HWM and is skipped. The HWM row is
//! locked (`SELECT ... FOR UPDATE`) for the whole transaction, so two
//! consumers that get the same record at the same time (a rebalance in
//! progress) serialize on it: one processes, the other sees a duplicate.
//!
//! # Why it is safe
//!
//! * walrelay's producer is idempotent (`acks=all`, gapless), so within a
//!   session each partition receives the keys in order with no gaps, or
//!   the session fails.
//! * Partitioning is deterministic (a pure function of the record), so a
//!   replayed event lands in the same partition as its first copy.
//! * A new session replays from the slot's confirmed position, which is at
//!   or before the first event not yet acknowledged, and reproduces the same
//!   keys. So every key appears in its partition for the first time in
//!   increasing order; repeats only go backwards.
//!
//! # When it is not
//!
//! * **The partition count of a topic changed.** Keys move to other
//!   partitions, whose HWMs may already be above them: events are skipped.
//! * **The slot was dropped and recreated, or the database restored.**
//!   Positions restart. If the source name stays the same (a fixed
//!   `relay.source_id`), new keys are compared with old HWMs and skipped.
//!   Use a new source name (the default `<system id>/<database>/<slot>`
//!   changes with the cluster), or reset the HWMs with consumers stopped.
//! * **Keys from different sources are compared.** They are not comparable;
//!   this crate keeps one HWM per source, so do not rewrite
//!   `walrelay-source` on the way.
//! * **Side effects outside the transaction** (HTTP calls, e-mails) can
//!   happen more than once: only what the handler does through the
//!   transaction is exactly-once.
//!
//! # Gap detection
//!
//! Each record also carries its previous key (`walrelay-prev`, or
//! `walrelay-prev-key` with the full header set), the key the relay sent
//! before it to the same partition in the same session. If it is above the
//! HWM (and the HWM is not the initial 32 zeros), a record in between was
//! never processed: [`PgHwmStore::process`] and the batch transaction log a
//! warning and count it in [`Counters::gaps`], and still process the
//! record. This **can** detect
//! records missing in the middle of a session (deleted by retention before
//! the group read them, a consumer whose offsets were moved forward, a
//! broker that lost acknowledged data). It **cannot** detect:
//!
//! * a gap at the very start of a session, whose first record has an empty
//!   prev-key (nothing to compare with);
//! * a gap before the first record a group ever processes for a partition
//!   and source (the initial HWM is not compared, by choice: new groups
//!   routinely start mid-stream);
//! * loss of the last record(s) of a partition: nothing comes after them to
//!   carry their key;
//! * a gap the relay itself never knew of (an event it never sent, e.g.
//!   filtered by its configuration or a bug upstream of the prev-key
//!   bookkeeping).
//!
//! # Usage
//!
//! Install the tables once (idempotent: fine on every start), then let
//! [`ConsumerLoop`] do the Kafka side: batches per partition in one
//! transaction each, partitions in parallel, poison records retried and
//! then stopped or parked (see [`consumer_loop`]):
//!
//! ```no_run
//! use rdkafka::ClientConfig;
//! use tokio::sync::watch;
//! use walrelay_consumer::{migrate, ConsumerLoop, Database, Delivery, PgHwmStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let database = Database::from_dsn("host=127.0.0.1 user=app dbname=app")?;
//! migrate(&database.connect().await?).await?;
//!
//! let mut kafka = ClientConfig::new();
//! kafka
//!     .set("bootstrap.servers", "localhost:9092")
//!     .set("group.id", "billing");
//! let consumer = ConsumerLoop::new(kafka, &["orders"], PgHwmStore::new(), database)?;
//! let (_stop, shutdown) = watch::channel(false); // send(true) to stop
//! consumer
//!     .run_batches(
//!         async |tx: &tokio_postgres::Transaction<'_>, batch: &[Delivery<'_>]| {
//!             let keys: Vec<String> = batch.iter().map(|d| d.meta.key.to_hex()).collect();
//!             tx.execute(
//!                 "INSERT INTO invoices (event_key) SELECT unnest($1::text[])",
//!                 &[&keys],
//!             )
//!             .await?;
//!             Ok::<(), tokio_postgres::Error>(())
//!         },
//!         shutdown,
//!     )
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Without the loop (any Kafka client, or records from elsewhere):
//!
//! ```no_run
//! use walrelay_consumer::{Outcome, PgHwmStore, Position, RecordMeta};
//!
//! # async fn demo(
//! #     client: &mut tokio_postgres::Client,
//! #     headers: Vec<(&str, Option<&[u8]>)>,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgHwmStore::new();
//! let meta = RecordMeta::from_headers(headers)?;
//! let position = Position::new("billing", "orders", 0);
//! match store
//!     .process(client, &position, &meta, async |tx| {
//!         tx.execute("UPDATE totals SET n = n + 1", &[]).await
//!     })
//!     .await?
//! {
//!     Outcome::Processed(rows) => println!("applied, {rows} row(s)"),
//!     Outcome::Duplicate { hwm } => println!("already processed (hwm {hwm})"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Modules
//!
//! Each module imports only modules above it in this table, so the crate's
//! modules form no cycle and each can be read without those below it.
//!
//! | module | what it owns |
//! |---|---|
//! | `position` (private; its types are re-exported here and in [`store`]) | [`Position`], [`INITIAL_HWM`], [`HwmRow`]: which mark a record is checked against, its first value, a stored one. A leaf: imports nothing of the crate |
//! | [`meta`] | [`RecordMeta`]: a record's walrelay headers, parsed |
//! | [`settings`], [`metrics`], [`outage`], [`denied`], [`pool`] | the loop's settings, the store's [`Counters`] and the loop's metrics, which database errors are outages, the ACL a refusal by Kafka points to, database connections ([`Database`]) |
//! | [`delivery`] | [`Delivery`]: a record as the handlers see it |
//! | [`batch`] | which records of a batch are new, and its gaps: a pure decision |
//! | [`parked`] | the dead-letter table, and [`redrive`] |
//! | [`apply`] | the batch transaction: lock the marks, run the handler on what is new, raise the marks, the guard, `COMMIT` |
//! | [`store`] | [`PgHwmStore`] and [`HwmStore`]: the public ways into the batch transaction (a record alone, a batch, the loop's batches), with their counters; a façade over [`apply`] |
//! | [`consumer_loop`] | [`ConsumerLoop`]: Kafka, per-partition batches through the store, retries, poison records, rebalances |
//!
//! (The SQL they run is in a private module too, one statement per file
//! of `sql/consumer/`, shared with the Python package.)

pub mod apply;
pub mod batch;
pub mod consumer_loop;
pub mod delivery;
pub mod denied;
pub mod meta;
pub mod metrics;
pub mod outage;
pub mod parked;
pub mod pool;
mod position;
pub mod settings;
mod statements;
pub mod store;

pub use apply::{BatchError, BatchOutcome};
pub use consumer_loop::{ConfigError, ConsumerLoop, GroupProtocol, LoopError, StoppedPartition};
pub use delivery::Delivery;
pub use meta::{MetaError, RecordMeta};
pub use metrics::{Counters, CountersSnapshot, LoopMetrics, Phase, PhaseLabels};
pub use parked::{redrive, ParkUnkeyedError, RedriveReport};
pub use pool::Database;
pub use position::{HwmRow, Position, INITIAL_HWM};
pub use settings::{OnPoison, RetryPolicy, Settings};
pub use store::{HwmStore, Outcome, PgHwmStore, ProcessError};
/// The OAuth options librdkafka has no property for (AWS MSK IAM), for
/// [`ConsumerLoop::with_oauth`].
pub use walrelay_oauth::plan::{OAuthOptions, ProviderName};

/// The migration that creates the high-water mark table
/// (`sql/walrelay_consumer.sql`). Idempotent.
pub const MIGRATION: &str = include_str!("../../../sql/walrelay_consumer.sql");

/// Runs [`MIGRATION`]: creates `walrelay_consumer_hwm` and
/// `walrelay_consumer_parked` if they do not exist.
/// Safe to call on every start and from several consumers at once (a
/// concurrent `CREATE TABLE IF NOT EXISTS` that loses the race is retried
/// once).
pub async fn migrate(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    match client.batch_execute(MIGRATION).await {
        // Two sessions creating the table at once: one fails on the
        // catalog's unique index; by now the table exists.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            client.batch_execute(MIGRATION).await
        }
        other => other,
    }
}
