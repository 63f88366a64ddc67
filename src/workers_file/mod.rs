//! `--workers-file PATH`: the engines to follow, one `/register` body a
//! line (blank lines and `#` comments allowed), read at start and again on
//! SIGHUP, and reconciled with the registry (`plan.rs` has the rules): new
//! entries are registered, gone ones unregistered, changed ones
//! unregistered and registered anew, and unchanged ones left alone.
//!
//! A read is checked whole before anything changes: a file that cannot be
//! read, a line `/register` would refuse (`parse.rs`), two lines that
//! disagree, or an entry that conflicts with a registration the file did
//! not make changes nothing, and the log names the file and the line.
//! Registrations made through `/register` (or `--workers`, or restored
//! from a snapshot) are never changed by the file; `/unregister` may end
//! one the file made, and the next read registers it again while the file
//! lists it. Only a registration that fails once begun (the pipeline did
//! not answer, or a `/register` raced the read) leaves a read partial:
//! each failure is logged with its line, and the next read tries again.
//! Each read is counted by outcome in the registry's `FileReloads`.

mod parse;
mod plan;

pub use parse::{Entry, WORKERS_FILE_BYTES_MAX};

use crate::registry::{Origin, Registry, RegistryError};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// The workers file of a daemon.
#[derive(Clone, Debug)]
pub struct WorkersFile {
    path: PathBuf,
}

/// What an applied read changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub registered: usize,
    pub unregistered: usize,
    /// Of those, registrations replaced by a changed entry.
    pub changed: usize,
    pub unchanged: usize,
}

impl WorkersFile {
    pub fn new(path: PathBuf) -> WorkersFile {
        WorkersFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and checks the file; an error names the file and the line.
    pub fn read(&self) -> Result<Vec<Entry>, String> {
        let mut text = Vec::new();
        let read = std::fs::File::open(&self.path)
            .and_then(|f| f.take(WORKERS_FILE_BYTES_MAX as u64 + 1).read_to_end(&mut text));
        if let Err(e) = read {
            return Err(format!("{}: cannot read it: {e}", self.name()));
        }
        parse::parse(&text).map_err(|(line, why)| self.at(Some(line).filter(|&l| l > 0), &why))
    }

    /// Reads the file and reconciles the registry with it; counted and
    /// logged (`when` says why it was read). Err if anything went wrong.
    pub fn reload(&self, registry: &Registry, when: &str) -> Result<Reconciled, String> {
        match self.read() {
            Ok(entries) => self.apply(registry, &entries, when),
            Err(e) => Err(self.refused(registry, e)),
        }
    }

    /// Reconciles the registry with `entries`, read from this file; counted
    /// and logged like `reload`.
    pub fn apply(&self, registry: &Registry, entries: &[Entry], when: &str) -> Result<Reconciled, String> {
        let registered = registry.registrations();
        let indexes: Vec<plan::IndexView> = registry
            .indexes()
            .iter()
            .map(|h| ((h.model_name.clone(), h.tenant_id.clone()), h.index().block_size()))
            .collect();
        let p = match plan::plan(entries, &registered, &indexes) {
            Ok(p) => p,
            Err((line, why)) => return Err(self.refused(registry, self.at(line, &why))),
        };
        let mut done = Reconciled { changed: p.changed, unchanged: p.unchanged, ..Reconciled::default() };
        let mut failures = Vec::new();
        for r in &p.remove {
            let (w, model, tenant) = (r.worker, &r.model_name, &r.tenant_id);
            match registry.unregister(w.instance_id, model, Some(tenant), Some(w.dp_rank)) {
                // Ended meanwhile by `/unregister`: what the read wanted.
                Ok(()) | Err(RegistryError::NotFound(_)) => done.unregistered += 1,
                Err(e) => failures.push(format!(
                    "{}: unregistering instance {} dp_rank {}: {e}",
                    self.name(),
                    w.instance_id,
                    w.dp_rank
                )),
            }
        }
        for e in &p.add {
            match registry.register_as(e.args.clone(), Origin::File(Box::new(e.args.clone()))) {
                Ok(()) => done.registered += 1,
                Err(err) => failures.push(self.at(Some(e.line), &err.to_string())),
            }
        }
        let counters = &registry.file_reloads;
        let summary = format!(
            "{} entries: {} registered, {} unregistered ({} of them changed and registered anew), {} unchanged",
            entries.len(),
            done.registered,
            done.unregistered,
            done.changed,
            done.unchanged
        );
        if failures.is_empty() {
            counters.applied.fetch_add(1, Ordering::Relaxed);
            counters.last_failed.store(false, Ordering::Relaxed);
            crate::info!("{} read {when}: {summary}", self.name());
            return Ok(done);
        }
        counters.partial.fetch_add(1, Ordering::Relaxed);
        counters.last_failed.store(true, Ordering::Relaxed);
        for f in &failures {
            crate::warn!("{f}");
        }
        let message = format!(
            "{} read {when} in part: {summary}; {} change(s) failed (logged above); the next read tries again",
            self.name(),
            failures.len()
        );
        crate::warn!("{message}");
        Err(message)
    }

    /// Counts and logs a refused read; returns the message.
    fn refused(&self, registry: &Registry, why: String) -> String {
        let counters = &registry.file_reloads;
        counters.refused.fetch_add(1, Ordering::Relaxed);
        counters.last_failed.store(true, Ordering::Relaxed);
        let message = format!("{why}; nothing changed");
        crate::warn!("{message}");
        message
    }

    fn name(&self) -> String {
        format!("workers file {}", self.path.display())
    }

    /// `why`, placed at `line` of the file (or the file as a whole).
    fn at(&self, line: Option<usize>, why: &str) -> String {
        match line {
            Some(line) => format!("{} line {line}: {why}", self.name()),
            None => format!("{}: {why}", self.name()),
        }
    }
}
