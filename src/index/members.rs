//! Who holds which blocks of one run, in one tier: per group of 64 worker
//! slots, the run's offsets cut into segments, each with an inline 64-bit
//! worker set that holds for every offset of the segment.
//!
//! Segment `i` of a group covers offsets `starts[i] .. starts[i + 1]` (the
//! last one up to the run's end); `starts[0]` is 0. So a run stored by one
//! worker costs one segment, however long it is, and a query learns where
//! each worker stops by walking a handful of segments, not blocks.
//!
//! Readers see a `Members` value whole: a change of shape (a split, a merge,
//! a new group) builds a new value that the writer publishes in place of the
//! old, which is freed through epochs. A change that only flips one worker's
//! bit over whole segments is done in place with atomic or/and: other
//! workers' bits never move, and the worker whose event it is changes them
//! inside a window readers check (see `query`).

use std::sync::atomic::{AtomicU64, Ordering};

/// One group's segments.
pub(crate) struct GroupSegs {
    pub group: u32,
    starts: Box<[u32]>,
    bits: Box<[AtomicU64]>,
}

impl GroupSegs {
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    #[inline]
    pub(crate) fn start(&self, i: usize) -> u32 {
        self.starts[i]
    }

    #[inline]
    pub(crate) fn bits(&self, i: usize) -> u64 {
        self.bits[i].load(Ordering::Acquire)
    }

    /// The end of segment `i` in a run of `len` blocks.
    #[inline]
    pub(crate) fn end(&self, i: usize, len: u32) -> u32 {
        self.starts.get(i + 1).copied().unwrap_or(len)
    }

    /// The segment holding `offset`.
    pub(crate) fn find(&self, offset: u32) -> usize {
        self.starts.partition_point(|&s| s <= offset) - 1
    }

    fn to_vec(&self) -> Vec<(u32, u64)> {
        self.starts.iter().zip(self.bits.iter()).map(|(&s, b)| (s, b.load(Ordering::Relaxed))).collect()
    }

    fn from_vec(group: u32, segs: &[(u32, u64)]) -> GroupSegs {
        GroupSegs {
            group,
            starts: segs.iter().map(|s| s.0).collect(),
            bits: segs.iter().map(|s| AtomicU64::new(s.1)).collect(),
        }
    }
}

/// Every group's segments of one run in one tier.
pub(crate) struct Members {
    groups: Box<[GroupSegs]>,
}

/// What a change needs from the caller.
pub(crate) enum Change {
    /// Done in place, or nothing to do.
    Done,
    /// Publish this in place of the old value (None: nobody holds anything).
    Replace(Option<Box<Members>>),
}

/// Merges equal neighbours. Segments past the run's end are kept as they
/// are; `prepare_append` clears them before blocks appear there.
fn normalize(segs: &mut Vec<(u32, u64)>) {
    segs.dedup_by(|later, earlier| later.1 == earlier.1);
}

impl Members {
    /// The segments of `group`, if any worker of it holds anything here.
    #[inline]
    pub(crate) fn group(&self, group: u32) -> Option<&GroupSegs> {
        self.groups.iter().find(|g| g.group == group)
    }

