//! Collecting blobs (component bytes, script sources, module texts and module manifests,
//! content-addressed in a store's `blobs`) once their last user is gone: what a run, a
//! registration, a run's module record or a queued start refers to ([`Referenced`], read
//! leniently from their stored JSON), the blobs a run refers to ([`of_run`]: the candidates
//! [`Store::collect_blobs`](super::Store::collect_blobs) deletes when nothing else refers to
//! them), and the [`Pins`] that keep a blob a start just put from being lost to a collection
//! racing with it.
//!
//! The race: a start puts its component (skipped when the store has it) and then writes the
//! run record that refers to it; a collection between the two finds the blob unreferenced
//! and deletes it. A store therefore pins what it is handed ([`Pins::pin`]) and, once a
//! record referring to pinned blobs is durable, makes sure they are still there
//! ([`Pins::due`], then stores them again from the pinned bytes when a collection took them).
//! A collection that reads the references after that record's commit sees the record; one
//! that deleted before it is repaired by the check (PostgreSQL orders the check after any
//! collection in progress by an advisory lock, redb by its one write transaction at a time).

use crate::model::script::{Manifest, ScriptRef};
use crate::store::{RunRecord, Store, StoreError};
use serde::Deserialize;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// What a run record refers to (the rest of the record is skipped unparsed).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RunRefs {
    component_hashes: Vec<String>,
    scripts: Vec<Option<ScriptRef>>,
}

/// What a registration refers to.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RegistrationRefs {
    hash: String,
    #[serde(default)]
    script: Option<ScriptRef>,
}

/// What a queued start refers to.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartRefs {
    component: String,
    #[serde(default)]
    script: Option<ScriptRef>,
}

/// The module texts a manifest names.
#[derive(Deserialize)]
struct ManifestRefs {
    modules: std::collections::BTreeMap<String, String>,
}

/// The blobs a script reference names directly (its source and its manifest).
fn script_refs(script: &ScriptRef) -> impl Iterator<Item = &String> {
    std::iter::once(&script.sha256).chain(script.modules.as_ref())
}

/// Every blob hash the stored rows of a store refer to, gathered row by row; the manifests
/// named by script references are read last ([`Referenced::manifests`]), for the module
/// texts they name.
#[derive(Debug, Default)]
pub(crate) struct Referenced {
    hashes: HashSet<String>,
    manifests: BTreeSet<String>,
}

impl Referenced {
    fn script(&mut self, script: Option<ScriptRef>) {
        if let Some(script) = script {
            self.hashes.insert(script.sha256);
            if let Some(manifest) = script.modules {
                self.hashes.insert(manifest.clone());
                self.manifests.insert(manifest);
            }
        }
    }

    /// A run record's JSON.
    pub(crate) fn run(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let refs: RunRefs = serde_json::from_slice(bytes).map_err(|e| super::corrupt("a run record's blobs", e))?;
        self.hashes.extend(refs.component_hashes);
        refs.scripts.into_iter().for_each(|s| self.script(s));
        Ok(())
    }

    /// A registration's JSON.
    pub(crate) fn registration(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let refs: RegistrationRefs =
            serde_json::from_slice(bytes).map_err(|e| super::corrupt("a registration's blobs", e))?;
        self.hashes.insert(refs.hash);
        self.script(refs.script);
        Ok(())
    }

    /// A queued start's JSON.
    pub(crate) fn start(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let refs: StartRefs = serde_json::from_slice(bytes).map_err(|e| super::corrupt("a queued start's blobs", e))?;
        self.hashes.insert(refs.component);
        self.script(refs.script);
        Ok(())
    }

    /// A run's module record, or a manifest blob: the module texts it names.
    pub(crate) fn manifest(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let refs: ManifestRefs = serde_json::from_slice(bytes).map_err(|e| super::corrupt("a module manifest", e))?;
        self.hashes.extend(refs.modules.into_values());
        Ok(())
    }

    /// The manifests script references name, to be read with [`Referenced::manifest`].
    pub(crate) fn manifests(&self) -> Vec<String> {
        self.manifests.iter().cloned().collect()
    }

    /// Whether every one of `candidates` is referred to already (the rows left need not be
    /// read: a collection stops there).
    pub(crate) fn covers(&self, candidates: &[String]) -> bool {
        candidates.iter().all(|h| self.hashes.contains(h))
    }

    /// Of `candidates`, those nothing refers to.
    pub(crate) fn unreferenced(&self, candidates: &[String]) -> Vec<String> {
        let mut dead: Vec<String> = candidates.iter().filter(|h| !self.hashes.contains(*h)).cloned().collect();
        dead.sort();
        dead.dedup();
        dead
    }
}

