//! A thousand workers on one daemon, started the way a shell starts it
//! (a soft limit of 1,024 open files): each worker's sockets used to run
//! into libzmq's default cap of 1,023 sockets a context (the 342nd
//! registration was refused) and, past about 160 workers, into that soft
//! limit. Every worker subscribes to the same engine here, so one stored
//! prefix must show up for all of them.

mod support;

use serde_json::json;
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestPublisher};
use support::wait_until;

use kv_indexer::StorageTier;
use support::publisher::TestEvent;

const WORKERS: u64 = 1_000;
const BLOCK_SIZE: u32 = 4;

#[test]
fn a_thousand_workers_register_and_all_match() {
    let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only `hard`, ours.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) }, 0);
    // Six descriptors a worker in the daemon; the engine's side of the
    // connections is this process's.
    assert!(
        hard.rlim_max >= 8 * WORKERS,
        "this test needs a hard open-files limit of at least {} (it is {})",
        8 * WORKERS,
        hard.rlim_max
    );
    let mut d = Daemon::start_with_open_files(&[], 1_024);
    assert!(d.wait_logged("open files limit raised from 1024"), "{:?}", d.log());

    let mut p = TestPublisher::new(PublisherConfig { block_size: BLOCK_SIZE, seed: 11, ..PublisherConfig::default() });
    for instance in 1..=WORKERS {
        let (status, v) = d.post_json(
            "/register",
            json!({"instance_id": instance, "endpoint": p.endpoint, "model_name": "m", "block_size": BLOCK_SIZE}),
        );
        assert_eq!(status, 201, "worker {instance}: {v}");
    }
    assert!(p.wait_subscribed(WORKERS as usize), "not every worker subscribed");

    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 3) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
    let tokens = p.chain_tokens(leaf);
    let matched = |d: &Daemon| {
        let (status, v) = d.post_json("/query", json!({"model_name": "m", "token_ids": tokens}));
        assert_eq!(status, 200, "{v}");
        let scores = v["scores"].as_object().cloned().unwrap_or_default();
        scores.values().filter(|ranks| ranks["0"].as_u64() == Some(3 * BLOCK_SIZE as u64)).count() as u64
    };
    assert!(wait_until(|| matched(&d) == WORKERS), "{} of {WORKERS} workers matched", matched(&d));
    let (_, workers) = d.get_json("/workers");
    assert_eq!(workers.as_array().map(Vec::len), Some(WORKERS as usize), "{workers}");
    // The dump holds every worker's three blocks.
    let (status, dump) = d.get_json("/dump");
    assert_eq!(status, 200);
    let events = dump["m:default"]["events"].as_array().cloned().unwrap_or_default();
    let holders: std::collections::BTreeSet<String> = events.iter().map(|e| e["worker_id"].to_string()).collect();
    assert_eq!(holders.len(), WORKERS as usize, "every worker in the dump: {:?}", events.first());

    for instance in 1..=WORKERS {
        let (status, v) = d.post_json("/unregister", json!({"instance_id": instance, "model_name": "m"}));
        assert_eq!(status, 200, "worker {instance}: {v}");
    }
    assert_eq!(d.get_json("/workers").1, json!([]));
    let (status, _) = d.post_json("/query", json!({"model_name": "m", "token_ids": tokens}));
    assert_eq!(status, 404, "the last worker gone, the index goes");
}