    /// Bytes held by this value.
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of::<Members>()
            + self.groups.iter().map(|g| std::mem::size_of::<GroupSegs>() + g.len() * 12).sum::<usize>()
    }

    /// One past the last offset below `len` anybody holds (0: nobody holds
    /// anything). Segments past the run's end do not count.
    pub(crate) fn held_end(&self, len: u32) -> u32 {
        let mut end = 0;
        for g in self.groups.iter() {
            let inside = g.starts.partition_point(|&s| s < len);
            if let Some(i) = (0..inside).rev().find(|&i| g.bits(i) != 0) {
                end = end.max(g.end(i, len).min(len));
            }
        }
        end
    }

    /// Whether offsets `from..` are held by nobody but `only` (group, bit).
    pub(crate) fn tail_only(&self, from: u32, only: Option<(u32, u64)>) -> bool {
        self.groups.iter().all(|g| {
            let allowed = match only {
                Some((group, bit)) if group == g.group => bit,
                _ => 0,
            };
            (g.find(from)..g.len()).all(|i| g.bits(i) & !allowed == 0)
        })
    }

    /// Whether `bit` of `group` holds `offset`.
    pub(crate) fn holds(&self, group: u32, bit: u64, offset: u32) -> bool {
        self.group(group).is_some_and(|g| g.bits(g.find(offset)) & bit != 0)
    }

    fn rebuilt(&self, group: u32, segs: Option<Vec<(u32, u64)>>) -> Option<Box<Members>> {
        let mut groups: Vec<GroupSegs> = Vec::with_capacity(self.groups.len() + 1);
        let mut placed = false;
        for g in self.groups.iter() {
            if g.group == group {
                placed = true;
                if let Some(s) = &segs {
                    groups.push(GroupSegs::from_vec(group, s));
                }
            } else {
                groups.push(GroupSegs::from_vec(g.group, &g.to_vec()));
            }
        }
        if !placed {
            if let Some(s) = &segs {
                groups.push(GroupSegs::from_vec(group, s));
            }
        }
        (!groups.is_empty()).then(|| Box::new(Members { groups: groups.into_boxed_slice() }))
    }
}

/// Sets (`on`) or clears `bit` of `group` over offsets `a..b` of a run of
/// `len` blocks (`b <= len`).
pub(crate) fn update(cur: Option<&Members>, group: u32, a: u32, b: u32, len: u32, bit: u64, on: bool) -> Change {
    debug_assert!(a < b && b <= len, "range {a}..{b} in a run of {len}");
    let existing = cur.and_then(|m| m.group(group));
    if let Some(g) = existing {
        let i = g.find(a);
        let j = g.starts.partition_point(|&s| s < b);
        if (i..j).all(|k| (g.bits(k) & bit != 0) == on) {
            return Change::Done;
        }
        // Whole segments: flip in place.
        let ends_on_boundary = j < g.len() && g.start(j) == b || j == g.len() && b == len;
        if g.start(i) == a && ends_on_boundary {
            for k in i..j {
                if on {
                    g.bits[k].fetch_or(bit, Ordering::Release);
                } else {
                    g.bits[k].fetch_and(!bit, Ordering::Release);
                }
                super::pause::point();
            }
            return Change::Done;
        }
    } else if !on {
        return Change::Done;
    }
    let mut segs = existing.map_or_else(|| vec![(0, 0)], GroupSegs::to_vec);
    split_at(&mut segs, a);
    if b < len {
        split_at(&mut segs, b);
    }
    for s in segs.iter_mut().filter(|s| s.0 >= a && s.0 < b) {
        s.1 = if on { s.1 | bit } else { s.1 & !bit };
    }
    normalize(&mut segs);
    let segs = (segs.iter().any(|s| s.1 != 0)).then_some(segs);
    match cur {
        Some(m) => Change::Replace(m.rebuilt(group, segs)),
        None => Change::Replace(segs.map(|s| Box::new(Members { groups: Box::new([GroupSegs::from_vec(group, &s)]) }))),
    }
}

