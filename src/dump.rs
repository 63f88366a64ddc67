//! `/dump`: every index's blocks as Dynamo's RouterEvent JSON, both ways, so
//! a Dynamo replica can recover from our dump and we from theirs.
//!
//! Shape (Dynamo 1.6.1 `protocols.rs` serde derives):
//!
//! ```text
//! {"<model>:<tenant>": {"model_name": "..", "tenant_id": "..", "block_size": 16, "events": [
//!   {"worker_id": 7, "storage_tier": "device", "residency_domain": "worker",
//!    "event": {"event_id": 0, "data": {"stored": {"parent_hash": 11, "start_position": null,
//!              "blocks": [{"block_hash": 12, "tokens_hash": 99, "mm_extra_info": null}]}},
//!              "dp_rank": 1}},
//!   {"worker_id": 7, "storage_tier": "host_pinned", "residency_domain": "worker",
//!    "event": {"event_id": 1, "data": {"stored": {"parent_hash": 5, "start_position": 6,
//!              "blocks": [{"block_hash": 31, "tokens_hash": 98, "mm_extra_info": null}],
//!              "kv_indexer_orphan": {"anchor_hash": 12, "missing_tokens_hashes": [41, 42, 43, 44]}}},
//!              "dp_rank": 1}}, ...]}}
//! ```
//!
//! What a dump means: the blocks each worker holds. Every (worker, tier,
//! engine hash) the index holds is one block of one `stored` event, and
//! nothing else is in it: no `removed`, no `cleared`, no block a worker
//! does not hold. Blocks of one event form a chain (each the parent of the
//! next); `parent_hash` is the engine hash the worker uses for the first
//! block's parent, resolved as a receiver resolves it (the block's own
//! tier first, then, for lower tiers, the others).
//!
//! - `block_hash` is the engine's hash, `tokens_hash` the block's local hash.
//! - An *orphan*, a block whose parent the worker does not hold there (a
//!   host block that outlived its device parent, a device block after a
//!   hole), starts an event with `start_position` (its position) and
//!   `kv_indexer_orphan`, which Dynamo ignores: the local hashes of the
//!   ancestors the worker does not hold, top down, ending with the
//!   parent's (`missing_tokens_hashes`), and `anchor_hash`, the block
//!   above them at position `start_position - 1 - len(missing)`: one the
//!   worker holds (named by its hash, resolved as a parent is), or, when
//!   the hash is that of an earlier orphan of the same worker and tier at
//!   a deeper position, the ancestor of that orphan there (so a missing
//!   prefix shared by many orphans is listed once); null when the missing
//!   ancestors start at the root. Its `parent_hash` is the hash the worker
//!   uses for the parent block in another tier, or else one it uses for no
//!   block, never null: Dynamo 1.6.1 refuses a device block whose parent
//!   the worker does not hold (parent not found) and keeps such a
//!   lower-tier block where no query of that worker reaches it, whereas a
//!   null parent would put the block at the root. So a Dynamo replica
//!   recovering from our dump holds a subset of the blocks: never one the
//!   worker does not hold. We place orphans exactly (`index::load`).
//! - `model_name` and `tenant_id` are ours (Dynamo ignores unknown fields):
//!   Dynamo splits the key at the first `:`, which breaks model names that
//!   contain one. Reading a dump without them, we split the same way.
//! - `event_id` counts from 0 per index, as Dynamo's dump does; it is
//!   required on input (Dynamo requires it) but otherwise unused.
//! - On input, as Dynamo: `storage_tier` defaults to device, `dp_rank` to 0,
//!   `parent_hash`, `start_position` and `mm_extra_info` may be absent or
//!   null, a cleared event may also be `{"cleared": null}`, unknown fields
//!   are ignored. Hashes may also be negative (two's complement). `removed`
//!   and `cleared` events (older dumps of ours, other peers) are applied in
//!   their place. `start_position` is read only with `kv_indexer_orphan`,
//!   which needs it; positions that do not add up refuse the dump.
//! - `residency_domain` is always `"worker"` on output (Dynamo 1.6.1
//!   writes it too). On input a missing one means `"worker"`, as in Dynamo;
//!   any other value (`"cache_owner"`, an unknown name, `null`, a number)
//!   is an unsupported residency domain: Dynamo skips such an event and
//!   counts it, and so do we (`unsupported_residency`, by event type), the
//!   rest of the dump still applies.
//! - Skipped, and counted, on input: events of a storage tier we do not
//!   know, events of an unsupported residency domain (above), and entries
//!   that carry an `"error"` instead of events (Dynamo writes those when
//!   one index fails to dump).
//!
//! Which levels tolerate our extra fields: Dynamo's `RouterEvent`,
//! `KvCacheEvent`, `KvCacheStoreData` (where `kv_indexer_orphan` goes),
//! `KvCacheStoredBlockData` and its recovery's dump entry are plain serde
//! derives without `deny_unknown_fields`; `data` is an externally tagged
//! enum, an object with exactly one key, so nothing may be added there.
//!
//! Writing is hand-rolled (a dump can hold millions of blocks) and
//! streamed from the live indexes (`stream`, which also says what a dump
//! taken while events land promises); a kv-indexer peer gets the same
//! events in a compact form (`binary`). Reading goes through serde, whose
//! recursion limit bounds nesting, as the bytes arrive (`read_dump_json`):
//! each event is handed to a `DumpSink` as soon as it is read, so no
//! document is ever held whole.

