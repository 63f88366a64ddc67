//! Finding, for every worker, how deep a prefix of a query it holds.
//!
//! Device tier: jump search. The query's sequence hashes name its prefixes,
//! and a device slot's worker set holds the workers that *reach* that
//! prefix (hold it and all of its ancestors), so membership is monotone
//! along the query: once a worker drops out it never comes back. The search
//! checks every `jump`-th position; when some workers drop out between two
//! checkpoints it finds each one's last position by binary search over the
//! dropped set, splitting the set at every probe.
//!
//! Lower tiers: each continues, position by position, from where the tier
//! before it stopped for that worker (device, then host, disk, external),
//! as Dynamo chains them. Empty tiers cost nothing.

use super::chain::Chains;
use super::level::Levels;
use super::slots::{SlotTable, GROUP_BITS};
use super::writer::Shared;
use super::{Matches, WorkerMatch};
use crate::event::StorageTier;
use crossbeam::epoch::{self, Guard};

const G: usize = GROUP_BITS as usize;

#[inline]
fn bits_at(levels: &Levels, chains: &mut Chains, level: usize, group: u32, guard: &Guard) -> u64 {
    match levels.get(level) {
        // A position no block ever reached costs no chain hash either.
        Some(t) if t.len() > 0 => t.bits(chains.at(level), group, guard),
        _ => 0,
    }
}

struct DeviceSearch<'a, 'c> {
    levels: &'a Levels,
    chains: &'a mut Chains<'c>,
    group: u32,
    guard: &'a Guard,
    depth: &'a mut [u32; G],
}

impl DeviceSearch<'_, '_> {
    #[inline]
    fn bits(&mut self, level: usize) -> u64 {
        bits_at(self.levels, self.chains, level, self.group, self.guard)
    }

    fn run(&mut self, live: u64, jump: usize) {
        let d = self.chains.len();
        if d == 0 {
            return;
        }
        let mut active = self.bits(0) & live;
        let mut lo = 0;
        while active != 0 && lo + 1 < d {
            let hi = (lo + jump).min(d - 1);
            let still = self.bits(hi) & active;
            if still != active {
                let dropped = active & !still;
                // Binary search costs about log2(window) probes per distinct
                // drop point; a linear scan costs the window once.
                let window = hi - lo - 1;
                let log = usize::BITS - window.leading_zeros();
                if dropped.count_ones() as usize * log as usize >= window {
                    self.scan(dropped, lo, hi);
                } else {
                    self.resolve(dropped, lo, hi);
                }
                active = still;
            }
            lo = hi;
        }
        self.assign(active, d as u32);
    }

    /// Every worker of `set` reaches `lo` and none reaches `hi`: find each
    /// one's last position by walking the positions in between.
    fn scan(&mut self, mut set: u64, lo: usize, hi: usize) {
        for k in lo + 1..hi {
            let still = self.bits(k) & set;
            self.assign(set & !still, k as u32);
            set = still;
            if set == 0 {
                return;
            }
        }
        self.assign(set, hi as u32);
    }

