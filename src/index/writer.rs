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
//! An event that names one engine hash twice leaves what two stores cut
//! before the repeat would: the later block is what the hash names, and
//! the earlier one is on the path but not held (as a dump's orphan's
//! missing ancestors are, placed by the same store). A remove clears the worker's bits (a range at a time) and trims the runs
//! it touched (`tree`).
//!
//! Readers rely on one rule (see `query`): every change of a worker's bits
//! is made inside a window of that worker (`workers::Window`) that only
//! sets bits or only clears them, opened and closed under the tree lock.
//! An event that does both (a store whose engine hashes name other blocks
//! already: the engine reused them for other content) clears first, in a
//! window of its own, and sets after: readers see the worker's bits go
//! down to a state that holds less than before and after, then up to the
//! state after, never a mix of the two. Blocks are set in add windows of
//! up to 128 blocks, between which other writers and waiting readers get
//! in.
//!
//! A store claims each of its hashes in the records before it takes the
//! tree lock: the claim says what the hash names now and marks its slot
//! (adding the hash if it is new) while the bucket is at hand; after the
//! tree lock the claimed slots get their blocks, and refused blocks give
//! theirs back. A writer that finds the tree lock held polls it (about the
//! longest walk) before it parks, since parking cost each wait two context
//! switches. At its end an event hands what it replaced (members, lists) to
//! `reclaim`, so queries never free it.

use super::blocks::NIL;
use super::chain;
use super::records::{Homes, Spot, CLAIMED};
use super::slots::Way;
use super::tree::{Holder, Place, Shared, Tree};
use super::workers::{Window, WorkerState};
use super::ApplyOutcome;
use crate::event::{StorageTier, StoredBlock};
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxHashMap;
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
            if self.on {
                tree.mark(shared, r.run, self.who, r.a, r.b, true);
            } else {
                tree.let_go(shared, r.run, self.who, r.a, r.b);
            }
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
/// without searching the members block by block. Valid while the store
/// holds the tree lock and only goes forward setting bits: it is dropped
/// when the lock is let go between pieces (another writer appending to the
/// run clears the worker's bits past its end). It never reaches past the
/// run's end, where the worker's bits may be left from a tail it let go.
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
                (g.start(i), g.end(i, len).min(len), g.bits(i) & who.bit != 0)
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

/// Net changes of one window to the pair counters.
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

/// Why the rest of a store was refused.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Refusal {
    UnknownParent,
    Depth,
    Shed,
    Full,
}

impl Refusal {
    fn count(self, out: &mut ApplyOutcome, n: usize) {
        let n = n as u32;
        match self {
            Refusal::UnknownParent => out.unknown_parent += n,
            Refusal::Depth => out.depth_exceeded += n,
            Refusal::Shed => out.shed += n,
            Refusal::Full => out.rejected += n,
        }
    }
}

/// What a store's hashes named before it, once claimed.
struct Claims {
    /// Per block, the block its hash named before the event (NIL: new to
    /// the worker).
    previous: Vec<u32>,
    spots: Vec<Spot>,
    /// Per block, whether a later block of the event names the same hash
    /// (the engine named it twice): then the later one is what the hash
    /// names after the event, and this one is not held.
    superseded: Vec<bool>,
}

/// Claims each block's hash in the records (adding it if new to the
/// worker) while its bucket is at hand, asked ahead of use.
fn claim(st: &mut WorkerState, tier: usize, blocks: &[StoredBlock]) -> Claims {
    let records = &mut st.records[tier];
    let mut ahead = [Homes::default(); PREFETCH_AHEAD];
    for (h, b) in ahead.iter_mut().zip(blocks) {
        *h = records.prefetch(b.engine_hash);
    }
    let n = blocks.len();
    let mut c = Claims { previous: Vec::with_capacity(n), spots: Vec::with_capacity(n), superseded: vec![false; n] };
    // Where each hash was named last in this event, once one repeats (rare).
    let mut last: Option<FxHashMap<u64, usize>> = None;
    for (k, b) in blocks.iter().enumerate() {
        let homes = ahead[k % PREFETCH_AHEAD];
        if let Some(next) = blocks.get(k + PREFETCH_AHEAD) {
            ahead[k % PREFETCH_AHEAD] = records.prefetch(next.engine_hash);
        }
        let (old, spot) = records.claim(b.engine_hash, homes);
        if old == Some(CLAIMED) {
            let last =
                last.get_or_insert_with(|| blocks[..k].iter().enumerate().map(|(j, b)| (b.engine_hash, j)).collect());
            let j = last.insert(b.engine_hash, k).expect("claimed before in this event");
            c.superseded[j] = true;
            c.previous.push(c.previous[j]);
            c.spots.push(spot);
            continue;
        }
        if let Some(last) = &mut last {
            last.insert(b.engine_hash, k);
        }
        c.previous.push(old.unwrap_or(NIL));
        c.spots.push(spot);
    }
    c
}