pub mod binary;
pub mod stream;

use crate::event::{Event, EventKind, StorageTier, StoredBlock, WorkerId};
use crate::hash::JsonHash;
use crate::index::{DumpEvent, Orphan};
use crate::json::out::{push_str, push_u64};
use crate::json::BodyError;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// The events of one (model, tenant) index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpEntry {
    pub model_name: String,
    pub tenant_id: String,
    pub block_size: u32,
    /// The blocks each worker holds, as stored chains (a peer's dump may
    /// also remove and clear); `Index::load_dump` applies them.
    pub events: Vec<DumpEvent>,
}

#[cfg(test)]
impl DumpEntry {
    /// (block, worker) pairs the events leave.
    pub fn pairs(&self) -> u64 {
        let (mut stored, mut removed) = (0u64, 0u64);
        for e in &self.events {
            match &e.event.kind {
                EventKind::Stored { blocks, .. } => stored += blocks.len() as u64,
                EventKind::Removed { engine_hashes } => removed += engine_hashes.len() as u64,
                EventKind::Cleared => {}
            }
        }
        stored.saturating_sub(removed)
    }
}

/// A parsed dump and what was left out of it.
#[cfg(test)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpParse {
    pub entries: Vec<DumpEntry>,
    /// Events skipped: unknown storage tier or unsupported residency domain.
    pub skipped_events: u64,
    /// Of those, events of an unsupported residency domain, by event type
    /// (stored, removed, cleared).
    pub unsupported_residency: [u64; 3],
    /// Entries skipped because the peer reported an error instead of events.
    pub skipped_entries: u64,
}

#[cfg(test)]
/// Writes the `/dump` body for `entries` (whole; `/dump` itself streams
/// from the indexes, `stream`).
pub fn write_dump(out: &mut Vec<u8>, entries: &[DumpEntry]) {
    out.push(b'{');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_entry_head(out, &entry.model_name, &entry.tenant_id, entry.block_size);
        for (event_id, event) in entry.events.iter().enumerate() {
            if event_id > 0 {
                out.push(b',');
            }
            write_event(out, event, event_id as u64);
        }
        out.extend_from_slice(b"]}");
    }
    out.push(b'}');
}

