//! The dead-letter table `walrelay_consumer_parked`: where the `park`
//! poison policy puts records that keep failing, and how to re-drive them.
//!
//! A record with walrelay headers is parked in the transaction that raises
//! its partition's mark past it ([`crate::apply`]): either both commit or
//! neither does, so a parked record is never lost and never applied by
//! the loop as well. Its row is unique on its event (group, topic,
//! partition, source, key), not on its offset, which repeats when a topic
//! is recreated or a group fails over to a mirror; the same event parked
//! again updates its row, and the batch fails unless exactly one row was
//! written.
//!
//! A record without usable headers has no key and moves no mark; it is
//! parked on its own. Nothing walrelay wrote identifies it, so its row is
//! unique on (group, topic, partition, offset): an identical row there is
//! the same record delivered again, a different one means the offset was
//! reused, and the consumer refuses ([`ParkUnkeyedError::OffsetReused`])
//! rather than guess.
//!
//! [`redrive`] takes parked records of a group one at a time, runs the
//! handler on each in a transaction that also deletes its row, and commits:
//! a re-driven record is applied once and leaves the table in the same
//! commit. Rows are locked with `SKIP LOCKED`, so two re-drives at once
//! never take the same record.

use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::Timestamp;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};

use crate::delivery::Delivery;
use crate::meta::RecordMeta;
use crate::position::Position;
use crate::statements;

/// How many records `group` has parked (waiting for a re-drive), for the
/// `walrelay_consumer_parked_records` gauge ([`crate::LoopMetrics`]).
pub async fn count(client: &Client, group: &str) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one(statements::PARKED_COUNT, &[&group])
        .await?;
    Ok(row.get(0))
}

/// One record's fields as the table stores them.
struct Row<'a> {
    position: &'a Position,
    message: &'a OwnedMessage,
    key: Option<String>,
    source: Option<&'a str>,
}

async fn insert_row(
    tx: &Transaction<'_>,
    sql: &str,
    row: Row<'_>,
    error: &str,
    attempts: u32,
) -> Result<u64, tokio_postgres::Error> {
    let (names, values): (Vec<&str>, Vec<Option<&[u8]>>) = match row.message.headers() {
        Some(h) => h.iter().map(|h| (h.key, h.value)).unzip(),
        None => (Vec::new(), Vec::new()),
    };
    let offset = row.message.offset();
    let attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
    tx.execute_typed(
        sql,
        &[
            (&row.position.group, Type::TEXT),
            (&row.position.topic, Type::TEXT),
            (&row.position.partition, Type::INT4),
            (&offset, Type::INT8),
            (&row.key, Type::TEXT),
            (&row.source, Type::TEXT),
            (&row.message.key(), Type::BYTEA),
            (&row.message.payload(), Type::BYTEA),
            (&names, Type::TEXT_ARRAY),
            (&values, Type::BYTEA_ARRAY),
            (&error, Type::TEXT),
            (&attempts, Type::INT4),
        ],
    )
    .await
}

/// Parks a record with walrelay headers inside the batch transaction that
/// raises its mark. Returns the rows written (the caller fails the batch
/// unless it is 1).
pub(crate) async fn insert(
    tx: &Transaction<'_>,
    record: &Delivery<'_>,
    error: &str,
    attempts: u32,
) -> Result<u64, tokio_postgres::Error> {
    let row = Row {
        position: record.position,
        message: record.message,
        key: Some(record.meta.key.to_hex()),
        source: Some(&record.meta.source),
    };
    insert_row(tx, statements::PARKED_INSERT, row, error, attempts).await
}

/// Why a record without walrelay headers was not parked.
#[derive(Debug, thiserror::Error)]
pub enum ParkUnkeyedError {
    /// The database failed (nothing was parked).
    #[error("parking a record without walrelay headers: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// The table already holds a different record without headers at this
    /// offset: the offsets were reused, and nothing else identifies such a
    /// record, so the consumer refuses to guess.
    #[error(
        "record {topic}/{partition} at offset {offset} has no walrelay headers and the \
         dead-letter table already holds a different record without headers at that offset \
         for group {group:?}: the offsets were reused (topic recreated, or a mirror failover), \
         so nothing tells whether this record is parked. Nothing was parked and the partition \
         stops: save and delete the old row (walrelay_consumer_parked, idempotency_key IS \
         NULL, kafka_offset = {offset}), then restart"
    )]
    OffsetReused {
        /// The consumer group.
        group: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
    },
}

