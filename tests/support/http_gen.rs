//! A grammar of HTTP/1.1 requests for fuzzing the daemon's framing. It
//! spells every token the framing reacts to (methods, targets, versions,
//! line ends, blank lines before a request; Content-Length,
//! Transfer-Encoding, Expect, Connection and Authorization with valid and
//! invalid values and name spellings; chunk sizes with leading zeros, case,
//! extensions and sizes near and past 2^64; trailers), pipelines up to three
//! requests, and says for each what the framing must conclude, by the rules
//! of `src/http/conn.rs` restated here independently. A share of cases is
//! then mutated (bytes flipped, dictionary tokens inserted, ranges deleted
//! or repeated, truncation), for which only "no panic, no body past the
//! limit" is known.

use super::rng::Rng;

/// The body limit the fuzz runs with.
pub const BODY_LIMIT: usize = 64;

/// What the framing must conclude about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    /// Read whole: these parts, and whether the connection closes after it.
    Ok { method: String, target: String, body: Vec<u8>, close: bool, continue_sent: bool },
    /// Malformed (400).
    Bad,
    /// A body past the limit (413).
    TooLarge,
    /// A head past its limits (431).
    HeadTooLarge,
    /// Mutated: anything but a panic or a body past the limit.
    Any,
}

/// Bytes of up to three pipelined requests and what each must give; the
/// framing stops at the first that is not `Ok` or that closes.
pub struct Case {
    pub bytes: Vec<u8>,
    pub wants: Vec<Want>,
}

/// Tokens mutations insert.
const DICTIONARY: &[&str] = &[
    "\r\n",
    "\n",
    "\r",
    "\r\n\r\n",
    ":",
    ";",
    ",",
    " ",
    "\t",
    "0",
    "ffffffffffffffff",
    "FFFFFFFFFFFFFFFF",
    "10000000000000000",
    "18446744073709551616",
    "Content-Length: ",
    "Transfer-Encoding: chunked\r\n",
    "chunked",
    "identity",
    "Expect: 100-continue\r\n",
    "Connection: close\r\n",
    "keep-alive",
    "HTTP/1.1",
    "HTTP/1.0",
    "GET / HTTP/1.1\r\n\r\n",
    "0\r\n\r\n",
    "\0",
    "\u{7f}",
    "\u{ff}",
];

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

/// One of `items` that `ok` takes when `clean`, else any.
fn pick_if<'a, T>(rng: &mut Rng, items: &'a [T], clean: bool, ok: impl Fn(&T) -> bool) -> &'a T {
    loop {
        let item = pick(rng, items);
        if !clean || ok(item) {
            return item;
        }
    }
}

/// One of `items`, as bytes.
fn one<'a>(rng: &mut Rng, items: &[&'a [u8]]) -> &'a [u8] {
    items[rng.below(items.len() as u64) as usize]
}

/// The framing's verdict so far on one request's head.
#[derive(Default)]
struct Model {
    /// Only valid choices (a case meant to be framed).
    clean: bool,
    http11: bool,
    close: bool,
    length: Option<u64>,
    chunked: bool,
    expect_continue: bool,
    /// An Authorization header was written (a second is refused).
    authorization: bool,
    /// The first error in header order.
    error: Option<Want>,
    /// A syntax error: httparse refuses the head before any value is read.
    syntax_error: bool,
}

impl Model {
    fn fail(&mut self, want: Want) {
        self.error.get_or_insert(want);
    }
}

/// Content-Length values: (spelling, value; None: malformed; Some(None): past u64).
const LENGTHS: &[(&str, Option<Option<u64>>)] = &[
    ("0", Some(Some(0))),
    ("5", Some(Some(5))),
    ("00012", Some(Some(12))),
    ("64", Some(Some(64))),
    ("65", Some(Some(65))),
    ("18446744073709551615", Some(Some(u64::MAX))),
    ("18446744073709551616", Some(None)),
    ("99999999999999999999999", Some(None)),
    ("-1", None),
    ("+5", None),
    ("5,5", None),
    ("5, 5", None),
    ("0x10", None),
    ("1e3", None),
    ("", None),
    ("5 5", None),
];

