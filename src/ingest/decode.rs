//! The one decode step between socket frames and shard messages: checks the
//! message shape, reads the seq and decodes the msgpack payload with `wire`.
//! A payload that does not decode still has a seq: it travels on as a batch
//! without events, so the sequencer counts it as a lost batch.

use crate::wire::{self, RawEvent, ReplayReply, REPLAY_END_SEQ};

/// One publisher batch, decoded.
#[derive(Debug)]
pub(crate) struct Batch {
    pub seq: u64,
    /// The rank named inside the batch; overrides the registered one.
    pub dp_rank: Option<u32>,
    /// `Err`: the payload did not decode (why, for the log).
    pub events: Result<Vec<RawEvent>, String>,
}

/// One message from a replay socket.
#[derive(Debug)]
pub(crate) enum Reply {
    Batch(Batch),
    End,
}

/// Decodes a live `[topic, seq, payload]` message. `Err` means the shape is
/// wrong (it is dropped and counted; it carries no usable seq).
pub(crate) fn decode_live(frames: &[Vec<u8>]) -> Result<Batch, String> {
    let (seq, payload) = wire::split_frames(frames).map_err(|e| e.to_string())?;
    if seq == REPLAY_END_SEQ {
        // Reserved for the replay end marker; no publisher reaches it.
        return Err(format!("live message with the reserved seq {seq}"));
    }
    Ok(decode_batch(seq, payload))
}

/// Decodes a replay reply: `[b"", seq, payload]` or `[b"", topic, seq, payload]`.
pub(crate) fn decode_reply(frames: &[Vec<u8>]) -> Result<Reply, String> {
    match wire::split_replay_frames(frames).map_err(|e| e.to_string())? {
        ReplayReply::End => Ok(Reply::End),
        ReplayReply::Batch { seq, payload } => Ok(Reply::Batch(decode_batch(seq, payload))),
    }
}

fn decode_batch(seq: u64, payload: &[u8]) -> Batch {
    match wire::decode_payload(payload) {
        Ok(decoded) => Batch { seq, dp_rank: decoded.dp_rank, events: Ok(decoded.events) },
        Err(e) => Batch { seq, dp_rank: None, events: Err(e.to_string()) },
    }
}
