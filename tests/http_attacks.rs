//! The HTTP front under attack, over real sockets to the real binary: no
//! request, and no way of sending one, may take the API down. Each test
//! runs with a handful of connection slots and ends by asking `/health`,
//! which must answer 200.
//!
//! - Chunk sizes past 2^64 or summing past it: 413 (or 400), never a panic
//!   that would keep the connection's slot.
//! - More slow clients than slots, each sending its head a byte at a time
//!   (or a body, or nothing): they lose their slots at the deadline.
//! - Requests from the framing grammar, mutated or not, pipelined.
//! - Bodies nested to the limit and far past it, on the connection
//!   threads' small stacks: answered, 400 past the limit.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::daemon::Daemon;
use support::http_gen::{case, Want};
use support::rng::Rng;
use support::wait_until;

/// Sends `bytes`, ends the write side, and reads everything the server answers.
fn exchange(d: &Daemon, bytes: &[u8]) -> String {
    // A refused connection lingers a little after its answer, holding its
    // slot: under a small cap, a quick next client may find none free and be
    // told to retry. That answer is the cap's, not the framing's: retry.
    for _ in 0..200 {
        let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // The server may refuse before reading everything; what it answered still counts.
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let answer = read_all(&mut s);
        if !answer.contains("too many open connections") {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no connection slot came free in 4 s");
}

/// Everything readable until the server closes (a reset ends it too).
fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the answer: {e} (after {:?})", String::from_utf8_lossy(&out)),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Status codes of the replies in `text`, interim 100s left out.
fn statuses(text: &str) -> Vec<u16> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(line_end) = rest.find("\r\n") {
        let status: u16 = rest[..line_end].split(' ').nth(1).and_then(|s| s.parse().ok()).expect(text);
        let head_end = rest.find("\r\n\r\n").expect(text) + 4;
        let head = &rest[..head_end];
        let length =
            head.lines().find_map(|l| l.strip_prefix("Content-Length: ")).map_or(0, |n| n.parse::<usize>().unwrap());
        if status != 100 {
            out.push(status);
        }
        rest = &rest[(head_end + length).min(rest.len())..];
        // A streamed reply (`/dump`): chunks, up to the empty one.
        if head.lines().any(|l| l == "Transfer-Encoding: chunked") {
            while let Some(size_end) = rest.find("\r\n") {
                let size = usize::from_str_radix(&rest[..size_end], 16).expect(text);
                rest = &rest[(size_end + 2 + size + 2).min(rest.len())..];
                if size == 0 {
                    break;
                }
            }
        }
    }
    out
}

fn health(d: &Daemon) -> u16 {
    d.get("/health").0
}

#[test]
fn chunk_sizes_past_two_to_the_64_never_take_the_api_down() {
    let d = Daemon::start(&["--http-connections-max", "4"]);
    let head = "POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    let attacks = [
        // The sum of sizes wraps: what used to panic the connection thread.
        ("1\r\na\r\nffffffffffffffff\r\n", 413),
        ("2\r\nab\r\nFFFFFFFFFFFFFFFE\r\n", 413),
        ("ffffffffffffffff\r\n", 413),
        ("8000000000000000;ext=1\r\n", 413),
        ("10000000000000000\r\n", 400),
        ("0000000000000000f\r\n", 400),
    ];
    // Twice as many attacks as slots, each on its own connection.
    for round in 0..2 {
        for (body, want) in attacks {
            let answer = exchange(&d, format!("{head}{body}").as_bytes());
            assert_eq!(statuses(&answer), vec![want], "round {round}, {body:?}: {answer}");
            assert!(answer.contains(r#"{"error":""#), "a JSON error: {answer}");
        }
    }
    let huge = "POST /query HTTP/1.1\r\nContent-Length: 18446744073709551616\r\n\r\n";
    assert_eq!(statuses(&exchange(&d, huge.as_bytes())), vec![413]);
    let refused = r#"kv_indexer_http_heads_refused_total{status="413"}"#;
    assert_eq!(support::truth_check::metric(&d, refused), 1, "a length past u64 is refused at the head");
    assert_eq!(health(&d), 200, "the API is still up");
}

#[test]
fn bodies_nested_to_the_limit_and_past_it_are_answered() {
    let d = Daemon::start(&["--http-connections-max", "4"]);
    // A connection's slot comes back once its thread has ended, a moment
    // after the client read the reply: on a busy machine the next request
    // may find all four still taken. A slot that never came back would
    // keep this at 503 past the deadline.
    let post = |path: &str, body: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, answer) = d.post(path, body);
            if status != 503 || Instant::now() >= deadline {
                return (status, answer);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let nested = |open: &str, close: &str, n: usize| {
        format!(r#"{{"x":{}1{},"token_ids":[1],"block_hashes":[1],"model_name":"m"}}"#, open.repeat(n), close.repeat(n))
    };
    for path in ["/query", "/query_by_hash", "/register"] {
        for (open, close) in [("[", "]"), (r#"{"a":"#, "}")] {
            // The top-level object is level 1: 126 more levels are the most.
            let (status, answer) = post(path, &nested(open, close, 126));
            let want = if path == "/register" { 422 } else { 404 };
            assert_eq!(status, want, "{path} at the limit: {answer}");
            for n in [127, 100_000] {
                let (status, answer) = post(path, &nested(open, close, n));
                // A control body past 64 KiB is refused for its size first.
                let want = if path == "/register" && n == 100_000 { 413 } else { 400 };
                assert_eq!(status, want, "{path} {n} deep: {answer}");
            }
        }
    }
    assert_eq!(health(&d), 200, "the API is still up");
}

/// A client that sends `bytes` one at a time, `every` apart, until the
/// server closes or `for_at_most` passes; returns what it read back.
fn trickle(port: u16, bytes: Vec<u8>, every: Duration, for_at_most: Duration) -> JoinHandle<(bool, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        let end = Instant::now() + for_at_most;
        for b in bytes.iter().cycle() {
            if Instant::now() >= end {
                return (false, String::new());
            }
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(every);
        }
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        (true, read_all(&mut s))
    })
}

/// A client that connects and reads (its connection is refused at once when no slot is free).
fn refused(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    read_all(&mut s)
}

#[test]
fn slow_heads_lose_their_slot_at_the_head_deadline() {
    let d = Daemon::start(&["--http-connections-max", "4", "--http-head-timeout-s", "1"]);
    let every = Duration::from_millis(50);
    // A head that never ends, sent a byte at a time, by more clients than slots.
    let head = b"GET /health HTTP/1.1\r\nX-Slow: aaaa".to_vec();
    let slow: Vec<_> = (0..3).map(|_| trickle(d.port, head.clone(), every, Duration::from_secs(15))).collect();
    // One that sends part of a head, then nothing (it will read the 408).
    let mut silent = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    silent.write_all(b"POST /query HTTP/1.1\r\nContent-").unwrap();
    // Slots are taken in connection order: every later client is refused.
    for _ in 0..2 {
        assert_eq!(statuses(&refused(d.port)), vec![503]);
    }
    assert_eq!(health(&d), 503, "four slow clients hold the four slots");
    // The slow clients go on; the head deadline frees their slots.
    assert!(wait_until(|| health(&d) == 200), "/health never answered while slow clients trickled");
    silent.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let answer = read_all(&mut silent);
    assert_eq!(statuses(&answer), vec![408], "{answer}");
    assert!(answer.contains("--http-head-timeout-s"), "{answer}");
    for t in slow {
        let (closed, _) = t.join().unwrap();
        assert!(closed, "a slow client kept its connection past the deadline");
    }
    // A client that connects and sends nothing loses its slot too.
    let mut idle = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(read_all(&mut idle), "", "closed without a word");
    assert_eq!(health(&d), 200);
    // Both kinds of refusal are counted: at the cap, and the four late heads.
    use support::truth_check::metric;
    assert!(metric(&d, "kv_indexer_http_connections_refused_total") >= 3);
    assert_eq!(metric(&d, r#"kv_indexer_http_heads_refused_total{status="408"}"#), 4);
    assert_eq!(metric(&d, r#"kv_indexer_http_heads_refused_total{status="400"}"#), 0);
}

#[test]
fn slow_bodies_lose_their_slot_at_the_body_deadline() {
    let d = Daemon::start(&["--http-connections-max", "2", "--http-body-timeout-s", "1"]);
    let mut clients: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", d.port)).unwrap();
            s.write_all(b"POST /query HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"token_ids\":").unwrap();
            s
        })
        .collect();
    assert_eq!(statuses(&refused(d.port)), vec![503]);
    assert!(wait_until(|| health(&d) == 200), "/health never answered while bodies were pending");
    for s in &mut clients {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let answer = read_all(s);
        assert_eq!(statuses(&answer), vec![408], "{answer}");
        assert!(answer.contains("--http-body-timeout-s"), "{answer}");
    }
}

#[test]
fn grammar_requests_over_sockets_never_take_the_api_down() {
    let d = Daemon::start(&["--http-connections-max", "4", "--body-limit-bytes", "1024"]);
    let mut rng = Rng::new(11);
    let mut refusals = 0;
    for i in 0..400 {
        let c = case(&mut rng);
        let answer = exchange(&d, &c.bytes);
        let got = statuses(&answer);
        let show = || format!("case {i}: {:?} answered {answer:?}", String::from_utf8_lossy(&c.bytes));
        assert!(got.len() <= c.bytes.len(), "{}", show());
        // Refusals the framing must make, after the requests before them.
        let ok_before = c.wants.iter().take_while(|w| matches!(w, Want::Ok { .. })).count();
        let want = match c.wants.get(ok_before) {
            Some(Want::Bad) => Some(400),
            Some(Want::HeadTooLarge) => Some(431),
            // The grammar's limit is below the daemon's: the body may pass.
            _ => None,
        };
        if let Some(status) = want {
            assert_eq!(got.len(), ok_before + 1, "{}", show());
            assert_eq!(got[ok_before], status, "{}", show());
            refusals += 1;
        } else if c.wants.iter().all(|w| matches!(w, Want::Ok { .. })) {
            assert_eq!(got.len(), c.wants.len(), "one answer per request: {}", show());
        }
    }
    assert!(refusals > 100, "{refusals} refusals");
    assert_eq!(health(&d), 200, "the API is still up");
}

#[test]
fn pipelined_requests_are_answered_in_order_and_head_gets_no_body() {
    let d = Daemon::start(&[]);
    let answer = exchange(
        &d,
        b"HEAD /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\nPOST /query HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /nothing HTTP/1.1\r\nConnection: close\r\n\r\nGET /health HTTP/1.1\r\n\r\n",
    );
    // HEAD: the length of the body GET would have, and no body.
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert!(answer.contains("Content-Length: 15\r\n"), "{answer}");
    let first_end = answer.find("\r\n\r\n").unwrap() + 4;
    assert!(answer[first_end..].starts_with("HTTP/1.1 200 "), "no body after the HEAD reply: {answer}");
    // The rest in order; nothing after the request that closes.
    assert_eq!(statuses(&answer[first_end..]), vec![200, 422, 404], "{answer}");
}
