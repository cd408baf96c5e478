//! The source side: what walrelay knows and checks of the PostgreSQL it
//! reads, beside the replication stream itself.
//!
//! [`publication`] says what the publication must contain and
//! [`monitor`] checks it while `run` runs; [`slot_record`] is what `setup`
//! remembers of the slot it made; [`published`] tells whether Kafka
//! already holds a source's records; [`slot_failover`] whether a failover
//! keeps what walrelay published; [`source_record`] keeps what each source
//! published in a compacted topic and detects a restore from it.

pub mod monitor;
pub mod publication;
pub mod published;
pub mod slot_failover;
pub mod slot_record;
pub mod source_record;
