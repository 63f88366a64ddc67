//! The shipped unit, run by systemd itself: a container (systemd-nspawn
//! over the host's /usr) boots systemd with `systemd/kv-indexer.service`
//! byte for byte, its whole sandbox (seccomp filter, dynamic user,
//! read-only system) applied by systemd. The daemon must start (READY=1:
//! the unit is active, not restarting), answer queries for a real engine's
//! blocks, serve its Unix socket to the router's group and no one else,
//! reread its workers file on `systemctl reload` (and stay up), log lines
//! journald files at their priority, and stop cleanly on SIGTERM.
//!
//! Needs root, systemd and systemd-nspawn (`scripts/install-test-tools.sh`
//! unpacks it into target/test-tools/); without them the test says why and
//! skips.

mod support;

use kv_indexer::StorageTier;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::daemon::request;
use support::publisher::{PublisherConfig, TestEvent, TestPublisher};
use support::wait_until;

/// The router's group; the probe asks as uid 4201 in it and as uid 4202 outside it.
const ROUTER_GID: u32 = 4200;
/// Bound on each container phase; only reached when something is broken.
const PHASE_MS: u64 = 90_000;
/// The workers file, where README tells an operator to install it.
const WORKERS_FILE: &str = "/etc/kv-indexer/workers.jsonl";

/// Runs in the container as root, after the daemon's start job ended.
const PROBE: &str = r#"#!/bin/sh
R=/results
show() {
    systemctl show kv-indexer -p ActiveState -p SubState -p Result -p ExecMainCode \
        -p ExecMainStatus -p NRestarts -p StatusText
}
ask() { # uid, extra setpriv args: HTTP status of GET /workers over the socket, 000 if refused
    setpriv --reuid="$1" --regid="$1" $2 -- curl -s -o /dev/null -w '%{http_code}' \
        --max-time 10 --unix-socket /run/kv-indexer/api.sock http://localhost/workers
}
show > $R/started.tmp && mv $R/started.tmp $R/started
journalctl -u kv-indexer -o cat --no-pager > $R/start.log 2>&1
stat -c '%a %G' /run/kv-indexer/api.sock > $R/socket 2>&1
ask 4201 --groups=4200 > $R/router
ask 4202 --clear-groups > $R/stranger
touch $R/ready
i=0
while [ ! -e $R/reload ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
systemctl reload kv-indexer > $R/reload.out 2>&1
echo "exit=$?" >> $R/reload.out
show > $R/reloaded.tmp && mv $R/reloaded.tmp $R/reloaded
i=0
while [ ! -e $R/go ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
systemctl stop kv-indexer
show > $R/stopped
journalctl -u kv-indexer -o json --no-pager > $R/journal.tmp && mv $R/journal.tmp $R/journal.json
"#;

const PROBE_UNIT: &str = "[Unit]
After=kv-indexer.service
Wants=kv-indexer.service
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Service]
Type=oneshot
ExecStart=/bin/sh /probe.sh
";

fn tool(name: &str) -> Option<PathBuf> {
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools").join(name);
    if local.exists() {
        return Some(local);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.exists())
}

/// Why the test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to start a container".into());
    }
    if !Path::new("/usr/lib/systemd/systemd").exists() {
        return Some("systemd is not installed".into());
    }
    for t in ["setpriv", "curl"] {
        if tool(t).is_none() {
            return Some(format!("{t} is not installed"));
        }
    }
    if tool("systemd-nspawn").is_none() {
        return Some("systemd-nspawn not found; scripts/install-test-tools.sh unpacks it".into());
    }
    None
}