/// Where a store starts: under which block, at which position, and the
/// chain of every block it names, worked out from the parent's.
struct Path {
    parent: Option<Place>,
    pos: u32,
    /// The chains of the unheld blocks, then of the store's.
    chains: Vec<u64>,
    /// How many blocks at the front are on the path but not held.
    unheld: usize,
}

impl Path {
    fn new(tree: &Tree, shared: &Shared, parent: Option<u32>, unheld: &[u64], blocks: &[StoredBlock]) -> Path {
        let (parent, pos, mut chain) = match parent {
            None => (None, 0, None),
            Some(p) => (Some(tree.place(p)), tree.position(shared, p) + 1, Some(tree.chain(shared, p))),
        };
        let locals = unheld.iter().copied().chain(blocks.iter().map(|b| b.local_hash));
        let chains = locals
            .enumerate()
            .map(|(k, local)| {
                let c = chain.map_or(local, |pc| chain::next(pc, local, pos + k as u32));
                chain = Some(c);
                c
            })
            .collect();
        Path { parent, pos, chains, unheld: unheld.len() }
    }

    /// Whether `old` is the very block the store names as its `k`th (the
    /// engine stored it again), not other content under a reused hash.
    fn names(&self, tree: &Tree, shared: &Shared, k: usize, old: u32) -> bool {
        let k = self.unheld + k;
        tree.chain(shared, old) == self.chains[k] && tree.position(shared, old) == self.pos + k as u32
    }
}

/// Where a store hangs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Above {
    /// At the root.
    Root,
    /// Under the block the worker names by this hash, resolved as a
    /// parent hash is (`parent_block`).
    Hash(u64),
    /// Under the ancestor at `position` of the block the worker names by
    /// `hash` (that block itself if it lies there): where a dump's orphan
    /// hangs.
    Ancestor { hash: u64, position: u32 },
}

/// Applies a Stored event (`unheld` empty), or places an orphan of a dump:
/// the blocks whose local hashes are `unheld` first, on the path but held
/// by nobody new, then `blocks`. Every block of `blocks` ends in exactly
/// one outcome: a refused block refuses every block after it, for the
/// same reason.
///
/// Phases: claim the hashes in the records; under the tree lock, release
/// the blocks whose hashes the engine reused for other content (bits only
/// cleared), then place the blocks (bits only set), then trim what the
/// release left unheld; then give each claimed slot its block. So readers
/// see the worker's bits go down, then up, never both in one window.
pub(crate) fn store(
    ctx: &Ctx,
    st: &mut WorkerState,
    tier: StorageTier,
    above: Above,
    unheld: &[u64],
    blocks: &[StoredBlock],
    out: &mut ApplyOutcome,
) {
    let shared = ctx.shared;
    let tier = tier as usize;
    let parent_id = match above {
        Above::Root => None,
        Above::Hash(h) => parent_block(st, tier, h),
        Above::Ancestor { hash, position } => {
            parent_block(st, tier, hash).and_then(|b| ctx.lock().ancestor_at(shared, b, position))
        }
    };
    if parent_id.is_none() && !matches!(above, Above::Root) {
        return Refusal::UnknownParent.count(out, blocks.len());
    }
    let claims = claim(st, tier, blocks);
    let mut ids: Vec<u32> = Vec::with_capacity(unheld.len() + blocks.len());
    let mut again = vec![false; blocks.len()];
    super::pause::open();
    {
        let mut guard = ctx.lock();
        let path = Path::new(&guard, shared, parent_id, unheld, blocks);
        let mut touched = Vec::new();
        // Blocks whose hashes the engine reused: their bits go unless
        // another hash still names them.
        let mut gone: Vec<(u32, u32)> = Vec::new();
        for (k, &old) in claims.previous.iter().enumerate() {
            if old == NIL || claims.superseded[k] {
                continue;
            }
            again[k] = path.names(&guard, shared, k, old);
            if !again[k] && !release_alias(st, tier, old) {
                gone.push(guard.locate(old));
            }
        }
        if !gone.is_empty() {
            let window = Window::open(st, Way::Remove);
            let (group, bit) = split(st.slot);
            // Not cut: the store may still need these blocks as parents.
            let dropped = clear_ranges(&mut guard, shared, Holder { tier, group, bit }, gone, false, &mut touched);
            drop(window);
            Delta { added: 0, dropped }.apply(shared, tier);
        }
        let how = Placing { path: &path, again: &again, claims: &claims };
        place(&mut guard, shared, st, tier, &how, &mut ids, &mut touched, out);
        trim_all(&mut guard, shared, touched);
    }
    super::pause::open();
    settle(st, tier, blocks, &claims, &again, &ids[unheld.len().min(ids.len())..]);
}

