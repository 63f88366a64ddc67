//! Applying events: the only code that changes an index.
//!
//! An event of a worker holds that worker's state (`workers`) throughout,
//! and the tree lock only for the part that changes the shape. The
//! worker's records (engine hash -> block id), the one structure that costs
//! per (block, worker), are looked up and changed outside the tree lock, a
//! batch at a time with the cache asked ahead, so writers of different
//! workers overlap on what costs most. Who holds a block is said once more,
//! for queries, by the worker's bit in the members of the block's run; the
//! two always agree.
//!
//! A store walks from the parent block: blocks that exist already only get
//! the worker's bit (a range at a time along a run); the first block that
//! does not exist, and every one after it, is created in one go: appended to
//! the parent's run when the parent is its last block, else as a new run.
//! An event that names one engine hash twice is applied as two stores, cut
//! before the repeat, so each part sees the records as they were before it.
//! A remove clears the worker's bits (a range at a time) and trims the runs
//! it touched (`tree`).

use super::blocks::NIL;
use super::chain;
use super::records::{Homes, Spot, CLAIMED};
use super::tree::{Holder, Place, Shared, Tree};
use super::workers::{Changing, WorkerState};
use super::ApplyOutcome;
use crate::event::{StorageTier, StoredBlock};
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashSet;
use std::sync::atomic::Ordering;

const DEVICE: usize = StorageTier::Device as usize;
/// How many records ahead a batch asks the cache for.
const PREFETCH_AHEAD: usize = 32;
/// Pairs taken from the shared budget at a time while following existing blocks.
const PAIR_CREDIT: u64 = 64;
/// Blocks a store changes in the tree, while readers must wait for its
/// worker, before it lets them in: a query waits for one piece, not for a
/// whole long prefill.
const PIECE_BLOCKS: usize = 128;

#[inline]
pub(crate) fn split(slot: u32) -> (u32, u64) {
    (slot / super::slots::GROUP_BITS, 1u64 << (slot % super::slots::GROUP_BITS))
}

/// What an event's writer works with.
pub(crate) struct Ctx<'a> {
    pub shared: &'a Shared,
    pub tree: &'a Mutex<Tree>,
}

/// Polls of a held tree lock a writer makes before it parks.
const LOCK_SPINS: u32 = 4096;

impl Ctx<'_> {
    /// The tree lock. Another writer holds it for one event's walk (tens of
    /// microseconds at most), so a writer that finds it held polls it for
    /// about that long before it parks: parking_lot alone yields and parks
    /// after a few hundred cycles, and on two vCPUs each park and wake-up
    /// cost more than the wait.
    fn lock(&self) -> MutexGuard<'_, Tree> {
        let mut spins = 0;
        loop {
            if let Some(g) = self.tree.try_lock() {
                return g;
            }
            while self.tree.is_locked() {
                spins += 1;
                if spins > LOCK_SPINS {
                    return self.tree.lock();
                }
                std::hint::spin_loop();
            }
        }
    }
}

/// Consecutive blocks of one run whose bit changes together.
struct Range {
    run: u32,
    a: u32,
    b: u32,
}

/// Bit changes along runs, flushed a range at a time.
struct Marks {
    who: Holder,
    on: bool,
    range: Option<Range>,
}

impl Marks {
    fn new(who: Holder, on: bool) -> Self {
        Marks { who, on, range: None }
    }

    fn flush(&mut self, tree: &mut Tree, shared: &Shared) {
        if let Some(r) = self.range.take() {
            tree.mark(shared, r.run, self.who, r.a, r.b, self.on);
        }
    }

    /// Adds block `id`; returns its run.
    fn add(&mut self, tree: &mut Tree, shared: &Shared, id: u32) -> u32 {
        let (run, off) = tree.locate(id);
        self.add_at(tree, shared, run, off);
        run
    }

