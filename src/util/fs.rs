//! Writes that never leave a half-written file, and reads of files anyone may have put in a
//! results directory that never block, never exhaust memory, never follow a link out.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temporary renamed into place: never a torn file. No
/// fsync (every writer here can run again after a crash).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    refuse_special(path)?;
    let mut tmp = temp_beside(path, ".tmp-")?;
    tmp.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    persist(tmp.into_temp_path(), path)
}

/// Every temporary not yet renamed into place: what a stop signal removes.
static TEMPORARIES: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

fn temporaries() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes every temporary and bars new ones (the process is about to exit); returns how many.
/// `freeze` runs with the list held, before any removal.
pub fn remove_temporaries(freeze: impl FnOnce()) -> usize {
    let list = temporaries();
    freeze();
    let mut removed = 0;
    for p in list.iter() {
        let gone = match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p).is_ok(),
            Ok(_) => std::fs::remove_file(p).is_ok(),
            Err(_) => false,
        };
        removed += gone as usize;
    }
    // Held until exit: nothing is renamed into place after the temporaries went.
    std::mem::forget(list);
    removed
}

/// A temporary folder inside `dir`, removed when dropped or by a stop signal.
pub fn scratch_dir_in(dir: &Path) -> Result<tempfile::TempDir> {
    // Made under the list's lock: a stop signal in between would leave it behind.
    let mut list = temporaries();
    let tmp = tempfile::Builder::new()
        .prefix(".sweep-scratch-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a temporary folder in {}", dir.display()))?;
    list.push(tmp.path().to_path_buf());
    Ok(tmp)
}

/// A directory, device, FIFO or socket where sweep would write a file.
#[derive(Debug)]
pub struct NotRegular {
    pub path: PathBuf,
    pub what: &'static str,
}

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the output {} is {}: sweep writes outputs only to regular files or new paths",
            self.path.display(),
            self.what
        )
    }
}

impl std::error::Error for NotRegular {}

/// A directory, device, FIFO or socket at `path` is never replaced by a rename (a link is).
fn refuse_special(path: &Path) -> Result<(), NotRegular> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() && !m.file_type().is_symlink() => Err(NotRegular {
            path: path.to_path_buf(),
            what: kind_of(m.file_type()),
        }),
        _ => Ok(()),
    }
}

/// Renames a finished temporary onto `target`, unless a special file is there.
pub fn persist(tmp: tempfile::TempPath, target: &Path) -> Result<()> {
    refuse_special(target)?;
    // Renamed under the list's lock: never half-way for a stop signal.
    let mut list = temporaries();
    let path = tmp.to_path_buf();
    tmp.persist(target)
        .with_context(|| format!("renaming into {}", target.display()))?;
    if let Some(i) = list.iter().rposition(|p| *p == path) {
        list.swap_remove(i);
    }
    Ok(())
}

/// A temporary beside `target`, readable by others once renamed.
pub fn temp_beside(target: &Path, prefix: &str) -> Result<tempfile::NamedTempFile> {
    temp_beside_as(target, prefix, "")
}

/// [`temp_beside`], its name ending in `suffix` (for writers that pick the format by it).
pub fn temp_beside_as(
    target: &Path,
    prefix: &str,
    suffix: &str,
) -> Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent_dir(target);
    // Made under the list's lock, as in [`scratch_dir_in`].
    let mut list = temporaries();
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    list.push(tmp.path().to_path_buf());
    Ok(tmp)
}

/// A temporary beside `target` for a long write, flocked while the lock is open (so
/// [`remove_stale_temps`] tells a dead writer's); keep it until the rename.
pub fn locked_temp_beside(
    target: &Path,
    prefix: &str,
) -> Result<(std::fs::File, tempfile::TempPath, std::fs::File)> {
    use std::os::fd::AsRawFd;
    let (file, path) = temp_beside(target, prefix)?.into_parts();
    let lock = file.try_clone()?;
    // SAFETY: flock on a descriptor this function owns, of a file it just created.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        anyhow::bail!(
            "locking {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok((file, path, lock))
}

/// Removes the temporaries `prefix*` in `dir` whose lock is free (their maker was killed).
pub fn remove_stale_temps(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut removed = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix)
            || !entry.file_type().is_ok_and(|t| t.is_file())
        {
            continue;
        }
        let path = entry.path();
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        else {
            continue;
        };
        // SAFETY: flock on a descriptor owned here, released when `f` closes.
        let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if free && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// [`write_atomic`], leaving a file already holding these bytes alone; whether it wrote.
pub fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool> {
    match std::fs::read(path) {
        Ok(old) if old == bytes => Ok(false),
        _ => write_atomic(path, bytes).map(|()| true),
    }
}

