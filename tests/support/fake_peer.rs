//! Fake indexer peers that fail in the middle of a `/dump`, for recovery
//! tests: one sends the headers and half the body, then closes; one sends
//! the headers and a few bytes, then hangs; one trickles the body a byte at
//! a time, each byte well within a read timeout, without end.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::json;

/// How the fake peer fails.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Full `Content-Length`, half the body, then the connection closes.
    HalfBody,
    /// Headers and 16 bytes, then nothing until the peer is dropped.
    Hang,
    /// One byte every `TRICKLE_MS`, never reaching its `Content-Length`.
    Trickle,
}

/// Pause between trickled bytes.
const TRICKLE_MS: u64 = 50;
/// Most bytes trickled (over an hour's worth).
const TRICKLE_BYTES_MAX: usize = 100_000;
/// Largest request head read.
const HEAD_BYTES_MAX: usize = 64 * 1024;

/// A fake peer serving until dropped.
pub struct FakePeer {
    pub url: String,
    /// Connections accepted.
    pub served: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakePeer {
    pub fn start(failure: Failure, body: Vec<u8>) -> FakePeer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (served2, stop2) = (served.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        served2.fetch_add(1, Ordering::Relaxed);
                        let _ = serve(stream, failure, &body, &stop2);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakePeer { url, served, stop, thread: Some(thread) }
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(mut stream: TcpStream, failure: Failure, body: &[u8], stop: &AtomicBool) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_BYTES_MAX {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let length = if failure == Failure::Trickle { 1 << 30 } else { body.len() };
    write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n")?;
    match failure {
        Failure::HalfBody => stream.write_all(&body[..body.len() / 2])?,
        Failure::Hang => {
            stream.write_all(&body[..16.min(body.len())])?;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Failure::Trickle => {
            // The body, then spaces: valid JSON so far, never finished.
            for i in 0..TRICKLE_BYTES_MAX {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                stream.write_all(&[body.get(i).copied().unwrap_or(b' ')])?;
                std::thread::sleep(Duration::from_millis(TRICKLE_MS));
            }
        }
    }
    stream.flush()
}

/// A well-formed dump of `events` one-block stores of worker `instance`
/// in model `model`: what a partial apply would leave behind.
pub fn dump_of(model: &str, instance: u64, events: u64) -> Vec<u8> {
    let events: Vec<_> = (0..events)
        .map(|i| {
            json!({"worker_id": instance, "storage_tier": "device", "event": {"event_id": i, "data": {"stored": {
                "parent_hash": if i == 0 { None } else { Some(1_000 + i - 1) }, "start_position": null,
                "blocks": [{"block_hash": 1_000 + i, "tokens_hash": 7_000 + i, "mm_extra_info": null}]}},
                "dp_rank": 0}})
        })
        .collect();
    let key = format!("{model}:default");
    serde_json::to_vec(&json!({key: {"model_name": model, "tenant_id": "default", "block_size": 4, "events": events}}))
        .unwrap()
}
