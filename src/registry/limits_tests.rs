//! Bounds on what the control plane can make the registry keep: (model,
//! tenant) indexes, and their names on every path that creates one.

use super::{Registry, RegistryError, INDEXES_MAX, NAME_BYTES_MAX};
use crate::index::Budget;
use crate::ingest::{Ingest, IngestConfig};
use std::sync::Arc;

#[test]
fn indexes_stop_at_their_limit_and_existing_ones_still_serve() {
    let cfg = IngestConfig { listener_threads: 1, shard_threads: 1, pin_threads: false, ..IngestConfig::default() };
    let ingest = Arc::new(Ingest::start(cfg).unwrap());
    let registry = Registry::new(ingest.clone(), 0, Arc::new(Budget::unlimited()));
    for i in 0..INDEXES_MAX {
        registry.index_or_create(&format!("model-{i}"), "t", 16).unwrap();
    }
    let refused = registry.index_or_create("one-too-many", "t", 16).err().expect("refused past the limit");
    assert!(matches!(&refused, RegistryError::Conflict(m) if m.contains(&INDEXES_MAX.to_string())), "{refused:?}");
    assert!(registry.index("one-too-many", "t").is_none(), "nothing was created");
    assert!(registry.index_or_create("model-7", "t", 16).is_ok(), "existing indexes are still found");
    assert_eq!(registry.indexes().len(), INDEXES_MAX);
    ingest.shutdown();
}

#[test]
fn index_names_are_bounded_on_every_path_that_creates_an_index() {
    // Registration, recovery from a peer's dump and snapshot restore all
    // create indexes here: a name this refuses never reaches a snapshot.
    let cfg = IngestConfig { listener_threads: 1, shard_threads: 1, pin_threads: false, ..IngestConfig::default() };
    let ingest = Arc::new(Ingest::start(cfg).unwrap());
    let registry = Registry::new(ingest.clone(), 0, Arc::new(Budget::unlimited()));
    let longest = "n".repeat(NAME_BYTES_MAX);
    assert!(registry.index_or_create(&longest, &longest, 16).is_ok());
    for (model, tenant) in
        [(format!("{longest}n"), "t".to_string()), ("m".into(), format!("{longest}t")), ("".into(), "t".into())]
    {
        let refused = registry.index_or_create(&model, &tenant, 16).err().expect("refused");
        assert!(
            matches!(&refused, RegistryError::Invalid(m) if m.contains(&NAME_BYTES_MAX.to_string())),
            "{refused:?}"
        );
    }
    assert_eq!(registry.indexes().len(), 1);
    ingest.shutdown();
}
