//! A test engine behind fault proxies, as the fault tests drive it: one
//! `TestPublisher`, one `FaultProxy` per daemon that follows it, a mixed
//! random workload over all four tiers, restarts, and the two ways a test
//! lets the system settle once faults stop (a marker batch that reveals any
//! trailing gap, and a re-announcement of every block the engine holds).

use serde_json::json;

use super::daemon::Daemon;
use super::fault_proxy::{FaultProxy, FaultStats, Faults};
use super::publisher::{apply_to, PublisherConfig, TestEvent, TestPublisher};
use super::rng::Rng;
use super::wait_until;
use kv_indexer::StorageTier;

/// The model every fault test registers its engines under.
pub const MODEL: &str = "m";
/// Tokens per block (small, so chains are cheap).
pub const BLOCK_SIZE: u32 = 4;
/// Blocks per batch when an engine re-announces what it holds.
const REPUBLISH_BLOCKS_PER_BATCH: usize = 16;

/// An engine and the proxies between it and each daemon.
pub struct Engine {
    pub instance: u64,
    pub publisher: TestPublisher,
    /// `proxies[path]` feeds the daemon that registered this engine on `path`.
    pub proxies: Vec<FaultProxy>,
    /// Whether daemons are told of the replay endpoint.
    pub replay: bool,
    /// Restarts injected.
    pub restarts: u64,
    /// Batches published, every process together: what each proxy reads.
    pub sent: u64,
    rng: Rng,
}

impl Engine {
    /// An engine with `paths` proxies, all injecting `faults`.
    pub fn new(instance: u64, cfg: PublisherConfig, faults: Faults, paths: usize) -> Engine {
        let replay = cfg.ring_capacity.is_some();
        let seed = cfg.seed;
        let mut publisher = TestPublisher::new(PublisherConfig { block_size: BLOCK_SIZE, ..cfg });
        let proxies: Vec<FaultProxy> = (0..paths)
            .map(|p| FaultProxy::start(&publisher.endpoint, faults, seed.wrapping_mul(7_919) + p as u64))
            .collect();
        assert!(publisher.wait_subscribed(paths), "proxies never subscribed to engine {instance}");
        Engine { instance, publisher, proxies, replay, restarts: 0, sent: 0, rng: Rng::new(seed ^ 0xFA17) }
    }

    /// Registers this engine with `d` through proxy `path` and waits for the subscription.
    pub fn register(&self, d: &Daemon, path: usize) {
        self.register_at(d, path, &self.proxies[path].endpoint);
    }

    /// Registers this engine with `d` at `endpoint`, something that leads
    /// to proxy `path` (a relay in front of it), and waits for the subscription.
    pub fn register_at(&self, d: &Daemon, path: usize, endpoint: &str) {
        let proxy = &self.proxies[path];
        let before = proxy.subscriptions();
        let (status, v) = d.post_json(
            "/register",
            json!({"instance_id": self.instance, "endpoint": endpoint,
                   "replay_endpoint": if self.replay { self.publisher.replay_endpoint.clone() } else { None },
                   "model_name": MODEL, "block_size": BLOCK_SIZE}),
        );
        assert_eq!(status, 201, "register {}: {v}", self.instance);
        assert!(proxy.wait_subscribed(before + 1), "daemon never subscribed to the proxy of {}", self.instance);
    }

    pub fn set_faults(&self, faults: Faults) {
        self.proxies.iter().for_each(|p| p.set_faults(faults));
    }

    pub fn publish(&mut self, events: Vec<TestEvent>) -> u64 {
        self.sent += 1;
        self.publisher.publish(events)
    }

    /// `batches` random batches: the publisher's device/host mix (stores,
    /// removes, clears), and one in seven on the disk and external tiers.
    pub fn workload(&mut self, batches: usize) {
        for _ in 0..batches {
            let events = if self.rng.chance(15) { self.lower_tier_batch() } else { self.publisher.random_batch() };
            self.publish(events);
        }
    }