    /// Adds the block at `off` of `run`.
    fn add_at(&mut self, tree: &mut Tree, shared: &Shared, run: u32, off: u32) {
        if let Some(r) = &mut self.range {
            if r.run == run && r.b == off {
                r.b += 1;
                return;
            }
            if r.run == run && off + 1 == r.a {
                r.a -= 1;
                return;
            }
        }
        self.flush(tree, shared);
        self.range = Some(Range { run, a: off, b: off + 1 });
    }
}

/// A stretch of one run over which the worker's bit is the same: whether a
/// store that follows existing blocks finds them held already (aliases)
/// without searching the members block by block. Valid while the store only
/// goes forward setting bits; anything that clears some drops it.
struct Held {
    run: u32,
    from: u32,
    to: u32,
    held: bool,
}

impl Held {
    fn at(cache: &mut Option<Held>, tree: &Tree, shared: &Shared, who: Holder, p: Place) -> bool {
        if let Some(h) = cache {
            if h.run == p.run && (h.from..h.to).contains(&p.off) {
                return h.held;
            }
        }
        let len = tree.len(shared, p.run);
        let (from, to, held) = match tree.members(shared, p.run, who.tier).and_then(|m| m.group(who.group)) {
            None => (0, len, false),
            Some(g) => {
                let i = g.find(p.off);
                (g.start(i), g.end(i, len), g.bits(i) & who.bit != 0)
            }
        };
        *cache = Some(Held { run: p.run, from, to, held });
        held
    }
}

/// Pairs taken from the budget ahead of use; what is left goes back on drop.
struct Credit<'a> {
    shared: &'a Shared,
    left: u64,
}

impl Credit<'_> {
    fn take(&mut self, wanted: u64) -> bool {
        if self.left == 0 {
            self.left = self.shared.budget.take_pairs(wanted.clamp(1, PAIR_CREDIT));
        }
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }
}

impl Drop for Credit<'_> {
    fn drop(&mut self) {
        self.shared.budget.release_pairs(self.left);
    }
}

/// The block a stored block's parent names for this worker: the same tier
/// first; a lower-tier block may also hang off a block the worker holds in
/// another tier. A device block needs a device parent.
fn parent_block(st: &WorkerState, tier: usize, engine_hash: u64) -> Option<u32> {
    if let Some(id) = st.records[tier].get(engine_hash) {
        return Some(id);
    }
    if tier == DEVICE {
        return None;
    }
    (0..4).filter(|&t| t != tier).find_map(|t| st.records[t].get(engine_hash))
}

/// One fewer extra hash for (tier, block); true if there was one.
fn release_alias(st: &mut WorkerState, tier: usize, id: u32) -> bool {
    if st.aliases.is_empty() {
        return false;
    }
    let Some(extra) = st.aliases.get_mut(&(tier as u8, id)) else { return false };
    *extra -= 1;
    if *extra == 0 {
        st.aliases.remove(&(tier as u8, id));
    }
    true
}

/// Net changes of one event to the pair counters, applied once at its end.
#[derive(Default)]
struct Delta {
    added: u64,
    dropped: u64,
}

impl Delta {
    fn apply(self, shared: &Shared, tier: usize) {
        shared.pairs.fetch_add(self.added, Ordering::Relaxed);
        shared.pairs.fetch_sub(self.dropped, Ordering::Relaxed);
        shared.tier_pairs[tier].fetch_add(self.added, Ordering::Relaxed);
        shared.tier_pairs[tier].fetch_sub(self.dropped, Ordering::Relaxed);
        shared.budget.release_pairs(self.dropped);
    }
}

/// The worker no longer names block `id` by one of its hashes (taken out of
/// its records, or about to be overwritten): its bit goes unless another
/// hash still names the block.
fn release_block(tree: &mut Tree, shared: &Shared, st: &mut WorkerState, tier: usize, id: u32, delta: &mut Delta) {
    if release_alias(st, tier, id) {
        return;
    }
    let (group, bit) = split(st.slot);
    delta.dropped += 1;
    let (run, off) = tree.locate(id);
    tree.mark(shared, run, Holder { tier, group, bit }, off, off + 1, false);
    tree.trim(shared, run);
}

