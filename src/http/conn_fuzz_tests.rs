//! Fuzz of the HTTP/1.1 framing (`Conn::read_head`, `Conn::read_body`) with
//! requests from a grammar that spells every token the framing reacts to
//! (`tests/support/http_gen.rs`, shared with `tests/http_attacks.rs`), pipelined, fed through reads of 1 byte to 16 KiB
//! so a head or chunk line ends anywhere in a read. For a
//! generated case the framing must reach exactly the generator's verdict:
//! the same method, target, body and connection handling for each request
//! and then the end of the input (no byte left over or taken from the next
//! request), or the same refusal (400, 413, 431). For a mutated case it
//! must not panic, and never hand over a body past the limit.
//!
//! Cases: 200,000 by default; set `HTTP_FUZZ_CASES` for more,
//! `HTTP_FUZZ_SEED` to explore other inputs.

#[path = "../../tests/support/http_gen.rs"]
mod http_gen;
#[path = "../../tests/support/rng.rs"]
mod rng;

use std::time::{Duration, Instant};

use super::conn::tests::Mem;
use super::conn::{Conn, ReadError};
use http_gen::{case, Want, BODY_LIMIT};
use rng::Rng;

const CAPACITIES: [usize; 8] = [1, 2, 3, 5, 8, 17, 64, 16 * 1024];

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What the framing concluded for one request, in the generator's terms.
fn frame(c: &mut Conn<Mem<'_>>) -> Option<Want> {
    let second = Duration::from_secs(1);
    let head = match c.read_head(second, second, None) {
        Ok(h) => h,
        Err(ReadError::Closed) => return None,
        Err(e) => return Some(refusal(e)),
    };
    c.sock.sent.clear();
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = match c.read_body(&head, BODY_LIMIT, deadline) {
        Ok(b) => b.to_vec(),
        Err(e) => return Some(refusal(e)),
    };
    assert!(body.len() <= BODY_LIMIT, "a body past the limit was handed over");
    if let Some(n) = head.content_length {
        assert_eq!(body.len() as u64, n, "a body shorter or longer than its Content-Length");
    }
    let continue_sent = match c.sock.sent.as_slice() {
        b"" => false,
        b"HTTP/1.1 100 Continue\r\n\r\n" => true,
        other => panic!("wrote {:?} while reading a request", String::from_utf8_lossy(other)),
    };
    Some(Want::Ok { method: head.method, target: head.target, body, close: head.close, continue_sent })
}

fn refusal(e: ReadError) -> Want {
    match e {
        ReadError::Bad(_) => Want::Bad,
        ReadError::BodyTooLarge => Want::TooLarge,
        ReadError::HeadTooLarge => Want::HeadTooLarge,
        ReadError::Closed | ReadError::Io | ReadError::TimedOut => panic!("bytes in memory cannot fail so: {e:?}"),
    }
}

#[test]
fn the_framing_reaches_the_grammar_s_verdict_on_every_request() {
    let cases = env_u64("HTTP_FUZZ_CASES", 200_000);
    let mut rng = Rng::new(env_u64("HTTP_FUZZ_SEED", 7));
    let mut seen = std::collections::BTreeMap::<&str, u64>::new();
    for i in 0..cases {
        let c = case(&mut rng);
        let capacity = CAPACITIES[rng.below(CAPACITIES.len() as u64) as usize];
        let mut r = Conn::new(Mem { data: &c.bytes[..], cap: capacity, sent: Vec::new() });
        let show = || format!("case {i}: {:?}", String::from_utf8_lossy(&c.bytes));
        if c.wants == [Want::Any] {
            // At most one request per two bytes can be framed.
            for _ in 0..=c.bytes.len() / 2 {
                match frame(&mut r) {
                    Some(Want::Ok { close: false, .. }) => continue,
                    _ => break,
                }
            }
            *seen.entry("mutated").or_default() += 1;
            continue;
        }
        for want in &c.wants {
            let got = frame(&mut r);
            assert_eq!(got.as_ref(), Some(want), "{}", show());
            *seen.entry(label(want)).or_default() += 1;
        }
        if let Some(Want::Ok { close: false, .. }) = c.wants.last() {
            assert_eq!(frame(&mut r), None, "bytes left after the last request: {}", show());
        }
    }
    eprintln!("{cases} cases: {seen:?}");
    for kind in ["ok", "400", "413", "431", "mutated"] {
        assert!(seen.get(kind).is_some_and(|&n| n > 0) || cases < 1_000, "no {kind} case in {seen:?}");
    }
}

fn label(w: &Want) -> &'static str {
    match w {
        Want::Ok { .. } => "ok",
        Want::Bad => "400",
        Want::TooLarge => "413",
        Want::HeadTooLarge => "431",
        Want::Any => "mutated",
    }
}
