//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `sweep` binary, run from `root` as the project root.
pub fn sweep(root: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sweep"));
    c.arg("-C").arg(root).current_dir(root);
    c
}

/// Runs a command and returns its output, with stdout/stderr shown on failure.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("the command starts");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A temporary project root with the repository's templates linked in.
pub fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::os::unix::fs::symlink(repo().join("templates"), dir.path().join("templates")).unwrap();
    dir
}

pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Polls `f` until it returns Some, or panics after `secs` seconds.
pub fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `sweep status --json` as (name -> (state, exit_code)).
pub fn status(
    root: &Path,
    manifest: &Path,
) -> std::collections::HashMap<String, (String, Option<i64>)> {
    let out = run_ok(sweep(root).arg("status").arg(manifest).arg("--json"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                (
                    r["state"].as_str().unwrap().to_string(),
                    r["exit_code"].as_i64(),
                ),
            )
        })
        .collect()
}
