//! TensorRT-LLM's multimodal blocks: the tokens a router hashes for them.
//!
//! **What the engine sends.** TensorRT-LLM's streaming publisher
//! (`tensorrt_llm/_torch/pyexecutor/kv_cache_events.py`, 2026-07, with
//! `mm_token_id_offset` set) writes a multimodal item into `token_ids` as
//! the item's hex digest (a string) at its first embedding position, then
//! `offset + k` at its k-th embedding position (k >= 1), where `offset` is
//! the engine's `mm_token_id_offset`; positions inside an item that are not
//! embeddings keep their text token. Per block, `mm_keys` lists each run of
//! item tokens the block holds, in order: `{hash, start_offset, uuid?}`, the
//! item's digest, the k of the run's first token (0 at the digest token)
//! and, when the request named the item, its identifier. A run starts at a
//! digest token, or at a block's first item token after text or at the
//! block's start; every later token above `offset` continues it. The wire
//! does not carry `offset`.
//!
//! **What a router hashes** (Dynamo's convention for multimodal routing):
//! the request's tokens with every embedding position of an item replaced by
//! [`hash::mm_pad_token`] of the item's identifier hash, blocks hashed as
//! usual. So a block's tokens are rewritten here: each run's tokens become
//! the pad token of its key's `uuid` ([`hash::mm_identifier_hash`]), text
//! stays. A router that sends those tokens to `/query` then meets the same
//! local hashes; no multimodal side channel is needed.
//!
//! **Finding the runs without `offset`.** The converter tries offsets
//! (the one learned earlier from this worker; those that make a block's
//! first int-started run begin at its key's `start_offset`; one below the
//! token after each digest; "none above") and keeps those for which every
//! multimodal block of the event replays exactly its `mm_keys` (digests
//! equal, starts equal, every key used). If all that fit give the same
//! tokens, those are the tokens, and a single fitting offset is learned
//! (the engine's offset is fixed per model; a reset forgets it).
//!
//! **Erring towards a miss.** A block whose tokens cannot be rebuilt that
//! way (no `mm_keys`, keys that do not fit, several readings that differ, or
//! a run whose item has no `uuid`: a router knows items by the request's
//! identifier, not by the engine's digest, so Dynamo drops such events) is
//! still stored, so removes and children find it, but under a local hash
//! over a byte string no token sequence encodes (its length is 1 mod 4), so
//! no query meets it short of a 64-bit collision. Everything after it in its
//! chain is unreachable by queries too.
//!
//! **Assumptions** (from the public source, not from a running engine):
//! the digest token's string equals its key's `hash`; pad tokens use the
//! `uuid` through Dynamo's Rust `hash_mm_identifier` (a 64-digit hex id by
//! its first 16 digits, any other id by XXH3), whereas one of Dynamo's
//! Python tests parses TensorRT-LLM uuids as whole hex numbers; the two
//! agree only for ids whose low 30 bits come out alike.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::raw::{RawMmKey, RawStored};
use crate::hash;

/// Most candidate offsets tried for one event (the learned one aside).
pub const OFFSET_CANDIDATES_MAX: usize = 64;

/// "No token is above the offset": only digest tokens are item tokens.
const NO_OFFSET: u32 = u32::MAX;

/// A block's tokens as a router sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Routing {
    /// No multimodal content: hash the tokens as sent.
    Text,
    /// Item positions rewritten to pad tokens.
    Tokens(Vec<u32>),
    /// Cannot be rebuilt: hash with [`unmatchable_hash`].
    Unresolved,
}

/// Per-worker state: the engine's `mm_token_id_offset`, once learned.
#[derive(Debug, Default)]
pub(crate) struct MmResolver {
    offset: Option<u32>,
}

/// One block's view of an event.
struct Block<'a> {
    tokens: &'a [u32],
    /// String tokens: position within the block, text.
    strings: Vec<(usize, &'a str)>,
    keys: &'a [RawMmKey],
}

/// Replays a block under `offset`: whether it reproduces its keys exactly,
/// and whether every run's item has an identifier. Writes the tokens to `out`.
fn replay(b: &Block<'_>, offset: u32, out: &mut Vec<u32>) -> Option<bool> {
    out.clear();
    let mut next_key = 0;
    let mut pad: Option<Option<u32>> = None;
    let mut identified = true;
    let mut strings = b.strings.iter().peekable();
    for (position, &token) in b.tokens.iter().enumerate() {
        let key_pad = |k: &RawMmKey| k.uuid.as_deref().and_then(hash::mm_identifier_hash).map(hash::mm_pad_token);
        if let Some(&(_, digest)) = strings.next_if(|(p, _)| *p == position) {
            let k = b.keys.get(next_key)?;
            next_key += 1;
            if k.start_offset != 0 || !k.hash.eq_ignore_ascii_case(digest) {
                return None;
            }
            pad = Some(key_pad(k));
        } else if token > offset {
            if pad.is_none() {
                let k = b.keys.get(next_key)?;
                next_key += 1;
                if k.start_offset != u64::from(token - offset) {
                    return None;
                }
                pad = Some(key_pad(k));
            }
        } else {
            pad = None;
            out.push(token);
            continue;
        }
        match pad.flatten() {
            Some(p) => out.push(p),
            None => {
                identified = false;
                out.push(0);
            }
        }
    }
    (next_key == b.keys.len()).then_some(identified)
}