/// Why the rest of a store was refused.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refusal {
    UnknownParent,
    Depth,
    Shed,
    Full,
}

impl Refusal {
    fn count(self, out: &mut ApplyOutcome, n: u32) {
        match self {
            Refusal::UnknownParent => out.unknown_parent += n,
            Refusal::Depth => out.depth_exceeded += n,
            Refusal::Shed => out.shed += n,
            Refusal::Full => out.rejected += n,
        }
    }
}

pub(crate) fn store(
    ctx: &Ctx,
    st: &mut WorkerState,
    tier: StorageTier,
    parent: Option<u64>,
    blocks: &[StoredBlock],
    out: &mut ApplyOutcome,
) {
    let tier = tier as usize;
    let mut parent = parent;
    let mut rest = blocks;
    while !rest.is_empty() {
        let (cut, refused) = store_part(ctx, st, tier, parent, rest, out);
        if let Some(why) = refused {
            // A refused block refuses every block after it.
            why.count(out, (rest.len() - cut) as u32);
            return;
        }
        parent = Some(rest[cut - 1].engine_hash);
        rest = &rest[cut..];
    }
}

/// Stores the first blocks of `blocks`, up to the first engine hash that
/// repeats one before it; returns how many it took and, if some of those
/// were refused (they are counted), why.
fn store_part(
    ctx: &Ctx,
    st: &mut WorkerState,
    tier: usize,
    parent: Option<u64>,
    blocks: &[StoredBlock],
    out: &mut ApplyOutcome,
) -> (usize, Option<Refusal>) {
    let shared = ctx.shared;
    let (group, bit) = split(st.slot);
    let holder = Holder { tier, group, bit };
    let parent_id = match parent {
        None => None,
        Some(h) => match parent_block(st, tier, h) {
            Some(p) => Some(p),
            None => {
                out.unknown_parent += blocks.len() as u32;
                return (blocks.len(), Some(Refusal::UnknownParent));
            }
        },
    };
    // What the worker's hashes name now, asked ahead of use. Each hash is
    // claimed (added, if new to the worker) while its bucket is at hand and
    // gets its block once the tree says which; a hash found claimed already
    // was named earlier in this event.
    let records = &mut st.records[tier];
    let mut ahead = [Homes::default(); PREFETCH_AHEAD];
    for (h, b) in ahead.iter_mut().zip(blocks) {
        *h = records.prefetch(b.engine_hash);
    }
    let mut previous: Vec<u32> = Vec::with_capacity(blocks.len());
    let mut spots: Vec<Spot> = Vec::with_capacity(blocks.len());
    for (k, b) in blocks.iter().enumerate() {
        let homes = ahead[k % PREFETCH_AHEAD];
        if let Some(next) = blocks.get(k + PREFETCH_AHEAD) {
            ahead[k % PREFETCH_AHEAD] = records.prefetch(next.engine_hash);
        }
        let (old, spot) = records.claim(b.engine_hash, homes);
        if old == Some(CLAIMED) {
            // Claimed by a block before it in this event: the engine named
            // one hash twice. The part ends here; the rest is stored after
            // it, against the records as this part leaves them.
            break;
        }
        previous.push(old.unwrap_or(NIL));
        spots.push(spot);
    }
    let blocks = &blocks[..previous.len()];

    // The shape, under the tree lock: the block each stored block lands on.
    let mut ids: Vec<u32> = Vec::with_capacity(blocks.len());
    let mut delta = Delta::default();
    let mut refused = None;
    {
        let mut guard = ctx.lock();
        // Only setting bits, a store shows readers states between the
        // worker's before and after, each a prefix of its blocks. Taking
        // bits back (a reused hash) could show a mix of both that never
        // was: from the first such block on, the worker's version is odd
        // and readers that overlap look again.
        let mut changing: Option<Changing> = None;
        let mut piece_end = PIECE_BLOCKS;
        let (mut cur, mut pos, mut pchain) = match parent_id {
            None => (None, 0u32, None),
            Some(p) => (Some(guard.place(p)), guard.position(shared, p) + 1, Some(guard.chain(shared, p))),
        };
        let mut held: Option<Held> = None;
        let mut marks = Marks::new(holder, true);
        let mut credit = Credit { shared, left: 0 };
        while ids.len() < blocks.len() {
            let k = ids.len();
            if k >= piece_end {
                if changing.is_some() {
                    // A piece done: readers waiting for the worker may look now.
                    marks.flush(&mut guard, shared);
                    drop(changing.take());
                    parking_lot::MutexGuard::bump(&mut guard);
                    changing = Some(Changing::new(st));
                }
                piece_end = k + PIECE_BLOCKS;
            }
            let tree = &mut *guard;
            if pos as usize >= shared.depth_max {
                out.depth_exceeded += (blocks.len() - k) as u32;
                refused = Some(Refusal::Depth);
                break;
            }
            let b = blocks[k];
            let chain = pchain.map_or(b.local_hash, |pc| chain::next(pc, b.local_hash, pos));
            let old = previous[k];
            if old != NIL && tree.chain(shared, old) == chain && tree.position(shared, old) == pos {
                out.duplicate += 1;
                ids.push(old);
                (cur, pchain, pos) = (Some(tree.place(old)), Some(chain), pos + 1);
                continue;
            }
            let Some(at) = tree.next(shared, cur, pos, chain) else {
                // From here on nothing exists: create the rest of the piece in one go.
                marks.flush(tree, shared);
                let n = (piece_end - k).min(blocks.len() - k);
                debug_assert!(n > 0, "a piece always has room");
                if previous[k..k + n].iter().any(|&old| old != NIL) {
                    changing.get_or_insert_with(|| Changing::new(st));
                }
                held = None;
                refused = create(
                    tree,
                    shared,
                    st,
                    holder,
                    cur.map_or(NIL, |p| p.id),
                    pos,
                    chain,
                    &blocks[k..k + n],
                    &previous[k..k + n],
                    &mut ids,
                    &mut delta,
                    out,
                );
                if refused.is_some() || ids.len() == blocks.len() {
                    break;
                }
                let last = *ids.last().expect("created");
                (cur, pchain) = (Some(tree.place(last)), Some(tree.chain(shared, last)));
                pos += n as u32;
                continue;
            };
            let id = at.id;
            let alias = Held::at(&mut held, tree, shared, holder, at);
            if !alias && !credit.take((blocks.len() - k) as u64) {
                out.shed += (blocks.len() - k) as u32;
                refused = Some(Refusal::Shed);
                break;
            }
            if alias {
                *st.aliases.entry((tier as u8, id)).or_insert(0) += 1;
                out.duplicate += 1;
            } else {
                marks.add_at(tree, shared, at.run, at.off);
                delta.added += 1;
                out.stored += 1;
            }
            if old != NIL {
                // The engine reused the hash for other content: the new block is
                // held first, which pins it (and its parents) against the trim.
                marks.flush(tree, shared);
                changing.get_or_insert_with(|| Changing::new(st));
                release_block(tree, shared, st, tier, old, &mut delta);
                held = None;
            }
            ids.push(id);
            (cur, pchain, pos) = (Some(at), Some(chain), pos + 1);
        }
        let tree = &mut *guard;
        marks.flush(tree, shared);
        if matches!(refused, Some(Refusal::Shed | Refusal::Full)) {
            // Hashes of refused blocks that named other blocks: the engine
            // reused them, so the old blocks are gone all the same.
            for &old in previous[ids.len()..].iter().filter(|&&old| old != NIL) {
                changing.get_or_insert_with(|| Changing::new(st));
                release_block(tree, shared, st, tier, old, &mut delta);
            }
        }
        drop(changing);
    }

    // The records, outside the tree lock: each claimed slot gets its block.
    let records = &mut st.records[tier];
    for &spot in spots.iter().take(PREFETCH_AHEAD) {
        records.prefetch_spot(spot);
    }
    for (k, &id) in ids.iter().enumerate() {
        if let Some(&next) = spots.get(k + PREFETCH_AHEAD) {
            records.prefetch_spot(next);
        }
        records.set(blocks[k].engine_hash, spots[k], id);
    }
    // Refused blocks: hashes new to the worker go again, and so do hashes
    // that named other blocks which the store released (shed or full);
    // the others name their old blocks again.
    let released = matches!(refused, Some(Refusal::Shed | Refusal::Full));
    for (k, &old) in previous.iter().enumerate().skip(ids.len()) {
        if old == NIL || released {
            records.remove(blocks[k].engine_hash);
        } else {
            records.set(blocks[k].engine_hash, spots[k], old);
        }
    }
    delta.apply(shared, tier);
    (blocks.len(), refused)
}

