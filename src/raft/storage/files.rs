//! Files made durable whole: a directory's entries `fsync`ed, and a small file created whole or
//! not at all. The WAL, the two-copy records, the `format` file and backups use these, so that
//! every file the storage creates is created the same way.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::write_faults::{attempt, Operation};

/// `fsync`s the directory `dir`, so that the files created, renamed or removed in it stay so;
/// the error names it.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    attempt(dir, Operation::Sync, || File::open(dir)?.sync_all())
}

/// Creates the file `name` in `dir` whole or not at all: `write` fills it under a temporary
/// name (`name.tmp`), which is synced and renamed into place, and the directory is synced, so
/// that a crash leaves the old file (or none) or the new one, never a part. The file is
/// created mode 0600, and neither name is followed if it is a symbolic link (the rename
/// replaces a link at `name`, it does not write through it). Returns the new file, open for
/// reading and writing.
pub fn create_durably(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let temporary = dir.join(format!("{name}.tmp"));
    let file = attempt(&temporary, Operation::Write, || {
        // A temporary file left by a crash, or a link planted in its place, is removed, never
        // followed; the new one is private (a backup holds the job's state).
        match std::fs::remove_file(&temporary) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)?;
        write(&file)?;
        Ok(file)
    })?;
    attempt(&temporary, Operation::Sync, || file.sync_all())?;
    attempt(&temporary, Operation::Write, || {
        std::fs::rename(&temporary, dir.join(name))
    })?;
    sync_dir(dir)?;
    Ok(file)
}

/// Rot in any file, for the tests and tools that inject it.
pub mod faults {
    use std::fs::OpenOptions;
    use std::io;
    use std::os::unix::fs::FileExt;
    use std::path::Path;

    /// Inverts the byte at `offset` of the file at `path`, as a rotting disk would.
    pub fn invert_byte(path: &Path, offset: u64) -> io::Result<()> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, offset)?;
        file.write_all_at(&[!byte[0]], offset)
    }
}