/// Clears the holder's bit on the blocks at `places` (run, offset), a
/// range of consecutive offsets at a time; with `cut`, a tail nobody else
/// holds is cut off instead (`Tree::let_go`). Returns how many blocks it
/// cleared; the runs go into `touched`, to be trimmed.
fn clear_ranges(
    tree: &mut Tree,
    shared: &Shared,
    who: Holder,
    mut places: Vec<(u32, u32)>,
    cut: bool,
    touched: &mut Vec<u32>,
) -> u64 {
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
        if cut {
            tree.let_go(shared, run, who, a, b);
        } else {
            tree.mark(shared, run, who, a, b, false);
        }
        if touched.last() != Some(&run) {
            touched.push(run);
        }
        i += 1;
    }
    places.len() as u64
}

/// What `place` needs to know of each block of a store.
struct Placing<'a> {
    path: &'a Path,
    /// Per block of the store, whether it is the one its hash named already.
    again: &'a [bool],
    claims: &'a Claims,
}

impl Placing<'_> {
    /// Whether the `k`th block placed (unheld ones first) is held.
    fn holds(&self, k: usize) -> bool {
        k >= self.path.unheld && !self.claims.superseded[k - self.path.unheld]
    }

    /// The block the `k`th block's hash named already, if it is the same.
    fn again(&self, k: usize) -> Option<u32> {
        let j = k.checked_sub(self.path.unheld)?;
        self.again[j].then(|| self.claims.previous[j])
    }

    /// Of the blocks placed `a..b`, how many are the store's own (counted
    /// in its outcome; the unheld in front are not).
    fn counted(&self, a: usize, b: usize) -> u32 {
        (b.max(self.path.unheld) - a.max(self.path.unheld)) as u32
    }
}

