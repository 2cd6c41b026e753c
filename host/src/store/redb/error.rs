//! How redb's failures become [`StoreError`]s: a database another process holds is
//! [`StoreError::Locked`], a damaged file [`StoreError::Corrupt`], anything else of redb's
//! [`StoreError::Database`] with redb's error as its cause.

use crate::store::StoreError;
use std::path::PathBuf;
use std::sync::Arc;

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Database(Arc::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::CursorError
);

impl From<redb::DatabaseError> for StoreError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked(PathBuf::new()),
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(m)) => StoreError::Corrupt(m.into()),
            other => StoreError::Database(Arc::new(other.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::journal::JournalError;
    use std::error::Error as _;

    #[test]
    fn errors_keep_their_causes() {
        // A journal failure carries the store error itself, which carries redb's.
        let redb_error = redb::Error::from(redb::StorageError::Io(std::io::Error::other("disk gone")));
        let store_error = StoreError::from(redb_error);
        let journal = JournalError::new(StoreError::WriteFailed(Arc::new(store_error)));
        let cause = journal.source().expect("the journal error has a cause");
        let store = cause.downcast_ref::<StoreError>().expect("the cause is a StoreError");
        assert!(matches!(store, StoreError::WriteFailed(_)));
        let first = store.source().and_then(|e| e.downcast_ref::<StoreError>()).expect("the first failure is kept");
        assert!(matches!(first, StoreError::Database(_)));
        assert!(first.source().is_some_and(|e| e.to_string().contains("disk gone")), "{first}");
    }
}
