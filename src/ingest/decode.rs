//! The one decode step between socket frames and shard messages: checks the
//! message shape, reads the seq and decodes the msgpack payload with `wire`.
//! A payload that does not decode still has a seq: it travels on as a batch
//! without events, so the sequencer counts it as a lost batch. Messages are
//! received into reused ZMQ frames (`Frames`): a read copies and allocates
//! nothing before the decode.

use super::budget::Charge;
use crate::wire::{self, RawEvent, ReplayReply, REPLAY_END_SEQ};
use xxhash_rust::xxh3::xxh3_64;

/// One publisher batch, decoded.
#[derive(Debug)]
pub(crate) struct Batch {
    pub seq: u64,
    /// The engine's wall-clock time of the batch, Unix seconds (NaN when
    /// the payload did not decode).
    pub ts: f64,
    /// The rank named inside the batch; overrides the registered one.
    pub dp_rank: Option<u32>,
    /// `Err`: the payload did not decode (why, for the log).
    pub events: Result<Vec<RawEvent>, String>,
    /// xxh3-64 of the payload bytes: a ring's copy of the batch has the
    /// same, another process's batch of the same seq almost surely not.
    pub digest: u64,
    /// The connection a live batch came on (the listener sets it; 0 for a
    /// ring's reply, which the stream judges by what it asked).
    pub conn: u32,
    /// Its bytes, charged to the ingest budget until it is applied or
    /// dropped (the listener charges it once decoded).
    pub charge: Charge,
}

impl Batch {
    /// Bytes the batch holds, itself included.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Batch>()
            + match &self.events {
                Ok(events) => {
                    events.capacity() * std::mem::size_of::<RawEvent>()
                        + events.iter().map(RawEvent::heap_bytes).sum::<usize>()
                }
                Err(why) => why.capacity(),
            }
    }
}

/// Frames kept by a message with more parts than any valid one; the rest
/// are read into the last and counted.
const FRAMES_KEPT_MAX: usize = 4;

/// One message's frames, received in place and reused for the next.
#[derive(Default)]
pub(crate) struct Frames {
    parts: Vec<zmq::Message>,
    len: usize,
}

impl Frames {
    /// Receives one whole message without waiting; false if none is queued.
    pub(crate) fn recv(&mut self, socket: &zmq::Socket) -> bool {
        self.len = 0;
        loop {
            let slot = self.len.min(FRAMES_KEPT_MAX - 1);
            if slot == self.parts.len() {
                self.parts.push(zmq::Message::new());
            }
            // A message's parts arrive together: only the first can fail.
            if socket.recv(&mut self.parts[slot], zmq::DONTWAIT).is_err() {
                return self.len > 0;
            }
            self.len += 1;
            if !self.parts[slot].get_more() {
                return true;
            }
        }
    }

    /// Bytes of the last message, every frame together (before decoding).
    pub(crate) fn bytes(&self) -> usize {
        self.parts[..self.len.min(FRAMES_KEPT_MAX)].iter().map(|m| m.len()).sum()
    }

    /// The frames of the last message; `Err` if it had more than any valid one.
    fn get(&self) -> Result<&[zmq::Message], String> {
        if self.len > FRAMES_KEPT_MAX {
            return Err(format!("message has {} frames, expected at most {FRAMES_KEPT_MAX}", self.len));
        }
        Ok(&self.parts[..self.len])
    }
}

/// Decodes a live `[topic, seq, payload]` message. `Err` means the shape is
/// wrong (it is dropped and counted; it carries no usable seq).
pub(crate) fn decode_live(frames: &Frames) -> Result<Batch, String> {
    let (seq, payload) = wire::split_frames(frames.get()?).map_err(|e| e.to_string())?;
    if seq == REPLAY_END_SEQ {
        // Reserved for the replay end marker; no publisher reaches it.
        return Err(format!("live message with the reserved seq {seq}"));
    }
    Ok(decode_batch(seq, payload))
}

/// Decodes a replay reply: `[b"", seq, payload]` or `[b"", topic, seq,
/// payload]`; None for the end marker.
pub(crate) fn decode_reply(frames: &Frames) -> Result<Option<Batch>, String> {
    match wire::split_replay_frames(frames.get()?).map_err(|e| e.to_string())? {
        ReplayReply::End => Ok(None),
        ReplayReply::Batch { seq, payload } => Ok(Some(decode_batch(seq, payload))),
    }
}

fn decode_batch(seq: u64, payload: &[u8]) -> Batch {
    let digest = xxh3_64(payload);
    match wire::decode_payload(payload) {
        Ok(d) => Batch {
            seq,
            ts: d.timestamp,
            dp_rank: d.dp_rank,
            events: Ok(d.events),
            digest,
            conn: 0,
            charge: Charge::default(),
        },
        Err(e) => Batch {
            seq,
            ts: f64::NAN,
            dp_rank: None,
            events: Err(e.to_string()),
            digest,
            conn: 0,
            charge: Charge::default(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_reused_and_a_surplus_is_refused() {
        let ctx = zmq::Context::new();
        let (a, b) = (ctx.socket(zmq::PAIR).unwrap(), ctx.socket(zmq::PAIR).unwrap());
        a.bind("inproc://frames-test").unwrap();
        b.connect("inproc://frames-test").unwrap();
        let mut frames = Frames::default();
        assert!(!frames.recv(&a), "nothing queued");
        b.send_multipart([&b"t"[..], &7u64.to_be_bytes(), &[0x92, 0x00, 0x90]], 0).unwrap();
        b.send_multipart([&[1u8][..]; 9], 0).unwrap();
        b.send_multipart([&b"t"[..], &8u64.to_be_bytes(), &[0x92, 0x00, 0x90]], 0).unwrap();
        assert!(frames.recv(&a));
        let batch = decode_live(&frames).unwrap();
        assert_eq!((batch.seq, batch.events.map(|e| e.len())), (7, Ok(0)));
        assert!(frames.recv(&a));
        assert_eq!(decode_live(&frames).unwrap_err(), "message has 9 frames, expected at most 4");
        assert_eq!(frames.parts.len(), FRAMES_KEPT_MAX, "a surplus reuses the last frame");
        assert!(frames.recv(&a));
        assert_eq!(decode_live(&frames).unwrap().seq, 8, "the next message reads whole");
        assert!(!frames.recv(&a));
    }
}