/// A scratch tree for one container, removed when dropped.
struct Scratch {
    dir: PathBuf,
    machine: String,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("KV_INDEXER_KEEP_CONTAINER").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        // nspawn leaves this empty directory behind on a host without systemd.
        let _ = std::fs::remove_dir(Path::new("/run/systemd/nspawn/propagate").join(&self.machine));
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The root of the container: the host's /usr, a few files of /etc, the
/// shipped unit, the router's group and the test's env file and probe.
fn build_root(s: &Scratch, env_file: &str, workers_file: &str) -> PathBuf {
    let root = s.dir.join("root");
    for d in ["usr", "etc", "proc", "sys", "dev", "run", "tmp", "var"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for d in ["bin", "lib", "lib64", "sbin"] {
        if Path::new("/usr").join(d).exists() {
            std::os::unix::fs::symlink(format!("usr/{d}"), root.join(d)).unwrap();
        }
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    write(&root.join("etc/passwd"), &passwd);
    let group = std::fs::read_to_string("/etc/group").unwrap();
    write(&root.join("etc/group"), &format!("{group}kvrouter:x:{ROUTER_GID}:\n"));
    write(&root.join("etc/nsswitch.conf"), "passwd: files\ngroup: files\nshadow: files\nhosts: files\n");
    write(&root.join("etc/machine-id"), "");
    // nspawn looks for it before /usr is mounted.
    write(&root.join("etc/os-release"), &std::fs::read_to_string("/usr/lib/os-release").unwrap());
    let unit =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/kv-indexer.service")).unwrap();
    write(&root.join("etc/systemd/system/kv-indexer.service"), &unit);
    // What README tells an operator to add for a co-located router.
    write(&root.join("etc/systemd/system/kv-indexer.service.d/router.conf"), "[Service]\nGroup=kvrouter\n");
    write(&root.join("etc/kv-indexer/kv-indexer.env"), env_file);
    write(&root.join(WORKERS_FILE.trim_start_matches('/')), workers_file);
    write(&root.join("etc/systemd/system/kvi-probe.service"), PROBE_UNIT);
    write(&root.join("probe.sh"), PROBE);
    std::fs::create_dir_all(s.dir.join("results")).unwrap();
    // The binary where the unit expects it, over the host's /usr.
    let bin = s.dir.join("usr/local/bin/kv-indexer");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_kv-indexer"), &bin).unwrap();
    root
}

fn boot(s: &Scratch, root: &Path) -> Child {
    let log = std::fs::File::create(s.dir.join("boot.log")).unwrap();
    Command::new(tool("systemd-nspawn").unwrap())
        .arg("-q")
        .arg("-D")
        .arg(root)
        .args(["--register=no", "--keep-unit", "--machine", &s.machine])
        .arg(format!("--overlay-ro=/usr:{}:/usr", s.dir.join("usr").display()))
        .arg(format!("--bind={}:/results", s.dir.join("results").display()))
        .args(["--boot", "--", "systemd.unit=kvi-probe.service"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting systemd-nspawn")
}

/// Waits for `file` in the results while the container runs.
fn wait_for(s: &Scratch, child: &mut Child, file: &str) -> String {
    let path = s.dir.join("results").join(file);
    let deadline = Instant::now() + Duration::from_millis(PHASE_MS);
    while !path.exists() {
        let exited = child.try_wait().unwrap().is_some();
        if exited || Instant::now() >= deadline {
            let _ = child.kill();
            let boot = std::fs::read_to_string(s.dir.join("boot.log")).unwrap_or_default();
            let tail: Vec<&str> = boot.lines().rev().take(40).collect();
            panic!("no {file} from the container (exited: {exited}); boot log, last lines first:\n{}", tail.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::read_to_string(path).unwrap()
}

fn properties(text: &str) -> std::collections::HashMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn message(entry: &Value) -> String {
    match &entry["MESSAGE"] {
        Value::String(s) => s.clone(),
        Value::Array(bytes) => bytes.iter().filter_map(|b| b.as_u64()).map(|b| b as u8 as char).collect(),
        _ => String::new(),
    }
}

#[test]
fn the_shipped_unit_starts_serves_and_stops_under_systemd() {
    if let Some(why) = missing_prerequisite() {
        println!("skipped: the unit was not booted under systemd: {why}");
        return;
    }
    let s = Scratch {
        dir: std::env::temp_dir().join(format!("kv-indexer-unit-{}", std::process::id())),
        machine: format!("kvi-test-{}", std::process::id()),
    };
    let _ = std::fs::remove_dir_all(&s.dir);
    let mut engine = TestPublisher::new(PublisherConfig { block_size: 4, ..PublisherConfig::default() });
    let (port, unreachable) = (free_port(), free_port());
    // Three workers (one of them from the workers file), one of which never
    // answers, and a gate of four.
    let env_file = format!(
        "KV_INDEXER_ARGS=--host 127.0.0.1 --port {port} --block-size 4 --model-name m \
         --workers 1={},2=tcp://127.0.0.1:{unreachable} --workers-file {WORKERS_FILE} \
         --unix-socket /run/kv-indexer/api.sock\n\
         KV_INDEXER_MIN_INITIAL_WORKERS=4\n",
        engine.endpoint
    );
    let endpoint = engine.endpoint.clone();
    let file_line = |instance: u64| {
        json!({"instance_id": instance, "endpoint": endpoint, "model_name": "m", "block_size": 4}).to_string()
    };
    let root = build_root(&s, &env_file, &format!("# engines\n{}\n", file_line(4)));
    let mut child = boot(&s, &root);

    wait_for(&s, &mut child, "ready");
    let started = properties(&std::fs::read_to_string(s.dir.join("results/started")).unwrap());
    let start_log = std::fs::read_to_string(s.dir.join("results/start.log")).unwrap_or_default();
    assert_eq!(started["ActiveState"], "active", "{started:?}\n{start_log}");
    assert_eq!(started["SubState"], "running", "{started:?}");
    assert_eq!(started["NRestarts"], "0", "{started:?}");
    assert_eq!(started["StatusText"], "waiting for workers: 3 of 4 registered", "{started:?}");

    // The worker gate is the router's: /health says why it is not ready.
    let base = format!("http://127.0.0.1:{port}");
    let (status, body) = request("GET", &format!("{base}/health"), None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("3 of 4"), "{body}");

    // A real engine's blocks are found.
    assert!(engine.wait_subscribed(2), "instance 1 and the file's instance 4");
    let TestEvent::Stored { hashes, .. } = engine.new_store(StorageTier::Device, None, 3) else { unreachable!() };
    let leaf = *hashes.last().unwrap();
    engine.publish(vec![TestEvent::Stored { tier: StorageTier::Device, parent: None, hashes }]);
    let query = json!({"block_hashes": engine.chain_locals(leaf), "model_name": "m"}).to_string();
    let found = wait_until(|| {
        let (status, body) = request("POST", &format!("{base}/query_by_hash"), Some(&query));
        status == 200 && serde_json::from_str::<Value>(&body).unwrap()["scores"]["1"]["0"] == 12
    });
    assert!(found, "the engine's 3 blocks were never found");
    let third = json!({"instance_id": 3, "endpoint": engine.endpoint, "model_name": "m", "block_size": 4});
    assert_eq!(request("POST", &format!("{base}/register"), Some(&third.to_string())).0, 201);
    assert_eq!(request("GET", &format!("{base}/health"), None).0, 200);

    // The router's group may use the socket; another user may not.
    let socket = std::fs::read_to_string(s.dir.join("results/socket")).unwrap();
    assert_eq!(socket.trim(), "660 kvrouter");
    assert_eq!(std::fs::read_to_string(s.dir.join("results/router")).unwrap(), "200");
    assert_eq!(std::fs::read_to_string(s.dir.join("results/stranger")).unwrap(), "000");

    // `systemctl reload`: the file's instance 4 makes way for 5.
    let instances = || {
        let (_, body) = request("GET", &format!("{base}/workers"), None);
        let workers: Value = serde_json::from_str(&body).unwrap();
        workers.as_array().unwrap().iter().map(|w| w["instance_id"].as_u64().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(instances(), [1, 2, 3, 4]);
    write(&root.join(WORKERS_FILE.trim_start_matches('/')), &format!("{}\n", file_line(5)));
    std::fs::write(s.dir.join("results/reload"), "").unwrap();
    let reloaded = properties(&wait_for(&s, &mut child, "reloaded"));
    let said = std::fs::read_to_string(s.dir.join("results/reload.out")).unwrap_or_default();
    assert!(said.ends_with("exit=0\n"), "systemctl reload: {said}");
    assert!(wait_until(|| instances() == [1, 2, 3, 5]), "{:?}", instances());
    assert_eq!((reloaded["ActiveState"].as_str(), reloaded["NRestarts"].as_str()), ("active", "0"), "{reloaded:?}");

    std::fs::write(s.dir.join("results/go"), "").unwrap();
    let journal = wait_for(&s, &mut child, "journal.json");
    let deadline = Instant::now() + Duration::from_millis(PHASE_MS);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();

    // SIGTERM stopped it cleanly: exited (code 1 is CLD_EXITED) with status 0.
    let stopped = properties(&std::fs::read_to_string(s.dir.join("results/stopped")).unwrap());
    assert_eq!(
        (stopped["Result"].as_str(), stopped["ExecMainCode"].as_str(), stopped["ExecMainStatus"].as_str()),
        ("success", "1", "0"),
        "{stopped:?}"
    );

    // journald filed each line at its priority and stripped the prefix.
    let lines: Vec<(String, String)> = journal
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["SYSLOG_IDENTIFIER"] == "kv-indexer")
        .map(|e| (e["PRIORITY"].as_str().unwrap_or("").to_string(), message(&e)))
        .collect();
    let find = |needle: &str| lines.iter().find(|(_, m)| m.contains(needle)).map(|(p, _)| p.as_str());
    assert_eq!(find("listening on"), Some("6"), "{lines:?}");
    assert_eq!(find(&format!("cannot connect to tcp://127.0.0.1:{unreachable}")), Some("4"), "{lines:?}");
    assert_eq!(find("stopped"), Some("6"), "{lines:?}");
    assert_eq!(find(&format!("workers file {WORKERS_FILE} read on SIGHUP: 1 entries")), Some("6"), "{lines:?}");
    assert_eq!(find("cannot pin"), None, "sched_setaffinity is allowed: {lines:?}");
    assert!(lines.iter().all(|(_, m)| !m.starts_with('<')), "{lines:?}");
}
