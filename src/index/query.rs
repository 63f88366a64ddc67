//! Finding, for every worker, how deep a prefix of a query it holds.
//!
//! The query's chain hashes name its prefixes. The search follows them
//! through runs: from the run that starts with the query's first block, it
//! finds how far the run agrees with the query (a jump search from the
//! run's start every `jump` blocks with a binary search inside the failed
//! jump, or the last block once no jump failed: chains agree on a prefix,
//! then never again), then looks up the run that starts with the next
//! query block, and so on until the query or the index ends.
//!
//! Along that path every worker moves through the tiers as Dynamo chains
//! them: it is in its device run while it holds each block on the device,
//! then continues through host-pinned blocks, then disk, then external, and
//! stops at the first block it holds in none of the tier it is in. Holdings
//! change only at segment starts (`members`), so the sweep visits segments,
//! not blocks, 64 workers at a time. A worker that loses a middle block stops
//! there; nothing has to be walked to make that so. Answers are the device
//! depth and the cumulative host and disk depths.
//!
//! A query computes its chains lazily, only as deep as its probes look, and
//! never looks back more than a jump behind the furthest block it reached,
//! so the chains live in a ring of a few jumps (`chain::Chains`). `find`
//! says why an answer keeps the promise: each worker's two window sequences
//! are read before and after a walk (for a group of 64 slots, first its
//! summary words, so a group where one way was quiet settles all 64
//! workers in two reads); a worker whose bits moved both ways is walked
//! again, after a bounded wait, and the eighth retry walks under the tree
//! lock, so a query walks at most nine times. A slot given to another worker while the query
//! ran is left out of its answer, even if it came back to the same worker
//! (each placement in a slot is numbered).

use super::chain::Chains;
use super::members::GroupSegs;
use super::reclaim;
use super::runs::RunView;
use super::slots::{group_one_way, one_way, Seqs, SlotTable, GROUP_BITS};
use super::tree::Shared;
use super::{Matches, WorkerMatch};
use crossbeam::epoch::Guard;

const G: usize = GROUP_BITS as usize;

/// One group's sweep: which workers are in which tier's stretch, and where
/// each one left its device, host and final stretch.
#[derive(Clone)]
struct Sweep {
    group: u32,
    /// Workers still in their device, host, disk and external stretch.
    alive: [u64; 4],
    device: [u32; G],
    host: [u32; G],
    last: [u32; G],
}

#[inline]
fn each(mut set: u64, mut f: impl FnMut(usize)) {
    while set != 0 {
        f(set.trailing_zeros() as usize);
        set &= set - 1;
    }
}

impl Sweep {
    fn new(group: u32, mask: u64) -> Self {
        Sweep { group, alive: [mask, 0, 0, 0], device: [0; G], host: [0; G], last: [0; G] }
    }

    fn done(&self) -> bool {
        self.alive.iter().all(|&a| a == 0)
    }

    /// At position `pos` the tiers hold `bits`: workers move on or stop.
    #[inline]
    fn step(&mut self, pos: u32, bits: [u64; 4]) {
        let mut leaving = 0u64;
        for (tier, (alive, held)) in self.alive.iter_mut().zip(bits).enumerate() {
            let here = *alive | leaving;
            leaving = here & !held;
            *alive = here & held;
            match tier {
                0 => each(leaving, |b| self.device[b] = pos),
                1 => each(leaving, |b| self.host[b] = pos),
                _ => {}
            }
        }
        each(leaving, |b| self.last[b] = pos);
    }

    /// The path ends at `pos`: everyone still moving stops there.
    fn finish(&mut self, pos: u32) {
        each(self.alive[0], |b| self.device[b] = pos);
        each(self.alive[0] | self.alive[1], |b| self.host[b] = pos);
        each(self.alive.iter().fold(0, |a, &x| a | x), |b| self.last[b] = pos);
        self.alive = [0; 4];
    }

    /// Walks blocks `0..m` of a run at position `base`.
    fn run(&mut self, view: &RunView, base: u32, m: u32, lower: [bool; 4]) {
        let segs: [Option<&GroupSegs>; 4] = std::array::from_fn(|t| {
            if t == 0 || lower[t] {
                view.members[t].and_then(|ms| ms.group(self.group))
            } else {
                None
            }
        });
        let mut at = [0usize; 4];
        let mut x = 0u32;
        while x < m && !self.done() {
            let mut bits = [0u64; 4];
            let mut next = m;
            for t in 0..4 {
                if let Some(s) = segs[t] {
                    while at[t] + 1 < s.len() && s.start(at[t] + 1) <= x {
                        at[t] += 1;
                    }
                    bits[t] = s.bits(at[t]);
                    if at[t] + 1 < s.len() {
                        next = next.min(s.start(at[t] + 1));
                    }
                }
            }
            self.step(base + x, bits);
            x = next;
        }
    }
}