/// Transfer-Encoding values: (spelling, codings in order).
const CODINGS: &[&str] = &[
    "chunked",
    "Chunked",
    "CHUNKED",
    "identity",
    "identity, chunked",
    "gzip",
    "chunked, gzip",
    "chunked,chunked",
    "chunked, identity",
    ",chunked",
    "x-custom",
];

fn apply_codings(m: &mut Model, value: &str) {
    for c in value.split(',').map(|c| c.trim_matches([' ', '\t'])) {
        if !m.chunked && c.eq_ignore_ascii_case("chunked") {
            m.chunked = true;
        } else if m.chunked || !c.eq_ignore_ascii_case("identity") {
            m.fail(Want::Bad);
        }
    }
}

/// One header line (without its line end), applied to the model.
fn header(rng: &mut Rng, m: &mut Model) -> Vec<u8> {
    let sep = *pick(rng, &[":", ": ", ":\t", ":  "]);
    let mut kind = if m.clean { *pick(rng, &[0, 1, 2, 3, 4, 5, 6, 8, 9]) } else { rng.below(10) };
    if kind == 6 && m.clean && m.authorization {
        // A clean case has one Authorization at most: another plain header instead.
        kind = 8;
    }
    let (name, value): (String, Vec<u8>) = match kind {
        0 | 1 => {
            let name = *pick(rng, &["Content-Length", "content-length", "CONTENT-LENGTH", "Content-length"]);
            let ok = |&(_, p): &(&str, Option<Option<u64>>)| p.flatten().is_some_and(|n| n <= BODY_LIMIT as u64);
            let &(text, parsed) = pick_if(rng, LENGTHS, m.clean, ok);
            match parsed {
                None => m.fail(Want::Bad),
                Some(None) => m.fail(Want::TooLarge),
                Some(Some(n)) => {
                    if m.length.is_some_and(|l| l != n) {
                        m.fail(Want::Bad);
                    }
                    m.length = Some(n);
                }
            }
            (name.into(), text.into())
        }
        2 | 3 => {
            let name = *pick(rng, &["Transfer-Encoding", "transfer-encoding", "TRANSFER-ENCODING"]);
            let value = *pick_if(rng, CODINGS, m.clean, |c| c.eq_ignore_ascii_case("chunked"));
            // Once chunked, a clean case names no other coding.
            let value = if m.clean && m.chunked { "identity" } else { value };
            apply_codings(m, value);
            (name.into(), value.into())
        }
        4 => {
            let value = *pick(rng, &["100-continue", "100-Continue", "200-ok", ""]);
            m.expect_continue = value.eq_ignore_ascii_case("100-continue");
            ("Expect".into(), value.into())
        }
        5 => {
            let value = *pick(rng, &["close", "keep-alive", "Keep-Alive, close", "upgrade", "", "x,close"]);
            for t in value.split(',').map(|t| t.trim()) {
                if t.eq_ignore_ascii_case("close") {
                    m.close = true;
                } else if t.eq_ignore_ascii_case("keep-alive") && !m.http11 {
                    m.close = false;
                }
            }
            ("Connection".into(), value.into())
        }
        6 => {
            let value: &[u8] = if m.clean { b"Bearer t" } else { one(rng, &[b"Bearer t", b"Basic x", b"\xff\xfe"]) };
            if std::str::from_utf8(value).is_err() || m.authorization {
                m.fail(Want::Bad);
            }
            m.authorization = true;
            ("Authorization".into(), value.into())
        }
        7 => {
            // Names httparse refuses: the head is malformed whatever follows.
            m.syntax_error = true;
            let name = *pick(rng, &["Content-Length ", "Transfer Encoding", "", " X", "X(y)"]);
            (name.into(), b"1".to_vec())
        }
        _ => {
            let &(name, value) = pick(
                rng,
                &[
                    ("Host", "localhost"),
                    ("Content-Type", "application/json"),
                    ("Trailer", "T"),
                    ("TE", "trailers"),
                    ("Keep-Alive", "timeout=5"),
                    ("X-Pad", "a b\tc \u{e9}"),
                ],
            );
            (name.into(), value.into())
        }
    };
    let mut out = name.into_bytes();
    out.extend_from_slice(sep.as_bytes());
    out.extend_from_slice(&value);
    out
}