/// Creates `blocks` (none of which exists) under `parent` at `pos`, the
/// first with chain `first`, held by the worker; pushes their ids.
#[allow(clippy::too_many_arguments)]
fn create(
    tree: &mut Tree,
    shared: &Shared,
    st: &mut WorkerState,
    holder: Holder,
    parent: u32,
    pos: u32,
    first: u64,
    blocks: &[StoredBlock],
    previous: &[u32],
    ids: &mut Vec<u32>,
    delta: &mut Delta,
    out: &mut ApplyOutcome,
) -> Option<Refusal> {
    let room = shared.depth_max.saturating_sub(pos as usize).min(blocks.len());
    out.depth_exceeded += (blocks.len() - room) as u32;
    let pairs = shared.budget.take_pairs(room as u64);
    let entries = shared.budget.take_entries(pairs);
    shared.budget.release_pairs(pairs - entries);
    let n = entries as usize;
    out.shed += (room - n) as u32;
    let refused = if n < room {
        Some(Refusal::Shed)
    } else if room < blocks.len() {
        Some(Refusal::Depth)
    } else {
        None
    };
    if n == 0 {
        return refused;
    }
    let mut chains = Vec::with_capacity(n);
    let mut c = first;
    for (j, b) in blocks[..n].iter().enumerate() {
        if j > 0 {
            c = chain::next(c, b.local_hash, pos + j as u32);
        }
        chains.push(c);
    }
    let made = if parent != NIL && tree.is_tail(shared, parent) {
        let (run, _) = tree.locate(parent);
        tree.append(shared, run, &chains, holder)
    } else if tree.chain_taken(shared, chains[0]) {
        // A chain collision with a run elsewhere (odds 2^-64): refuse.
        None
    } else {
        tree.new_run(shared, parent, pos, &chains, holder)
    };
    let Some(first_id) = made else {
        shared.budget.release_pairs(entries);
        shared.budget.release_entries(entries);
        out.rejected += n as u32;
        return Some(Refusal::Full);
    };
    // The new blocks are consecutive in one run.
    let at = tree.place(first_id);
    tree.push_ids(shared, at.run, at.off, n as u32, ids);
    delta.added += n as u64;
    out.stored += n as u32;
    // Hashes the engine reused for this new content: the old blocks go.
    for &old in previous[..n].iter().filter(|&&old| old != NIL) {
        release_block(tree, shared, st, holder.tier, old, delta);
    }
    refused
}