/// An entry's key and fields, up to the `[` of its events.
fn write_entry_head(out: &mut Vec<u8>, model_name: &str, tenant_id: &str, block_size: u32) {
    push_str(out, &format!("{model_name}:{tenant_id}"));
    out.extend_from_slice(b":{\"model_name\":");
    push_str(out, model_name);
    out.extend_from_slice(b",\"tenant_id\":");
    push_str(out, tenant_id);
    out.extend_from_slice(b",\"block_size\":");
    push_u64(out, u64::from(block_size));
    out.extend_from_slice(b",\"events\":[");
}

fn write_event(out: &mut Vec<u8>, dumped: &DumpEvent, event_id: u64) {
    let event = &dumped.event;
    out.extend_from_slice(b"{\"worker_id\":");
    push_u64(out, event.worker.instance_id);
    out.extend_from_slice(b",\"storage_tier\":\"");
    out.extend_from_slice(event.tier.as_str().as_bytes());
    out.extend_from_slice(b"\",\"residency_domain\":\"worker\",\"event\":{\"event_id\":");
    push_u64(out, event_id);
    out.extend_from_slice(b",\"data\":");
    match &event.kind {
        EventKind::Stored { parent, blocks } => {
            out.extend_from_slice(b"{\"stored\":{\"parent_hash\":");
            match parent {
                Some(p) => push_u64(out, *p),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"start_position\":");
            match &dumped.orphan {
                Some(o) => push_u64(out, u64::from(o.position)),
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(b",\"blocks\":[");
            for (i, b) in blocks.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(b"{\"block_hash\":");
                push_u64(out, b.engine_hash);
                out.extend_from_slice(b",\"tokens_hash\":");
                push_u64(out, b.local_hash);
                out.extend_from_slice(b",\"mm_extra_info\":null}");
            }
            out.push(b']');
            if let Some(o) = &dumped.orphan {
                out.extend_from_slice(b",\"kv_indexer_orphan\":{\"anchor_hash\":");
                match o.anchor {
                    Some(h) => push_u64(out, h),
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(b",\"missing_tokens_hashes\":[");
                for (i, l) in o.missing.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    push_u64(out, *l);
                }
                out.extend_from_slice(b"]}");
            }
            out.extend_from_slice(b"}}");
        }
        EventKind::Removed { engine_hashes } => {
            out.extend_from_slice(b"{\"removed\":{\"block_hashes\":[");
            for (i, h) in engine_hashes.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_u64(out, *h);
            }
            out.extend_from_slice(b"]}}");
        }
        EventKind::Cleared => out.extend_from_slice(b"\"cleared\""),
    }
    out.extend_from_slice(b",\"dp_rank\":");
    push_u64(out, u64::from(event.worker.dp_rank));
    out.extend_from_slice(b"}}");
}

/// Where a dump's reader puts what it reads, as it reads it: an index's
/// entry begins (`index`), then its events come one by one (`event`).
/// An error stops the read; it is what the read returns.
pub trait DumpSink {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String>;
    fn event(&mut self, event: DumpEvent) -> Result<(), String>;
}

/// What a read left out of a dump.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Events skipped: unknown storage tier or unsupported residency domain.
    pub events: u64,
    /// Of those, events of an unsupported residency domain, by event type
    /// (stored, removed, cleared).
    pub unsupported_residency: [u64; 3],
    /// Entries skipped because the peer reported an error instead of events.
    pub entries: u64,
}

/// Why a dump could not be read: the dump's fault (malformed), or the
/// sink's (its message), or the reader's (I/O, in the message).
#[derive(Debug)]
pub enum ReadFailed {
    Dump(BodyError),
    Sink(String),
}

impl ReadFailed {
    pub fn message(&self) -> String {
        match self {
            ReadFailed::Dump(e) => format!("malformed dump: {}", e.message()),
            ReadFailed::Sink(m) => m.clone(),
        }
    }
}