/// The directory a file lives in (`.` for a bare file name).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Makes a path absolute against `base` without touching the file system.
pub fn absolute(base: &Path, path: &Path) -> std::path::PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    }
}

/// Why a file could not be read by [`read_regular`].
#[derive(Debug)]
pub enum ReadError {
    NotFound,
    /// A directory, FIFO, socket or device: `what` says which.
    NotRegular {
        what: &'static str,
    },
    TooLarge {
        size: u64,
        limit: u64,
    },
    /// A link (or a path through one) that resolves outside the file's directory.
    Outside {
        target: PathBuf,
        dir: PathBuf,
    },
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::NotFound => write!(f, "does not exist"),
            ReadError::NotRegular { what } => write!(f, "is {what}, not a regular file"),
            ReadError::TooLarge { size, limit } => write!(
                f,
                "is {:.1} MB, more than the {:.0} MB a file read here may have",
                *size as f64 / 1e6,
                *limit as f64 / 1e6
            ),
            ReadError::Outside { target, dir } => write!(
                f,
                "is a link to {}, outside {}",
                target.display(),
                dir.display()
            ),
            ReadError::Io(e) => write!(f, "cannot be read: {e}"),
        }
    }
}

impl std::error::Error for ReadError {}

pub(crate) fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_file() {
        "a file"
    } else {
        "not a regular file"
    }
}

fn io(e: std::io::Error) -> ReadError {
    match e.kind() {
        std::io::ErrorKind::NotFound => ReadError::NotFound,
        _ => ReadError::Io(e),
    }
}

/// Opens a file without blocking (a FIFO with no writer would block `open`), with `extra`
/// flags, then checks it is a regular file (what was checked is what is read).
pub fn open_regular(
    path: &Path,
    extra: i32,
) -> Result<(std::fs::File, std::fs::Metadata), ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | extra)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular {
            what: kind_of(meta.file_type()),
        });
    }
    Ok((file, meta))
}

/// Whether `dir` (or the folder it would be made in) may be written: else that folder and why.
pub fn writable(dir: &Path) -> std::result::Result<(), (PathBuf, std::io::Error)> {
    use std::os::unix::ffi::OsStrExt;
    let Some(existing) = dir.ancestors().find(|d| d.exists()) else {
        return Ok(());
    };
    let Ok(c) = std::ffi::CString::new(existing.as_os_str().as_bytes()) else {
        return Ok(());
    };
    // SAFETY: access(2) on a NUL-terminated path; it reads nothing else.
    match unsafe { libc::access(c.as_ptr(), libc::W_OK) } {
        0 => Ok(()),
        _ => Err((existing.to_path_buf(), std::io::Error::last_os_error())),
    }
}

/// Makes a directory and its parents; where something else stands in the way, says what.
pub fn make_dir(dir: &Path) -> Result<()> {
    let Err(e) = std::fs::create_dir_all(dir) else {
        return Ok(());
    };
    let blocker = dir
        .ancestors()
        .find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m)))
        .filter(|(_, m)| !m.is_dir());
    match blocker {
        Some((at, m)) if at == dir => {
            anyhow::bail!(
                "{} is {}, not a directory",
                dir.display(),
                kind_of(m.file_type())
            )
        }
        Some((at, m)) => anyhow::bail!(
            "cannot make the directory {}: {} is {}, not a directory",
            dir.display(),
            at.display(),
            kind_of(m.file_type())
        ),
        None => Err(e).with_context(|| format!("creating {}", dir.display())),
    }
}

/// The bytes of a regular file of at most `limit` bytes, opened as [`open_regular`]; with
/// `within`, its resolved path must lie inside that directory.
pub fn read_regular(path: &Path, limit: u64, within: Option<&Path>) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    if let Some(dir) = within {
        let target = path.canonicalize().map_err(io)?;
        let dir = dir.canonicalize().map_err(io)?;
        if !target.starts_with(&dir) {
            return Err(ReadError::Outside { target, dir });
        }
    }
    let (file, meta) = open_regular(path, 0)?;
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    // The file may grow while it is read: never more than the limit.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// A file a user names, read whole: a regular file of at most `limit` bytes, the error naming it.
pub fn read_input(what: &str, path: &Path, limit: u64) -> Result<Vec<u8>> {
    read_regular(path, limit, None).map_err(|e| anyhow::anyhow!("{what} {} {e}", path.display()))
}

/// A file a user names, opened as [`read_input`] reads one.
pub fn open_input(what: &str, path: &Path) -> Result<std::fs::File> {
    open_regular(path, 0)
        .map(|(file, _)| file)
        .map_err(|e| anyhow::anyhow!("{what} {} {e}", path.display()))
}

