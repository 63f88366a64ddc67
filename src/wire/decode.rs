//! Payload bytes to [`DecodedBatch`]: the batch array and both event encodings.
//!
//! A batch is `[ts, events, data_parallel_rank?]`; the rank is absent in old
//! vLLM, nil or an integer elsewhere, and elements after it are ignored.
//! Events are either tagged maps (`{"type": "BlockStored", ...}`, any key
//! order, unknown keys skipped) or positional arrays whose first element is
//! the tag. Positional fields are only ever appended by the engines, so they
//! are read by position while present and trailing extras are skipped; the
//! layout is vLLM's (`[tag, block_hashes, parent_block_hash, token_ids,
//! block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//! kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership]`),
//! which SGLang's shorter tuples are a prefix of.
//!
//! TensorRT-LLM's streaming publisher sends tagged maps in the same layout,
//! with two additions: a token may be a string (the hex digest that opens a
//! multimodal item) and `mm_keys` lists each block's multimodal runs as
//! `{"type": "mm_key", "hash", "start_offset", "uuid"?}` maps. Both are kept
//! as sent; what they mean for a block's hash is `super::multimodal`'s.
//!
//! Every count is checked against a named limit and against the bytes left
//! before anything is reserved; any violation, wrong type or truncation is a
//! [`WireError`], never a panic. One odd store does not sink its batch: a
//! `BlockStored` that fails to decode (a field of a wrong type, a missing
//! field) but is well-formed msgpack is skipped whole and reported as
//! [`RawEvent::MalformedStore`], counted while the rest of the batch
//! applies. Anything else unreadable (a remove, an event whose type cannot
//! be read, broken msgpack) still fails the batch, which resyncs. The
//! recovery runs only on that error path: valid events decode as fast.

use super::error::WireError;
use super::extra_keys::{classify, BlockKeys, ExtraKey};
use super::msgpack::{u32_at, Item, Reader};
use super::raw::{DecodedBatch, RawEvent, RawMmKey, RawMultimodal, RawRemoved, RawStored};
use crate::event::BLOCKS_PER_EVENT_MAX;

/// Largest payload decoded; larger ones are refused unread.
pub const PAYLOAD_BYTES_MAX: usize = 64 << 20;
/// Most events in one batch.
pub const EVENTS_PER_BATCH_MAX: u32 = 1 << 16;
/// Most token ids in one event.
pub const TOKENS_PER_EVENT_MAX: u32 = 1 << 24;
/// Longest string an engine message may carry (event type, LoRA name,
/// salt, medium, extra key).
pub const ENGINE_STRING_BYTES_MAX: usize = 64 << 10;
/// Events reserved up front; more grow the vector as they are actually read.
const EVENTS_RESERVE_MAX: usize = 1024;

/// Decodes one msgpack batch payload.
pub fn decode_payload(payload: &[u8]) -> Result<DecodedBatch, WireError> {
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(WireError::message(format!("payload of {} bytes, limit {PAYLOAD_BYTES_MAX}", payload.len())));
    }
    let mut r = Reader::new(payload);
    let len = r.array("batch")?;
    if len < 2 {
        return Err(r.error(format!("batch has {len} elements, expected [ts, events, dp_rank?]")));
    }
    let timestamp = read_timestamp(&mut r)?;
    let count = r.array("events")?;
    if count > EVENTS_PER_BATCH_MAX {
        return Err(r.error(format!("batch claims {count} events, limit {EVENTS_PER_BATCH_MAX}")));
    }
    let mut events = Vec::with_capacity((count as usize).min(EVENTS_RESERVE_MAX));
    for _ in 0..count {
        let start = r.pos();
        events.push(match decode_event(&mut r) {
            Ok(event) => event,
            Err(e) => recover(&mut r, start, e)?,
        });
    }
    let dp_rank = if len >= 3 { r.u32_or_nil("data_parallel_rank")? } else { None };
    for _ in 3..len {
        r.skip()?;
    }
    if r.remaining() != 0 {
        return Err(r.error(format!("{} trailing bytes after the batch", r.remaining())));
    }
    Ok(DecodedBatch { timestamp, dp_rank, events })
}