/// Reads a `/dump` JSON document from `r` as it arrives, handing each
/// entry and event to `sink`; an entry whose events come before its
/// `block_size` (or, when the key does not split, its names) is held
/// until they are known. Nothing is read past the document's end.
pub fn read_dump_json(r: impl std::io::Read, sink: &mut dyn DumpSink) -> Result<Skipped, ReadFailed> {
    let mut state = ReadState { sink, skipped: Skipped::default(), failed: None, invalid: None };
    let mut de = serde_json::Deserializer::from_reader(r);
    let done = de::DeserializeSeed::deserialize(TopSeed(&mut state), &mut de).and_then(|()| de.end());
    match (done, state.failed, state.invalid) {
        (_, Some(m), _) => Err(ReadFailed::Sink(m)),
        (_, None, Some(m)) => Err(ReadFailed::Dump(BodyError::Invalid(m))),
        (Ok(()), None, None) => Ok(state.skipped),
        (Err(e), None, None) => Err(ReadFailed::Dump(match e.classify() {
            serde_json::error::Category::Data => BodyError::Unprocessable(format!("dump: {e}")),
            serde_json::error::Category::Io => BodyError::Malformed(format!("reading the dump: {e}")),
            _ => BodyError::Malformed(format!("dump: {e}")),
        })),
    }
}

/// Parses a whole `/dump` body and counts what was skipped.
#[cfg(test)]
pub fn parse_dump_counted(body: &[u8]) -> Result<DumpParse, BodyError> {
    let mut sink = Collect::default();
    let skipped = read_dump_json(body, &mut sink).map_err(|e| match e {
        ReadFailed::Dump(e) => e,
        ReadFailed::Sink(m) => BodyError::Invalid(m),
    })?;
    Ok(DumpParse {
        entries: sink.0,
        skipped_events: skipped.events,
        unsupported_residency: skipped.unsupported_residency,
        skipped_entries: skipped.entries,
    })
}

/// A sink that keeps every entry.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Collect(pub(crate) Vec<DumpEntry>);

#[cfg(test)]
impl DumpSink for Collect {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        let (model_name, tenant_id) = (model_name.to_owned(), tenant_id.to_owned());
        self.0.push(DumpEntry { model_name, tenant_id, block_size, events: Vec::new() });
        Ok(())
    }

    fn event(&mut self, event: DumpEvent) -> Result<(), String> {
        self.0.last_mut().ok_or("an event before its index")?.events.push(event);
        Ok(())
    }
}

struct ReadState<'s> {
    sink: &'s mut dyn DumpSink,
    skipped: Skipped,
    /// The sink's error, which stopped the read.
    failed: Option<String>,
    /// A value the format allows but no index takes (400, not 422).
    invalid: Option<String>,
}

impl ReadState<'_> {
    fn sink_call<E: de::Error>(&mut self, r: Result<(), String>) -> Result<(), E> {
        r.map_err(|m| {
            self.failed = Some(m);
            E::custom("stopped")
        })
    }
}

/// The top-level map, each entry read as it comes.
struct TopSeed<'a, 's>(&'a mut ReadState<'s>);

impl<'de> de::DeserializeSeed<'de> for TopSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of \"model:tenant\" entries")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            map.next_value_seed(EntrySeed { key: &key, state: &mut *self.0 })?;
        }
        Ok(())
    }
}

/// One entry: its names and block size, then its events handed on as they
/// come once those are known, else held until the entry ends.
struct EntrySeed<'a, 's> {
    key: &'a str,
    state: &'a mut ReadState<'s>,
}

/// What an entry said so far.
#[derive(Default)]
struct EntryHead {
    block_size: Option<u32>,
    model_name: Option<String>,
    tenant_id: Option<String>,
    /// The names its events went to, once they began.
    began: Option<(String, String)>,
}

impl EntryHead {
    /// The entry's names: its own, else its key split at the first `:`.
    fn names(&self, key: &str) -> Option<(String, String)> {
        let split = key.split_once(':');
        let model = self.model_name.clone().or_else(|| split.map(|(m, _)| m.to_owned()))?;
        let tenant = self.tenant_id.clone().or_else(|| split.map(|(_, t)| t.to_owned()))?;
        Some((model, tenant))
    }
}