/// Places a store's blocks in the tree, in windows that only set the
/// worker's bits, a piece of `PIECE_BLOCKS` blocks each; pushes the id of
/// each block placed. Blocks that exist already only get the worker's bit;
/// from the first that does not, the rest of the piece is created in one
/// go. A superseded block is placed (the blocks after it hang under it)
/// but not held; its run is trimmed after (`touched`). Refused blocks are
/// counted.
#[allow(clippy::too_many_arguments)]
fn place(
    guard: &mut MutexGuard<'_, Tree>,
    shared: &Shared,
    st: &mut WorkerState,
    tier: usize,
    how: &Placing,
    ids: &mut Vec<u32>,
    touched: &mut Vec<u32>,
    out: &mut ApplyOutcome,
) {
    let (group, bit) = split(st.slot);
    let holder = Holder { tier, group, bit };
    let n = how.path.chains.len();
    let mut window = Window::open(st, Way::Add);
    let mut piece_end = PIECE_BLOCKS;
    let (mut cur, mut pos) = (how.path.parent, how.path.pos);
    let mut held: Option<Held> = None;
    let mut marks = Marks::new(holder, true);
    let mut credit = Credit { shared, left: 0 };
    let mut delta = Delta::default();
    let mut refused = None;
    while ids.len() < n {
        let k = ids.len();
        if k >= piece_end && how.holds(k - 1) {
            // A piece done: a query waiting for the worker may look now,
            // and other writers may take the tree lock (not while the last
            // block placed is one the worker does not hold: their trims
            // could take it).
            marks.flush(guard, shared);
            drop(window);
            MutexGuard::unlocked_fair(guard, super::pause::open);
            held = None;
            window = Window::open(st, Way::Add);
            piece_end = k + PIECE_BLOCKS;
        }
        let tree = &mut **guard;
        if pos as usize >= shared.depth_max {
            refused = Some(Refusal::Depth);
            break;
        }
        if let Some(old) = how.again(k) {
            out.duplicate += 1;
            ids.push(old);
            (cur, pos) = (Some(tree.place(old)), pos + 1);
            continue;
        }
        let Some(at) = tree.next(shared, cur, pos, how.path.chains[k]) else {
            // From here on nothing exists: create the rest of the piece in
            // one go, a stretch of blocks held (or not) alike at a time.
            marks.flush(tree, shared);
            held = None;
            let stretch =
                Stretch { holder, parent: cur.map_or(NIL, |p| p.id), pos, k, end: piece_end.max(k + 1).min(n) };
            match create_stretch(tree, shared, how, stretch, ids, &mut delta, touched, out) {
                Ok(m) => (cur, pos) = (ids.last().map(|&id| tree.place(id)), pos + m as u32),
                Err(why) => {
                    refused = Some(why);
                    break;
                }
            }
            continue;
        };
        if !how.holds(k) {
            // Named again later in the event, or above an orphan: on the
            // path, not held.
            out.duplicate += how.counted(k, k + 1);
        } else if Held::at(&mut held, tree, shared, holder, at) {
            // Held already under another engine hash: an alias.
            *st.aliases.entry((tier as u8, at.id)).or_insert(0) += 1;
            out.duplicate += 1;
        } else if credit.take((n - k) as u64) {
            marks.add_at(tree, shared, at.run, at.off);
            delta.added += 1;
            out.stored += 1;
        } else {
            refused = Some(Refusal::Shed);
            break;
        }
        ids.push(at.id);
        (cur, pos) = (Some(at), pos + 1);
    }
    marks.flush(guard, shared);
    drop(window);
    delta.apply(shared, tier);
    if let Some(why) = refused {
        why.count(out, how.counted(ids.len(), n) as usize);
    }
}

/// Where `place` creates blocks: from the `k`th block placed, under
/// `parent` at position `pos`, up to the `end`th at most.
struct Stretch {
    holder: Holder,
    parent: u32,
    pos: u32,
    k: usize,
    end: usize,
}

/// Creates the blocks of `s` as far as they are held (or not) alike, and
/// counts them; how many were created, or why the rest is refused.
#[allow(clippy::too_many_arguments)]
fn create_stretch(
    tree: &mut Tree,
    shared: &Shared,
    how: &Placing,
    s: Stretch,
    ids: &mut Vec<u32>,
    delta: &mut Delta,
    touched: &mut Vec<u32>,
    out: &mut ApplyOutcome,
) -> Result<usize, Refusal> {
    let k = s.k;
    let hold = how.holds(k);
    let m = (k..s.end).position(|j| how.holds(j) != hold).unwrap_or(s.end - k);
    let who = Holder { bit: if hold { s.holder.bit } else { 0 }, ..s.holder };
    let refused = create(tree, shared, who, s.parent, s.pos, &how.path.chains[k..k + m], ids, delta);
    if hold {
        out.stored += how.counted(k, ids.len());
    } else {
        out.duplicate += how.counted(k, ids.len());
        touched.extend(ids.last().map(|&id| tree.locate(id).0));
    }
    refused.map_or(Ok(m), Err)
}