fn read_timestamp(r: &mut Reader<'_>) -> Result<f64, WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Float(v) => Ok(v),
        Item::Uint(v) => Ok(v as f64),
        Item::Int(v) => Ok(v as f64),
        other => Err(WireError::at(start, format!("timestamp: expected a number, found {}", other.kind()))),
    }
}

/// The fields of one event as read: the optional ones straight into a
/// `RawStored` (a remove takes its share), extra keys borrowed from the payload.
#[derive(Default)]
struct Fields<'a> {
    tag: Option<&'a str>,
    block_hashes: Option<Vec<u64>>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    extra_keys: Option<BlockKeys<'a>>,
    rest: RawStored,
}

#[derive(Copy, Clone, PartialEq, Eq)]
enum Tag {
    Stored,
    Removed,
    Other,
}

/// After an event failed to decode: a store is skipped whole and reported
/// as [`RawEvent::MalformedStore`]; anything else keeps its error.
#[cold]
#[inline(never)]
fn recover(r: &mut Reader<'_>, start: usize, e: WireError) -> Result<RawEvent, WireError> {
    r.rewind(start);
    let is_store = event_tag(&mut r.fork()).ok().flatten() == Some("BlockStored");
    if !is_store {
        return Err(e);
    }
    r.skip()?;
    Ok(RawEvent::MalformedStore)
}

/// The type tag of the event at `r`, if it can be read.
fn event_tag<'a>(r: &mut Reader<'a>) -> Result<Option<&'a str>, WireError> {
    match r.next()? {
        Item::Array(len) if len > 0 => read_tag(r).map(Some),
        Item::Map(len) => {
            for _ in 0..len {
                match r.next()? {
                    Item::Str(b"type") => return read_tag(r).map(Some),
                    other => {
                        r.skip_children(other, 1)?;
                        r.skip()?;
                    }
                }
            }
            Ok(None)
        }
        _ => Ok(None),
    }
}

fn decode_event(r: &mut Reader<'_>) -> Result<RawEvent, WireError> {
    let start = r.pos();
    let fields = match r.next()? {
        Item::Array(len) => read_positional(r, len, start)?,
        Item::Map(len) => read_map(r, len)?,
        other => {
            return Err(WireError::at(start, format!("event: expected a tagged map or array, found {}", other.kind())))
        }
    };
    finish(fields, start)
}

fn read_tag<'a>(r: &mut Reader<'a>) -> Result<&'a str, WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Str(bytes) => r.utf8(start, "event type", bytes, ENGINE_STRING_BYTES_MAX),
        other => Err(WireError::at(start, format!("event type: expected a string, found {}", other.kind()))),
    }
}

fn read_positional<'a>(r: &mut Reader<'a>, len: u32, start: usize) -> Result<Fields<'a>, WireError> {
    if len == 0 {
        return Err(WireError::at(start, "event array is empty: no type tag"));
    }
    let tag = read_tag(r)?;
    let kind = match tag {
        "BlockStored" => Tag::Stored,
        "BlockRemoved" => Tag::Removed,
        _ => Tag::Other,
    };
    let mut f = Fields { tag: Some(tag), ..Fields::default() };
    let o = &mut f.rest;
    for position in 1..len {
        match (kind, position) {
            (Tag::Stored | Tag::Removed, 1) => f.block_hashes = Some(read_hashes(r)?),
            (Tag::Stored, 2) => o.parent_block_hash = read_hash_or_nil(r)?,
            (Tag::Stored, 3) => f.token_ids = Some(read_tokens(r, &mut o.multimodal)?),
            (Tag::Stored, 4) => f.block_size = Some(r.u32("block_size")?),
            (Tag::Stored, 5) => o.lora_id = read_lora_id(r)?,
            (Tag::Stored, 6) | (Tag::Removed, 2) => o.medium = read_str(r, "medium")?,
            (Tag::Stored, 7) => read_lora_slot(r, o)?,
            (Tag::Stored, 8) => f.extra_keys = read_extra_keys(r)?,
            (Tag::Stored, 9) | (Tag::Removed, 3) => o.group_idx = r.u32_or_nil("group_idx")?,
            (Tag::Stored, 10) | (Tag::Removed, 4) => o.kv_cache_spec_kind = read_str(r, "kv_cache_spec_kind")?,
            (Tag::Stored, 12) | (Tag::Removed, 6) => o.locality = read_str(r, "locality")?,
            (Tag::Stored, 13) | (Tag::Removed, 7) => o.ownership = read_str(r, "ownership")?,
            _ => r.skip()?,
        }
    }
    Ok(f)
}