impl<'de> de::DeserializeSeed<'de> for EntrySeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for EntrySeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a dump entry")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let key = self.key;
        let mut head = EntryHead::default();
        let (mut has_events, mut has_error) = (false, false);
        // Events read before the entry's block size or names were known.
        let mut held: Vec<DumpEvent> = Vec::new();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "block_size" => head.block_size = Some(map.next_value::<u32>()?),
                "model_name" => head.model_name = Some(map.next_value::<String>()?),
                "tenant_id" => head.tenant_id = Some(map.next_value::<String>()?),
                "error" => {
                    has_error = true;
                    map.next_value::<IgnoredAny>()?;
                }
                "events" => {
                    has_events = true;
                    if let (Some(block_size), Some(names), None) = (head.block_size, head.names(key), &head.began) {
                        check_block_size(self.state, key, block_size)?;
                        let begun = self.state.sink.index(&names.0, &names.1, block_size);
                        self.state.sink_call(begun)?;
                        head.began = Some(names);
                    }
                    let to_sink = head.began.is_some();
                    map.next_value_seed(EventsSeed { state: &mut *self.state, held: (!to_sink).then_some(&mut held) })?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if has_error && !has_events {
            self.state.skipped.entries += 1;
            return Ok(());
        }
        let (Some(block_size), true) = (head.block_size, has_events) else {
            return Err(de::Error::custom(format!("dump entry {key:?} needs `block_size` and `events`")));
        };
        check_block_size(self.state, key, block_size)?;
        let Some(names) = head.names(key) else {
            return Err(de::Error::custom(format!(
                "dump key {key:?} is not \"model:tenant\" and the entry has no model_name and tenant_id"
            )));
        };
        match &head.began {
            Some(began) if *began != names => Err(de::Error::custom(format!(
                "dump entry {key:?} names model {:?} tenant {:?} after its events, which went to {:?} {:?}",
                names.0, names.1, began.0, began.1
            ))),
            Some(_) => Ok(()),
            None => {
                let begun = self.state.sink.index(&names.0, &names.1, block_size);
                self.state.sink_call(begun)?;
                for e in held {
                    let r = self.state.sink.event(e);
                    self.state.sink_call(r)?;
                }
                Ok(())
            }
        }
    }
}

fn check_block_size<E: de::Error>(state: &mut ReadState<'_>, key: &str, block_size: u32) -> Result<(), E> {
    if block_size == 0 {
        state.invalid = Some(format!("dump entry {key:?} has block_size 0"));
        return Err(E::custom("stopped"));
    }
    Ok(())
}

/// An entry's events, converted as they are read and handed to the sink
/// (or to `held`), with the count skipped.
struct EventsSeed<'a, 's> {
    state: &'a mut ReadState<'s>,
    held: Option<&'a mut Vec<DumpEvent>>,
}

