//! One `sweep` at a time writes a study, and one trainer at a time a run: an
//! advisory lock on `results/<study>/.lock` and on `<run>/.train.lock` (flock,
//! which the kernel drops with the process that holds it, so a crash leaves
//! no stale lock). The holder writes who it is into the file, so that a
//! second `sweep` can say what it waits for.

use anyhow::{bail, Context, Result};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

/// The lock file inside a study directory.
pub const LOCK_FILE: &str = ".lock";

/// The lock file inside a run directory: its trainer's (rank 0's).
pub const TRAIN_LOCK_FILE: &str = ".train.lock";

/// A held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct DirLock {
    file: Option<std::fs::File>,
}

/// What acquiring did besides taking the lock.
#[derive(Debug, PartialEq, Eq)]
pub enum Acquired {
    /// It was free.
    At,
    /// Another process held it; it was waited for.
    AfterWaiting,
    /// The file system refuses locks (some network file systems): none is held.
    Unsupported,
}

impl DirLock {
    /// Takes the lock of `study_dir` (created if missing) for `what` (the
    /// command, for the message a second `sweep` prints). When another
    /// process holds it, `waiting` is called once with who that is, and
    /// this waits until it is released.
    pub fn study(
        study_dir: &Path,
        what: &str,
        waiting: impl FnOnce(&str),
    ) -> Result<(DirLock, Acquired)> {
        DirLock::take(&study_dir.join(LOCK_FILE), what, waiting, None)
    }

    /// Takes the lock of a run directory for its trainer (two trainers would
    /// write one log and checkpoints): a holder is waited for up to
    /// `patience`, then named in the error.
    pub fn run(
        run_dir: &Path,
        what: &str,
        waiting: impl FnOnce(&str),
        patience: std::time::Duration,
    ) -> Result<(DirLock, Acquired)> {
        DirLock::take(
            &run_dir.join(TRAIN_LOCK_FILE),
            what,
            waiting,
            Some(patience),
        )
    }

    fn take(
        path: &Path,
        what: &str,
        waiting: impl FnOnce(&str),
        patience: Option<std::time::Duration>,
    ) -> Result<(DirLock, Acquired)> {
        use std::os::unix::fs::OpenOptionsExt;
        crate::util::fs::make_dir(crate::util::fs::parent_dir(path))?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            // Never through a link, never blocking on a FIFO.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("opening the lock {}", path.display()))?;
        if !file.metadata()?.file_type().is_file() {
            bail!(
                "{} is not a regular file: remove it so that sweep can lock its directory",
                path.display()
            );
        }
        let fd = file.as_raw_fd();
        let mut how = Acquired::At;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {
                    waiting(&holder_of(&file));
                    wait_for(fd, patience).map_err(|e| match e {
                        None => anyhow::anyhow!(
                            "{} is still held after {} s, by {}",
                            path.display(),
                            patience.unwrap_or_default().as_secs(),
                            holder_of(&file)
                        ),
                        Some(err) => {
                            anyhow::anyhow!("waiting for the lock on {}: {err}", path.display())
                        }
                    })?;
                    how = Acquired::AfterWaiting;
                }
                Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS) => {
                    return Ok((DirLock { file: None }, Acquired::Unsupported));
                }
                _ => bail!("locking {}: {err}", path.display()),
            }
        }
        let host = crate::util::process::host_name();
        let who = format!(
            "process {} on {host} ({what}) since {}\n",
            std::process::id(),
            crate::util::now_rfc3339()
        );
        // Written in place (a new file renamed over this one would be another
        // lock), then cut to length, so that the file is never empty between
        // two holders.
        let written = file
            .rewind()
            .and_then(|()| file.write_all(who.as_bytes()))
            .and_then(|()| file.set_len(who.len() as u64));
        written.with_context(|| format!("writing who holds the lock {}", path.display()))?;
        Ok((DirLock { file: Some(file) }, how))
    }

    /// Whether a lock is held (not on a file system that refuses them).
    pub fn held(&self) -> bool {
        self.file.is_some()
    }
}

