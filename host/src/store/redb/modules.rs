//! The modules a script run loaded, in the redb store: one [`Manifest`] per run (JSON under
//! the run's id in [`RUN_MODULES`]), rewritten as the run loads more, so a resume — even
//! after a crash mid-attempt — serves every module an attempt already ran as it was then
//! (`resume --component` runs other code: its attempt starts a new record). The modules'
//! texts are content-addressed blobs (the [`BLOBS`](super::tables::BLOBS) table components
//! and script sources use).

use super::tables::RUN_MODULES;
use super::RedbStore;
use crate::model::script::Manifest;
use crate::store::op::Op;
use crate::store::{corrupt, StoreError};
use redb::ReadableDatabase;

impl RedbStore {
    /// Queue `manifest` as run `run_id`'s record of loaded modules (replacing the last).
    pub(super) fn queue_run_modules(&self, run_id: &str, manifest: &Manifest) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(manifest)?;
        self.writer.send(Op::RunModules { run: run_id.to_string(), manifest: bytes })
    }

    /// The modules run `run_id` recorded (`None`: it loaded none, or ran before modules).
    pub(super) fn read_run_modules(&self, run_id: &str) -> Result<Option<Manifest>, StoreError> {
        let txn = self.db.get().begin_read()?;
        let table = txn.open_table(RUN_MODULES)?;
        let Some(bytes) = table.get(run_id)? else { return Ok(None) };
        serde_json::from_slice(bytes.value()).map(Some).map_err(|e| corrupt("a run's module record", e))
    }
}