impl<'de> de::DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of RouterEvent objects")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<WireEvent>()? {
            match e.into_event() {
                Ok(ev) => match &mut self.held {
                    Some(held) => held.push(ev),
                    None => {
                        let r = self.state.sink.event(ev);
                        self.state.sink_call(r)?;
                    }
                },
                Err(Skip::Tier) => self.state.skipped.events += 1,
                Err(Skip::Residency(kind)) => {
                    self.state.skipped.events += 1;
                    self.state.skipped.unsupported_residency[kind] += 1;
                }
                Err(Skip::Invalid(why)) => return Err(de::Error::custom(why)),
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct WireEvent {
    worker_id: u64,
    #[serde(default)]
    storage_tier: WireTier,
    /// Whatever the value is, it is read whole and judged, as Dynamo's
    /// tolerant wire type does: only `"worker"` (or none) is ours.
    #[serde(default, rename = "residency_domain", deserialize_with = "foreign_domain")]
    foreign_domain: bool,
    event: WireKvEvent,
}

/// Why an event of a dump is left out.
enum Skip {
    Tier,
    /// An unsupported residency domain; the event's type (stored, removed, cleared).
    Residency(usize),
    /// Not an event at all: the whole dump is refused.
    Invalid(String),
}

impl WireEvent {
    fn into_event(self) -> Result<DumpEvent, Skip> {
        if self.foreign_domain {
            let kind = match self.event.data {
                WireData::Stored(_) => 0,
                WireData::Removed(_) => 1,
                WireData::Cleared => 2,
            };
            return Err(Skip::Residency(kind));
        }
        let WireTier(Some(tier)) = self.storage_tier else {
            return Err(Skip::Tier);
        };
        let worker = WorkerId::new(self.worker_id, self.event.dp_rank);
        let mut orphan = None;
        let kind = match self.event.data {
            WireData::Stored(s) => {
                if let Some(o) = s.kv_indexer_orphan {
                    let Some(position) = s.start_position else {
                        return Err(Skip::Invalid("a kv_indexer_orphan without its start_position".into()));
                    };
                    let o = Orphan {
                        position,
                        anchor: o.anchor_hash.map(|h| h.0),
                        missing: o.missing_tokens_hashes.into_iter().map(|h| h.0).collect(),
                    };
                    if !o.is_consistent() {
                        return Err(Skip::Invalid(format!(
                            "a kv_indexer_orphan at start_position {position} with {} missing ancestors {} an anchor",
                            o.missing.len(),
                            if o.anchor.is_some() { "and" } else { "but no" }
                        )));
                    }
                    orphan = Some(o);
                }
                EventKind::Stored {
                    parent: s.parent_hash.map(|h| h.0),
                    blocks: s
                        .blocks
                        .into_iter()
                        .map(|b| StoredBlock { engine_hash: b.block_hash.0, local_hash: b.tokens_hash.0 })
                        .collect(),
                }
            }
            WireData::Removed(r) => {
                EventKind::Removed { engine_hashes: r.block_hashes.into_iter().map(|h| h.0).collect() }
            }
            WireData::Cleared => EventKind::Cleared,
        };
        Ok(DumpEvent { event: Event { worker, tier, kind }, orphan })
    }
}

#[derive(Deserialize)]
struct WireKvEvent {
    #[serde(rename = "event_id")]
    _event_id: u64,
    data: WireData,
    #[serde(default)]
    dp_rank: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum WireData {
    Stored(WireStore),
    Removed(WireRemove),
    Cleared,
}

#[derive(Deserialize)]
struct WireStore {
    #[serde(default)]
    parent_hash: Option<JsonHash>,
    #[serde(default)]
    start_position: Option<u32>,
    blocks: Vec<WireBlock>,
    #[serde(default)]
    kv_indexer_orphan: Option<WireOrphan>,
}

#[derive(Deserialize)]
struct WireOrphan {
    anchor_hash: Option<JsonHash>,
    missing_tokens_hashes: Vec<JsonHash>,
}

#[derive(Deserialize)]
struct WireBlock {
    block_hash: JsonHash,
    tokens_hash: JsonHash,
    #[serde(default, rename = "mm_extra_info")]
    _mm_extra_info: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct WireRemove {
    block_hashes: Vec<JsonHash>,
}

/// A storage tier; None for a name we do not know.
struct WireTier(Option<StorageTier>);

impl Default for WireTier {
    fn default() -> Self {
        WireTier(Some(StorageTier::Device))
    }
}

impl<'de> Deserialize<'de> for WireTier {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = WireTier;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a storage tier name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<WireTier, E> {
                Ok(WireTier(StorageTier::parse(v)))
            }
        }
        d.deserialize_str(V)
    }
}

fn foreign_domain<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(serde_json::Value::deserialize(d)?.as_str() != Some("worker"))
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;
