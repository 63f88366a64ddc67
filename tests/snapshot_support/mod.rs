//! Helpers for the snapshot tests: a scratch directory removed on drop,
//! a worker's blocks read from a daemon's /dump, and the file's layout
//! (to forge files whose checksum is right but whose content is not).

#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Held engine hashes per tier (device, host pinned, disk, external).
pub type Tiers = [BTreeSet<u64>; 4];

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kvi-snapshot-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn arg(&self) -> String {
        self.0.display().to_string()
    }

    pub fn file(&self) -> PathBuf {
        self.0.join("snapshot.bin")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The blocks `/dump` says worker `instance:rank` holds in index `key`.
pub fn held(dump: &Value, key: &str, instance: u64, rank: u32) -> Tiers {
    let mut out = Tiers::default();
    let Some(events) = dump.get(key).and_then(|e| e["events"].as_array()) else { return out };
    for ev in events {
        if ev["worker_id"].as_u64() != Some(instance) || ev["event"]["dp_rank"].as_u64() != Some(rank as u64) {
            continue;
        }
        let tier = match ev["storage_tier"].as_str().unwrap_or("device") {
            "device" => 0,
            "host_pinned" => 1,
            "disk" => 2,
            _ => 3,
        };
        // A dump is a list of held blocks: stores only, each block once.
        let blocks = ev["event"]["data"]["stored"]["blocks"].as_array();
        for b in blocks.unwrap_or_else(|| panic!("not a store: {ev}")) {
            assert!(out[tier].insert(b["block_hash"].as_u64().unwrap()), "listed twice: {ev}");
        }
    }
    out
}

/// A dump as a set of (index, worker, tier, block, local, parent) facts
/// (and where each orphan hangs), whatever the order and grouping of its
/// events.
pub fn facts(dump: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (key, entry) in dump.as_object().unwrap() {
        out.insert(format!("{key} block_size {}", entry["block_size"]));
        for ev in entry["events"].as_array().unwrap() {
            let worker = format!("{}:{}", ev["worker_id"], ev["event"]["dp_rank"]);
            let tier = ev["storage_tier"].as_str().unwrap_or("device").to_string();
            let stored = &ev["event"]["data"]["stored"];
            assert!(stored.is_object(), "a dump lists stored blocks only: {ev}");
            let mut parent = stored["parent_hash"].to_string();
            if !stored["kv_indexer_orphan"].is_null() {
                let (at, orphan) = (&stored["start_position"], &stored["kv_indexer_orphan"]);
                out.insert(format!("{key} {worker} {tier} {} at {at} hangs under {orphan}", stored["blocks"][0]));
            }
            for b in stored["blocks"].as_array().unwrap() {
                out.insert(format!("{key} {worker} {tier} {} {} {parent}", b["block_hash"], b["tokens_hash"]));
                parent = b["block_hash"].to_string();
            }
        }
    }
    out
}

/// Length of a snapshot file's header (see `snapshot::codec`).
pub fn header_len(file: &[u8]) -> usize {
    14 + u16::from_le_bytes([file[12], file[13]]) as usize + 8
}

/// Bytes of a snapshot file's trailer: four counts and the checksum.
pub const TRAILER_BYTES: usize = 4 + 4 + 8 + 8 + 8;

/// Makes a file's checksum (its last 8 bytes) right again after a change.
pub fn reseal(file: &mut [u8]) {
    use xxhash_rust::xxh3::xxh3_64;
    let n = file.len() - 8;
    let sum = xxh3_64(&file[..n]);
    file[n..].copy_from_slice(&sum.to_le_bytes());
}

/// Whether `path` holds a whole snapshot file: the magic, then a checksum
/// at its end that matches every byte before it (what the reader checks
/// last; the restart tests check the content by restoring it).
pub fn well_formed(path: &Path) -> bool {
    use xxhash_rust::xxh3::xxh3_64;
    let Ok(file) = std::fs::read(path) else { return false };
    if file.len() < 12 + TRAILER_BYTES || &file[..8] != b"KVIXSNAP" {
        return false;
    }
    let n = file.len() - 8;
    u64::from_le_bytes(file[n..].try_into().unwrap()) == xxh3_64(&file[..n])
}

/// The format of a snapshot file (at its fixed offset 8, forever).
pub fn format(file: &[u8]) -> u32 {
    u32::from_le_bytes(file[8..12].try_into().unwrap())
}
