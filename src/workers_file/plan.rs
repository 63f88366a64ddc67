//! A read's entries against what is registered: what to unregister, what
//! to register, and whether that can be done whole. Pure: it sees the
//! registrations and indexes as given and changes nothing.
//!
//! Only registrations the file made (`Origin::File`) are the file's to
//! change. One the file no longer lists is unregistered; one whose entry
//! changed (any field) is unregistered and registered anew; one whose
//! entry is the same is left alone, listener, watermark and blocks. An
//! entry with no registration (new, or ended by `/unregister`) is
//! registered. A change is refused whole when it cannot all be done: an
//! entry whose key, or whose instance under another (model, tenant), is
//! registered by someone else, or whose block size differs from that of an
//! index that stays, or more listeners or indexes than a daemon runs.

use super::parse::Entry;
use crate::event::WorkerId;
use crate::ingest::LISTENERS_MAX;
use crate::registry::{Origin, Registration, INDEXES_MAX};
use rustc_hash::{FxHashMap, FxHashSet};

/// What a read changes.
#[derive(Debug, Default)]
pub struct Plan {
    /// The file's registrations to end: no longer listed, or changed.
    pub remove: Vec<Registration>,
    /// Entries to register: new, changed, or listed but not registered.
    pub add: Vec<Entry>,
    /// Entries among `add` that replace a registration in `remove`.
    pub changed: usize,
    /// Entries whose registration stays as it is.
    pub unchanged: usize,
}

/// An index as the plan sees it: (model, tenant) and block size.
pub type IndexView = ((String, String), u32);

/// Why a read cannot be applied: the entry's line (None: the file as a
/// whole) and why.
pub type Refusal = (Option<usize>, String);

