use super::*;
use crate::index::{Matches, WorkerMatch};
use crate::predict::Predicted;

const W1: WorkerId = WorkerId::new(1, 0);
const W2: WorkerId = WorkerId::new(2, 0);

impl Predictions {
    /// Live bookings of this index (expired ones until swept).
    fn bookings(&self) -> u64 {
        self.live_bookings.load(Ordering::Relaxed)
    }

    /// Checks the invariants of the module doc; panics on a breach.
    fn check(&self) {
        let book = self.book.read();
        let mut blocks = 0;
        let mut bookings = 0;
        for wb in book.workers.values() {
            assert!(!wb.bookings.is_empty(), "a worker without bookings is removed");
            for (p, id) in &wb.positions {
                let b = wb.bookings.get(id).expect("a position names a live booking");
                assert!(b.prefixes.contains(p), "the booking a position names holds it");
            }
            for b in wb.bookings.values() {
                assert!(!b.prefixes.is_empty() && b.prefixes.len() == b.locals.len());
                blocks += b.prefixes.len() as u64;
            }
            bookings += wb.bookings.len() as u64;
        }
        assert_eq!((blocks, bookings), (book.blocks, book.bookings));
        assert_eq!(bookings, self.live_bookings.load(Ordering::Relaxed));
    }
}

fn store(max_blocks: u64) -> Predictions {
    Predictions::new(Arc::new(PredictLimits::new(max_blocks, 100)))
}

fn held(worker: WorkerId, device: u32) -> Matches {
    Matches { workers: vec![WorkerMatch { worker, device, host: device, disk: device }] }
}

fn depth(p: &Predictions, m: &Matches, q: &[u64], now: u64, w: WorkerId) -> u32 {
    p.lookup(m, q, now).iter().find(|x| x.worker == w).map_or(0, |x| x.blocks)
}

fn stored(worker: WorkerId, tier: StorageTier, root: bool, locals: &[u64]) -> Event {
    let blocks = locals.iter().map(|&l| StoredBlock { engine_hash: l ^ 0xE, local_hash: l }).collect();
    Event { worker, tier, kind: EventKind::Stored { parent: (!root).then_some(99), blocks } }
}

fn all_applied(n: usize) -> ApplyOutcome {
    ApplyOutcome { stored: n as u32, ..Default::default() }
}

fn counts(p: &Predictions) -> [u64; 6] {
    let c = &p.limits.counters;
    [&c.made, &c.renewed, &c.confirmed, &c.expired, &c.dropped, &c.refused].map(|a| a.load(Ordering::Relaxed))
}

#[test]
fn a_booking_covers_its_prefix_only_past_what_the_worker_holds() {
    let p = store(100);
    assert!(p.is_empty());
    assert_eq!(p.book(W1, &[1, 2, 3, 4, 5], 2, 100, 0), Ok(3));
    p.check();
    let none = Matches::default();
    // The worker holds 0..2 (the index says so): predicted through 5.
    assert_eq!(p.lookup(&held(W1, 2), &[1, 2, 3, 4, 5, 6], 10), vec![Predicted { worker: W1, blocks: 5 }]);
    // A query sharing 0..4 only; one diverging at the first predicted block.
    assert_eq!(depth(&p, &held(W1, 2), &[1, 2, 3, 4, 9], 10, W1), 4);
    assert_eq!(depth(&p, &held(W1, 2), &[1, 2, 9, 4, 5], 10, W1), 0);
    // Without its held prefix the worker's predicted blocks do not count:
    // block 0 is neither held nor predicted.
    assert_eq!(depth(&p, &none, &[1, 2, 3, 4, 5], 10, W1), 0);
    // The same chunks elsewhere in a prefix are another prefix.
    assert_eq!(depth(&p, &held(W1, 2), &[7, 2, 3, 4, 5], 10, W1), 0);
    // Another worker has none.
    assert_eq!(depth(&p, &held(W2, 2), &[1, 2, 3, 4, 5], 10, W2), 0);
    // Held as deep as predicted: nothing to report.
    assert_eq!(depth(&p, &held(W1, 5), &[1, 2, 3, 4, 5], 10, W1), 0);
    // A whole-request booking on an empty worker: listed with no match at all.
    assert_eq!(p.book(W2, &[1, 2], 0, 100, 0), Ok(2));
    assert_eq!(depth(&p, &none, &[1, 2, 3], 10, W2), 2);
    assert_eq!(p.book(W2, &[1, 2], 2, 100, 0), Ok(0), "nothing past what is held");
    assert_eq!((p.blocks(), p.bookings(), p.limits.live()), (5, 2, 5));
}

