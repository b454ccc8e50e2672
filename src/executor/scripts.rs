//! The scripts `sweep submit` writes beside the runs' own `job.sbatch`: a
//! job array's and a packed block's, rendered from `templates/` (values
//! shell-quoted by the template engine) and named by their content.

use super::ended::EXIT_CODE;
use super::packed::STARTED;
use crate::template::Engine;
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

const ARRAY: (&str, &str) = (
    "array.sbatch.j2",
    include_str!("../../templates/array.sbatch.j2"),
);
const BLOCK: (&str, &str) = (
    "block.sbatch.j2",
    include_str!("../../templates/block.sbatch.j2"),
);

#[derive(Serialize)]
struct Values<'a> {
    /// The `#SBATCH` lines shared by the runs (checked when they rendered).
    header: &'a [String],
    /// Where the job logs (`%x`, `%A`, `%a`, `%j` filled in by SLURM).
    output: String,
    dirs: Vec<String>,
    block: Option<u32>,
    job_script: &'static str,
    exit_code: &'static str,
    started: &'static str,
}

fn render((name, text): (&str, &str), ctx: &Values) -> Result<String> {
    let mut engine = Engine::new();
    engine.set_fuel(Some(crate::template::GROUP_SCRIPT_FUEL));
    engine
        .add(name, text)
        .and_then(|()| engine.render(name, &crate::template::context(ctx)))
        .map_err(|e| anyhow::anyhow!("rendering {name}: {}", crate::template::describe(&e)))
}

fn context<'a>(study_dir: &Path, header: &'a [String], dirs: &[PathBuf], log: &str) -> Values<'a> {
    Values {
        header,
        output: study_dir
            .join(crate::layout::LOGS_DIR)
            .join(log)
            .display()
            .to_string(),
        dirs: dirs.iter().map(|d| d.display().to_string()).collect(),
        block: None,
        job_script: crate::layout::JOB_SBATCH,
        exit_code: EXIT_CODE,
        started: STARTED,
    }
}

/// An array's script: the shared header, its own log pattern, and a body that
/// runs the task's own `job.sbatch` (which then logs into its run directory).
pub fn array(
    study_dir: &Path,
    header: &[String],
    dirs: &[PathBuf],
    dry_run: bool,
) -> Result<PathBuf> {
    let text = render(ARRAY, &context(study_dir, header, dirs, "%x-%A_%a.out"))?;
    write(
        study_dir,
        crate::layout::ARRAYS_DIR,
        "array",
        &text,
        dry_run,
    )
}

/// Block `block`'s script: the allocation's header, then each run's
/// `job.sbatch` in order with its state records; a failed run does not end
/// the block, and a requeued block skips the runs it completed.
pub fn block(
    study_dir: &Path,
    block: u32,
    header: &[String],
    dirs: &[PathBuf],
    dry_run: bool,
) -> Result<PathBuf> {
    let ctx = Values {
        block: Some(block),
        ..context(study_dir, header, dirs, "%x-%j.out")
    };
    let text = render(BLOCK, &ctx)?;
    let stem = format!("block-{block}");
    write(study_dir, crate::layout::BLOCKS_DIR, &stem, &text, dry_run)
}

/// Writes a script as `results/<study>/<dir>/<stem>-<hash>.sbatch` (named by
/// its content: the same is reused) and makes `logs/`; returns the path.
fn write(study_dir: &Path, dir: &str, stem: &str, text: &str, dry_run: bool) -> Result<PathBuf> {
    let id = crate::util::hash::sha256_bytes(text.as_bytes());
    let scripts = study_dir.join(dir);
    let path = scripts.join(format!("{stem}-{}.sbatch", &id[..12]));
    if !dry_run {
        let logs = study_dir.join(crate::layout::LOGS_DIR);
        for d in [&logs, &scripts] {
            crate::util::fs::make_dir(d)?;
        }
        crate::util::fs::write_if_changed(&path, text.as_bytes())?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What bash reads without running it: the script is well-formed.
    fn parses(path: &Path) {
        let out = std::process::Command::new("bash")
            .arg("-n")
            .arg(path)
            .status()
            .unwrap();
        assert!(out.success(), "bash -n {}", path.display());
    }

    #[test]
    fn the_block_script_lists_its_runs_in_order_and_goes_on_after_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = [tmp.path().join("b"), tmp.path().join("a x")];
        let head = ["#SBATCH --nodes=2".to_string()];
        let path = block(tmp.path(), 3, &head, &dirs, false).unwrap();
        let s = std::fs::read_to_string(&path).unwrap();
        assert!(
            path.starts_with(tmp.path().join("blocks")),
            "{}",
            path.display()
        );
        let b = s.find("/b\n").unwrap();
        let a = s.find("/a x'").unwrap();
        assert!(b < a, "the block's order:\n{s}");
        assert!(s.contains("#SBATCH --nodes=2\n#SBATCH --output="), "{s}");
        assert!(s.contains("|| failed=$((failed + 1))"), "{s}");
        assert!(s.contains("\"$dir/exit_code\""), "{s}");
        assert!(s.contains("sweep: block 3 done"), "{s}");
        // The same block, the same script: written once.
        assert_eq!(block(tmp.path(), 3, &head, &dirs, false).unwrap(), path);
        parses(&path);
    }

    #[test]
    fn the_array_script_runs_the_tasks_own_job_script() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = [tmp.path().join("r0"), tmp.path().join("it's")];
        let head = ["#SBATCH --time=00:10:00".to_string()];
        let path = array(tmp.path(), &head, &dirs, false).unwrap();
        let s = std::fs::read_to_string(&path).unwrap();
        assert!(path.starts_with(tmp.path().join("arrays")));
        assert!(
            s.contains("#SBATCH --time=00:10:00\n#SBATCH --output="),
            "{s}"
        );
        assert!(s.contains("%x-%A_%a.out"), "{s}");
        assert!(s.contains(r"it'\''s'"), "quoted: {s}");
        assert!(
            s.ends_with("exec bash \"${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}/job.sbatch\"\n"),
            "{s}"
        );
        parses(&path);
    }
}
