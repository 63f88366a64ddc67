//! A dump loaded where nobody sees it, then kept whole or not at all: a
//! peer's at startup recovery (`daemon::recovery`), a snapshot's
//! (`snapshot::restore`).
//!
//! Each index the dump names is loaded as it arrives into a fresh index
//! of the registry's making (`Registry::new_index`), held here; queries and
//! snapshots still see the old one. Only once the dump arrived whole does
//! `keep` put each fresh index in place of the old (`install_index`),
//! after copying into it, over a snapshot, the old index's workers the
//! dump does not name (the peer's blocks replace the snapshot's for every
//! worker the dump names; the others keep the snapshot's). A dump that
//! fails is dropped with this staging: nothing of it was ever visible,
//! not even in the counters, which are added to the registry's on `keep`.
//!
//! A snapshot's staging refuses the whole file once `--max-pairs` sheds a
//! store (`refusing_shed`): which blocks a cap sheds is arbitrary, so the
//! daemon rather starts without it than from an arbitrary part of it.
//!
//! Memory: the fresh indexes are the state the daemon keeps, built once;
//! nothing of the dump is held besides them but the stores that wait for
//! their parents (`index::Loader`, none for a dump of ours), bounded by
//! `--max-pairs`. Over a snapshot the old and fresh indexes live side by
//! side until the swap; both count against `--max-pairs`. A snapshot is
//! staged at startup, into an empty registry: the fresh indexes are the
//! only copy.

use crate::dump::DumpSink;
use crate::event::{Event, WorkerId};
use crate::index::{ApplyOutcome, Index, Loaded, Loader};
use crate::registry::event_status::ApplyCounters;
use crate::registry::{Registry, INDEXES_MAX, NAME_BYTES_MAX};
use rustc_hash::{FxHashMap, FxHashSet};

/// One index of the dump, staged.
struct Staged {
    model_name: String,
    tenant_id: String,
    index: Index,
    loader: Loader,
    /// Workers the dump lists in this index.
    named: FxHashSet<WorkerId>,
}

/// What keeping a staged dump did, summed over its indexes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub indexes: usize,
    pub loaded: Loaded,
    /// Workers whose snapshot blocks the dump replaced.
    pub replaced_workers: usize,
}

/// A dump being staged (see the module doc).
pub struct Staging<'r> {
    registry: &'r Registry,
    staged: Vec<Staged>,
    by_key: FxHashMap<(String, String), usize>,
    /// The entry being read: its place in `staged`, or None while skipped.
    current: Option<usize>,
    counters: ApplyCounters,
    waiting_max: u64,
    /// Staged indexes the registry does not have yet.
    new_indexes: usize,
    /// Who stages, for log lines: "recovery", "snapshot".
    who: &'static str,
    /// A store the shared cap sheds fails the whole dump.
    refuse_shed: bool,
}

impl<'r> Staging<'r> {
    pub fn new(registry: &'r Registry, who: &'static str) -> Staging<'r> {
        Staging {
            registry,
            staged: Vec::new(),
            by_key: FxHashMap::default(),
            current: None,
            counters: ApplyCounters::default(),
            waiting_max: registry.budget.pairs_max().unwrap_or(u64::MAX),
            new_indexes: 0,
            who,
            refuse_shed: false,
        }
    }

    /// The same staging, failing as soon as `--max-pairs` sheds a store.
    pub fn refusing_shed(self) -> Staging<'r> {
        Staging { refuse_shed: true, ..self }
    }

    fn shed_error(&self) -> String {
        let max = self.registry.budget.pairs_max().unwrap_or(u64::MAX);
        format!("it holds more (block, worker) pairs than --max-pairs {max} allows")
    }

    /// Puts every staged index in place of the registry's (see the module
    /// doc); with `over_snapshot`, the old index's workers the dump does
    /// not name are copied in first. Refusing shed stores, every index is
    /// completed before any is put in place, and a shed one fails them all.
    pub fn keep(self, over_snapshot: bool) -> Result<Kept, String> {
        let shed_error = self.shed_error();
        let mut kept = Kept::default();
        let Staging { registry, staged, counters, refuse_shed, who, .. } = self;
        let mut complete = Vec::new();
        for mut s in staged {
            let mut shed = 0u64;
            let mut seen = |e: &Event, o: &ApplyOutcome| {
                counters.add(&e.kind, o);
                shed += u64::from(o.shed);
            };
            if over_snapshot {
                if let Some(old) = registry.index(&s.model_name, &s.tenant_id).map(|h| h.index_arc()) {
                    kept.replaced_workers += old.workers().iter().filter(|w| s.named.contains(w)).count();
                    let mut cursor = old.dump_cursor();
                    while let Some(events) = cursor.next_worker(&old) {
                        if events.first().is_some_and(|e| s.named.contains(&e.event.worker)) {
                            continue;
                        }
                        for e in events {
                            // The snapshot's own parents come first: nothing waits.
                            let _ = s.loader.push(&s.index, e, &mut seen);
                        }
                    }
                }
            }
            let loaded = s.loader.finish(&s.index, &mut seen);
            if refuse_shed && shed > 0 {
                return Err(shed_error);
            }
            let done = (s.model_name, s.tenant_id, s.index, loaded);
            match refuse_shed {
                true => complete.push(done),
                false => install(registry, who, done, &mut kept),
            }
        }
        for done in complete {
            install(registry, who, done, &mut kept);
        }
        registry.counters.add_all(&counters);
        Ok(kept)
    }
}

