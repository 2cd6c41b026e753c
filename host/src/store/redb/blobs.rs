//! Collecting a redb store's blobs ([`RedbStore::delete_unreferenced`]: one write
//! transaction that reads every reference and deletes the candidates none names, serialized
//! with the writer's commits by redb's one write transaction at a time) and the check after a
//! durable record that keeps a blob a start just put ([`RedbStore::keep_pinned`]; see
//! [`store::blobs`](crate::store::blobs) for the race it closes).

use super::tables::{BLOBS, FACTORIES, RUNS, RUN_MODULES};
use super::RedbStore;
use crate::store::codec;
use crate::store::op::Op;
use crate::store::{corrupt, StoreError};
use redb::ReadableTable;
use std::sync::Arc;

impl RedbStore {
    /// After a durable record referring to them: store again the pinned blobs `due` that a
    /// collection deleted meanwhile (see [`blobs`](crate::store::blobs)), then unpin them.
    pub(super) async fn keep_pinned(&self, due: Vec<(String, Arc<[u8]>)>) -> Result<(), StoreError> {
        if due.is_empty() {
            return Ok(());
        }
        let mut missing = false;
        for (hash, bytes) in &due {
            if !self.blob_exists(hash)? {
                self.writer.send(Op::Blob { hash: hash.clone(), bytes: bytes.clone() })?;
                self.known_blobs.lock().unwrap_or_else(|p| p.into_inner()).insert(hash.clone());
                missing = true;
            }
        }
        if missing {
            self.writer.flush().await?;
        }
        self.pins.release(&due);
        Ok(())
    }

    /// Delete those of `candidates` nothing refers to, in one write transaction (which reads
    /// every reference: runs, registrations, module records, the manifests scripts name).
    pub(super) async fn delete_unreferenced(&self, candidates: &[String]) -> Result<usize, StoreError> {
        if candidates.is_empty() {
            return Ok(0);
        }
        self.writer.flush().await?;
        let txn = self.db.get().begin_write()?;
        let dead = {
            let mut blobs = txn.open_table(BLOBS)?;
            let mut stored = Vec::new();
            for hash in candidates {
                if blobs.get(hash.as_str())?.is_some() {
                    stored.push(hash.clone());
                }
            }
            if stored.is_empty() {
                return Ok(0);
            }
            // Read until every candidate is found referred to (the common case: a component
            // other runs share), else to the end.
            let mut refs = crate::store::blobs::Referenced::default();
            for row in txn.open_table(RUNS)?.iter()? {
                if refs.covers(&stored) {
                    break;
                }
                refs.run(row?.1.value())?;
            }
            for row in txn.open_table(FACTORIES)?.iter()? {
                if refs.covers(&stored) {
                    break;
                }
                refs.registration(row?.1.value())?;
            }
            for row in txn.open_table(RUN_MODULES)?.iter()? {
                if refs.covers(&stored) {
                    break;
                }
                refs.manifest(row?.1.value())?;
            }
            for manifest in refs.manifests() {
                if let Some(bytes) = blobs.get(manifest.as_str())? {
                    let bytes = codec::decode_blob(bytes.value().to_vec())
                        .map_err(|e| corrupt(&format!("blob {manifest}"), e))?;
                    refs.manifest(&bytes)?;
                }
            }
            let dead = refs.unreferenced(&stored);
            for hash in &dead {
                blobs.remove(hash.as_str())?;
            }
            dead
        };
        txn.commit()?;
        let mut known = self.known_blobs.lock().unwrap_or_else(|p| p.into_inner());
        for hash in &dead {
            known.remove(hash);
        }
        Ok(dead.len())
    }
}