/// Waits until the lock on `fd` is taken: for ever, or for `patience` (then
/// `Err(None)`); `Err(Some(_))` where locking itself fails.
fn wait_for(fd: i32, patience: Option<std::time::Duration>) -> Result<(), Option<std::io::Error>> {
    let Some(patience) = patience else {
        // SAFETY: flock on a descriptor the caller owns; blocks until the
        // holder releases it or exits.
        return match unsafe { libc::flock(fd, libc::LOCK_EX) } {
            0 => Ok(()),
            _ => Err(Some(std::io::Error::last_os_error())),
        };
    };
    let until = std::time::Instant::now() + patience;
    loop {
        // SAFETY: as above, without blocking.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Some(err));
        }
        if std::time::Instant::now() >= until {
            return Err(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Who holds the lock, as its holder wrote it. A holder that has just taken
/// the lock writes a moment later (a new lock file is empty until then), so an
/// empty file is read again for up to half a second.
fn holder_of(mut file: &std::fs::File) -> String {
    let mut holder = String::new();
    for _ in 0..25 {
        holder.clear();
        if file.rewind().is_ok() {
            let _ = file.take(4096).read_to_string(&mut holder);
        }
        if !holder.trim().is_empty() {
            return holder.trim().to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    "another sweep".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits_and_is_told_who_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let study = dir.path().join("s");
        let (first, how) = DirLock::study(&study, "sweep run a.toml", |_| panic!()).unwrap();
        assert_eq!(how, Acquired::At);
        assert!(first.held());
        let (tx, rx) = std::sync::mpsc::channel();
        let s2 = study.clone();
        let second = std::thread::spawn(move || {
            // flock locks belong to open files: another open of the file in
            // this process contends like another process would.
            let (lock, how) =
                DirLock::study(&s2, "sweep submit", |who| tx.send(who.to_string()).unwrap())
                    .unwrap();
            (lock.held(), how)
        });
        let who = rx.recv().unwrap();
        assert!(
            who.contains(&format!("process {}", std::process::id()))
                && who.contains("sweep run a.toml"),
            "{who}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !second.is_finished(),
            "it waits while the first holds the lock"
        );
        drop(first);
        assert_eq!(second.join().unwrap(), (true, Acquired::AfterWaiting));
    }

    #[test]
    fn a_holder_that_has_not_yet_written_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        // Locked, still empty: the moment between a holder's flock and its write.
        let held = std::fs::File::create(&path).unwrap();
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::fs::write(&path, "process 1 on h (sweep run)\n").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(held);
        });
        let mut said = String::new();
        let (lock, how) = DirLock::study(dir.path(), "x", |who| said = who.to_string()).unwrap();
        writer.join().unwrap();
        assert_eq!(said, "process 1 on h (sweep run)");
        assert!(lock.held() && how == Acquired::AfterWaiting);
    }

    #[test]
    fn a_run_lock_held_past_its_patience_is_an_error_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let patience = std::time::Duration::from_millis(300);
        let (first, _) = DirLock::run(dir.path(), "sweep train, job 7", |_| (), patience).unwrap();
        let e = DirLock::run(dir.path(), "sweep train, job 8", |_| (), patience).unwrap_err();
        let holder = format!("by process {} on ", std::process::id());
        assert!(
            e.to_string().contains("is still held after 0 s")
                && e.to_string().contains(&holder)
                && e.to_string().contains("(sweep train, job 7)"),
            "{e}"
        );
        drop(first);
        let (again, how) =
            DirLock::run(dir.path(), "sweep train, job 8", |_| (), patience).unwrap();
        assert!(again.held() && how == Acquired::At);
    }

    #[test]
    fn a_special_file_in_the_locks_place_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        crate::util::fs::tests::mkfifo(&dir.path().join(LOCK_FILE));
        let e = DirLock::study(dir.path(), "x", |_| ()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
