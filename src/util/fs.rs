//! File writes that never leave a half-written file behind.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` through a temporary file in the same directory,
/// then renames it into place: readers see the old file or the new one, never a
/// torn one. No fsync: this guards against crashes of the writer, not power
/// loss, and every writer here can simply run again. The directory must exist.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = temp_beside(path, ".tmp-")?;
    tmp.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

/// A temporary file beside `target`, readable by others once renamed (temp
/// files are created private).
pub fn temp_beside(target: &Path, prefix: &str) -> Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent_dir(target);
    let tmp = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o644))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    Ok(tmp)
}

/// Like [`write_atomic`], but leaves the file (and its mtime) alone when it
/// already holds exactly these bytes. Returns whether it wrote.
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

#[cfg(test)]
mod tests {
    use super::*;

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