/// Jump probes asked of the cache ahead of the one being made: under load
/// a probe's miss takes longer than the chains of several jumps take to
/// work out (under a nanosecond a block), and eight ahead of 32-block jumps left
/// long, deep queries waiting on their probes.
const PROBES_AHEAD: u32 = 16;

/// How many blocks from offset 0 of `view` agree with the query from `pos`.
fn agreed(shared: &Shared, view: &RunView, chains: &mut Chains, pos: u32, jump: u32, guard: &Guard) -> u32 {
    let e = view.len.min(chains.len() as u32 - pos);
    if e == 0 {
        return 0;
    }
    let same =
        |k: u32, chains: &mut Chains| view.chain(&shared.chunks, k, guard) == Some(chains.at((pos + k) as usize));
    if !same(0, chains) {
        return 0;
    }
    // Offset `lo` agrees, `hi` does not. Jumps go forward from the start:
    // most queries leave a run before its end (nine in ten on the
    // conversation trace), so the chains past where they leave are never
    // computed.
    let (mut lo, mut hi) = (0u32, e);
    for ahead in 1..=PROBES_AHEAD {
        if ahead * jump < e {
            view.prefetch(&shared.chunks, ahead * jump, guard);
        }
    }
    while lo + jump < hi {
        // Probes are misses in a long run: ask for a later one while this
        // one's chains are worked out.
        if lo + (PROBES_AHEAD + 1) * jump < e {
            view.prefetch(&shared.chunks, lo + (PROBES_AHEAD + 1) * jump, guard);
        }
        if same(lo + jump, chains) {
            lo += jump;
        } else {
            hi = lo + jump;
            break;
        }
    }
    if hi == e {
        // No failed jump: the last block decides the rest of the way.
        if lo + 1 == e || same(e - 1, chains) {
            return e;
        }
        hi = e - 1;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if same(mid, chains) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo + 1
}

/// Walks the query's path once for the groups in `sweeps`; true if a run
/// on the path was cut while the walk used it (the answers may mix its old
/// length with newer members: walk again).
fn walk(shared: &Shared, chains: &mut Chains, jump: u32, sweeps: &mut [Sweep], guard: &Guard) -> bool {
    let mut torn = false;
    let lower: [bool; 4] =
        std::array::from_fn(|t| t > 0 && shared.tier_pairs[t].load(std::sync::atomic::Ordering::Relaxed) > 0);
    let n = chains.len() as u32;
    let mut pos = 0u32;
    while pos < n {
        let Some(run) = shared.starts.get(chains.at(pos as usize), guard) else { break };
        let Some(header) = shared.runs.get(run, guard) else { break };
        let view = header.view(guard);
        super::pause::open();
        if view.start != pos {
            break;
        }
        let m = agreed(shared, &view, chains, pos, jump, guard);
        if m == 0 {
            break;
        }
        for s in sweeps.iter_mut() {
            s.run(&view, pos, m, lower);
        }
        super::pause::open();
        torn |= header.cut_since(&view);
        pos += m;
        if sweeps.iter().all(Sweep::done) {
            break;
        }
    }
    for s in sweeps.iter_mut() {
        s.finish(pos);
    }
    torn
}

/// Retries before a query walks under the tree lock instead.
const RETRIES_MAX: usize = 8;
/// How long a query waits, in all, for workers in the middle of an event
/// before it retries without waiting.
const WAIT_MAX_US: u64 = 200;

/// Waits until no worker of `masks` has a window open, or the deadline
/// passes. Spins briefly, then yields.
fn wait_between_events(table: &SlotTable, masks: &[(usize, u64)], deadline: std::time::Instant) {
    let mut v = [[0u64; 2]; G];
    for round in 0u32.. {
        let mut busy = false;
        for &(group, mask) in masks {
            table.read_seqs(group, mask, &mut v);
            each(mask, |b| busy |= (v[b][0] | v[b][1]) & 1 == 1);
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

/// Every worker's depths, none of them more than the worker held at one
/// instant while the query ran, and each exact for a worker whose blocks
/// did not change meanwhile.
///
/// Why: a writer changes a worker's bits only inside a window that either
/// only sets them or only clears them (`writer`), and readers check each
/// worker's two sequences (`slots::Versions`) before and after a walk. If
/// no clearing window was open at any time during the walk, the worker's
/// bits only grew meanwhile, so every bit the walk saw set was still set
/// when it ended: the answer is at most what the worker held then. If no
/// setting window was, they only shrank, and every bit seen set was set
/// when the walk began. Depths only grow with the bits, so either way the
/// answer is at most a depth the worker held at one instant. A worker whose
/// bits moved both ways is walked again (after waiting, briefly and
/// bounded, for its event to end); past `RETRIES_MAX` retries the query
/// walks under the tree lock (`lock_writer`), under which no bit changes.
/// If `lock_writer` cannot give it (None), workers still unsettled then are
/// left out of the answer (an under-report). A walk that saw a run on its
/// path cut (its length and members may not go together) is done again
/// for everyone.
pub(crate) fn find<L, W>(shared: &Shared, chains: &mut Chains, jump: usize, lock_writer: L) -> Matches
where
    L: Fn() -> Option<W>,
{
    SCRATCH.with(|s| find_with(shared, chains, jump, lock_writer, &mut s.borrow_mut()))
}

/// What a query works in, kept per thread so a query allocates nothing
/// but its answer.
#[derive(Default)]
struct Scratch {
    /// Groups (and their workers) still to be answered.
    pending: Vec<(usize, u64)>,
    /// Groups to walk again after this attempt.
    still: Vec<(usize, u64)>,
    /// Each finished sweep with the workers whose answers it gives.
    results: Vec<(Sweep, u64)>,
    sweeps: Vec<Sweep>,
    /// Per pending group, its summary words (first walk) or its slots'
    /// sequences (later walks), read before the walk.
    before: Vec<[Seqs; G]>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

fn find_with<L, W>(shared: &Shared, chains: &mut Chains, jump: usize, lock_writer: L, s: &mut Scratch) -> Matches
where
    L: Fn() -> Option<W>,
{
    let guard = reclaim::pin_for_query();
    let jump = jump.max(1) as u32;
    let Scratch { pending, still, results, sweeps, before } = s;
    let workers: Vec<WorkerMatch> = shared.slots.read(&guard, |table: &SlotTable| {
        pending.clear();
        pending.extend((0..table.groups()).map(|g| (g, table.live[g])).filter(|&(_, m)| m != 0));
        results.clear();
        let mut deadline = None;
        let mut after = [[0u64; 2]; G];
        for attempt in 0..=RETRIES_MAX {
            if pending.is_empty() {
                break;
            }
            if attempt > 0 {
                let d = *deadline
                    .get_or_insert_with(|| std::time::Instant::now() + std::time::Duration::from_micros(WAIT_MAX_US));
                wait_between_events(table, pending, d);
            }
            let held = if attempt == RETRIES_MAX { lock_writer() } else { None };
            let locked = held.is_some();
            // The first walk checks each group by its summary words, which
            // settle a quiet group in two reads; a group that was not quiet
            // is walked again, checked slot by slot.
            let quick = attempt == 0;
            before.clear();
            before.resize(pending.len(), [[0; 2]; G]);
            for (k, &(group, mask)) in pending.iter().enumerate() {
                if quick {
                    before[k][0] = table.group_words(group);
                } else {
                    table.read_seqs(group, mask, &mut before[k]);
                }
            }
            sweeps.clear();
            sweeps.extend(pending.iter().map(|&(g, m)| Sweep::new(g as u32, m)));
            super::pause::open();
            let torn = walk(shared, chains, jump, sweeps, &guard) && !locked;
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            still.clear();
            for (k, s) in sweeps.drain(..).enumerate() {
                let (group, mask) = pending[k];
                let mut unstable = 0u64;
                if torn || quick && !locked && !group_one_way(before[k][0], table.group_words(group)) {
                    unstable = mask;
                } else if !quick && !locked {
                    table.read_seqs(group, mask, &mut after);
                    each(mask, |b| {
                        if !one_way(before[k][b], after[b]) {
                            unstable |= 1 << b;
                        }
                    });
                }
                results.push((s, mask & !unstable));
                if unstable != 0 {
                    still.push((group, unstable));
                }
            }
            std::mem::swap(pending, still);
        }
        let mut out = Vec::new();
        for (s, taken) in results.iter() {
            let group = s.group as usize;
            each(*taken, |b| {
                if s.last[b] > 0 {
                    if let Some(worker) = table.worker(group, b as u32) {
                        out.push(WorkerMatch { worker, device: s.device[b], host: s.host[b], disk: s.last[b] });
                    }
                }
            });
        }
        // A slot given to another worker while the query ran may hold that
        // worker's bits: answer for slots whose worker was not placed anew
        // (the slot may have gone to another and back). Only a new slot
        // table can say so (the old one stays alive while the query is
        // pinned, so its address is not reused).
        shared.slots.read(&guard, |now: &SlotTable| {
            if !std::ptr::eq(now, table) {
                out.retain(|m| now.kept_since(table, m.worker));
            }
        });
        out
    });
    Matches { workers }
}