#[test]
fn bookings_expire_without_a_timer_and_sweeps_give_the_room_back() {
    let p = store(100);
    p.book(W1, &[1, 2, 3], 0, 100, 1_000).unwrap();
    let none = Matches::default();
    assert_eq!(depth(&p, &none, &[1, 2, 3], 1_099, W1), 3);
    assert_eq!(depth(&p, &none, &[1, 2, 3], 1_100, W1), 0, "expired at its instant, before any sweep");
    assert_eq!(p.blocks(), 3, "not swept yet");
    p.sweep(1_099);
    assert_eq!(p.blocks(), 3);
    p.sweep(1_100);
    p.check();
    assert_eq!((p.blocks(), p.limits.live(), p.is_empty()), (0, 0, true));
    assert_eq!(counts(&p), [3, 0, 0, 3, 0, 0]);
}

#[test]
fn a_booking_again_renews_the_one_that_covers_it() {
    let p = store(100);
    let none = Matches::default();
    p.book(W1, &[1, 2, 3, 4], 0, 100, 0).unwrap();
    assert_eq!(p.book(W1, &[1, 2, 3, 4], 0, 100, 50), Ok(4), "the same blocks: renewed");
    assert_eq!(p.blocks(), 4, "no blocks added");
    p.sweep(120);
    assert_eq!(depth(&p, &none, &[1, 2, 3, 4], 120, W1), 4, "renewed to 150");
    // Longer than any booking: a new one, and the old one still predicts what it did.
    assert_eq!(p.book(W1, &[1, 2, 3, 4, 5], 0, 10, 120), Ok(5));
    p.check();
    assert_eq!(depth(&p, &none, &[1, 2, 3, 4, 5], 125, W1), 5);
    p.sweep(140);
    assert_eq!(depth(&p, &none, &[1, 2, 3, 4, 5], 140, W1), 4, "the short-lived one went, the renewed one stays");
    p.sweep(150);
    p.check();
    assert!(p.is_empty());
    assert_eq!(counts(&p), [9, 4, 0, 9, 0, 0]);
}

#[test]
fn a_device_stored_confirms_the_blocks_it_continues() {
    let p = store(100);
    p.book(W1, &[1, 2, 3, 4, 5], 2, 100, 0).unwrap();
    let ev = stored(W1, StorageTier::HostPinned, false, &[3, 4]);
    p.on_event(&ev, &all_applied(2), 1);
    assert_eq!(p.blocks(), 3, "another tier confirms nothing");
    // The event's own prefix, then the booking's next two chunks, then one more.
    let ev = stored(W1, StorageTier::Device, false, &[3, 4, 8]);
    p.on_event(&ev, &all_applied(3), 1);
    p.check();
    assert_eq!(p.blocks(), 1, "3 and 4 confirmed");
    assert_eq!(depth(&p, &held(W1, 4), &[1, 2, 3, 4, 5], 2, W1), 5);
    // The index refused the event's blocks (unknown parent): nothing is real.
    p.on_event(&stored(W1, StorageTier::Device, false, &[5]), &ApplyOutcome::default(), 2);
    assert_eq!(p.blocks(), 1);
    // At position 0 an event must start where the booking does (it starts at 4).
    p.on_event(&stored(W1, StorageTier::Device, true, &[5]), &all_applied(1), 2);
    assert_eq!(p.blocks(), 1);
    p.on_event(&stored(W2, StorageTier::Device, false, &[5]), &all_applied(1), 2);
    assert_eq!(p.blocks(), 1, "another worker's Stored confirms nothing of this one");
    p.on_event(&stored(W1, StorageTier::Device, false, &[5, 6]), &all_applied(2), 2);
    p.check();
    assert!(p.is_empty());
    assert_eq!(counts(&p), [3, 0, 3, 0, 0, 0]);
    // From the root: an event of the whole prefix confirms a booking at 0.
    p.book(W1, &[1, 2], 0, 100, 0).unwrap();
    p.on_event(&stored(W1, StorageTier::Device, true, &[1, 2]), &all_applied(2), 3);
    assert!(p.is_empty());
}

#[test]
fn only_the_applied_prefix_of_an_event_confirms() {
    let p = store(100);
    p.book(W1, &[1, 2, 3], 0, 100, 0).unwrap();
    let shed = ApplyOutcome { stored: 1, shed: 2, ..Default::default() };
    p.on_event(&stored(W1, StorageTier::Device, true, &[1, 2, 3]), &shed, 1);
    assert_eq!(p.blocks(), 2);
    assert_eq!(depth(&p, &held(W1, 1), &[1, 2, 3], 1, W1), 3);
}

