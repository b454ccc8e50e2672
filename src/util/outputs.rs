//! The one rule for every file a command writes where its user pointed it: it never replaces a
//! file sweep reads or owns (inputs, a history, any TOML file, anything in a study's, run's or
//! stage's directory, a file git tracks), and two outputs are never one file. Paths are
//! compared resolved, files by device and inode, so no other name passes.

use std::path::{Component, Path, PathBuf};

/// One output of a command: the flag that named it and its file.
#[derive(Debug, Clone, Copy)]
pub struct Output<'a> {
    pub flag: &'a str,
    pub path: &'a Path,
}

impl<'a> Output<'a> {
    pub fn new(flag: &'a str, path: &'a Path) -> Output<'a> {
        Output { flag, path }
    }
}

/// What a command may write into that the rule otherwise protects: its own kind of directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allow {
    /// A study's stage directory: `sweep pretokenize` (the stage's job) writes there.
    pub stage: bool,
}

/// Why a path cannot receive a command's output.
#[derive(Debug)]
pub enum OutputError {
    /// A device, FIFO, socket or directory is there (or a link names one).
    NotRegular(super::fs::NotRegular),
    /// It is one of the command's inputs (the same file, by device and inode).
    IsInput { path: PathBuf, input: PathBuf },
    /// It is (or lies inside) something sweep reads or owns: `what` says what.
    Owned {
        flag: String,
        path: PathBuf,
        what: String,
    },
    /// Two outputs of the command resolve to one file.
    Same {
        flags: (String, String),
        path: PathBuf,
    },
}

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputError::NotRegular(e) => e.fmt(f),
            OutputError::IsInput { path, input } => write!(
                f,
                "the output {} is the input {}: writing it would destroy the input, and an output \
                 never replaces a file sweep reads or owns: choose another output",
                path.display(),
                input.display()
            ),
            OutputError::Owned { flag, path, what } => write!(
                f,
                "{flag} {}: {what}, and an output never replaces a file sweep reads or owns: \
                 name a file elsewhere",
                path.display()
            ),
            OutputError::Same { flags, path } => write!(
                f,
                "{} and {} both name {}: give each output its own file",
                flags.0,
                flags.1,
                path.display()
            ),
        }
    }
}

impl std::error::Error for OutputError {}

/// Checks every output of a command together; `inputs` are the files it reads.
pub fn check(outputs: &[Output], inputs: &[&Path], allow: Allow) -> Result<(), OutputError> {
    // Each output checked so far: where it resolves to, what is there.
    let mut seen: Vec<(PathBuf, Option<(u64, u64)>)> = Vec::new();
    for (n, o) in outputs.iter().enumerate() {
        check_one(o, inputs, allow)?;
        let resolved = resolve(o.path);
        let id = identity(o.path);
        if let Some(k) = seen
            .iter()
            .position(|(p, i)| *p == resolved || (id.is_some() && *i == id))
        {
            return Err(OutputError::Same {
                flags: (outputs[k].flag.to_string(), outputs[n].flag.to_string()),
                path: o.path.to_path_buf(),
            });
        }
        seen.push((resolved, id));
    }
    Ok(())
}

