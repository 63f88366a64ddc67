//! The optional admin token: a bearer token that requests changing what the
//! daemon listens to (`/register`, `/unregister`, `/register_peer`,
//! `/deregister_peer`) must carry when one is configured.
//!
//! Reads stay open: routers query without credentials and peers fetch
//! `/dump` for recovery without one. The token is compared in time that
//! depends only on its own length, never on how much of a guess matches,
//! and it is never printed: its `Debug` is redacted, and nothing logs it.

use std::fmt;

/// Longest token accepted, in bytes (a token is a shared secret, not a document).
pub const ADMIN_TOKEN_BYTES_MAX: usize = 4_096;

/// The `WWW-Authenticate` challenge sent with a 401.
pub const CHALLENGE: &str = "Bearer realm=\"kv-indexer\"";

/// The configured admin token.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(String);

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The 401 message for a request without `Authorization: Bearer`; says
/// what to send, never the token.
pub const MISSING: &str = "this endpoint needs the admin token: send \"Authorization: Bearer <token>\" (--admin-token)";
/// The 401 message for a bearer token that is not the configured one.
pub const WRONG: &str = "the bearer token is not the admin token (--admin-token)";

impl AdminToken {
    /// A token from the command line or environment: printable ASCII without
    /// spaces, 1..=`ADMIN_TOKEN_BYTES_MAX` bytes (what a header can carry).
    pub fn new(token: &str) -> Result<AdminToken, String> {
        if token.is_empty() || token.len() > ADMIN_TOKEN_BYTES_MAX {
            return Err(format!("the admin token must be 1 to {ADMIN_TOKEN_BYTES_MAX} bytes"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the admin token must be printable ASCII without spaces".into());
        }
        Ok(AdminToken(token.to_string()))
    }

    /// Checks an `Authorization` header value (`None`: no header); refused
    /// with the message of the 401 body, `MISSING` or `WRONG`.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), &'static str> {
        // The scheme is case-insensitive (RFC 9110); the token is not.
        let bearer =
            authorization.and_then(|v| v.trim().split_once(' ')).filter(|(s, _)| s.eq_ignore_ascii_case("bearer"));
        let (_, token) = bearer.ok_or(MISSING)?;
        if !constant_time_eq(token.trim_start().as_bytes(), self.0.as_bytes()) {
            return Err(WRONG);
        }
        Ok(())
    }
}

/// Whether `given == secret`, looking at every byte of `secret` whatever
/// `given` holds, so the time taken tells nothing about a partial match.
fn constant_time_eq(given: &[u8], secret: &[u8]) -> bool {
    let mut diff = (given.len() != secret.len()) as u8;
    for (i, &s) in secret.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!s);
        diff |= std::hint::black_box(g ^ s);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_checked() {
        let t = AdminToken::new("s3cret-Token").unwrap();
        assert_eq!(t.check(Some("Bearer s3cret-Token")), Ok(()));
        assert_eq!(t.check(Some("bearer  s3cret-Token ")), Ok(()));
        assert_eq!(t.check(None), Err(MISSING));
        assert_eq!(t.check(Some("Basic czNjcmV0")), Err(MISSING));
        assert_eq!(t.check(Some("Bearer")), Err(MISSING));
        assert_eq!(t.check(Some("Bearer  ")), Err(MISSING));
        for wrong in ["Bearer s3cret-token", "Bearer s3cret-Token2", "Bearer s3cret-Toke", "Bearer x"] {
            assert_eq!(t.check(Some(wrong)), Err(WRONG), "{wrong:?}");
        }
    }

    #[test]
    fn bad_tokens_are_refused_and_never_printed() {
        assert!(AdminToken::new("").is_err());
        assert!(AdminToken::new("has space").is_err());
        assert!(AdminToken::new(&"x".repeat(ADMIN_TOKEN_BYTES_MAX + 1)).is_err());
        let t = AdminToken::new("visible-nowhere").unwrap();
        assert!(!format!("{t:?}").contains("visible-nowhere"));
    }

    #[test]
    fn comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abd", b"abc"));
        assert!(!constant_time_eq(b"ab", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
    }
}