/// Puts one completed index in place.
fn install(
    registry: &Registry,
    who: &str,
    (model, tenant, index, loaded): (String, String, Index, Loaded),
    kept: &mut Kept,
) {
    match registry.install_index(&model, &tenant, index) {
        Ok(()) => {
            kept.indexes += 1;
            kept.loaded.events += loaded.events;
            kept.loaded.blocks_stored += loaded.blocks_stored;
            kept.loaded.blocks_refused += loaded.blocks_refused;
            kept.loaded.orphans += loaded.orphans;
        }
        Err(e) => crate::warn!("{who}: skipping model={model:?} tenant={tenant:?}: {e}"),
    }
}

impl DumpSink for Staging<'_> {
    fn index(&mut self, model_name: &str, tenant_id: &str, block_size: u32) -> Result<(), String> {
        let key = (model_name.to_owned(), tenant_id.to_owned());
        if let Some(&i) = self.by_key.get(&key) {
            if self.staged[i].index.block_size() != block_size {
                return Err(format!("model={model_name:?} tenant={tenant_id:?} is listed twice, with two block sizes"));
            }
            self.current = Some(i);
            return Ok(());
        }
        self.current = None;
        let existing = self.registry.index(model_name, tenant_id).map(|h| h.index().block_size());
        let why = if [model_name, tenant_id].iter().any(|n| n.is_empty() || n.len() > NAME_BYTES_MAX) {
            Some(format!("names must be 1..={NAME_BYTES_MAX} bytes"))
        } else if existing.is_some_and(|b| b != block_size) {
            Some(format!("block_size {block_size}, not this daemon's {}", existing.unwrap_or(0)))
        } else if existing.is_none() && self.registry.indexes().len() + self.new_indexes >= INDEXES_MAX {
            Some(format!("{INDEXES_MAX} (model, tenant) indexes exist already"))
        } else {
            None
        };
        if let Some(why) = why {
            crate::warn!("{}: skipping model={model_name:?} tenant={tenant_id:?} of the dump: {why}", self.who);
            return Ok(());
        }
        self.new_indexes += usize::from(existing.is_none());
        self.by_key.insert(key, self.staged.len());
        self.current = Some(self.staged.len());
        self.staged.push(Staged {
            model_name: model_name.to_owned(),
            tenant_id: tenant_id.to_owned(),
            index: self.registry.new_index(block_size),
            loader: Loader::with_waiting_max(self.waiting_max),
            named: FxHashSet::default(),
        });
        Ok(())
    }

    fn event(&mut self, event: crate::index::DumpEvent) -> Result<(), String> {
        let Some(s) = self.current.map(|i| &mut self.staged[i]) else { return Ok(()) };
        s.named.insert(event.event.worker);
        let counters = &self.counters;
        let mut shed = 0u32;
        let mut seen = |e: &Event, o: &ApplyOutcome| {
            counters.add(&e.kind, o);
            shed |= o.shed;
        };
        s.loader.push(&s.index, event, &mut seen).map_err(|e| format!("{e} (--max-pairs)"))?;
        if self.refuse_shed && shed > 0 {
            return Err(self.shed_error());
        }
        Ok(())
    }
}
