//! How stale the index is, as an operator reads it from the real binary:
//! per listener in `/workers` (beside Dynamo's fields) and `/metrics`,
//! whether it is connected, its last seq and the seconds since its last
//! batch, moving as batches arrive and stop and as the engine goes; and
//! `kv_indexer_event_lag_seconds`, which counts every applied batch by how
//! long after its engine stamped it it was applied.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};
use support::daemon::Daemon;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

const SERIES: &str = r#"{model="m",tenant="default",instance_id="1",dp_rank="0"}"#;

fn engine() -> TestPublisher {
    TestPublisher::new(PublisherConfig { block_size: 4, ..PublisherConfig::default() })
}

fn start_with(p: &mut TestPublisher) -> Daemon {
    let d = Daemon::start(&[]);
    let body = json!({"instance_id": 1, "endpoint": p.endpoint, "model_name": "m", "block_size": 4});
    assert_eq!(d.post_json("/register", body).0, 201);
    assert!(p.wait_subscribed(1));
    d
}

fn publish_chain(p: &mut TestPublisher) -> u64 {
    let TestEvent::Stored { hashes, .. } = p.new_store(StorageTier::Device, None, 2) else { unreachable!() };
    p.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }])
}

/// Listener rank 0 of the one instance `/workers` lists.
fn listener(d: &Daemon) -> Value {
    d.get_json("/workers").1[0]["listeners"]["0"].clone()
}

/// The value of one series (name with its labels) in a scrape, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn metric(d: &Daemon, series: &str) -> Option<f64> {
    sample(&d.get("/metrics").1, series)
}

fn unix_now_s() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn listener_staleness_moves_as_batches_arrive_and_stop_and_the_engine_goes() {
    let mut p = engine();
    let d = start_with(&mut p);
    assert!(wait_until(|| listener(&d)["connected"] == true), "{}", listener(&d));
    let l = listener(&d);
    assert_eq!((&l["status"], &l["endpoint"]), (&json!("active"), &json!(p.endpoint)), "Dynamo's fields stay: {l}");
    assert_eq!((&l["last_seq"], &l["batches_received"]), (&Value::Null, &json!(0)), "{l}");
    let connected = format!("kv_indexer_listener_connected{SERIES}");
    let last_seq = format!("kv_indexer_listener_last_seq{SERIES}");
    let age = format!("kv_indexer_listener_last_batch_age_seconds{SERIES}");
    assert_eq!(metric(&d, &connected), Some(1.0));
    assert_eq!(metric(&d, &last_seq), None, "no seq before the first batch");

    publish_chain(&mut p);
    assert!(wait_until(|| listener(&d)["last_seq"] == 0), "{}", listener(&d));
    assert_eq!(metric(&d, &last_seq), Some(0.0));

    // Nothing arrives: the age grows, in /workers and in /metrics alike.
    let mut quiet = 0.0;
    assert!(wait_until(|| {
        quiet = listener(&d)["last_batch_age_s"].as_f64().unwrap();
        quiet >= 1.5
    }));
    assert!(metric(&d, &age).unwrap() >= quiet);

    // A batch arrives: the seq moves on and the age starts again.
    publish_chain(&mut p);
    assert!(wait_until(|| {
        let l = listener(&d);
        l["last_seq"] == 1 && l["last_batch_age_s"].as_f64().unwrap() < quiet
    }));
    assert_eq!(listener(&d)["batches_received"], 2);
    assert_eq!(metric(&d, &last_seq), Some(1.0));

    // The engine goes: not connected, the last seq stays what it was.
    drop(p);
    assert!(wait_until(|| listener(&d)["connected"] == false), "{}", listener(&d));
    let l = listener(&d);
    assert_eq!((&l["status"], &l["last_seq"]), (&json!("pending"), &json!(1)), "{l}");
    assert_eq!(metric(&d, &connected), Some(0.0));
    assert_eq!(metric(&d, &last_seq), Some(1.0));
}

#[test]
fn the_lag_histogram_counts_every_applied_batch_by_its_lag() {
    let mut p = engine();
    let d = start_with(&mut p);
    let bucket = |text: &str, le: &str| sample(text, &format!("kv_indexer_event_lag_seconds_bucket{{le=\"{le}\"}}"));
    assert_eq!(bucket(&d.get("/metrics").1, "+Inf"), Some(0.0), "nothing applied yet");

    // Stamped 100 s ago, an hour ahead (skew: zero), and now.
    p.set_timestamp(Some(unix_now_s() - 100.0));
    publish_chain(&mut p);
    p.set_timestamp(Some(unix_now_s() + 3_600.0));
    publish_chain(&mut p);
    p.set_timestamp(None);
    for _ in 0..3 {
        publish_chain(&mut p);
    }
    let mut text = String::new();
    assert!(wait_until(|| {
        text = d.get("/metrics").1;
        sample(&text, "kv_indexer_event_lag_seconds_count") == Some(5.0)
    }));
    assert_eq!(sample(&text, "kv_indexer_batches_applied_total"), Some(5.0), "one count per applied batch");
    assert_eq!(bucket(&text, "+Inf"), Some(5.0));
    assert_eq!(bucket(&text, "60"), Some(4.0), "all but the one stamped 100 s ago");
    assert!(bucket(&text, "0.0001").unwrap() >= 1.0, "the skewed one counts as no lag");
    let sum = sample(&text, "kv_indexer_event_lag_seconds_sum").unwrap();
    assert!(sum >= 100.0, "the old batch alone lagged 100 s: {sum}");
}
