//! The embedded default store: one redb database file under a data directory.

use crate::error::StoreError;
use crate::registration::Registration;
use crate::store::{RegistrationStore, StoreFuture};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Registrations by id, each as JSON.
const REGISTRATIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("registrations");

/// The file name inside the data directory.
pub const DATABASE_FILE: &str = "registrations.redb";

/// Registrations in a redb database (ACID, one file, no set-up). Each change is one
/// committed write transaction; I/O runs on tokio's blocking threads.
#[derive(Clone)]
pub struct RedbStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

fn failed(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError(format!("{what} {}: {e}", path.display()))
}

impl RedbStore {
    /// Opens (or creates) the database `registrations.redb` in `data_dir`, creating
    /// the directory if needed.
    pub fn open(data_dir: &Path) -> Result<RedbStore, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| failed("cannot create the data directory", data_dir, e))?;
        let path = data_dir.join(DATABASE_FILE);
        let db = Database::create(&path).map_err(|e| {
            failed(
                "cannot open the registration database (is another `cobalt rd` using it?)",
                &path,
                e,
            )
        })?;
        let write = db
            .begin_write()
            .map_err(|e| failed("cannot write", &path, e))?;
        write
            .open_table(REGISTRATIONS)
            .map_err(|e| failed("cannot create the table in", &path, e))?;
        write
            .commit()
            .map_err(|e| failed("cannot commit to", &path, e))?;
        Ok(RedbStore {
            db: Arc::new(db),
            path,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Database, &Path) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<'_, T> {
        let (db, path) = (self.db.clone(), self.path.clone());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || op(&db, &path))
                .await
                .map_err(|e| StoreError(format!("a store task failed: {e}")))?
        })
    }
}

impl RegistrationStore for RedbStore {
    fn load(&self) -> StoreFuture<'_, Vec<Registration>> {
        self.blocking(|db, path| {
            let read = db
                .begin_read()
                .map_err(|e| failed("cannot read", path, e))?;
            let table = read
                .open_table(REGISTRATIONS)
                .map_err(|e| failed("cannot read", path, e))?;
            let mut all = Vec::new();
            for entry in table.iter().map_err(|e| failed("cannot read", path, e))? {
                let (id, bytes) = entry.map_err(|e| failed("cannot read", path, e))?;
                match serde_json::from_slice::<Registration>(bytes.value()) {
                    Ok(r) => all.push(r),
                    Err(e) => tracing::warn!(
                        id = id.value(),
                        "skipping an unreadable registration in {}: {e}",
                        path.display()
                    ),
                }
            }
            Ok(all)
        })
    }

    fn put(&self, registration: Registration) -> StoreFuture<'_, ()> {
        self.blocking(move |db, path| {
            let bytes = serde_json::to_vec(&registration)
                .map_err(|e| failed("cannot encode for", path, e))?;
            let write = db
                .begin_write()
                .map_err(|e| failed("cannot write", path, e))?;
            {
                let mut table = write
                    .open_table(REGISTRATIONS)
                    .map_err(|e| failed("cannot write", path, e))?;
                table
                    .insert(registration.id, bytes.as_slice())
                    .map_err(|e| failed("cannot write", path, e))?;
            }
            write
                .commit()
                .map_err(|e| failed("cannot commit to", path, e))
        })
    }

    fn remove(&self, ids: Vec<u64>) -> StoreFuture<'_, ()> {
        self.blocking(move |db, path| {
            let write = db
                .begin_write()
                .map_err(|e| failed("cannot write", path, e))?;
            {
                let mut table = write
                    .open_table(REGISTRATIONS)
                    .map_err(|e| failed("cannot write", path, e))?;
                for id in ids {
                    table
                        .remove(id)
                        .map_err(|e| failed("cannot write", path, e))?;
                }
            }
            write
                .commit()
                .map_err(|e| failed("cannot commit to", path, e))
        })
    }
}