/// Checks a file sweep writes in its own place: nothing special there, none of the inputs.
pub fn check_own(path: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(()); // a new path (or a dangling link, which rename replaces)
    };
    if !meta.file_type().is_file() {
        return Err(OutputError::NotRegular(super::fs::NotRegular {
            path: path.to_path_buf(),
            what: super::fs::kind_of(meta.file_type()),
        }));
    }
    let id = identity(path);
    match inputs.iter().find(|i| identity(i) == id) {
        Some(input) => Err(OutputError::IsInput {
            path: path.to_path_buf(),
            input: input.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// Checks one output (see [`check`]).
pub fn check_one(o: &Output, inputs: &[&Path], allow: Allow) -> Result<(), OutputError> {
    let path = o.path;
    let owned = |what: String| OutputError::Owned {
        flag: o.flag.to_string(),
        path: path.to_path_buf(),
        what,
    };
    check_own(path, inputs)?;
    let meta = std::fs::metadata(path).ok();
    let resolved = resolve(path);
    if let Some(what) = history_file(&resolved) {
        return Err(owned(what));
    }
    if meta.is_some() && resolved.extension().is_some_and(|e| e == "toml") {
        return Err(owned(
            "it is a TOML file (a manifest or a run's configuration)".into(),
        ));
    }
    if let Some((dir, kind)) = sweep_directory(&resolved) {
        if !(allow.stage && kind == DirKind::Stage) {
            return Err(owned(format!(
                "it lies inside {} {}, which sweep owns",
                kind.describe(),
                dir.display()
            )));
        }
    }
    if meta.is_some() {
        if let Some(repo) = tracked_by_git(&resolved) {
            return Err(owned(format!(
                "git tracks it in {} (a file of the checkout)",
                repo.display()
            )));
        }
    }
    Ok(())
}

/// The device and inode `path` names, through links; None when nothing is there.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The absolute path `path` names with links and `..` resolved (the missing part by components).
pub fn resolve(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<Component> = abs.components().collect();
    for keep in (1..=parts.len()).rev() {
        let head: PathBuf = parts[..keep].iter().collect();
        if let Ok(mut out) = head.canonicalize() {
            for c in &parts[keep..] {
                match c {
                    Component::ParentDir => {
                        out.pop();
                    }
                    Component::CurDir => {}
                    other => out.push(other),
                }
            }
            return out;
        }
    }
    abs
}

/// Whether a resolved path is a history (sweep's application id, or `results/history.sqlite`)
/// or one of SQLite's side files; what it is, in words.
fn history_file(resolved: &Path) -> Option<String> {
    let name = resolved.file_name()?.to_string_lossy().into_owned();
    let base = ["-wal", "-shm", "-journal"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(&name);
    let file = resolved.with_file_name(base);
    let named = base == crate::layout::HISTORY_SQLITE
        && file
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|d| d == "results");
    // Opened without blocking (the file beside an output may be a FIFO).
    let ours = super::fs::open_regular(&file, 0)
        .ok()
        .is_some_and(|(f, _)| {
            use std::io::Read;
            let mut header = [0u8; 72];
            f.take(72).read_exact(&mut header).is_ok()
                && header.starts_with(b"SQLite format 3\0")
                && i32::from_be_bytes(header[68..72].try_into().expect("4 bytes"))
                    == crate::layout::HISTORY_APPLICATION_ID
        });
    (named || ours).then(|| match base == name {
        true => "it is sweep's performance history".to_string(),
        false => "it is a file SQLite keeps beside sweep's performance history".to_string(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirKind {
    Study,
    Run,
    Stage,
}

impl DirKind {
    fn describe(self) -> &'static str {
        match self {
            DirKind::Study => "the study directory",
            DirKind::Run => "the run directory",
            DirKind::Stage => "the stage directory",
        }
    }
}

/// The innermost directory above a resolved path that sweep owns: a run's, a stage's, or a
/// study's (`study.json`, or any directory directly under `results/`).
fn sweep_directory(resolved: &Path) -> Option<(PathBuf, DirKind)> {
    // sweep runs in its project's root (`-C`).
    let results = std::env::current_dir()
        .ok()
        .and_then(|d| d.join("results").canonicalize().ok());
    sweep_directory_in(resolved, results.as_deref())
}

fn sweep_directory_in(resolved: &Path, results: Option<&Path>) -> Option<(PathBuf, DirKind)> {
    use crate::layout::{RUN_JSON, STAGE_JSON, STUDY_JSON};
    let mut dir = resolved.parent();
    while let Some(d) = dir {
        for (file, kind) in [
            (RUN_JSON, DirKind::Run),
            (STAGE_JSON, DirKind::Stage),
            (STUDY_JSON, DirKind::Study),
        ] {
            if d.join(file).is_file() {
                return Some((d.to_path_buf(), kind));
            }
        }
        if results.is_some() && d.parent() == results {
            return Some((d.to_path_buf(), DirKind::Study));
        }
        dir = d.parent();
    }
    None
}

/// The checkout whose git tracks a resolved path; None where git is missing or does not.
fn tracked_by_git(resolved: &Path) -> Option<PathBuf> {
    let dir = resolved.parent()?;
    let name = resolved.file_name()?;
    let tracked = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["ls-files", "--error-unmatch", "--"])
        .arg(name)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?
        .success();
    if !tracked {
        return None;
    }
    let top = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()?;
    Some(PathBuf::from(
        String::from_utf8_lossy(&top.stdout).trim().to_string(),
    ))
}

/// Checks a folder a command makes its files in (`--dir`): outside every sweep directory.
pub fn check_dir(flag: &str, dir: &Path) -> Result<(), OutputError> {
    if let Ok(m) = std::fs::metadata(dir) {
        if !m.is_dir() {
            return Err(OutputError::Owned {
                flag: flag.to_string(),
                path: dir.to_path_buf(),
                what: format!(
                    "it is {}, not a folder",
                    match m.is_file() {
                        true => "a file",
                        false => super::fs::kind_of(m.file_type()),
                    }
                ),
            });
        }
    }
    match sweep_directory(&resolve(dir).join("new")) {
        Some((owner, kind)) => Err(OutputError::Owned {
            flag: flag.to_string(),
            path: dir.to_path_buf(),
            what: format!(
                "it lies inside {} {}, which sweep owns",
                kind.describe(),
                owner.display()
            ),
        }),
        None => Ok(()),
    }
}

/// Checks `path` as a command's one output ([`check`]), then writes it atomically.
pub fn write(flag: &str, path: &Path, bytes: &[u8], inputs: &[&Path]) -> anyhow::Result<()> {
    check(&[Output::new(flag, path)], inputs, Allow::default())?;
    write_checked(path, bytes)
}

/// Writes an output already checked: atomically, making its folder.
pub fn write_checked(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = super::fs::parent_dir(path);
    super::fs::make_dir(dir)?;
    super::fs::write_atomic(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::fs::tests::mkfifo;

    /// A project with a history, a manifest, a study with a run, a stage
    /// and its report, and a file git tracks.
    fn project() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let results = d.join("results");
        std::fs::create_dir_all(results.join("s/run-a")).unwrap();
        std::fs::create_dir_all(results.join("s/stages/st")).unwrap();
        std::fs::write(d.join("m.toml"), "name = \"s\"").unwrap();
        std::fs::write(results.join("s/study.json"), "{}").unwrap();
        std::fs::write(results.join("s/summary.csv"), "x").unwrap();
        std::fs::write(results.join("s/run-a/run.json"), "{}").unwrap();
        std::fs::write(results.join("s/run-a/metrics.jsonl"), "").unwrap();
        std::fs::write(results.join("s/stages/st/stage.json"), "{}").unwrap();
        let h = rusqlite::Connection::open(results.join(crate::layout::HISTORY_SQLITE)).unwrap();
        h.pragma_update(
            None,
            "application_id",
            crate::layout::HISTORY_APPLICATION_ID,
        )
        .unwrap();
        h.execute_batch("CREATE TABLE t(x)").unwrap();
        dir
    }

    fn refused(path: &Path) -> String {
        check(&[Output::new("--junit", path)], &[], Allow::default())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn no_output_replaces_what_sweep_reads_or_owns() {
        let dir = project();
        let d = dir.path();
        let r = d.join("results");
        for (path, says) in [
            (r.join("history.sqlite"), "performance history"),
            (
                r.join("history.sqlite-wal"),
                "beside sweep's performance history",
            ),
            (r.join("s/../history.sqlite"), "performance history"),
            (
                r.join("new/../../results/./history.sqlite"),
                "performance history",
            ),
            (d.join("m.toml"), "TOML file"),
            (r.join("s/summary.csv"), "inside the study directory"),
            (r.join("s/report.html"), "inside the study directory"),
            (r.join("s/run-a/run.json"), "inside the run directory"),
            (r.join("s/run-a/metrics.jsonl"), "inside the run directory"),
            (r.join("s/run-a/new.xml"), "inside the run directory"),
            (
                r.join("s/stages/st/padded.parquet"),
                "inside the stage directory",
            ),
        ] {
            let e = refused(&path);
            assert!(e.contains(says), "{}: {e}", path.display());
        }
        // Another name for the history: a link, a copy of it elsewhere.
        std::os::unix::fs::symlink(r.join("history.sqlite"), d.join("h.xml")).unwrap();
        assert!(refused(&d.join("h.xml")).contains("history"));
        std::fs::copy(r.join("history.sqlite"), d.join("old-history.db")).unwrap();
        assert!(refused(&d.join("old-history.db")).contains("history"));
        // A directory directly under the project's results/ is a study's
        // (an imported study has no study.json).
        let other = r.canonicalize().unwrap().join("imported/x.xml");
        assert_eq!(
            sweep_directory_in(&other, Some(&r.canonicalize().unwrap())).map(|x| x.1),
            Some(DirKind::Study)
        );
        assert_eq!(sweep_directory_in(&other, None), None);
        // A stage's own files, for the command that writes them.
        let stage = Allow { stage: true };
        assert!(check_one(
            &Output::new("--out", &r.join("s/stages/st/padded.parquet")),
            &[],
            stage
        )
        .is_ok());
        // New files outside sweep's directories, or a file beside the
        // history, are fine (the documented `results/nightly-check.xml`).
        for fine in [r.join("nightly-check.xml"), d.join("out/check.html")] {
            assert!(
                check(&[Output::new("--junit", &fine)], &[], Allow::default()).is_ok(),
                "{}",
                fine.display()
            );
        }
        std::fs::write(r.join("nightly-check.xml"), "old").unwrap();
        assert!(check(
            &[Output::new("--junit", &r.join("nightly-check.xml"))],
            &[],
            Allow::default()
        )
        .is_ok());
        // Special files are never replaced.
        let fifo = d.join("fifo");
        mkfifo(&fifo);
        assert!(refused(&fifo).contains("a FIFO"));
        assert!(refused(Path::new("/dev/null")).contains("a device"));
        // A FIFO beside an output named like a history's side file is
        // looked at without blocking.
        let beside = d.join("fifo-wal");
        assert!(check(&[Output::new("--junit", &beside)], &[], Allow::default()).is_ok());
    }

    #[test]
    fn two_outputs_are_never_one_file_and_inputs_are_never_outputs() {
        let dir = project();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("out.xml"), "x").unwrap();
        std::os::unix::fs::symlink(d.join("out.xml"), d.join("link.xml")).unwrap();
        for (a, b) in [
            (d.join("new.xml"), d.join("sub/../new.xml")),
            (d.join("new.xml"), d.join("./new.xml")),
            (d.join("link.xml"), d.join("out.xml")),
        ] {
            let e = check(
                &[Output::new("--junit", &a), Output::new("--html", &b)],
                &[],
                Allow::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("--junit and --html both name"), "{e}");
        }
        std::fs::hard_link(d.join("out.xml"), d.join("hard.xml")).unwrap();
        let e = check(
            &[
                Output::new("--junit", &d.join("hard.xml")),
                Output::new("--html", &d.join("link.xml")),
            ],
            &[],
            Allow::default(),
        )
        .unwrap_err();
        assert!(matches!(e, OutputError::Same { .. }), "{e}");
        let notes = d.join("notes.txt");
        std::fs::write(&notes, "the only copy").unwrap();
        let e = write("--out", &d.join("sub/../notes.txt"), b"x", &[&notes]).unwrap_err();
        assert!(e.to_string().contains("would destroy the input"), "{e}");
        assert_eq!(std::fs::read(&notes).unwrap(), b"the only copy");
    }

    #[test]
    fn files_git_tracks_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(d)
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .output()
                .map(|o| o.status.success())
        };
        // git is how the project is fetched and what the rule asks of it:
        // a machine without it cannot run this test, and says so by failing.
        assert_eq!(git(&["init", "-q"]).ok(), Some(true), "git is needed here");
        std::fs::write(d.join("README.md"), "# project").unwrap();
        assert_eq!(git(&["add", "README.md"]).ok(), Some(true));
        assert_eq!(git(&["commit", "-qm", "x"]).ok(), Some(true));
        let e = refused(&d.join("README.md"));
        assert!(e.contains("git tracks it"), "{e}");
        std::fs::write(d.join("untracked.html"), "x").unwrap();
        assert!(check(
            &[Output::new("--html", &d.join("untracked.html"))],
            &[],
            Allow::default()
        )
        .is_ok());
    }
}
