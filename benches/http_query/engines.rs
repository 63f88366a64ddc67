//! Benchmark engines: one ZMQ publisher per worker, speaking the engines'
//! wire format (SPEC section 2: `[topic, seq BE, msgpack batch]`, tagged-map
//! events), and remembering which prefixes each worker holds so it only
//! publishes blocks it does not hold yet, as a real engine with prefix
//! caching would.
//!
//! A block's engine hash is the Dynamo sequence hash of its prefix: unique
//! per prefix, and opaque to the indexers (they link parents with it and
//! hash tokens themselves). Sockets are XPUB so the bench can wait for the
//! servers' subscriptions instead of sleeping through the slow-joiner window.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use kv_indexer::hash::{local_hash, BASE_SEED};

#[path = "../trace/dynamo_hash.rs"]
pub mod dynamo_hash;
use dynamo_hash::chain_hash;

/// Messages a publisher queues per subscriber before ZMQ drops: more than
/// any population phase sends to one worker, so a slow server never loses one.
pub const SEND_QUEUE_MAX: i32 = 1_000_000;
/// Blocks per Stored event; longer prompts are split into chained events.
pub const BLOCKS_PER_EVENT_MAX: usize = 256;
/// How long to wait for subscriptions.
pub const SUBSCRIBE_WAIT_MS: u64 = 30_000;

/// A storage medium as the engines name it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Medium {
    Gpu,
    Cpu,
    Disk,
}

impl Medium {
    fn name(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
            Medium::Disk => "DISK",
        }
    }
}

/// One engine event, ready to encode.
#[derive(Clone, Debug)]
pub enum WireEvent {
    Stored {
        parent: Option<u64>,
        hashes: Vec<u64>,
        tokens: Vec<u32>,
        medium: Medium,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Medium,
    },
    /// Every block of the worker is gone (an engine's cache reset).
    Cleared,
}

/// One worker's engine: its socket, stream position and what it holds.
pub struct Engine {
    pub instance_id: u64,
    pub endpoint: String,
    socket: zmq::Socket,
    next_seq: u64,
    subscriptions: usize,
    /// Engine hashes of every device block this worker holds.
    pub held: HashSet<u64>,
    /// Last block hash of every prompt stored through `store_prompt`.
    pub tips: Vec<u64>,
    pub block_size: usize,
    pub blocks_stored: u64,
}

impl Engine {
    /// Binds a fresh publisher on a free loopback port.
    pub fn new(ctx: &zmq::Context, instance_id: u64, block_size: usize) -> Result<Engine, String> {
        let socket = ctx.socket(zmq::XPUB).map_err(|e| format!("xpub socket: {e}"))?;
        socket.set_linger(0).map_err(|e| e.to_string())?;
        socket.set_xpub_verbose(true).map_err(|e| e.to_string())?;
        socket.set_sndhwm(SEND_QUEUE_MAX).map_err(|e| e.to_string())?;
        socket.bind("tcp://127.0.0.1:*").map_err(|e| format!("bind: {e}"))?;
        let endpoint =
            socket.get_last_endpoint().map_err(|e| e.to_string())?.map_err(|_| "endpoint is not UTF-8".to_string())?;
        Ok(Engine {
            instance_id,
            endpoint,
            socket,
            next_seq: 0,
            subscriptions: 0,
            held: HashSet::new(),
            tips: Vec::new(),
            block_size,
            blocks_stored: 0,
        })
    }