/// Parks a record without usable walrelay headers, in its own transaction.
/// Returns whether a row was written (false: the same record was parked
/// before); refuses when a different one is parked at its offset.
pub(crate) async fn insert_unkeyed(
    client: &mut Client,
    position: &Position,
    message: &OwnedMessage,
    error: &str,
) -> Result<bool, ParkUnkeyedError> {
    let tx = client.transaction().await?;
    let row = Row {
        position,
        message,
        key: None,
        source: None,
    };
    if insert_row(&tx, statements::PARKED_INSERT_UNKEYED, row, error, 1).await? == 1 {
        tx.commit().await?;
        return Ok(true);
    }
    let (names, values): (Vec<&str>, Vec<Option<&[u8]>>) = match message.headers() {
        Some(h) => h.iter().map(|h| (h.key, h.value)).unzip(),
        None => (Vec::new(), Vec::new()),
    };
    let offset = message.offset();
    let same = tx
        .query_typed_opt(
            statements::PARKED_SAME_UNKEYED,
            &[
                (&position.group, Type::TEXT),
                (&position.topic, Type::TEXT),
                (&position.partition, Type::INT4),
                (&offset, Type::INT8),
                (&message.key(), Type::BYTEA),
                (&message.payload(), Type::BYTEA),
                (&names, Type::TEXT_ARRAY),
                (&values, Type::BYTEA_ARRAY),
            ],
        )
        .await?
        .and_then(|r| r.get::<_, Option<bool>>(0));
    tx.commit().await?;
    if same == Some(true) {
        return Ok(false);
    }
    Err(ParkUnkeyedError::OffsetReused {
        group: position.group.clone(),
        topic: position.topic.clone(),
        partition: position.partition,
        offset,
    })
}

/// What a [`redrive`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedriveReport {
    /// Records applied and removed from the table.
    pub applied: u64,
    /// Records whose handler failed again (left in the table, with the
    /// attempt counted).
    pub failed: u64,
    /// Records without usable walrelay headers (left in the table: they
    /// need a person).
    pub unusable: u64,
}

/// Why a re-drive stopped.
#[derive(Debug, thiserror::Error)]
#[error("re-driving parked records: {0}")]
pub struct RedriveError(#[from] tokio_postgres::Error);

/// Applies the parked records of `group` through `handler`, oldest first,
/// each in its own transaction that also deletes its row. A record whose
/// handler fails again stays parked (its `attempts` and `error` updated)
/// and the re-drive goes on with the next one.
pub async fn redrive<E, H>(
    client: &mut Client,
    group: &str,
    mut handler: H,
) -> Result<RedriveReport, RedriveError>
where
    E: std::fmt::Display,
    H: AsyncFnMut(&Transaction<'_>, &Delivery<'_>) -> Result<(), E>,
{
    let mut report = RedriveReport::default();
    let mut after: i64 = 0;
    loop {
        let tx = client.transaction().await?;
        let Some(row) = tx
            .query_typed_opt(
                statements::PARKED_TAKE,
                &[(&group, Type::TEXT), (&after, Type::INT8)],
            )
            .await?
        else {
            tx.commit().await?;
            return Ok(report);
        };
        let id: i64 = row.get(0);
        after = id;
        let names: Vec<String> = row.get(6);
        let values: Vec<Option<Vec<u8>>> = row.get(7);
        let mut headers = OwnedHeaders::new_with_capacity(names.len());
        for (name, value) in names.iter().zip(&values) {
            headers = headers.insert(Header {
                key: name,
                value: value.as_deref(),
            });
        }
        let message = OwnedMessage::new(
            row.get::<_, Option<Vec<u8>>>(5),
            row.get::<_, Option<Vec<u8>>>(4),
            row.get(1),
            Timestamp::NotAvailable,
            row.get(2),
            row.get(3),
            Some(headers),
        );
        let meta = match message.headers().map(RecordMeta::from_kafka_headers) {
            Some(Ok(meta)) => meta,
            _ => {
                report.unusable += 1;
                tx.commit().await?;
                continue;
            }
        };
        let position = Position::new(group, message.topic(), message.partition());
        let delivery = Delivery {
            message: &message,
            meta: &meta,
            position: &position,
        };
        match handler(&tx, &delivery).await {
            Ok(()) => {
                tx.execute_typed(statements::PARKED_DELETE, &[(&id, Type::INT8)])
                    .await?;
                tx.commit().await?;
                report.applied += 1;
            }
            Err(e) => {
                drop(tx.rollback().await);
                client
                    .execute(
                        crate::statements::PARKED_FAILED_AGAIN,
                        &[&id, &e.to_string()],
                    )
                    .await?;
                tracing::warn!(
                    parked_id = id,
                    key = %meta.key,
                    "re-driving a parked record failed again: {e}"
                );
                report.failed += 1;
            }
        }
    }
}