/// Offsets worth trying for `blocks`, learned one first, at most
/// [`OFFSET_CANDIDATES_MAX`] more.
fn candidates(blocks: &[Block<'_>], learned: Option<u32>) -> Vec<u32> {
    let mut out: Vec<u32> = learned.into_iter().collect();
    let add = |o: u32, out: &mut Vec<u32>| {
        if !out.contains(&o) && out.len() < OFFSET_CANDIDATES_MAX + usize::from(learned.is_some()) {
            out.push(o);
        }
    };
    add(NO_OFFSET, &mut out);
    for b in blocks {
        let is_string = |p: usize| b.strings.iter().any(|&(q, _)| q == p);
        for &(p, _) in &b.strings {
            if let Some(&t) = b.tokens.get(p + 1).filter(|_| !is_string(p + 1)) {
                if t >= 1 {
                    add(t - 1, &mut out);
                }
            }
        }
        // A block whose first run starts on an int: the run's first token t
        // is offset + start, and every token before it is text (<= offset).
        let Some(first) = b.keys.first().filter(|k| k.start_offset > 0) else { continue };
        let Ok(start) = u32::try_from(first.start_offset) else { continue };
        let mut text_max = 0;
        for (p, &t) in b.tokens.iter().enumerate() {
            if is_string(p) {
                break;
            }
            if t > start && text_max <= t - start {
                add(t - start, &mut out);
            }
            text_max = text_max.max(t);
        }
    }
    out
}

impl MmResolver {
    /// The router's tokens of each engine block of `s`, whose blocks are
    /// `engine_block` tokens long; None when the store has no multimodal
    /// content at all.
    pub(crate) fn resolve(&mut self, s: &RawStored, engine_block: usize) -> Option<Vec<Routing>> {
        let mm = s.multimodal.as_deref()?;
        let any_key = mm.mm_keys.as_ref().is_some_and(|k| k.iter().any(|b| !b.is_empty()));
        if mm.string_tokens.is_empty() && !any_key {
            return None;
        }
        let count = s.block_hashes.len();
        let aligned = mm.mm_keys.as_ref().filter(|k| k.len() == count);
        let mut routing = vec![Routing::Text; count];
        let Some(keys) = aligned else {
            // Keys missing or not one list per block: which blocks hold item
            // tokens is unknown, so none of them can be trusted.
            routing.fill(Routing::Unresolved);
            return Some(routing);
        };
        let mut strings = mm.string_tokens.iter().peekable();
        let mut blocks = Vec::new();
        let mut indexes = Vec::new();
        for (i, block_keys) in keys.iter().enumerate() {
            let base = i * engine_block;
            let mut b =
                Block { tokens: &s.token_ids[base..base + engine_block], strings: Vec::new(), keys: block_keys };
            while let Some((p, text)) = strings.next_if(|(p, _)| (*p as usize) < base + engine_block) {
                b.strings.push((*p as usize - base, text.as_str()));
            }
            if !b.strings.is_empty() || !b.keys.is_empty() {
                blocks.push(b);
                indexes.push(i);
            }
        }

        // The readings every candidate offset gives, and which offsets fit.
        let mut reading: Option<Vec<(Vec<u32>, bool)>> = None;
        let mut fitting = Vec::new();
        let mut ambiguous = false;
        let mut scratch = Vec::new();
        for offset in candidates(&blocks, self.offset) {
            let mut this = Vec::with_capacity(blocks.len());
            for b in &blocks {
                match replay(b, offset, &mut scratch) {
                    Some(identified) => this.push((scratch.clone(), identified)),
                    None => break,
                }
            }
            if this.len() < blocks.len() {
                continue;
            }
            if Some(offset) == self.offset {
                // The engine's own offset, learned before: nothing else to weigh.
                reading = Some(this);
                fitting.clear();
                break;
            }
            fitting.push(offset);
            match &reading {
                None => reading = Some(this),
                Some(first) => ambiguous |= *first != this,
            }
        }
        let reading = match reading {
            Some(r) if !ambiguous => r,
            _ => {
                for &i in &indexes {
                    routing[i] = Routing::Unresolved;
                }
                return Some(routing);
            }
        };
        if let [offset] = fitting[..] {
            if offset != NO_OFFSET {
                self.offset = Some(offset);
            }
        }
        for (&i, (tokens, identified)) in indexes.iter().zip(reading) {
            routing[i] = if identified { Routing::Tokens(tokens) } else { Routing::Unresolved };
        }
        Some(routing)
    }
}

/// The local hash of piece `piece` (its `tokens`) of a block that cannot be
/// rebuilt: over the tokens, the block's string tokens and the piece index,
/// padded to a length of 1 mod 4, which no token sequence (4 bytes a
/// token) and no vLLM multimodal block (8 more a hash) has.
pub(crate) fn unmatchable_hash(tokens: &[u32], strings: &[&str], piece: u32, seed: u64, bytes: &mut Vec<u8>) -> u64 {
    bytes.clear();
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    for s in strings {
        bytes.extend_from_slice(s.as_bytes());
        bytes.push(0);
    }
    bytes.extend(piece.to_le_bytes());
    bytes.push(0xff);
    while bytes.len() % 4 != 1 {
        bytes.push(0xff);
    }
    xxh3_64_with_seed(bytes, seed)
}

#[cfg(test)]
#[path = "multimodal_tests.rs"]
mod tests;