    /// Stores under any held block, or removes, in the disk or external tier.
    fn lower_tier_batch(&mut self) -> Vec<TestEvent> {
        let mut scratch = self.publisher.truth().clone();
        let count = 1 + self.rng.below(2);
        let mut events = Vec::new();
        for _ in 0..count {
            let tier = if self.rng.chance(50) { StorageTier::Disk } else { StorageTier::External };
            let here: Vec<u64> = scratch[tier.index()].iter().copied().collect();
            let event = if !here.is_empty() && self.rng.chance(35) {
                let n = 1 + self.rng.below(2);
                TestEvent::Removed {
                    tier,
                    hashes: (0..n).map(|_| here[self.rng.below(here.len() as u64) as usize]).collect(),
                }
            } else {
                let any: Vec<u64> = scratch.iter().flatten().copied().collect();
                let parent =
                    (!any.is_empty() && self.rng.chance(80)).then(|| any[self.rng.below(any.len() as u64) as usize]);
                let n = 1 + self.rng.below(3) as usize;
                self.publisher.new_store(tier, parent, n)
            };
            apply_to(&mut scratch, &event);
            events.push(event);
        }
        events
    }

    /// Waits until every proxy has read all batches, then forwards held copies.
    pub fn quiesce(&self) {
        for p in &self.proxies {
            assert!(p.wait_received(self.sent), "proxy of {} read {:?} of {}", self.instance, p.stats(), self.sent);
            p.flush();
        }
    }

    /// Ends the faults: everything sent so far has gone through them.
    pub fn stop_faults(&self) {
        self.quiesce();
        self.set_faults(Faults::NONE);
    }

    /// The engine restarts: empty cache, seq from 0. With `rebind` it is a
    /// new process on the same port, and each proxy's PUB side is rebound
    /// too, so daemons see the reconnect they would see without a proxy;
    /// `subscribed[path]` says whether a daemon follows that proxy now.
    /// Without `rebind` nothing tells the restart but seq 0, so that batch
    /// passes the proxies unharmed (see the fault tests' module docs).
    pub fn restart(&mut self, rebind: bool, subscribed: &[bool]) {
        self.quiesce();
        self.restarts += 1;
        self.publisher.restart(rebind);
        if rebind {
            assert!(self.publisher.wait_subscribed(self.proxies.len()), "proxies never came back");
            for (p, &sub) in self.proxies.iter().zip(subscribed) {
                p.rebind();
                assert!(!sub || p.wait_subscribed(1), "daemon never reconnected to the proxy of {}", self.instance);
            }
        } else {
            self.proxies.iter().for_each(|p| p.pass_next(1));
        }
    }

    /// Publishes a fresh one-block root store and waits until `d` shows it:
    /// the daemon has then dealt with every earlier batch of this engine
    /// (gaps found, replayed or resynced), since one worker's batches apply
    /// in order.
    pub fn settle(&mut self, daemons: &[&Daemon]) {
        let TestEvent::Stored { hashes, .. } = self.publisher.new_store(StorageTier::Device, None, 1) else {
            unreachable!()
        };
        let leaf = hashes[0];
        self.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
        let locals = self.publisher.chain_locals(leaf);
        for d in daemons {
            let seen = wait_until(|| {
                let (_, v) = d.post_json("/query_by_hash", json!({"block_hashes": locals, "model_name": MODEL}));
                v["instances"][self.instance.to_string()]["gpu"] == u64::from(BLOCK_SIZE)
            });
            assert!(seen, "{} never showed engine {}'s marker batch", d.base, self.instance);
        }
    }

    /// Announces every block the engine holds again (clean), as engines
    /// re-store blocks on reuse: what lets a resynced worker converge.
    pub fn republish(&mut self) {
        let batches = self.publisher.republish_visible(REPUBLISH_BLOCKS_PER_BATCH);
        self.sent += batches as u64;
    }

    /// Fault figures of all proxies.
    pub fn stats(&self) -> FaultStats {
        let mut s = FaultStats::default();
        self.proxies.iter().for_each(|p| s += p.stats());
        s
    }
}

/// Test rounds: `KV_INDEXER_FAULT_ROUNDS` (default 1, at most 1,000) for soak runs.
pub fn rounds() -> usize {
    std::env::var("KV_INDEXER_FAULT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).clamp(1, 1_000)
}
