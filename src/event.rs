//! The event model: what an engine says happened to its cache, in the
//! index's terms. Wire formats are decoded into these in `wire`; the index
//! applies them. Engine hashes are opaque per-worker identifiers: they follow
//! no known formula and are only used for parent links and removes.

use std::fmt;

/// Most blocks a Stored event, or hashes a Removed event, carries: from an
/// engine (longer events are refused whole) and in a snapshot (longer
/// chains are written as several chained events). As deep as the index's
/// default `depth_max`, so one event can hold the longest chain it keeps.
pub const BLOCKS_PER_EVENT_MAX: usize = 1 << 18;

/// One data-parallel rank of one inference instance: the unit that holds blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId {
    pub instance_id: u64,
    pub dp_rank: u32,
}

impl WorkerId {
    pub const fn new(instance_id: u64, dp_rank: u32) -> Self {
        Self { instance_id, dp_rank }
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.instance_id, self.dp_rank)
    }
}

/// Where a block lives. Queries walk the tiers in this order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StorageTier {
    Device = 0,
    HostPinned = 1,
    Disk = 2,
    External = 3,
}

impl StorageTier {
    /// Every tier, in query order.
    pub const ALL: [StorageTier; 4] =
        [StorageTier::Device, StorageTier::HostPinned, StorageTier::Disk, StorageTier::External];

    /// The name used in Dynamo's RouterEvent JSON.
    pub fn as_str(self) -> &'static str {
        ["device", "host_pinned", "disk", "external"][self.index()]
    }

    /// Parses a RouterEvent `storage_tier` name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One stored block: the engine's opaque hash and the local (chunk) hash of its tokens.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct StoredBlock {
    pub engine_hash: u64,
    pub local_hash: u64,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// Blocks cached as a chain: `blocks[0]`'s parent is `parent` (None: the
    /// chain starts at position 0), and each later block's parent is the one before it.
    Stored { parent: Option<u64>, blocks: Vec<StoredBlock> },
    /// Blocks evicted, by engine hash.
    Removed { engine_hashes: Vec<u64> },
    /// Every block of the worker, in every tier, is gone.
    Cleared,
}

/// One event of one worker in one storage tier (`Cleared` ignores the tier).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub worker: WorkerId,
    pub tier: StorageTier,
    pub kind: EventKind,
}

impl Event {
    pub fn stored(worker: WorkerId, tier: StorageTier, parent: Option<u64>, blocks: Vec<StoredBlock>) -> Self {
        Self { worker, tier, kind: EventKind::Stored { parent, blocks } }
    }

    pub fn removed(worker: WorkerId, tier: StorageTier, engine_hashes: Vec<u64>) -> Self {
        Self { worker, tier, kind: EventKind::Removed { engine_hashes } }
    }

    pub fn cleared(worker: WorkerId) -> Self {
        Self { worker, tier: StorageTier::Device, kind: EventKind::Cleared }
    }
}
