//! A tiny stateful wrapper around [`decode_with`].
//!
//! Whether a data message has a leading xid depends on whether it sits
//! between a Stream Start and a Stream Stop, which only the sequence of
//! messages tells. Forgetting to flip that bit would misparse every field
//! after the tag, so [`Decoder`] flips it itself as it sees those messages.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::message::{decode_with, DecodeOptions, PgOutputMessage};

/// Decodes a sequence of pgoutput messages from one replication session,
/// tracking streamed-transaction blocks.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    options: DecodeOptions,
}

impl Decoder {
    /// A decoder outside any streamed block, expecting the short Stream
    /// Abort form.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets whether the session uses `streaming = parallel` (protocol ≥ 4),
    /// in which Stream Abort carries an abort LSN and timestamp.
    #[must_use]
    pub fn with_parallel_streaming(mut self, parallel: bool) -> Self {
        self.options.parallel_streaming = parallel;
        self
    }

    /// `true` between a Stream Start and the following Stream Stop.
    #[must_use]
    pub fn in_stream(&self) -> bool {
        self.options.in_stream
    }

    /// Forgets any streamed block, e.g. after reconnecting.
    pub fn reset(&mut self) {
        self.options.in_stream = false;
    }

    /// Decodes the next message and updates the streamed-block state.
    ///
    /// A Stream Start inside a block or a Stream Stop outside one is
    /// [`DecodeError::UnexpectedStreamState`]; on any error the state is
    /// left unchanged.
    pub fn decode(&mut self, buf: Bytes) -> Result<PgOutputMessage, DecodeError> {
        let msg = decode_with(buf, self.options)?;
        match (&msg, self.options.in_stream) {
            (PgOutputMessage::StreamStart(_), false) => self.options.in_stream = true,
            (PgOutputMessage::StreamStop, true) => self.options.in_stream = false,
            (PgOutputMessage::StreamStart(_) | PgOutputMessage::StreamStop, in_stream) => {
                return Err(DecodeError::UnexpectedStreamState {
                    message: msg.kind(),
                    in_stream,
                })
            }
            _ => {}
        }
        Ok(msg)
    }
}
