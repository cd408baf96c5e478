//! The command line: `run`'s flags ([`cli`]), and the commands beside it:
//! [`setup`] (helpers, publication, slot), [`status`] (the slot, and with
//! `--kafka` the topics and the fence's verdict) and [`verify`] (read the
//! topics back and check what a consumer needs). `run` itself is the
//! [`engine`](crate::engine)'s pipeline.

pub mod cli;
pub mod setup;
pub mod status;
pub mod verify;