/// The last `bytes` bytes of a regular file, never through a link (it goes on a page).
pub fn read_tail(path: &Path, bytes: u64) -> Result<Vec<u8>, ReadError> {
    use std::io::{Read, Seek, SeekFrom};
    let (mut file, meta) = open_regular(path, libc::O_NOFOLLOW)?;
    file.seek(SeekFrom::Start(meta.len().saturating_sub(bytes)))
        .map_err(io)?;
    let mut out = Vec::new();
    file.take(bytes).read_to_end(&mut out).map_err(io)?;
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn only_regular_files_within_their_directory_and_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let study = dir.path().join("study");
        std::fs::create_dir(&study).unwrap();
        let f = study.join("a.log");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_regular(&f, 10, Some(&study)).unwrap(), b"0123456789");
        assert!(matches!(
            read_regular(&f, 9, None),
            Err(ReadError::TooLarge { size: 10, limit: 9 })
        ));
        assert!(matches!(
            read_regular(&study.join("none"), 9, Some(&study)),
            Err(ReadError::NotFound)
        ));
        // A FIFO without a writer: refused at once, not waited on.
        let fifo = study.join("fifo");
        mkfifo(&fifo);
        let e = read_regular(&fifo, 10, Some(&study)).unwrap_err();
        assert!(e.to_string().contains("a FIFO"), "{e}");
        assert!(read_regular(Path::new("/dev/zero"), 10, None)
            .unwrap_err()
            .to_string()
            .contains("a device"));
        assert!(matches!(
            read_regular(&study, 10, None),
            Err(ReadError::NotRegular {
                what: "a directory"
            })
        ));
        // Links: inside the directory fine, outside refused.
        let outside = dir.path().join("secret");
        std::fs::write(&outside, b"x").unwrap();
        std::os::unix::fs::symlink(&outside, study.join("out")).unwrap();
        std::os::unix::fs::symlink(&f, study.join("in")).unwrap();
        assert!(read_regular(&study.join("in"), 10, Some(&study)).is_ok());
        let e = read_regular(&study.join("out"), 10, Some(&study)).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
        assert!(read_regular(&study.join("out"), 10, None).is_ok());
    }

    #[test]
    fn a_tail_is_read_from_regular_files_only_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("job.out");
        std::fs::write(&f, b"first\nsecond\nthird\n").unwrap();
        assert_eq!(read_tail(&f, 6).unwrap(), b"third\n");
        assert_eq!(read_tail(&f, 1000).unwrap().len(), 19);
        let fifo = dir.path().join("fifo.out");
        mkfifo(&fifo);
        assert!(matches!(
            read_tail(&fifo, 10),
            Err(ReadError::NotRegular { .. })
        ));
        let link = dir.path().join("link.out");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(read_tail(&link, 10).is_err(), "a link is not followed");
        assert!(matches!(
            read_tail(&dir.path().join("none"), 10),
            Err(ReadError::NotFound)
        ));
    }

    #[test]
    fn a_directory_that_cannot_be_made_names_what_is_in_its_way() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("notes");
        std::fs::write(&file, b"x").unwrap();
        let e = make_dir(&file.join("sub/deeper")).unwrap_err().to_string();
        assert!(
            e.ends_with(&format!("{} is a file, not a directory", file.display())),
            "{e}"
        );
        let e = make_dir(Path::new("/dev/null")).unwrap_err().to_string();
        assert_eq!(e, "/dev/null is a device, not a directory");
        make_dir(&dir.path().join("a/b")).unwrap();
        make_dir(&dir.path().join("a/b")).unwrap();
    }

    #[test]
    fn only_temporaries_nobody_writes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.parquet");
        let (_file, live, lock) = locked_temp_beside(&target, ".w-").unwrap();
        let (file, dead) = temp_beside(&target, ".w-").unwrap().into_parts();
        drop(file);
        let dead = dead.keep().unwrap();
        std::fs::write(dir.path().join(".other"), b"x").unwrap();
        assert_eq!(remove_stale_temps(dir.path(), ".w-"), vec![dead]);
        assert!(live.exists(), "a file being written is kept");
        drop(lock);
        drop(_file);
        assert_eq!(
            remove_stale_temps(dir.path(), ".w-"),
            vec![live.to_path_buf()]
        );
        assert!(dir.path().join(".other").exists());
    }

    #[test]
    fn atomic_write_replaces_and_skips_identical_content() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        let p = dir.path().join("a/b.txt");
        write_atomic(&p, b"one").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"one");
        assert!(!write_if_changed(&p, b"one").unwrap());
        assert!(write_if_changed(&p, b"two").unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // No temporary files are left behind.
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("b.txt")]);
    }
}