/// Body bytes: anything, including what a confused parser could take for framing.
fn payload(rng: &mut Rng, n: usize) -> Vec<u8> {
    let alphabet = b"ab\r\n0;:GET /HTTP1.\xff";
    (0..n).map(|_| *pick(rng, alphabet)).collect()
}

/// A chunk size line for `size`: case, leading zeros, extension.
fn size_line(rng: &mut Rng, size: u64) -> Vec<u8> {
    let hex = if rng.chance(50) { format!("{size:x}") } else { format!("{size:X}") };
    let zeros = (rng.below(4) as usize).min(16 - hex.len());
    let ext = *pick(rng, &["", "", ";a", ";a=b", ";a=\"x;y\"", " ;a", "\t;a", ";"]);
    format!("{}{hex}{ext}\r\n", "0".repeat(zeros)).into_bytes()
}

/// A chunked body; returns its bytes and the verdict (the body when whole).
fn chunked(rng: &mut Rng, clean: bool) -> (Vec<u8>, Result<Vec<u8>, Want>) {
    let mut out = Vec::new();
    let mut body = Vec::new();
    for _ in 0..rng.below(5) {
        if !clean && rng.chance(8) {
            let (text, want) = pick(
                rng,
                &[
                    ("ffffffffffffffff\r\n", Want::TooLarge),
                    ("FFFFFFFFFFFFFFFF\r\n", Want::TooLarge),
                    ("8000000000000000\r\n", Want::TooLarge),
                    ("10000000000000000\r\n", Want::Bad),
                    ("zz\r\n", Want::Bad),
                    ("\r\n", Want::Bad),
                    ("-1\r\n", Want::Bad),
                    ("0x5\r\n", Want::Bad),
                    ("5\n", Want::Bad),
                    ("3 3\r\n", Want::Bad),
                ],
            );
            out.extend_from_slice(text.as_bytes());
            return (out, Err(want.clone()));
        }
        let size = 1 + rng.below(30);
        out.extend_from_slice(&size_line(rng, size));
        if body.len() as u64 + size > BODY_LIMIT as u64 {
            return (out, Err(Want::TooLarge));
        }
        let data = payload(rng, size as usize);
        out.extend_from_slice(&data);
        body.extend_from_slice(&data);
        out.extend_from_slice(one(rng, &[b"\r\n", b"\n"]));
    }
    out.extend_from_slice(one(rng, &[b"0\r\n", b"000\r\n", b"0;last\r\n"]));
    for _ in 0..rng.below(3) {
        if !clean && rng.chance(10) {
            out.extend_from_slice(b"no colon\r\n");
            return (out, Err(Want::Bad));
        }
        out.extend_from_slice(one(rng, &[b"T: 1\r\n", b"Content-Length: 5\n", b"X:\r\n"]));
    }
    out.extend_from_slice(one(rng, &[b"\r\n", b"\n"]));
    (out, Ok(body))
}

