//! Storage faults for the store's tests: a redb [`StorageBackend`] over a real file that,
//! once armed, fails its writes, fails its fsyncs, or reports a full disk once a number of
//! bytes more were written. It is the boundary under the store, not the thing under test.

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every write fails (EIO).
    Write,
    /// Every fsync fails (EIO): data may be written, never made durable.
    Sync,
    /// Writes fail with ENOSPC once this many more bytes were written.
    DiskFullAfter(u64),
}

/// The switches a test flips; shared with the backend.
#[derive(Debug)]
pub struct Faults {
    fail_writes: AtomicBool,
    fail_syncs: AtomicBool,
    /// Bytes still writable before the disk is "full" (`u64::MAX`: no limit).
    disk_left: AtomicU64,
    /// Operations that failed because of an injected fault.
    pub injected: AtomicU64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            fail_writes: AtomicBool::new(false),
            fail_syncs: AtomicBool::new(false),
            disk_left: AtomicU64::new(u64::MAX),
            injected: AtomicU64::new(0),
        }
    }
}

impl Faults {
    /// Inject `fault` from now on.
    pub fn arm(&self, fault: Fault) {
        match fault {
            Fault::Write => self.fail_writes.store(true, Ordering::SeqCst),
            Fault::Sync => self.fail_syncs.store(true, Ordering::SeqCst),
            Fault::DiskFullAfter(bytes) => self.disk_left.store(bytes, Ordering::SeqCst),
        }
    }

    /// How many operations failed by injection so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn fail(&self, kind: io::ErrorKind, what: &str) -> io::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        io::Error::new(kind, format!("injected {what}"))
    }
}

/// The file backend with [`Faults`] in front of it.
#[derive(Debug)]
pub struct Faulty {
    inner: FileBackend,
    faults: Arc<Faults>,
}

impl Faulty {
    /// Open (or create) `path` as a store file behind `faults`.
    pub fn open(path: &Path, faults: Arc<Faults>) -> Faulty {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("open the store file");
        Faulty { inner: FileBackend::new(file).expect("a file backend"), faults }
    }
}

impl StorageBackend for Faulty {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if self.faults.fail_syncs.load(Ordering::SeqCst) {
            return Err(self.faults.fail(io::ErrorKind::Other, "fsync failure"));
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if self.faults.fail_writes.load(Ordering::SeqCst) {
            return Err(self.faults.fail(io::ErrorKind::Other, "write failure"));
        }
        let len = data.len() as u64;
        let fits = self.faults.disk_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            if left == u64::MAX {
                Some(left)
            } else {
                left.checked_sub(len)
            }
        });
        if fits.is_err() {
            return Err(self.faults.fail(io::ErrorKind::StorageFull, "full disk (no space left on device)"));
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