pub(crate) fn remove(ctx: &Ctx, st: &mut WorkerState, tier: StorageTier, hashes: &[u64], out: &mut ApplyOutcome) {
    let tier = tier as usize;
    let (group, bit) = split(st.slot);
    // The records, outside the tree lock.
    let mut gone: Vec<u32> = Vec::with_capacity(hashes.len());
    let mut ahead = [Homes::default(); PREFETCH_AHEAD];
    for (a, &h) in ahead.iter_mut().zip(hashes) {
        *a = st.records[tier].prefetch(h);
    }
    for (k, &h) in hashes.iter().enumerate() {
        let homes = ahead[k % PREFETCH_AHEAD];
        if let Some(&next) = hashes.get(k + PREFETCH_AHEAD) {
            ahead[k % PREFETCH_AHEAD] = st.records[tier].prefetch(next);
        }
        let Some(id) = st.records[tier].remove_ahead(h, homes) else {
            out.unknown_removed += 1;
            continue;
        };
        out.removed += 1;
        if !release_alias(st, tier, id) {
            gone.push(id);
        }
    }
    if gone.is_empty() {
        return;
    }
    let shared = ctx.shared;
    {
        // Only taking bits back, a remove shows readers states between the
        // worker's before and after: it needs no version change.
        let mut guard = ctx.lock();
        let tree = &mut *guard;
        let mut marks = Marks::new(Holder { tier, group, bit }, false);
        let mut touched: Vec<u32> = Vec::new();
        for &id in &gone {
            let run = marks.add(tree, shared, id);
            if touched.last() != Some(&run) {
                touched.push(run);
            }
        }
        marks.flush(tree, shared);
        touched.sort_unstable();
        touched.dedup();
        trim_all(tree, shared, touched);
    }
    Delta { added: 0, dropped: gone.len() as u64 }.apply(shared, tier);
}