    /// Every worker of `set` reaches `lo` and none reaches `hi`: binary
    /// search, splitting the set at each probe.
    fn resolve(&mut self, set: u64, lo: usize, hi: usize) {
        if hi - lo <= 1 {
            self.assign(set, lo as u32 + 1);
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let deeper = self.bits(mid) & set;
        if deeper != 0 {
            self.resolve(deeper, mid, hi);
        }
        if set & !deeper != 0 {
            self.resolve(set & !deeper, lo, mid);
        }
    }

    fn assign(&mut self, mut set: u64, depth: u32) {
        while set != 0 {
            self.depth[set.trailing_zeros() as usize] = depth;
            set &= set - 1;
        }
    }
}

/// Extends each live worker from `start[w]` through consecutive positions
/// held in this tier; writes the extension length to `ext`.
fn extend(
    levels: &Levels,
    chains: &mut Chains,
    group: u32,
    live: u64,
    start: &[u32; G],
    ext: &mut [u32; G],
    guard: &Guard,
) {
    let d = chains.len() as u32;
    let mut order: Vec<(u32, u32)> = (0..G as u32)
        .filter(|&b| live >> b & 1 == 1 && start[b as usize] < d)
        .map(|b| (start[b as usize], b))
        .collect();
    order.sort_unstable();
    let mut next = 0;
    let mut alive = 0u64;
    let mut level = match order.first() {
        Some(&(s, _)) => s,
        None => return,
    };
    while level < d {
        while next < order.len() && order[next].0 == level {
            alive |= 1 << order[next].1;
            next += 1;
        }
        if alive == 0 {
            match order.get(next) {
                Some(&(s, _)) => {
                    level = s;
                    continue;
                }
                None => break,
            }
        }
        let held = bits_at(levels, chains, level as usize, group, guard) & alive;
        let mut dropped = alive & !held;
        while dropped != 0 {
            let b = dropped.trailing_zeros() as usize;
            ext[b] = level - start[b];
            dropped &= dropped - 1;
        }
        alive = held;
        level += 1;
    }
    while alive != 0 {
        let b = alive.trailing_zeros() as usize;
        ext[b] = d - start[b];
        alive &= alive - 1;
    }
}

/// Attempts per group before a query waits for the writer instead.
const RETRIES_MAX: usize = 8;
/// How long a query waits, in all, for workers in the middle of an event
/// before it takes the writer lock instead (a last resort: the lock may be
/// held across a whole batch of events).
const WAIT_EVEN_MAX_US: u64 = 50_000;

/// Waits until no worker of `mask` is in the middle of an event, or the
/// deadline passes. Spins briefly, then yields: one event takes microseconds
/// to a fraction of a millisecond.
fn wait_between_events(table: &SlotTable, group: usize, mask: u64, deadline: std::time::Instant) {
    let mut v = [0u64; G];
    for round in 0u32.. {
        table.read_versions(group, mask, &mut v);
        let mut m = mask;
        let mut busy = false;
        while m != 0 {
            let b = m.trailing_zeros() as usize;
            busy |= v[b] & 1 == 1;
            m &= m - 1;
        }
        if !busy || std::time::Instant::now() >= deadline {
            return;
        }
        if round < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Per-slot depths of one group: device, host (cumulative), disk (cumulative).
type Depths = ([u32; G], [u32; G], [u32; G]);

fn group_depths(
    shared: &Shared,
    chains: &mut Chains,
    jump: usize,
    group: u32,
    mask: u64,
    lower_tiers: &[StorageTier],
    guard: &Guard,
) -> Depths {
    let mut device = [0u32; G];
    DeviceSearch { levels: &shared.levels[StorageTier::Device.index()], chains, group, guard, depth: &mut device }
        .run(mask, jump);
    let mut host = device;
    let mut disk = device;
    if !lower_tiers.is_empty() {
        let mut reach = device;
        for &tier in lower_tiers {
            let mut ext = [0u32; G];
            extend(&shared.levels[tier.index()], chains, group, mask, &reach, &mut ext, guard);
            for b in 0..G {
                reach[b] += ext[b];
            }
            if tier == StorageTier::HostPinned {
                host = reach;
            }
        }
        for b in 0..G {
            disk[b] = reach[b].max(host[b]);
        }
    }
    (device, host, disk)
}

fn merge(into: &mut Depths, from: &Depths, mut mask: u64) {
    while mask != 0 {
        let b = mask.trailing_zeros() as usize;
        into.0[b] = from.0[b];
        into.1[b] = from.1[b];
        into.2[b] = from.2[b];
        mask &= mask - 1;
    }
}

/// Every worker's depths. A worker whose events were being applied while
/// its bits were read is searched again (alone), so each worker's answer is
/// a state it really had. Before each retry it waits (briefly, bounded)
/// for those workers' events in progress to finish; past `RETRIES_MAX`
/// retries it takes the writer lock (`lock_writer`), which no event can
/// then interleave with.
pub(crate) fn find<L, G2>(shared: &Shared, chains: &mut Chains, jump: usize, lock_writer: L) -> Matches
where
    L: Fn() -> G2,
{
    let lower_tiers: Vec<StorageTier> = [StorageTier::HostPinned, StorageTier::Disk, StorageTier::External]
        .into_iter()
        .filter(|t| shared.tier_pairs[t.index()].load(std::sync::atomic::Ordering::Relaxed) > 0)
        .collect();
    let guard = epoch::pin();
    shared.slots.read(&guard, |table: &SlotTable| {
        let mut out = Vec::new();
        for group in 0..table.groups() {
            let live = table.live[group];
            if live == 0 {
                continue;
            }
            let (mut before, mut after) = ([0u64; G], [0u64; G]);
            let mut mask = live;
            let mut depths: Depths = ([0; G], [0; G], [0; G]);
            let mut deadline = None;
            for attempt in 0..=RETRIES_MAX {
                if attempt > 0 {
                    // Wait out the events in progress rather than race them again.
                    let d = *deadline.get_or_insert_with(|| {
                        std::time::Instant::now() + std::time::Duration::from_micros(WAIT_EVEN_MAX_US)
                    });
                    wait_between_events(table, group, mask, d);
                }
                let _held = (attempt == RETRIES_MAX).then(&lock_writer);
                table.read_versions(group, mask, &mut before);
                let found = group_depths(shared, chains, jump, group as u32, mask, &lower_tiers, &guard);
                table.read_versions(group, mask, &mut after);
                let mut unstable = 0u64;
                let mut m = mask;
                while m != 0 {
                    let b = m.trailing_zeros() as usize;
                    if before[b] != after[b] || before[b] & 1 == 1 {
                        unstable |= 1 << b;
                    }
                    m &= m - 1;
                }
                if attempt == RETRIES_MAX {
                    unstable = 0; // under the writer lock nothing moved
                }
                merge(&mut depths, &found, mask & !unstable);
                mask = unstable;
                if mask == 0 {
                    break;
                }
            }
            let (device, host, disk) = depths;
            for bit in 0..G as u32 {
                let b = bit as usize;
                if live >> bit & 1 == 0 || disk[b] == 0 {
                    continue;
                }
                if let Some(worker) = table.worker(group, bit) {
                    out.push(WorkerMatch { worker, device: device[b], host: host[b], disk: disk[b] });
                }
            }
        }
        Matches { workers: out }
    })
}