/// Makes offsets `len..` (about to be appended) held by nobody, without
/// touching offsets before `len`; `keep` (group, bits) may stay set there
/// when the caller is about to set exactly those bits, which saves a split
/// when a worker extends a run it alone holds.
pub(crate) fn prepare_append(cur: Option<&Members>, len: u32, keep: Option<(u32, u64)>) -> Change {
    let Some(m) = cur else { return Change::Done };
    let wants = |g: &GroupSegs| match keep {
        Some((group, bits)) if group == g.group => bits,
        _ => 0,
    };
    if m.groups.iter().all(|g| g.find(len) == g.len() - 1 && g.bits(g.len() - 1) == wants(g)) {
        return Change::Done;
    }
    let groups: Vec<GroupSegs> = m
        .groups
        .iter()
        .map(|g| {
            let mut segs = g.to_vec();
            segs.retain(|s| s.0 < len || s.0 == 0);
            if segs.last().map(|s| s.1) != Some(wants(g)) {
                segs.push((len, 0));
            }
            GroupSegs::from_vec(g.group, &segs)
        })
        .collect();
    Change::Replace(Some(Box::new(Members { groups: groups.into_boxed_slice() })))
}

fn split_at(segs: &mut Vec<(u32, u64)>, at: u32) {
    let i = segs.partition_point(|s| s.0 <= at) - 1;
    if segs[i].0 != at {
        let bits = segs[i].1;
        segs.insert(i + 1, (at, bits));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(m: &mut Option<Box<Members>>, group: u32, a: u32, b: u32, len: u32, bit: u64, on: bool) {
        if let Change::Replace(n) = update(m.as_deref(), group, a, b, len, bit, on) {
            *m = n;
        }
    }

    fn holders(m: &Option<Box<Members>>, group: u32, offset: u32) -> u64 {
        m.as_deref().and_then(|m| m.group(group)).map_or(0, |g| g.bits(g.find(offset)))
    }

    #[test]
    fn ranges_against_a_per_offset_model() {
        let len = 40u32;
        let mut m: Option<Box<Members>> = None;
        let mut model = vec![[0u64; 3]; len as usize];
        let mut x: u64 = 0x9E37_79B9;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let a = (x % len as u64) as u32;
            let b = a + 1 + ((x >> 8) % (len - a) as u64) as u32;
            let group = ((x >> 16) % 3) as u32;
            let bit = 1u64 << ((x >> 20) % 5);
            let on = !(x >> 30).is_multiple_of(3);
            apply(&mut m, group, a, b, len, bit, on);
            for o in a..b {
                let v = &mut model[o as usize][group as usize];
                *v = if on { *v | bit } else { *v & !bit };
            }
            let end = model.iter().rposition(|g| g.iter().any(|&v| v != 0)).map_or(0, |o| o as u32 + 1);
            assert_eq!(m.as_deref().map_or(0, |m| m.held_end(len)), end);
        }
        for o in 0..len {
            for g in 0..3 {
                assert_eq!(holders(&m, g, o), model[o as usize][g as usize], "offset {o} group {g}");
            }
        }
    }

    #[test]
    fn extending_a_run_one_holds_alone_changes_nothing() {
        let mut m = None;
        apply(&mut m, 0, 0, 10, 10, 1, true);
        assert!(matches!(prepare_append(m.as_deref(), 10, Some((0, 1))), Change::Done));
        // Another holder of the tail: the new offsets need a segment of their own.
        apply(&mut m, 0, 5, 10, 10, 2, true);
        match prepare_append(m.as_deref(), 10, Some((0, 1))) {
            Change::Replace(n) => m = n,
            Change::Done => panic!("a split is needed"),
        }
        apply(&mut m, 0, 10, 11, 11, 1, true);
        assert_eq!((holders(&m, 0, 9), holders(&m, 0, 10)), (3, 1));
        // Cut back to 10 blocks (worker 1 let go of the last): a segment of
        // nobody stays past the end until the run grows again.
        apply(&mut m, 0, 10, 11, 11, 1, false);
        assert_eq!(holders(&m, 0, 10), 0);
        match prepare_append(m.as_deref(), 10, Some((0, 2))) {
            Change::Replace(n) => m = n,
            Change::Done => panic!("worker 2 does not hold the tail alone"),
        }
        apply(&mut m, 0, 10, 11, 11, 2, true);
        assert_eq!((holders(&m, 0, 9), holders(&m, 0, 10)), (3, 2));
    }
}