fn read_map<'a>(r: &mut Reader<'a>, len: u32) -> Result<Fields<'a>, WireError> {
    let mut f = Fields::default();
    for _ in 0..len {
        // Keys are matched as bytes: an unknown key is skipped whatever it holds.
        let key = match r.short_str_fast() {
            Some(bytes) => bytes,
            None => match r.next()? {
                Item::Str(bytes) => bytes,
                other => {
                    // Not a field of ours: skip the key and its value.
                    r.skip_children(other, 1)?;
                    r.skip()?;
                    continue;
                }
            },
        };
        let o = &mut f.rest;
        match key {
            b"type" => f.tag = Some(read_tag(r)?),
            b"block_hashes" => f.block_hashes = Some(read_hashes(r)?),
            b"parent_block_hash" => o.parent_block_hash = read_hash_or_nil(r)?,
            b"token_ids" => f.token_ids = Some(read_tokens(r, &mut o.multimodal)?),
            b"block_size" => f.block_size = Some(r.u32("block_size")?),
            b"lora_id" => o.lora_id = read_lora_id(r)?,
            b"medium" => o.medium = read_str(r, "medium")?,
            b"lora_name" => o.lora_name = read_str(r, "lora_name")?,
            b"cache_salt" => o.cache_salt = read_str(r, "cache_salt")?,
            b"extra_keys" => f.extra_keys = read_extra_keys(r)?,
            b"mm_keys" => read_mm_keys(r, &mut o.multimodal)?,
            b"group_idx" => o.group_idx = r.u32_or_nil("group_idx")?,
            b"kv_cache_spec_kind" => o.kv_cache_spec_kind = read_str(r, "kv_cache_spec_kind")?,
            b"locality" => o.locality = read_str(r, "locality")?,
            b"ownership" => o.ownership = read_str(r, "ownership")?,
            _ => r.skip()?,
        }
    }
    Ok(f)
}

fn finish(f: Fields<'_>, start: usize) -> Result<RawEvent, WireError> {
    let Some(tag) = f.tag else {
        return Err(WireError::at(start, "event map has no \"type\""));
    };
    let missing = |field: &str| WireError::at(start, format!("{tag} event without {field}"));
    let o = f.rest;
    match tag {
        "BlockStored" => {
            let block_hashes = f.block_hashes.ok_or_else(|| missing("block_hashes"))?;
            let token_ids = f.token_ids.ok_or_else(|| missing("token_ids"))?;
            let block_size = f.block_size.ok_or_else(|| missing("block_size"))?;
            let classified = f.extra_keys.map(|keys| classify(&keys, o.lora_name.as_deref())).unwrap_or_default();
            Ok(RawEvent::Stored(RawStored {
                block_hashes,
                token_ids,
                block_size,
                extra_keys_salt: classified.salt,
                block_mm_hashes: classified.block_mm_hashes,
                opaque_extra_keys_from: classified.opaque_from,
                ..o
            }))
        }
        "BlockRemoved" => Ok(RawEvent::Removed(RawRemoved {
            block_hashes: f.block_hashes.ok_or_else(|| missing("block_hashes"))?,
            medium: o.medium,
            group_idx: o.group_idx,
            kv_cache_spec_kind: o.kv_cache_spec_kind,
            locality: o.locality,
            ownership: o.ownership,
        })),
        "AllBlocksCleared" => Ok(RawEvent::Cleared),
        _ => Ok(RawEvent::Unknown),
    }
}

/// A string or nil; an empty string is absent.
fn read_str(r: &mut Reader<'_>, what: &str) -> Result<Option<String>, WireError> {
    Ok(r.str_or_nil(what, ENGINE_STRING_BYTES_MAX)?.filter(|s| !s.is_empty()).map(str::to_owned))
}

