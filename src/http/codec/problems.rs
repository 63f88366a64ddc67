//! What went wrong with a request body, sorted by class.
//!
//! Parsers record type and value problems as they scan and keep going, so
//! a syntax error later in the body still wins; at the end the class is
//! chosen by rank (malformed, then unprocessable, then invalid), never by
//! field order, and the message is the first problem of that class.

use super::scan::SResult;
use super::BodyError;

/// Problems found while scanning, kept by class so the reported class does
/// not depend on field order (see the module rules in `codec`).
#[derive(Default)]
pub(super) struct Problems {
    unprocessable: Option<String>,
    invalid: Option<String>,
}

impl Problems {
    pub fn unprocessable(&mut self, message: impl FnOnce() -> String) {
        if self.unprocessable.is_none() {
            self.unprocessable = Some(message());
        }
    }

    pub fn invalid(&mut self, message: impl FnOnce() -> String) {
        if self.invalid.is_none() {
            self.invalid = Some(message());
        }
    }

    /// Records a second occurrence of a known field; true if this is the first.
    pub fn first(&mut self, seen: &mut u32, bit: u32, name: &str) -> bool {
        if *seen & bit != 0 {
            self.unprocessable(|| format!("duplicate field `{name}`"));
            return false;
        }
        *seen |= bit;
        true
    }

    /// The outcome once the whole body was scanned without a syntax error.
    pub fn result(self) -> Result<(), BodyError> {
        if let Some(m) = self.unprocessable {
            return Err(BodyError::Unprocessable(m));
        }
        if let Some(m) = self.invalid {
            return Err(BodyError::Invalid(m));
        }
        Ok(())
    }
}

/// Turns the scanner's outcome into the endpoint's error, syntax first.
pub(super) fn finish(scanned: SResult<bool>, mut problems: Problems, what: &str) -> Result<(), BodyError> {
    match scanned {
        Err(syntax) => Err(BodyError::Malformed(syntax.message())),
        Ok(false) => {
            problems.unprocessable = Some(format!("the body must be a JSON object ({what})"));
            problems.result()
        }
        Ok(true) => problems.result(),
    }
}

/// Merges the two spellings of the tenant: both given must agree.
pub(super) fn tenant<T: AsRef<str>>(
    tenant_id: Option<T>,
    routing_group: Option<T>,
    problems: &mut Problems,
) -> Option<T> {
    match (tenant_id, routing_group) {
        (Some(t), Some(g)) => {
            if t.as_ref() != g.as_ref() {
                problems.invalid(|| {
                    format!(
                        "`tenant_id` ({:?}) and `routing_group` ({:?}) name the same field and disagree; send one",
                        t.as_ref(),
                        g.as_ref()
                    )
                });
            }
            Some(t)
        }
        (t, g) => t.or(g),
    }
}
