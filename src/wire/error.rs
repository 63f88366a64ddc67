//! The one error type of the wire module: what was wrong with a message and
//! where, worded for an operator reading a log line or a listener's
//! `last_error`.

use std::fmt;

/// A message that cannot be decoded. Says what was expected and, for payload
/// errors, the byte offset where decoding stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireError {
    offset: Option<usize>,
    message: String,
}

impl WireError {
    /// An error about the message as a whole (frame shape, sizes).
    pub(crate) fn message(message: impl Into<String>) -> Self {
        Self { offset: None, message: message.into() }
    }

    /// An error at byte `offset` of the msgpack payload.
    pub(crate) fn at(offset: usize, message: impl Into<String>) -> Self {
        Self { offset: Some(offset), message: message.into() }
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(offset) => write!(f, "malformed KV event payload at byte {offset}: {}", self.message),
            None => write!(f, "malformed KV event message: {}", self.message),
        }
    }
}

impl std::error::Error for WireError {}
