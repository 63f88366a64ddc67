//! A server under the fleet bench: its process (started here, stderr kept),
//! what /proc says of it (resident set and its peak, open files, threads,
//! CPU time) and plain HTTP calls to it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines of a server's stderr kept for error reports.
const LOG_TAIL_LINES: usize = 40;
/// Error lines kept besides the tail.
const KEPT_LINES_MAX: usize = 8;
/// Longest wait for a server to log its port.
const PORT_WAIT: Duration = Duration::from_secs(600);
/// Longest wait for a stopped server to exit.
const EXIT_WAIT: Duration = Duration::from_secs(600);

pub struct Server {
    pub name: String,
    pub base: String,
    pub pid: u32,
    child: Option<Child>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Lines mentioning a snapshot, and the first errors, kept whole.
    pub snapshot_lines: Arc<Mutex<Vec<String>>>,
}

fn port_of(line: &str) -> Option<u16> {
    let rest = line.split("listening on ").nth(1)?;
    let addr = rest.split_whitespace().next()?.trim_start_matches("http://");
    let port: String = addr.rsplit(':').next()?.chars().take_while(char::is_ascii_digit).collect();
    port.parse().ok()
}

impl Server {
    /// Starts `program args` and waits until it logs the port it listens on.
    pub fn spawn(name: &str, program: &str, args: &[String]) -> Result<Server, String> {
        let mut child = Command::new(program)
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("DYN_ROUTER_MIN_INITIAL_WORKERS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .die_with_parent()
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let snapshot_lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let (keep, snaps) = (tail.clone(), snapshot_lines.clone());
        // With FLEET_LOG_DIR set, every line also goes to DIR/NAME.log.
        let mut copy = std::env::var_os("FLEET_LOG_DIR").map(|dir| {
            let path = std::path::Path::new(&dir).join(format!("{name}.log"));
            let _ = std::fs::create_dir_all(&dir);
            std::fs::File::create(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(f) = copy.as_mut() {
                    use std::io::Write;
                    let _ = writeln!(f, "{line}");
                }
                if let Some(port) = port_of(&line) {
                    let _ = tx.send(port);
                }
                let fatal = ["ERROR", "panick", "Too many open files", "error:", "Assert", "abort", ".cpp"]
                    .iter()
                    .any(|k| line.contains(k));
                let mut kept = snaps.lock().unwrap();
                if line.contains("snapshot") || (fatal && kept.len() < KEPT_LINES_MAX) {
                    kept.push(line.clone());
                }
                drop(kept);
                let mut tail = keep.lock().unwrap();
                if tail.len() == LOG_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
        let pid = child.id();
        let mut s = Server { name: name.into(), base: String::new(), pid, child: Some(child), tail, snapshot_lines };
        let port = rx.recv_timeout(PORT_WAIT).map_err(|_| format!("{name} did not log its port: {}", s.log_tail()))?;
        s.base = format!("http://127.0.0.1:{port}");
        Ok(s)
    }

    /// The first error lines, then the last lines.
    pub fn log_tail(&self) -> String {
        let errors: Vec<String> =
            self.snapshot_lines.lock().unwrap().iter().filter(|l| !l.contains("snapshot")).cloned().collect();
        let tail = self.tail.lock().unwrap().iter().rev().take(3).rev().cloned().collect::<Vec<_>>();
        errors.into_iter().chain(tail).collect::<Vec<_>>().join(" | ")
    }

    /// Whether the process is running (not gone, not a zombie), without waiting for it.
    pub fn running(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state != "Z")
    }

    /// How the process ended, if it has.
    pub fn exit_status(&mut self) -> Option<String> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()).map(|s| s.to_string())
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until `/health` answers 200.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if get(&self.base, "/health").is_ok_and(|(status, _)| status == 200) {
                return Ok(());
            }
            if !self.alive() {
                return Err(format!("{} exited: {}", self.name, self.log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!("{} not healthy: {}", self.name, self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn status(&self) -> ProcStatus {
        ProcStatus::read(self.pid)
    }

    /// Resets the peak resident set, so the next phase measures its own.
    pub fn reset_peak(&self) {
        let _ = std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5");
    }

    /// SIGTERM, then waits for the exit (however long a snapshot takes);
    /// the seconds it took, and the highest VmHWM read meanwhile (every
    /// 5 ms until the exit: the peak since `reset_peak`, but for the last
    /// few ms).
    pub fn stop(&mut self) -> Result<(f64, u64), String> {
        let Some(mut child) = self.child.take() else { return Ok((0.0, 0)) };
        let t = Instant::now();
        let mut peak = 0;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        while t.elapsed() < EXIT_WAIT {
            peak = peak.max(ProcStatus::read(self.pid).hwm);
            if let Ok(Some(_)) = child.try_wait() {
                return Ok((t.elapsed().as_secs_f64(), peak));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!("{} did not exit within {EXIT_WAIT:?} of SIGTERM", self.name))
    }

    /// SIGKILL: no snapshot written.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Ends a child process when the bench ends, however it ends.
pub trait DieWithParent {
    fn die_with_parent(&mut self) -> &mut Self;
}

impl DieWithParent for Command {
    fn die_with_parent(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl(2) is async-signal-safe and touches nothing shared.
        unsafe {
            self.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        }
    }
}

/// One reading of a process from /proc.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcStatus {
    pub rss: u64,
    pub hwm: u64,
    pub fds: u64,
    pub threads: u64,
    pub cpu_s: f64,
}

impl ProcStatus {
    pub fn read(pid: u32) -> ProcStatus {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |k| k * 1024)
        };
        let count = |dir: &str| std::fs::read_dir(format!("/proc/{pid}/{dir}")).map_or(0, |d| d.count() as u64);
        ProcStatus { rss: kb("VmRSS:"), hwm: kb("VmHWM:"), fds: count("fd"), threads: count("task"), cpu_s: cpu_s(pid) }
    }
}

/// utime + stime of `pid`, in seconds.
pub fn cpu_s(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    let Some(close) = stat.rfind(')') else { return 0.0 };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout_connect(Duration::from_secs(5)).timeout(Duration::from_secs(900)).build()
}

/// GET: the status and body.
pub fn get(base: &str, path: &str) -> Result<(u16, String), String> {
    match agent().get(&format!("{base}{path}")).call() {
        Ok(r) => {
            let status = r.status();
            r.into_string().map(|b| (status, b)).map_err(|e| e.to_string())
        }
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// POST a JSON body: the status and body.
pub fn post(base: &str, path: &str, body: &str) -> Result<(u16, String), String> {
    let req = agent().post(&format!("{base}{path}")).set("content-type", "application/json");
    match req.send_string(body) {
        Ok(r) => {
            let status = r.status();
            r.into_string().map(|b| (status, b)).map_err(|e| e.to_string())
        }
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// GET `path`, reading the body as it comes without keeping it: its bytes.
pub fn get_counted(base: &str, path: &str) -> Result<u64, String> {
    let r = agent().get(&format!("{base}{path}")).call().map_err(|e| format!("{path}: {e}"))?;
    let mut reader = r.into_reader();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => n += k as u64,
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
}

/// The sum of every sample of `name` (any labels) in a Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = l.strip_prefix(name) else { continue };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}
