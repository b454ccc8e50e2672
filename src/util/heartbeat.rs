//! Each rank's progress, for its run's watchdog (`sweep watchdog`): the
//! file `progress/rank-<r>` in the run directory holds one line, `<step>
//! <unix ms> <host> <pid>`, rewritten in place as the rank starts (step 0)
//! and after every step. Written only under a watchdog (which sets
//! [`ENV`]); read by it to tell which rank stopped first, and where.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Set by the watchdog for the processes it starts: its own token, which
/// every process of the run inherits (also on other nodes, through `srun`),
/// so that it finds them again.
pub const ENV: &str = "SWEEP_WATCHDOG";

/// A line's fixed width: each write replaces the whole line at once.
const WIDTH: usize = 128;

/// A rank's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    pub rank: usize,
    /// The last step it finished; 0 when it has only started.
    pub step: u64,
    pub at_ms: u64,
    pub host: String,
    pub pid: u32,
}

pub fn dir(run_dir: &Path) -> PathBuf {
    run_dir.join(crate::layout::PROGRESS_DIR)
}

fn path(run_dir: &Path, rank: usize) -> PathBuf {
    dir(run_dir).join(format!("rank-{rank}"))
}

/// Where a rank writes its threads' stacks when the watchdog asks.
pub fn stacks_path(run_dir: &Path, rank: usize) -> PathBuf {
    dir(run_dir).join(format!("rank-{rank}.stacks"))
}

/// A rank's writer, when a watchdog watches the run.
pub struct Heartbeat {
    file: File,
    host: String,
}

impl Heartbeat {
    /// `None` without a watchdog, or where the file cannot be made (a
    /// heartbeat never stops a run: the watchdog then sees no progress from
    /// this rank and says so).
    pub fn open(run_dir: &Path, rank: usize) -> Option<Heartbeat> {
        std::env::var_os(ENV)?;
        Heartbeat::create(run_dir, rank)
    }

    fn create(run_dir: &Path, rank: usize) -> Option<Heartbeat> {
        std::fs::create_dir_all(dir(run_dir)).ok()?;
        let file = File::create(path(run_dir, rank)).ok()?;
        let mut h = Heartbeat {
            file,
            host: crate::util::process::host_name(),
        };
        h.beat(0);
        Some(h)
    }

    pub fn beat(&mut self, step: u64) {
        let line = format!(
            "{step} {} {} {}",
            now_ms(),
            self.host.replace(char::is_whitespace, "_"),
            std::process::id()
        );
        let mut buf = [b' '; WIDTH];
        let n = line.len().min(WIDTH - 1);
        buf[..n].copy_from_slice(&line.as_bytes()[..n]);
        buf[WIDTH - 1] = b'\n';
        // A failed write is a missed beat, not a failed run.
        let _ = self.file.write_all_at(&buf, 0);
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Every rank's last report, by rank (a file that does not parse, being
/// written or not a rank's, is left out).
pub fn read_all(run_dir: &Path) -> Vec<Beat> {
    let Ok(entries) = std::fs::read_dir(dir(run_dir)) else {
        return Vec::new();
    };
    let mut beats: Vec<Beat> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rank = name.strip_prefix("rank-")?.parse().ok()?;
            let mut buf = [0u8; WIDTH];
            // A FIFO or device put there is never opened to block or read.
            let (file, _) = crate::util::fs::open_regular(&e.path(), libc::O_NOFOLLOW).ok()?;
            let n = file.read_at(&mut buf, 0).ok()?;
            parse(rank, std::str::from_utf8(&buf[..n]).ok()?)
        })
        .collect();
    beats.sort_by_key(|b| b.rank);
    beats
}

fn parse(rank: usize, line: &str) -> Option<Beat> {
    let mut f = line.split_whitespace();
    Some(Beat {
        rank,
        step: f.next()?.parse().ok()?,
        at_ms: f.next()?.parse().ok()?,
        host: f.next()?.to_string(),
        pid: f.next()?.parse().ok()?,
    })
}

/// Removes an earlier job's reports before the run starts again: the
/// files a rank writes (`rank-<r>`, `rank-<r>.stacks`), then the folder
/// if that left it empty. Nothing else in it is touched.
pub fn clear(run_dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir(run_dir)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let rank = name.to_str().and_then(|n| n.strip_prefix("rank-"));
        let ours = rank.is_some_and(|r| r.trim_end_matches(".stacks").parse::<usize>().is_ok());
        if ours && e.file_type()?.is_file() {
            std::fs::remove_file(e.path())?;
        }
    }
    match std::fs::remove_dir(dir(run_dir)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        // What is left there is not ours to remove.
        Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_beat_replaces_the_last_and_reads_back_by_rank() {
        let d = tempfile::tempdir().unwrap();
        let mut one = Heartbeat::create(d.path(), 1).unwrap();
        let mut zero = Heartbeat::create(d.path(), 0).unwrap();
        one.beat(12);
        zero.beat(3);
        one.beat(13);
        std::fs::write(dir(d.path()).join("rank-x"), "junk").unwrap();
        std::fs::write(dir(d.path()).join("rank-2"), "").unwrap();
        let beats = read_all(d.path());
        assert_eq!(beats.len(), 2, "{beats:?}");
        assert_eq!((beats[0].rank, beats[0].step), (0, 3));
        assert_eq!((beats[1].rank, beats[1].step), (1, 13));
        assert_eq!(beats[1].pid, std::process::id());
        clear(d.path()).unwrap();
        let left = |d: &Path| -> Vec<_> {
            std::fs::read_dir(dir(d))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect()
        };
        assert_eq!(left(d.path()), ["rank-x"], "no rank's: not its own");
        std::fs::remove_file(dir(d.path()).join("rank-x")).unwrap();
        clear(d.path()).unwrap();
        assert!(!dir(d.path()).exists(), "empty, so removed");
        assert!(read_all(d.path()).is_empty());
        // What it did not write stays, and so does the folder holding it.
        Heartbeat::create(d.path(), 0).unwrap();
        std::fs::write(dir(d.path()).join("notes"), "mine").unwrap();
        std::fs::write(dir(d.path()).join("rank-0.stacks"), "stacks").unwrap();
        clear(d.path()).unwrap();
        assert_eq!(left(d.path()), ["notes"]);
    }
}