    /// Waits until `n` subscriptions reached this engine in total.
    pub fn wait_subscribed(&mut self, n: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(SUBSCRIBE_WAIT_MS);
        while self.subscriptions < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("engine {} got {} of {n} subscriptions", self.instance_id, self.subscriptions));
            }
            if self.socket.poll(zmq::POLLIN, left.as_millis().min(100) as i64).unwrap_or(0) > 0 {
                if let Ok(msg) = self.socket.recv_bytes(zmq::DONTWAIT) {
                    // 1 = subscribe, 0 = unsubscribe.
                    if msg.first() == Some(&1) {
                        self.subscriptions += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Publishes one batch.
    pub fn publish(&mut self, events: &[WireEvent]) -> Result<(), String> {
        let payload = encode_batch(events, self.block_size);
        let seq = self.next_seq;
        self.next_seq += 1;
        let frames: [&[u8]; 3] = [b"kv", &seq.to_be_bytes(), &payload];
        self.socket.send_multipart(frames, 0).map_err(|e| format!("publish: {e}"))
    }

    /// Stores the full blocks of `tokens` the worker does not hold yet, as an
    /// engine that just ran this prompt would; returns the blocks published.
    pub fn store_prompt(&mut self, tokens: &[u32]) -> Result<usize, String> {
        let hashes = sequence_hashes(None, tokens, self.block_size);
        let Some(&tip) = hashes.last() else { return Ok(0) };
        let first_new = hashes.iter().position(|h| !self.held.contains(h)).unwrap_or(hashes.len());
        if first_new == hashes.len() {
            return Ok(0);
        }
        let parent = first_new.checked_sub(1).map(|i| hashes[i]);
        let new = &hashes[first_new..];
        let events = stored_events(parent, new, &tokens[first_new * self.block_size..], self.block_size);
        self.publish(&events)?;
        self.held.extend(new.iter().copied());
        self.tips.push(tip);
        self.blocks_stored += new.len() as u64;
        Ok(new.len())
    }

    /// Drops every block, as an engine whose cache was reset announces it.
    pub fn clear(&mut self) -> Result<(), String> {
        self.publish(&[WireEvent::Cleared])?;
        self.held.clear();
        self.tips.clear();
        Ok(())
    }
}

/// Splits a store into chained events of at most `BLOCKS_PER_EVENT_MAX` blocks.
pub fn stored_events(parent: Option<u64>, hashes: &[u64], tokens: &[u32], block_size: usize) -> Vec<WireEvent> {
    let mut parent = parent;
    let mut events = Vec::new();
    for (chunk, toks) in hashes.chunks(BLOCKS_PER_EVENT_MAX).zip(tokens.chunks(BLOCKS_PER_EVENT_MAX * block_size)) {
        events.push(WireEvent::Stored {
            parent,
            hashes: chunk.to_vec(),
            tokens: toks[..chunk.len() * block_size].to_vec(),
            medium: Medium::Gpu,
        });
        parent = chunk.last().copied();
    }
    events
}

/// Engine hashes (Dynamo sequence hashes) of the full blocks of `tokens`,
/// continuing the chain below `parent`.
pub fn sequence_hashes(parent: Option<u64>, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut prev = parent;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let local = local_hash(block, BASE_SEED);
            let seq = match prev {
                None => local,
                Some(p) => chain_hash(p, local),
            };
            prev = Some(seq);
            seq
        })
        .collect()
}

/// Encodes `[ts, [events], nil]` with tagged-map events (vLLM >= 0.24).
pub fn encode_batch(events: &[WireEvent], block_size: usize) -> Vec<u8> {
    use rmp::encode::*;
    let mut buf = Vec::new();
    // Writes into a Vec cannot fail.
    write_array_len(&mut buf, 3).unwrap();
    write_f64(&mut buf, 1_700_000_000.0).unwrap();
    write_array_len(&mut buf, events.len() as u32).unwrap();
    for event in events {
        match event {
            WireEvent::Stored { parent, hashes, tokens, medium } => {
                write_map_len(&mut buf, 8).unwrap();
                write_str(&mut buf, "type").unwrap();
                write_str(&mut buf, "BlockStored").unwrap();
                write_str(&mut buf, "block_hashes").unwrap();
                write_array_len(&mut buf, hashes.len() as u32).unwrap();
                for &h in hashes {
                    write_uint(&mut buf, h).unwrap();
                }
                write_str(&mut buf, "parent_block_hash").unwrap();
                match parent {
                    Some(p) => {
                        write_uint(&mut buf, *p).unwrap();
                    }
                    None => write_nil(&mut buf).unwrap(),
                }
                write_str(&mut buf, "token_ids").unwrap();
                write_array_len(&mut buf, tokens.len() as u32).unwrap();
                for &t in tokens {
                    write_uint(&mut buf, u64::from(t)).unwrap();
                }
                write_str(&mut buf, "block_size").unwrap();
                write_uint(&mut buf, block_size as u64).unwrap();
                write_str(&mut buf, "lora_id").unwrap();
                write_nil(&mut buf).unwrap();
                write_str(&mut buf, "medium").unwrap();
                write_str(&mut buf, medium.name()).unwrap();
                write_str(&mut buf, "lora_name").unwrap();
                write_nil(&mut buf).unwrap();
            }
            WireEvent::Removed { hashes, medium } => {
                write_map_len(&mut buf, 3).unwrap();
                write_str(&mut buf, "type").unwrap();
                write_str(&mut buf, "BlockRemoved").unwrap();
                write_str(&mut buf, "block_hashes").unwrap();
                write_array_len(&mut buf, hashes.len() as u32).unwrap();
                for &h in hashes {
                    write_uint(&mut buf, h).unwrap();
                }
                write_str(&mut buf, "medium").unwrap();
                write_str(&mut buf, medium.name()).unwrap();
            }
            WireEvent::Cleared => {
                write_map_len(&mut buf, 1).unwrap();
                write_str(&mut buf, "type").unwrap();
                write_str(&mut buf, "AllBlocksCleared").unwrap();
            }
        }
    }
    write_nil(&mut buf).unwrap();
    buf
}