/// The blobs run `record` refers to: its components, scripts and their manifests, the
/// module texts those manifests name and those its module record names (the candidates a
/// removal of the run hands [`Store::collect_blobs`]). A manifest that cannot be read adds
/// nothing (its texts stay).
pub async fn of_run(store: &dyn Store, record: &RunRecord) -> Result<Vec<String>, StoreError> {
    let mut out: Vec<String> = record.component_hashes.clone();
    let scripts: Vec<&ScriptRef> = record.scripts.iter().flatten().collect();
    for script in &scripts {
        out.extend(script_refs(script).cloned());
    }
    let manifests: BTreeSet<&String> = scripts.iter().filter_map(|s| s.modules.as_ref()).collect();
    for hash in manifests {
        if let Some(bytes) = store.blob(hash).await? {
            if let Ok(refs) = serde_json::from_slice::<ManifestRefs>(&bytes) {
                out.extend(refs.modules.into_values());
            }
        }
    }
    if let Some(manifest) = store.run_modules(&record.envelope.run_id).await? {
        out.extend(manifest.modules.into_values());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Blobs put and not yet known to be referenced by a durable record, with their bytes (see
/// the module's paragraph), and the module texts each run's module record named.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    inner: Mutex<PinsInner>,
}

#[derive(Debug, Default)]
struct PinsInner {
    blobs: HashMap<String, Arc<[u8]>>,
    modules: HashMap<String, Vec<String>>,
}

impl Pins {
    fn inner(&self) -> std::sync::MutexGuard<'_, PinsInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep `bytes` under `hash` until a durable record referring to it is checked.
    pub(crate) fn pin(&self, hash: &str, bytes: &Arc<[u8]>) {
        self.inner().blobs.insert(hash.to_string(), bytes.clone());
    }

    /// Run `run_id`'s module record names `manifest`'s texts: check them with its next record.
    pub(crate) fn pin_modules(&self, run_id: &str, manifest: &Manifest) {
        let mut inner = self.inner();
        let pinned: Vec<String> = manifest.modules.values().filter(|h| inner.blobs.contains_key(*h)).cloned().collect();
        if !pinned.is_empty() {
            inner.modules.entry(run_id.to_string()).or_default().extend(pinned);
        }
    }

    /// The pinned blobs a durable run record (`record`, JSON) refers to, with the module
    /// texts of its pinned manifests and of its module record: to check, then
    /// [`Pins::release`].
    pub(crate) fn due_for_run(&self, run_id: &str, record: &[u8]) -> Vec<(String, Arc<[u8]>)> {
        let mut inner = self.inner();
        if inner.blobs.is_empty() {
            return Vec::new();
        }
        let mut refs = Referenced::default();
        if refs.run(record).is_err() {
            return Vec::new();
        }
        refs.hashes.extend(inner.modules.remove(run_id).unwrap_or_default());
        due(&inner, refs)
    }

    /// The pinned blobs a durable registration or queued start (`json`, read by `read`)
    /// refers to.
    pub(crate) fn due_for(
        &self,
        json: &[u8],
        read: fn(&mut Referenced, &[u8]) -> Result<(), StoreError>,
    ) -> Vec<(String, Arc<[u8]>)> {
        let inner = self.inner();
        if inner.blobs.is_empty() {
            return Vec::new();
        }
        let mut refs = Referenced::default();
        if read(&mut refs, json).is_err() {
            return Vec::new();
        }
        due(&inner, refs)
    }

    /// Checked: no longer pinned.
    pub(crate) fn release(&self, checked: &[(String, Arc<[u8]>)]) {
        let mut inner = self.inner();
        for (hash, _) in checked {
            inner.blobs.remove(hash);
        }
    }
}

/// Of `refs`, the pinned blobs, with the texts the pinned manifests among them name.
fn due(inner: &PinsInner, mut refs: Referenced) -> Vec<(String, Arc<[u8]>)> {
    for manifest in refs.manifests() {
        if let Some(bytes) = inner.blobs.get(&manifest) {
            let _ = refs.manifest(bytes);
        }
    }
    let mut out: Vec<(String, Arc<[u8]>)> =
        refs.hashes.iter().filter_map(|h| inner.blobs.get(h).map(|b| (h.clone(), b.clone()))).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read_from_runs_registrations_starts_and_manifests() {
        let mut refs = Referenced::default();
        refs.run(br#"{"componentHashes":["c1"],"scripts":[null,{"sha256":"s1","fileName":"f.js","modules":"m1"}],"envelope":{"big":[1,2]}}"#)
            .expect("a run");
        refs.registration(br#"{"hash":"c2","meta":{}}"#).expect("a registration");
        refs.start(br#"{"component":"c3","backend":{}}"#).expect("a start");
        refs.manifest(br#"{"modules":{"a.js":"t1"},"resolved":[]}"#).expect("a manifest");
        assert_eq!(refs.manifests(), vec!["m1".to_string()]);
        let candidates: Vec<String> = ["c1", "c2", "c3", "s1", "m1", "t1", "gone", "gone"].map(String::from).into();
        assert_eq!(refs.unreferenced(&candidates), vec!["gone".to_string()]);
        assert!(refs.covers(&candidates[..6]) && !refs.covers(&candidates));
        assert!(refs.run(b"not json").is_err(), "an unreadable record fails the collection, never drops a blob");
    }

    #[test]
    fn a_pinned_blob_is_due_with_the_record_that_refers_to_it_and_released_after() {
        let pins = Pins::default();
        let bytes: Arc<[u8]> = Arc::from(&b"x"[..]);
        for hash in ["c1", "m1", "t1", "t2", "other"] {
            pins.pin(hash, &bytes);
        }
        let manifest: Arc<[u8]> = Arc::from(&br#"{"modules":{"a.js":"t1"},"resolved":[]}"#[..]);
        pins.pin("m1", &manifest);
        let modules = Manifest {
            root: None,
            modules: std::collections::BTreeMap::from([("b.js".to_string(), "t2".to_string())]),
            resolved: Vec::new(),
        };
        pins.pin_modules("r", &modules);
        let record = br#"{"componentHashes":["c1"],"scripts":[{"sha256":"s1","fileName":"f.js","modules":"m1"}]}"#;
        let due = pins.due_for_run("r", record);
        let hashes: Vec<&str> = due.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(hashes, vec!["c1", "m1", "t1", "t2"], "what the record, its manifest and its modules name");
        pins.release(&due);
        assert!(pins.due_for_run("r", record).is_empty(), "released");
        assert_eq!(pins.due_for(br#"{"hash":"other"}"#, Referenced::registration).len(), 1, "still pinned");
    }
}