/// One request and its verdict.
fn request(rng: &mut Rng) -> (Vec<u8>, Want) {
    let clean = rng.chance(60);
    let mut out = Vec::new();
    if rng.chance(10) {
        out.extend_from_slice(one(rng, &[b"\r\n", b"\n", b"\r\n\r\n"]));
    }
    let &(method, method_ok) = pick_if(
        rng,
        &[("GET", true), ("POST", true), ("PUT", true), ("DELETE", true), ("get", true), ("G(T", false), ("", false)],
        clean,
        |&(_, ok)| ok,
    );
    // (target, httparse takes it, the framing takes it)
    let &(target, target_parses, target_ok) = pick_if(
        rng,
        &[
            ("/query", true, true),
            ("/health", true, true),
            ("/dump?x=1", true, true),
            ("/a%20b", true, true),
            ("*", true, false),
            ("http://x/", true, false),
            ("/a b", false, false),
        ],
        clean,
        |&(_, _, ok)| ok,
    );
    let &(version, http11) = pick_if(
        rng,
        &[
            ("HTTP/1.1", Some(true)),
            ("HTTP/1.1", Some(true)),
            ("HTTP/1.0", Some(false)),
            ("HTTP/2", None),
            ("http/1.1", None),
            ("HTTP/1.10", None),
        ],
        clean,
        |&(_, v)| v.is_some(),
    );
    let eol: &[u8] = one(rng, &[b"\r\n", b"\n"]);
    out.extend_from_slice(format!("{method} {target} {version}").as_bytes());
    out.extend_from_slice(eol);
    let mut m = Model { clean, http11: http11 == Some(true), close: http11 != Some(true), ..Model::default() };
    m.syntax_error = !method_ok || !target_parses || http11.is_none();
    if !target_ok {
        m.fail(Want::Bad);
    }
    let headers = if !clean && rng.chance(2) { 129 + rng.below(3) } else { rng.below(6) };
    for _ in 0..headers {
        if headers > 128 {
            out.extend_from_slice(b"X: 1");
        } else {
            out.extend_from_slice(&header(rng, &mut m));
        }
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(eol);
    if headers > 128 && !m.syntax_error {
        return (out, Want::HeadTooLarge);
    }
    if m.syntax_error {
        return (out, Want::Bad);
    }
    if m.chunked && m.length.is_some() {
        m.fail(Want::Bad);
    }
    if let Some(want) = m.error {
        return (out, want);
    }
    let continue_sent = m.expect_continue && (m.chunked || m.length.is_some_and(|n| n > 0));
    let ok = |body| Want::Ok { method: method.into(), target: target.into(), body, close: m.close, continue_sent };
    if m.chunked {
        let (bytes, verdict) = chunked(rng, clean);
        out.extend_from_slice(&bytes);
        return (out, verdict.map_or_else(|w| w, ok));
    }
    let n = m.length.unwrap_or(0);
    if n > BODY_LIMIT as u64 {
        return (out, Want::TooLarge);
    }
    let body = payload(rng, n as usize);
    out.extend_from_slice(&body);
    (out, ok(body))
}

/// Changes `bytes` a little, in one of several ways.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(bytes.len() as u64 + 1) as usize;
        match rng.below(5) {
            0 if at < bytes.len() => bytes[at] ^= 1 << rng.below(8),
            1 => {
                let token = pick(rng, DICTIONARY).as_bytes();
                bytes.splice(at..at, token.iter().copied());
            }
            2 => {
                let end = (at + 1 + rng.below(8) as usize).min(bytes.len());
                bytes.drain(at.min(end)..end);
            }
            3 => {
                let end = (at + 1 + rng.below(16) as usize).min(bytes.len());
                let copy = bytes[at.min(end)..end].to_vec();
                bytes.splice(at..at, copy);
            }
            _ => bytes.truncate(at),
        }
    }
}

/// One case: up to three pipelined requests, a quarter of them mutated.
pub fn case(rng: &mut Rng) -> Case {
    let mut bytes = Vec::new();
    let mut wants = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let (b, w) = request(rng);
        bytes.extend_from_slice(&b);
        let last = !matches!(w, Want::Ok { close: false, .. });
        wants.push(w);
        if last {
            break;
        }
    }
    if rng.chance(25) {
        mutate(rng, &mut bytes);
        wants = vec![Want::Any];
    }
    Case { bytes, wants }
}