/// Trims every run in `runs` that is still live, deepest first.
fn trim_all(tree: &mut Tree, shared: &Shared, runs: impl IntoIterator<Item = u32>) {
    let mut runs: Vec<u32> = runs.into_iter().collect();
    runs.sort_unstable_by_key(|&r| std::cmp::Reverse(tree.start(shared, r)));
    for run in runs {
        if tree.is_live(run) {
            tree.trim(shared, run);
        }
    }
}

/// Drops every block of the worker; returns how many pairs went.
pub(crate) fn clear(ctx: &Ctx, st: &mut WorkerState) -> u64 {
    let shared = ctx.shared;
    let (group, bit) = split(st.slot);
    let taken: Vec<Vec<(u64, u32)>> = st.records.iter_mut().map(|r| r.take()).collect();
    st.aliases = Default::default();
    let mut dropped = 0;
    let mut tree = ctx.lock();
    let tree = &mut *tree;
    let _changing = Changing::new(st);
    let mut touched: FxHashSet<u32> = FxHashSet::default();
    for (tier, records) in taken.iter().enumerate() {
        let mut places: Vec<(u32, u32)> = records.iter().map(|&(_, id)| tree.locate(id)).collect();
        places.sort_unstable();
        places.dedup();
        let mut i = 0;
        while i < places.len() {
            let (run, a) = places[i];
            let mut b = a + 1;
            while i + 1 < places.len() && places[i + 1] == (run, b) {
                b += 1;
                i += 1;
            }
            tree.mark(shared, run, Holder { tier, group, bit }, a, b, false);
            touched.insert(run);
            i += 1;
        }
        let n = places.len() as u64;
        shared.tier_pairs[tier].fetch_sub(n, Ordering::Relaxed);
        dropped += n;
    }
    shared.pairs.fetch_sub(dropped, Ordering::Relaxed);
    shared.budget.release_pairs(dropped);
    trim_all(tree, shared, touched);
    dropped
}

/// Checks that the worker's bits say exactly what its records say; returns
/// its pairs.
pub(crate) fn check_worker(tree: &Tree, shared: &Shared, st: &WorkerState) -> u64 {
    let (group, bit) = split(st.slot);
    let mut pairs = 0u64;
    for tier in 0..4 {
        let mut named: Vec<(u32, u32)> = st.records[tier].iter().map(|(_, id)| tree.locate(id)).collect();
        named.sort_unstable();
        named.dedup();
        let mut held = Vec::new();
        for run in tree.live_runs() {
            let len = tree.len(shared, run);
            if let Some(m) = tree.members(shared, run, tier) {
                held.extend((0..len).filter(|&o| m.holds(group, bit, o)).map(|o| (run, o)));
            }
        }
        assert_eq!(named, held, "worker {} tier {tier}: records and bits agree", st.id);
        let extra: u32 = st.aliases.iter().filter(|(k, _)| k.0 as usize == tier).map(|(_, &v)| v).sum();
        assert_eq!(st.records[tier].iter().count(), named.len() + extra as usize, "aliases count the extra hashes");
        pairs += named.len() as u64;
    }
    pairs
}
