//! What the API's request bodies and the `/dump` format share: the classes
//! a refused JSON body falls in, the request bodies' size check, and the
//! primitives that write JSON straight into a byte buffer.

pub(crate) mod out;

use std::fmt;

/// Why a request body was refused. Each maps to one HTTP status; the message
/// goes in `{"error": "..."}`, names the field and says what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Not well-formed JSON (HTTP 400).
    Malformed(String),
    /// Well-formed and well-typed, but a value is not acceptable (HTTP 400).
    Invalid(String),
    /// Well-formed JSON with a missing, duplicated or wrongly typed field (HTTP 422).
    Unprocessable(String),
    /// Longer than the endpoint takes (HTTP 413).
    TooLarge(String),
}

impl BodyError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> u16 {
        match self {
            BodyError::Malformed(_) | BodyError::Invalid(_) => 400,
            BodyError::Unprocessable(_) => 422,
            BodyError::TooLarge(_) => 413,
        }
    }

    /// The text for `{"error": ...}`.
    pub fn message(&self) -> &str {
        match self {
            BodyError::Malformed(m) | BodyError::Invalid(m) | BodyError::Unprocessable(m) | BodyError::TooLarge(m) => m,
        }
    }
}

/// What a parse came to, as tests name it: "ok" or the error's kind.
#[cfg(test)]
pub(crate) fn class<T>(r: Result<T, BodyError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(BodyError::Malformed(_)) => "malformed",
        Err(BodyError::Invalid(_)) => "invalid",
        Err(BodyError::Unprocessable(_)) => "unprocessable",
        Err(BodyError::TooLarge(_)) => "too large",
    }
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for BodyError {}

/// Refuses a request body longer than `max` before reading it.
pub(crate) fn check_size(body: &[u8], max: usize) -> Result<(), BodyError> {
    if body.len() > max {
        return Err(BodyError::TooLarge(format!("request body is {} bytes; the limit is {max}", body.len())));
    }
    Ok(())
}