/// The records, outside the tree lock: each claimed hash gets the block
/// its last block in the event landed on. A refused block's hash names its
/// old block again if that is the block it named (still held), and is
/// dropped otherwise: new to the worker, or reused for other content,
/// whose old block went all the same.
fn settle(st: &mut WorkerState, tier: usize, blocks: &[StoredBlock], claims: &Claims, again: &[bool], ids: &[u32]) {
    let records = &mut st.records[tier];
    for &spot in claims.spots.iter().take(PREFETCH_AHEAD) {
        records.prefetch_spot(spot);
    }
    for (k, b) in blocks.iter().enumerate() {
        if let Some(&next) = claims.spots.get(k + PREFETCH_AHEAD) {
            records.prefetch_spot(next);
        }
        if claims.superseded[k] {
            continue;
        }
        if let Some(&id) = ids.get(k) {
            records.set(b.engine_hash, claims.spots[k], id);
        } else if again[k] {
            records.set(b.engine_hash, claims.spots[k], claims.previous[k]);
        } else {
            records.remove(b.engine_hash);
        }
    }
}

/// Creates blocks of `chains` (none of which exists) under `parent` at
/// `pos`, held by the holder (by nobody if its bit is 0); pushes their ids.
/// Returns why the rest was refused if not all could be (the caller counts
/// the refused).
#[allow(clippy::too_many_arguments)]
fn create(
    tree: &mut Tree,
    shared: &Shared,
    holder: Holder,
    parent: u32,
    pos: u32,
    chains: &[u64],
    ids: &mut Vec<u32>,
    delta: &mut Delta,
) -> Option<Refusal> {
    let room = shared.depth_max.saturating_sub(pos as usize).min(chains.len());
    let held = holder.bit != 0;
    let pairs = if held { shared.budget.take_pairs(room as u64) } else { room as u64 };
    let entries = shared.budget.take_entries(pairs);
    if held {
        shared.budget.release_pairs(pairs - entries);
    }
    let n = entries as usize;
    let refused = if n < room {
        Some(Refusal::Shed)
    } else if room < chains.len() {
        Some(Refusal::Depth)
    } else {
        None
    };
    if n == 0 {
        return refused;
    }
    let chains = &chains[..n];
    let made = if parent != NIL && tree.is_tail(shared, parent) {
        let (run, _) = tree.locate(parent);
        tree.append(shared, run, chains, holder)
    } else if tree.chain_taken(shared, chains[0]) {
        // A chain collision with a run elsewhere (odds 2^-64): refuse.
        None
    } else {
        tree.new_run(shared, parent, pos, chains, holder)
    };
    let Some(first_id) = made else {
        if held {
            shared.budget.release_pairs(entries);
        }
        shared.budget.release_entries(entries);
        return Some(Refusal::Full);
    };
    // The new blocks are consecutive in one run.
    let at = tree.place(first_id);
    tree.push_ids(shared, at.run, at.off, n as u32, ids);
    if held {
        delta.added += n as u64;
    }
    refused
}

/// Applies a Removed event: the worker's bits are only cleared.
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
    super::pause::open();
    {
        let mut guard = ctx.lock();
        let tree = &mut *guard;
        let window = Window::open(st, Way::Remove);
        let mut marks = Marks::new(Holder { tier, group, bit }, false);
        let mut touched: Vec<u32> = Vec::new();
        for &id in &gone {
            let run = marks.add(tree, shared, id);
            if touched.last() != Some(&run) {
                touched.push(run);
            }
        }
        marks.flush(tree, shared);
        drop(window);
        touched.sort_unstable();
        touched.dedup();
        trim_all(tree, shared, touched);
    }
    Delta { added: 0, dropped: gone.len() as u64 }.apply(shared, tier);
}

/// Trims every run in `runs` that is still live, deepest first.
fn trim_all(tree: &mut Tree, shared: &Shared, runs: impl IntoIterator<Item = u32>) {
    let mut runs: Vec<u32> = runs.into_iter().collect();
    runs.sort_unstable_by_key(|&r| (std::cmp::Reverse(tree.start(shared, r)), r));
    runs.dedup();
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
    let window = Window::open(st, Way::Remove);
    let mut touched = Vec::new();
    for (tier, records) in taken.iter().enumerate() {
        let places: Vec<(u32, u32)> = records.iter().map(|&(_, id)| tree.locate(id)).collect();
        let n = clear_ranges(tree, shared, Holder { tier, group, bit }, places, true, &mut touched);
        shared.tier_pairs[tier].fetch_sub(n, Ordering::Relaxed);
        dropped += n;
    }
    drop(window);
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
