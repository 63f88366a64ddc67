//! `GET /workers` and `GET /peers` bodies.
//!
//! One object per registered instance, as Dynamo 1.6.1 lists them:
//! `{"instance_id":1,"source":"zmq","status":"active","model_name":"m",
//! "tenant_id":"default","routing_group":"default","block_size":16,
//! "endpoints":{"0":"tcp://.."},"listeners":{"0":{"endpoint":"tcp://..",
//! "status":"active","last_error":".."}}}`. Dynamo 1.6.1 names the tenant
//! `routing_group` here while its docs say `tenant_id`; both are written so
//! clients of either keep working. `last_error` is left out when there is
//! none; an instance with no listener is left out (Dynamo does the same, it
//! only happens mid-unregister). Ranks are in ascending order.

use crate::ingest::ListenerStatus;
use crate::json::out::{push_str, push_u64, push_u64_key};

/// An instance's status from its listeners': failed > pending > active >
/// paused (Dynamo's precedence). None if there are no listeners.
pub fn aggregate_status(statuses: impl IntoIterator<Item = ListenerStatus>) -> Option<ListenerStatus> {
    let rank = |s: ListenerStatus| match s {
        ListenerStatus::Paused => 0,
        ListenerStatus::Active => 1,
        ListenerStatus::Pending => 2,
        ListenerStatus::Failed => 3,
    };
    statuses.into_iter().max_by_key(|&s| rank(s))
}

/// One listener (one dp rank) of an instance, as `/workers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerListener {
    pub dp_rank: u32,
    pub endpoint: String,
    pub status: ListenerStatus,
    pub last_error: Option<String>,
}

/// One registered instance, as `/workers` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    pub instance_id: u64,
    pub model_name: String,
    pub tenant_id: String,
    pub block_size: u32,
    /// In any order; one per rank.
    pub listeners: Vec<WorkerListener>,
}

/// Writes the `/workers` array, instances in the order given.
pub fn write_workers(out: &mut Vec<u8>, workers: &[WorkerInfo]) {
    out.push(b'[');
    let mut first = true;
    let mut order: Vec<usize> = Vec::new();
    for w in workers {
        let Some(status) = aggregate_status(w.listeners.iter().map(|l| l.status)) else {
            continue;
        };
        if !first {
            out.push(b',');
        }
        first = false;
        order.clear();
        order.extend(0..w.listeners.len());
        order.sort_by_key(|&i| w.listeners[i].dp_rank);
        // A rank listed twice would make a duplicate key; keep the first.
        order.dedup_by_key(|i| w.listeners[*i].dp_rank);

        out.extend_from_slice(b"{\"instance_id\":");
        push_u64(out, w.instance_id);
        out.extend_from_slice(b",\"source\":\"zmq\",\"status\":\"");
        out.extend_from_slice(status.as_str().as_bytes());
        out.extend_from_slice(b"\",\"model_name\":");
        push_str(out, &w.model_name);
        out.extend_from_slice(b",\"tenant_id\":");
        push_str(out, &w.tenant_id);
        out.extend_from_slice(b",\"routing_group\":");
        push_str(out, &w.tenant_id);
        out.extend_from_slice(b",\"block_size\":");
        push_u64(out, u64::from(w.block_size));
        out.extend_from_slice(b",\"endpoints\":{");
        for (j, &i) in order.iter().enumerate() {
            let l = &w.listeners[i];
            if j > 0 {
                out.push(b',');
            }
            push_u64_key(out, u64::from(l.dp_rank));
            push_str(out, &l.endpoint);
        }
        out.extend_from_slice(b"},\"listeners\":{");
        for (j, &i) in order.iter().enumerate() {
            let l = &w.listeners[i];
            if j > 0 {
                out.push(b',');
            }
            push_u64_key(out, u64::from(l.dp_rank));
            out.extend_from_slice(b"{\"endpoint\":");
            push_str(out, &l.endpoint);
            out.extend_from_slice(b",\"status\":\"");
            out.extend_from_slice(l.status.as_str().as_bytes());
            out.push(b'"');
            if let Some(e) = &l.last_error {
                out.extend_from_slice(b",\"last_error\":");
                push_str(out, e);
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"}}");
    }
    out.push(b']');
}

/// Writes the `/peers` array of URLs.
pub fn write_peers(out: &mut Vec<u8>, peers: &[String]) {
    out.push(b'[');
    for (i, p) in peers.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_str(out, p);
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::ListenerStatus::*;
    use serde_json::{json, Value};

    fn listener(dp_rank: u32, status: ListenerStatus, last_error: Option<&str>) -> WorkerListener {
        WorkerListener {
            dp_rank,
            endpoint: format!("tcp://127.0.0.1:{}", 5557 + dp_rank),
            status,
            last_error: last_error.map(str::to_owned),
        }
    }

    #[test]
    fn aggregate_precedence() {
        assert_eq!(aggregate_status([]), None);
        assert_eq!(aggregate_status([Paused, Active]), Some(Active));
        assert_eq!(aggregate_status([Active, Pending, Paused]), Some(Pending));
        assert_eq!(aggregate_status([Pending, Failed, Active]), Some(Failed));
        assert_eq!(aggregate_status([Paused]), Some(Paused));
    }

    #[test]
    fn workers_shape() {
        let workers = vec![
            WorkerInfo {
                instance_id: 1,
                model_name: "m".into(),
                tenant_id: "default".into(),
                block_size: 16,
                listeners: vec![listener(1, Failed, Some("gap \"replay\" failed")), listener(0, Active, None)],
            },
            WorkerInfo {
                instance_id: 2,
                model_name: "m".into(),
                tenant_id: "t".into(),
                block_size: 16,
                listeners: vec![],
            },
        ];
        let mut out = Vec::new();
        write_workers(&mut out, &workers);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!([{
                "instance_id": 1, "source": "zmq", "status": "failed", "model_name": "m",
                "tenant_id": "default", "routing_group": "default", "block_size": 16,
                "endpoints": {"0": "tcp://127.0.0.1:5557", "1": "tcp://127.0.0.1:5558"},
                "listeners": {
                    "0": {"endpoint": "tcp://127.0.0.1:5557", "status": "active"},
                    "1": {"endpoint": "tcp://127.0.0.1:5558", "status": "failed", "last_error": "gap \"replay\" failed"}
                }
            }])
        );
        out.clear();
        write_workers(&mut out, &[]);
        assert_eq!(out, b"[]");
    }

    #[test]
    fn peers_shape() {
        let mut out = Vec::new();
        write_peers(&mut out, &["http://a:1".to_string(), "http://b:2".to_string()]);
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), json!(["http://a:1", "http://b:2"]));
    }
}