/// An engine hash: uint64, int64 (two's complement) or bytes (last 8, big-endian).
fn hash_of(start: usize, item: Item<'_>) -> Result<u64, WireError> {
    match item {
        Item::Uint(v) => Ok(v),
        Item::Int(v) => Ok(v as u64),
        Item::Bin(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            Ok(tail.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
        }
        other => Err(WireError::at(
            start,
            format!("block hash: expected an integer or non-empty bytes, found {}", other.kind()),
        )),
    }
}

fn read_hash_or_nil(r: &mut Reader<'_>) -> Result<Option<u64>, WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Nil => Ok(None),
        item => hash_of(start, item).map(Some),
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<u64>, WireError> {
    let len = r.array("block_hashes")?;
    if len as usize > BLOCKS_PER_EVENT_MAX {
        return Err(r.error(format!("block_hashes: {len} hashes, limit {BLOCKS_PER_EVENT_MAX}")));
    }
    // The reader guarantees len <= bytes left, so this reserve is bounded by the payload.
    let mut out = Vec::with_capacity(len as usize);
    for _ in 0..len {
        if let Some(v) = r.uint_fast() {
            out.push(v);
            continue;
        }
        let start = r.pos();
        let item = r.next()?;
        out.push(hash_of(start, item)?);
    }
    Ok(out)
}

/// Token ids, plain or as SGLang's bigram pairs `[token, next]` (the first
/// is the block's token); a string token reads 0 and goes to `multimodal`.
fn read_tokens(r: &mut Reader<'_>, multimodal: &mut Option<Box<RawMultimodal>>) -> Result<Vec<u32>, WireError> {
    let len = r.array("token_ids")?;
    if len > TOKENS_PER_EVENT_MAX {
        return Err(r.error(format!("token_ids: {len} tokens, limit {TOKENS_PER_EVENT_MAX}")));
    }
    let len = len as usize;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let left = len - out.len();
        if r.u32s_fast(left, &mut out) == left {
            break;
        }
        // Anything but a small unsigned int: bigram pairs, other widths, errors.
        let start = r.pos();
        match r.next()? {
            Item::Array(2) => {
                out.push(r.u32("token id")?);
                r.u32("token id")?;
            }
            Item::Str(bytes) => string_token(r, start, bytes, &mut out, multimodal)?,
            item => out.push(u32_at(start, item, "token id")?),
        }
    }
    Ok(out)
}

/// A token sent as a string: kept aside, 0 in its place.
#[cold]
#[inline(never)]
fn string_token(
    r: &Reader<'_>,
    start: usize,
    bytes: &[u8],
    out: &mut Vec<u32>,
    multimodal: &mut Option<Box<RawMultimodal>>,
) -> Result<(), WireError> {
    let text = r.utf8(start, "token id", bytes, ENGINE_STRING_BYTES_MAX)?;
    // out.len() < len <= TOKENS_PER_EVENT_MAX, so it fits in u32.
    multimodal.get_or_insert_default().string_tokens.push((out.len() as u32, text.to_owned()));
    out.push(0);
    Ok(())
}

fn read_lora_id(r: &mut Reader<'_>) -> Result<Option<u64>, WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Nil => Ok(None),
        Item::Uint(v) => Ok(Some(v)),
        Item::Int(v) => Ok(Some(v as u64)),
        other => Err(WireError::at(start, format!("lora_id: expected an integer or nil, found {}", other.kind()))),
    }
}

/// Position 7 of a positional BlockStored: vLLM's `lora_name`, or a map
/// carrying SGLang's `cache_salt`.
fn read_lora_slot(r: &mut Reader<'_>, o: &mut RawStored) -> Result<(), WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Nil => {}
        Item::Str(bytes) => {
            let name = r.utf8(start, "lora_name", bytes, ENGINE_STRING_BYTES_MAX)?;
            o.lora_name = Some(name.to_owned()).filter(|s| !s.is_empty());
        }
        Item::Map(len) => {
            for _ in 0..len {
                match r.next()? {
                    Item::Str(b"cache_salt") => o.cache_salt = read_str(r, "cache_salt")?,
                    other => {
                        r.skip_children(other, 1)?;
                        r.skip()?;
                    }
                }
            }
        }
        other => {
            return Err(WireError::at(start, format!("lora_name: expected a string or nil, found {}", other.kind())))
        }
    }
    Ok(())
}

