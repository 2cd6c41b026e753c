//! A run's revision, with one owner: [`Revisions`] reads it from the store (the record's writes
//! plus its last progress entry) and announces it to the host's subscribers.

use super::Host;
use crate::engine::run::Capabilities;
use crate::error::Error;
use crate::model::progress::RunUpdated;
use crate::store::{RunRecord, Store};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::broadcast;

/// The one owner of run revisions: a run's revision is its record's writes plus the sequence
/// of its last progress entry, read here (from the store, or from the attempt executing it)
/// and sent to the host's subscribers as [`RunUpdated`].
pub(super) struct Revisions {
    store: Arc<dyn Store>,
    updates: broadcast::Sender<RunUpdated>,
}

impl Revisions {
    /// Revisions of the runs in `store`, announced to no subscriber yet.
    pub(super) fn new(store: Arc<dyn Store>) -> Self {
        let (updates, _) = broadcast::channel(1024);
        Revisions { store, updates }
    }

    /// Every announced revision, from now on.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<RunUpdated> {
        self.updates.subscribe()
    }

    /// Where an attempt executing here announces its own revisions (its record's writes plus
    /// its last progress entry, see [`Revisions::live`]).
    pub(super) fn sender(&self) -> broadcast::Sender<RunUpdated> {
        self.updates.clone()
    }

    /// The revision of `run_id` whose record counts `writes`, as the store holds it.
    pub(super) async fn stored(&self, run_id: &str, writes: u64) -> Result<u64, Error> {
        Ok(writes + self.store.last_progress_seq(run_id).await?)
    }

    /// The revision of a run whose record counts `writes` while `shared`'s attempt executes it.
    pub(super) fn live(writes: u64, shared: &Capabilities) -> u64 {
        writes + shared.attempt.last_seq()
    }

    /// Tell subscribers `run_id` is at `revision`.
    pub(super) fn send(&self, run_id: String, revision: u64) {
        let _ = self.updates.send(RunUpdated { run_id, revision });
    }

    /// Tell subscribers `record`'s run is at its stored revision.
    pub(super) async fn announce(&self, record: &RunRecord) -> Result<(), Error> {
        let run_id = record.envelope.run_id.clone();
        let revision = self.stored(&run_id, record.writes).await?;
        self.send(run_id, revision);
        Ok(())
    }
}

impl Host {
    /// Tell subscribers an attempt has ended, once the run has left `active`: until then a
    /// read of the run still shows it running, so an update sent earlier could wake a
    /// follower to a read that does not show the end, and no later update would come.
    pub(super) async fn announce_end(&self, record: &RunRecord) {
        let run_id = record.envelope.run_id.clone();
        // A store that cannot say its last entry: announced with the record's writes alone.
        let revision = self.revisions.stored(&run_id, record.writes).await.unwrap_or(record.writes);
        self.revisions.send(run_id, revision);
    }

    /// Tell this host's subscribers (`wait`, followers, event streams) that run `run_id`,
    /// which another process sharing the store executes, changed: its revision read from the
    /// store is announced, once per revision (`last` holds what was announced per run, and
    /// forgets runs that ended). A run executing here announces itself.
    pub async fn announce_elsewhere(&self, run_id: &str, last: &mut HashMap<String, u64>) -> Result<(), Error> {
        if self.active().contains_key(run_id) {
            return Ok(());
        }
        let Some(record) = self.store.run(run_id).await? else { return Ok(()) };
        let revision = self.revisions.stored(run_id, record.writes).await?;
        if last.get(run_id) == Some(&revision) {
            return Ok(());
        }
        if record.envelope.status.is_terminal() {
            last.remove(run_id);
        } else {
            last.insert(run_id.to_string(), revision);
        }
        self.revisions.send(run_id.to_string(), revision);
        Ok(())
    }
}