#[test]
fn cleared_and_removal_drop_a_workers_bookings_only() {
    let p = store(100);
    p.book(W1, &[1, 2, 3], 0, 100, 0).unwrap();
    p.book(W1, &[5, 6], 0, 100, 0).unwrap();
    p.book(W2, &[1, 2, 3], 0, 100, 0).unwrap();
    let cleared = Event::cleared(W1);
    p.on_event(&cleared, &ApplyOutcome::default(), 1);
    p.check();
    assert_eq!((p.blocks(), p.bookings()), (3, 1));
    assert_eq!(depth(&p, &Matches::default(), &[1, 2, 3], 1, W2), 3);
    assert_eq!(p.drop_worker(W2), 3);
    assert_eq!(p.drop_worker(W2), 0);
    assert!(p.is_empty());
    assert_eq!(counts(&p), [8, 0, 0, 0, 8, 0]);
    p.sweep(1_000);
    assert_eq!(counts(&p)[3], 0, "dropped bookings never expire later");
}

#[test]
fn the_cap_holds_over_indexes_and_a_refusal_changes_nothing() {
    let limits = Arc::new(PredictLimits::new(10, 100));
    let a = Predictions::new(limits.clone());
    let b = Predictions::new(limits.clone());
    assert_eq!(a.book(W1, &[1, 2, 3, 4, 5, 6], 0, 100, 0), Ok(6));
    let Err(RoutedError::Full { asked, message }) = b.book(W1, &[1, 2, 3, 4, 5], 0, 100, 0) else { panic!() };
    assert_eq!(asked, 5);
    assert!(message.contains("6 of --predict-max-blocks 10 blocks are live"), "{message}");
    assert!(b.is_empty());
    b.check();
    assert_eq!(a.book(W1, &[1, 2, 3, 4, 5, 6], 0, 100, 0), Ok(6), "renewing takes no room");
    assert_eq!(b.book(W1, &[1, 2, 3, 4], 0, 100, 0), Ok(4));
    assert_eq!(limits.live(), 10);
    drop(a);
    assert_eq!(limits.live(), 4, "an index that goes gives its room back");
    let c = &limits.counters;
    assert_eq!(
        (c.refused.load(Ordering::Relaxed), c.dropped.load(Ordering::Relaxed)),
        (0, 6),
        "the caller counts refusals"
    );
    assert_eq!(c.renewed.load(Ordering::Relaxed), 6);
}

/// Random bookings, sweeps and drops against a plain model: a worker's
/// predicted depth is the walk from its held depth over positions some
/// live booking of it predicts on the query's path.
#[test]
fn lookups_agree_with_a_model() {
    struct ModelBooking {
        worker: WorkerId,
        locals: Vec<u64>,
        start: usize,
        expires: u64,
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _round in 0..200 {
        let p = store(40);
        let mut model: Vec<ModelBooking> = Vec::new();
        let mut now = 0u64;
        for _ in 0..60 {
            now += rnd(20);
            let worker = WorkerId::new(rnd(2), 0);
            let locals: Vec<u64> = (0..1 + rnd(7)).map(|_| 1 + rnd(2)).collect();
            let start = rnd(locals.len() as u64) as usize;
            match rnd(10) {
                0 => {
                    p.drop_worker(worker);
                    model.retain(|b| b.worker != worker);
                }
                1 => p.sweep(now),
                _ => {
                    let ttl = 1 + rnd(100);
                    if p.book(worker, &locals, start, ttl, now).is_ok() {
                        model.push(ModelBooking { worker, locals: locals.clone(), start, expires: now + ttl });
                    }
                }
            }
            p.check();
            let query: Vec<u64> = (0..1 + rnd(8)).map(|_| 1 + rnd(2)).collect();
            let device = rnd(3) as u32;
            for w in [WorkerId::new(0, 0), WorkerId::new(1, 0)] {
                let mut d = (device as usize).min(query.len());
                while d < query.len()
                    && model.iter().any(|b| {
                        b.worker == w
                            && b.expires > now
                            && b.start <= d
                            && d < b.locals.len()
                            && b.locals[..=d] == query[..=d]
                    })
                {
                    d += 1;
                }
                let want = if d > device as usize { d as u32 } else { 0 };
                assert_eq!(depth(&p, &held(w, device), &query, now, w), want, "query {query:?} worker {w}");
            }
        }
        let live: u64 = model.iter().map(|b| (b.locals.len() - b.start) as u64).sum();
        let c = counts(&p);
        assert!(p.limits.live() <= 40);
        assert_eq!(c[0], c[2] + c[3] + c[4] + p.limits.live(), "made = confirmed + expired + dropped + live");
        assert!(p.limits.live() <= live, "renewals add nothing");
    }
}