/// Plans the change from `registered` (every registration) and `indexes`
/// (every index) to what `entries` ask for.
pub fn plan(entries: &[Entry], registered: &[Registration], indexes: &[IndexView]) -> Result<Plan, Refusal> {
    let wanted: FxHashMap<WorkerId, &Entry> = entries.iter().map(|e| (e.args.worker(), e)).collect();
    let mut p = Plan::default();
    for r in registered {
        let Origin::File(was) = &r.origin else { continue };
        match wanted.get(&r.worker) {
            Some(e) if e.args == **was => p.unchanged += 1,
            Some(_) => {
                p.changed += 1;
                p.remove.push(r.clone());
            }
            None => p.remove.push(r.clone()),
        }
    }
    let leaving: FxHashSet<WorkerId> = p.remove.iter().map(|r| r.worker).collect();
    let staying: Vec<&Registration> = registered.iter().filter(|r| !leaving.contains(&r.worker)).collect();
    let index_of = |r: &Registration| (r.model_name.clone(), r.tenant_id.clone());
    // An index goes with its last registration (`Registry::unregister`).
    let kept: FxHashSet<(String, String)> = staying.iter().map(|r| index_of(r)).collect();
    let dropped: FxHashSet<(String, String)> = p.remove.iter().map(index_of).filter(|k| !kept.contains(k)).collect();
    let block_sizes: FxHashMap<&(String, String), u32> =
        indexes.iter().filter(|(k, _)| !dropped.contains(k)).map(|(k, b)| (k, *b)).collect();

    for e in entries {
        let a = &e.args;
        let refuse = |why: String| Err((Some(e.line), why));
        if let Some(r) = staying.iter().find(|r| r.worker == a.worker()) {
            if matches!(r.origin, Origin::File(_)) {
                continue; // unchanged
            }
            return refuse(format!(
                "instance {} dp_rank {} is registered already (by /register, --workers or a snapshot) with \
                 endpoint {}; unregister it first or drop this line",
                a.instance_id, a.dp_rank, r.endpoint
            ));
        }
        let elsewhere = |r: &&&Registration| {
            r.worker.instance_id == a.instance_id && (&r.model_name, &r.tenant_id) != (&a.model_name, &a.tenant_id)
        };
        if let Some(r) = staying.iter().find(elsewhere) {
            return refuse(format!(
                "instance {} is registered under model={:?} tenant={:?} (dp_rank {}); an instance serves one \
                 (model, tenant)",
                a.instance_id, r.model_name, r.tenant_id, r.worker.dp_rank
            ));
        }
        let index = (a.model_name.clone(), a.tenant_id.clone());
        if let Some(&size) = block_sizes.get(&index).filter(|&&size| size != a.block_size) {
            return refuse(format!(
                "model={:?} tenant={:?} has block_size {size}, not {}; it keeps its block size while anything \
                 is registered on it",
                a.model_name, a.tenant_id, a.block_size
            ));
        }
        p.add.push(e.clone());
    }

    let listeners = staying.len() + p.add.len();
    if listeners > LISTENERS_MAX {
        return Err((None, format!("{listeners} listeners would run, more than {LISTENERS_MAX}")));
    }
    let new_indexes: FxHashSet<(String, String)> = p
        .add
        .iter()
        .map(|e| (e.args.model_name.clone(), e.args.tenant_id.clone()))
        .filter(|k| !block_sizes.contains_key(k))
        .collect();
    let index_count = block_sizes.len() + new_indexes.len();
    if index_count > INDEXES_MAX {
        return Err((None, format!("{index_count} (model, tenant) indexes would exist, more than {INDEXES_MAX}")));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::ListenerId;
    use crate::registry::RegisterArgs;

    fn args(instance: u64, rank: u32, endpoint: &str, model: &str, block_size: u32) -> RegisterArgs {
        RegisterArgs {
            instance_id: instance,
            dp_rank: rank,
            endpoint: endpoint.into(),
            replay_endpoint: None,
            model_name: model.into(),
            tenant_id: "default".into(),
            block_size,
        }
    }

    fn entry(line: usize, a: RegisterArgs) -> Entry {
        Entry { line, args: a }
    }

    fn reg(a: &RegisterArgs, file: bool) -> Registration {
        Registration {
            worker: a.worker(),
            endpoint: a.endpoint.clone(),
            replay_endpoint: a.replay_endpoint.clone(),
            model_name: a.model_name.clone(),
            tenant_id: a.tenant_id.clone(),
            listener: ListenerId(a.instance_id),
            origin: if file { Origin::File(Box::new(a.clone())) } else { Origin::Api },
        }
    }

    fn index(model: &str, block_size: u32) -> IndexView {
        ((model.into(), "default".into()), block_size)
    }

    fn keys(regs: &[Registration]) -> Vec<u64> {
        regs.iter().map(|r| r.worker.instance_id).collect()
    }

    #[test]
    fn new_gone_changed_and_unchanged_entries() {
        let (a, b, c) =
            (args(1, 0, "tcp://h:1", "m", 16), args(2, 0, "tcp://h:2", "m", 16), args(3, 0, "tcp://h:3", "m", 16));
        let moved = args(2, 0, "tcp://h:22", "m", 16);
        let api = args(7, 0, "tcp://h:7", "m", 16);
        let registered = [reg(&a, true), reg(&b, true), reg(&c, true), reg(&api, false)];
        let d = args(4, 0, "tcp://h:4", "m", 16);
        let p = plan(&[entry(1, a), entry(2, moved), entry(5, d)], &registered, &[index("m", 16)]).unwrap();
        assert_eq!(keys(&p.remove), [2, 3], "b changed, c is gone; the API's stays");
        assert_eq!(p.add.iter().map(|e| e.line).collect::<Vec<_>>(), [2, 5]);
        assert_eq!((p.changed, p.unchanged), (1, 1));
    }

    #[test]
    fn a_listed_entry_an_unregister_ended_is_registered_again() {
        let a = args(1, 0, "tcp://h:1", "m", 16);
        let p = plan(&[entry(1, a)], &[], &[]).unwrap();
        assert_eq!((p.add.len(), p.remove.len(), p.unchanged), (1, 0, 0));
    }

    #[test]
    fn conflicts_with_other_registrations_refuse_the_whole_read() {
        let api = args(5, 0, "tcp://h:5", "m", 16);
        let registered = [reg(&api, false)];
        let ok = entry(1, args(1, 0, "tcp://h:1", "m", 16));
        let cases = [
            (entry(3, args(5, 0, "tcp://h:9", "m", 16)), "registered already"),
            (entry(3, args(5, 1, "tcp://h:9", "other", 16)), "registered under model=\"m\""),
            (entry(3, args(6, 0, "tcp://h:9", "m", 32)), "has block_size 16, not 32"),
        ];
        for (bad, why) in cases {
            let (line, msg) = plan(&[ok.clone(), bad], &registered, &[index("m", 16)]).unwrap_err();
            assert_eq!(line, Some(3), "{msg}");
            assert!(msg.contains(why), "{msg}");
        }
    }

    #[test]
    fn an_index_the_file_alone_held_may_change_its_block_size() {
        let a = args(1, 0, "tcp://h:1", "m", 16);
        let bigger = args(1, 0, "tcp://h:1", "m", 32);
        let p = plan(&[entry(1, bigger.clone())], &[reg(&a, true)], &[index("m", 16)]).unwrap();
        assert_eq!((keys(&p.remove), p.add.len(), p.changed), (vec![1], 1, 1));
        // With another registration on it, the index stays and keeps its size.
        let api = args(2, 0, "tcp://h:2", "m", 16);
        let err = plan(&[entry(1, bigger)], &[reg(&a, true), reg(&api, false)], &[index("m", 16)]).unwrap_err();
        assert!(err.1.contains("has block_size 16"), "{err:?}");
    }

    #[test]
    fn listener_and_index_caps_hold() {
        let entries: Vec<Entry> =
            (0..=LISTENERS_MAX as u64).map(|i| entry(i as usize + 1, args(i, 0, "tcp://h:1", "m", 16))).collect();
        assert_eq!(plan(&entries, &[], &[]).unwrap_err().0, None);
        let indexes: Vec<IndexView> = (0..INDEXES_MAX).map(|i| index(&format!("m{i}"), 16)).collect();
        let err = plan(&[entry(1, args(1, 0, "tcp://h:1", "new", 16))], &[], &indexes).unwrap_err();
        assert!(err.1.contains("indexes"), "{err:?}");
        assert!(plan(&[entry(1, args(1, 0, "tcp://h:1", "m0", 16))], &[], &indexes).is_ok(), "an existing index");
    }
}