fn read_extra_keys<'a>(r: &mut Reader<'a>) -> Result<Option<BlockKeys<'a>>, WireError> {
    let Some(len) = r.array_or_nil("extra_keys")? else {
        return Ok(None);
    };
    if len as usize > BLOCKS_PER_EVENT_MAX {
        return Err(r.error(format!("extra_keys: {len} entries, limit {BLOCKS_PER_EVENT_MAX}")));
    }
    let mut blocks = Vec::with_capacity(len as usize);
    for _ in 0..len {
        let Some(count) = r.array_or_nil("extra_keys entry")? else {
            blocks.push(None);
            continue;
        };
        let mut keys = Vec::with_capacity((count as usize).min(r.remaining()));
        for _ in 0..count {
            keys.push(read_extra_key(r)?);
        }
        blocks.push(Some(keys));
    }
    Ok(Some(blocks))
}

/// TensorRT-LLM's `mm_keys`: nil, or per block nil or a list of key maps.
/// Kept out of line so the common events' decoding stays compact.
#[inline(never)]
fn read_mm_keys(r: &mut Reader<'_>, multimodal: &mut Option<Box<RawMultimodal>>) -> Result<(), WireError> {
    let Some(len) = r.array_or_nil("mm_keys")? else {
        return Ok(());
    };
    if len as usize > BLOCKS_PER_EVENT_MAX {
        return Err(r.error(format!("mm_keys: {len} entries, limit {BLOCKS_PER_EVENT_MAX}")));
    }
    let mut blocks = Vec::with_capacity(len as usize);
    for _ in 0..len {
        let count = r.array_or_nil("mm_keys entry")?.unwrap_or(0);
        let mut keys = Vec::with_capacity((count as usize).min(r.remaining()));
        for _ in 0..count {
            keys.push(read_mm_key(r)?);
        }
        blocks.push(keys);
    }
    multimodal.get_or_insert_default().mm_keys = Some(blocks);
    Ok(())
}

/// One `mm_key` map: `hash` and `start_offset` required, `uuid` optional,
/// anything else (its `"type"` tag) skipped.
fn read_mm_key(r: &mut Reader<'_>) -> Result<RawMmKey, WireError> {
    let start = r.pos();
    let len = match r.next()? {
        Item::Map(len) => len,
        other => return Err(WireError::at(start, format!("mm_keys item: expected a map, found {}", other.kind()))),
    };
    let (mut hash, mut offset, mut uuid) = (None, None, None);
    for _ in 0..len {
        match r.next()? {
            Item::Str(b"hash") => hash = read_str(r, "mm_key hash")?,
            Item::Str(b"uuid") => uuid = read_str(r, "mm_key uuid")?,
            Item::Str(b"start_offset") => {
                let at = r.pos();
                offset = match r.next()? {
                    Item::Uint(v) => Some(v),
                    Item::Int(v) if v >= 0 => Some(v as u64),
                    other => {
                        return Err(WireError::at(
                            at,
                            format!("mm_key start_offset: expected an integer >= 0, found {}", other.kind()),
                        ))
                    }
                };
            }
            other => {
                r.skip_children(other, 1)?;
                r.skip()?;
            }
        }
    }
    match (hash, offset) {
        (Some(hash), Some(start_offset)) => Ok(RawMmKey { hash, start_offset, uuid }),
        _ => Err(WireError::at(start, "mm_keys item without hash or start_offset")),
    }
}

fn read_extra_key<'a>(r: &mut Reader<'a>) -> Result<ExtraKey<'a>, WireError> {
    let start = r.pos();
    match r.next()? {
        Item::Str(bytes) => Ok(ExtraKey::Text(r.utf8(start, "extra key", bytes, ENGINE_STRING_BYTES_MAX)?)),
        Item::Array(2) => {
            let first_start = r.pos();
            let first = r.next()?;
            let Item::Str(bytes) = first else {
                r.skip_children(first, 1)?;
                r.skip()?;
                return Ok(ExtraKey::Other);
            };
            let text = r.utf8(first_start, "extra key", bytes, ENGINE_STRING_BYTES_MAX)?;
            match r.next()? {
                Item::Uint(_) | Item::Int(_) => Ok(ExtraKey::TextWithOffset(text)),
                other => {
                    r.skip_children(other, 1)?;
                    Ok(ExtraKey::Other)
                }
            }
        }
        other => {
            r.skip_children(other, 1)?;
            Ok(ExtraKey::Other)
        }
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
