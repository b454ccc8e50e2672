//! One `sbatch` call: the environment it gets (a login profile's `SBATCH_*`
//! for options the script sets left out), and what it answered — the job's
//! id (past a site's notices), a refusal for a submit limit, or a job SLURM
//! queued though sbatch failed.

use crate::manifest::slurm_options::SLURM_OPTIONS;
use crate::util::process::output;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// What `sbatch` answered: the job's id, or a refusal for a limit on the
/// jobs one may have queued at once, which waiting for jobs to end lifts.
pub enum Answer {
    Queued(String),
    /// The limit SLURM named (`QOSMaxSubmitJobPerUserLimit`).
    Full(String),
}

pub fn sbatch(args: &[String], script: &Path, dry_run: bool) -> Result<Answer> {
    if dry_run {
        return Ok(Answer::Queued(String::new()));
    }
    let mut cmd = Command::new("sbatch");
    let text = std::fs::read_to_string(script).unwrap_or_default();
    for name in overriding_env(&text, |n| std::env::var_os(n).is_some()) {
        say_once(name, || {
            format!(
                "sweep: {name}={} in your environment is left out of sbatch's: the study's job script sets that option, and the manifest's value is what its runs record",
                std::env::var(name).unwrap_or_default()
            )
        });
        cmd.env_remove(name);
    }
    // sbatch would wait for each job to end (`--wait`), or make each of
    // sweep's single jobs an array: sweep decides both for its study.
    for name in ["SBATCH_WAIT", "SBATCH_ARRAY_INX"] {
        if std::env::var_os(name).is_some() {
            say_once(name, || {
                format!("sweep: {name} in your environment is left out of sbatch's: sweep submits each job once, as the plan says, and does not wait for it (`sweep run` follows a study's jobs)")
            });
            cmd.env_remove(name);
        }
    }
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    let outer = allocation_env(&names);
    if !outer.is_empty() {
        say_once("SLURM_JOB_ID", || {
            format!(
                "sweep: submitting from inside SLURM job {}: its SLURM_* and SRUN_* variables are left out of the jobs' environment (they describe that allocation, and srun in each job would read them)",
                std::env::var("SLURM_JOB_ID").unwrap_or_default()
            )
        });
    }
    for name in outer {
        cmd.env_remove(name);
    }
    let out = match output(cmd.arg("--parsable").args(args).arg(script)) {
        Ok(out) => out,
        Err(e) => {
            let why = e.root_cause().to_string();
            if let Some(limit) = submit_limit(&why) {
                return Ok(Answer::Full(limit.to_string()));
            }
            // A controller that timed out answering may have queued the job
            // all the same (`Socket timed out on send/recv operation`): a job
            // SLURM holds for this script is recorded, not sent a second time.
            return match queued_for(script) {
                Some(id) => {
                    eprintln!(
                        "sweep: sbatch failed ({}), but SLURM holds job {id} of {}: recorded",
                        crate::util::text::note(&why),
                        script.display()
                    );
                    Ok(Answer::Queued(id))
                }
                None => Err(e).with_context(|| format!("submitting {}", script.display())),
            };
        }
    };
    match parse_job_id(&out) {
        Some(id) => Ok(Answer::Queued(id.to_string())),
        None => bail!("sbatch printed `{}` instead of a job id", out.trim()),
    }
}

/// The `SBATCH_*` variables set (`set`) that would override an option the
/// script's `#SBATCH` lines set (sbatch prefers them: a profile's
/// `SBATCH_PARTITION` would run a study elsewhere than its records say).
fn overriding_env(script: &str, set: impl Fn(&str) -> bool) -> Vec<&'static str> {
    let mut names = Vec::new();
    let options = script
        .lines()
        .filter_map(|line| line.strip_prefix("#SBATCH"))
        .flat_map(|rest| {
            crate::util::slurm::options(crate::util::slurm::Tool::Sbatch, rest).unwrap_or_default()
        });
    for option in options {
        let row = SLURM_OPTIONS.iter().find(|o| o.name == option);
        names.extend_from_slice(row.map_or(&[], |o| o.env));
    }
    names.sort_unstable();
    names.dedup();
    names.retain(|n| set(n));
    names
}

/// The variables of the allocation sweep runs in, which `--export=ALL` would
/// pass to every job's `srun` (`SLURM_MEM_PER_CPU` beside the job's own is
/// fatal); none outside one; the user's settings (`SLURM_CONF`, ...) kept.
fn allocation_env(names: &[String]) -> Vec<&str> {
    const KEPT: [&str; 4] = [
        "SLURM_CONF",
        "SLURM_CLUSTERS",
        "SLURM_TIME_FORMAT",
        "SLURM_DEBUG_FLAGS",
    ];
    if !names.iter().any(|n| n == "SLURM_JOB_ID") {
        return Vec::new();
    }
    names
        .iter()
        .map(String::as_str)
        .filter(|n| (n.starts_with("SLURM_") || n.starts_with("SRUN_")) && !KEPT.contains(n))
        .collect()
}

/// Says `line` on standard error once per process for each `what`.
fn say_once(what: &str, line: impl FnOnce() -> String) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.iter().any(|s| s == what) {
        said.push(what.to_string());
        eprintln!("{}", line());
    }
}

/// The limit SLURM names where it refuses a job for the jobs already queued
/// (`QOSMaxSubmitJobPerUserLimit`, ...): the name decides, as the policy
/// line is the same for limits no wait lifts.
fn submit_limit(stderr: &str) -> Option<&str> {
    stderr
        .split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| w.contains("SubmitJob") && w.ends_with("Limit"))
}

/// The newest job (an array's own id) SLURM holds of the user's whose batch
/// script is `script`, if squeue answers.
fn queued_for(script: &Path) -> Option<String> {
    let out =
        output(crate::util::slurm::query("squeue").args(["--me", "--noheader", "--format=%F|%o"]))
            .ok()?;
    let script = std::fs::canonicalize(script).ok()?;
    parse_queued_for(&out, &script)
}

fn parse_queued_for(out: &str, script: &Path) -> Option<String> {
    out.lines()
        .filter_map(|l| l.trim().split_once('|'))
        .filter(|(_, path)| std::fs::canonicalize(path).is_ok_and(|p| p == script))
        .filter_map(|(id, _)| id.parse::<u64>().ok())
        .max()
        .map(|id| id.to_string())
}

/// The job id in what `sbatch --parsable` printed (`<id>` or `<id>;<cluster>`
/// on its last line), or in `Submitted batch job <id>` where a site's
/// wrapper prints notices or drops `--parsable`.
fn parse_job_id(out: &str) -> Option<&str> {
    let last = out.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
    let id = match last.strip_prefix("Submitted batch job ") {
        Some(rest) => rest.split(' ').next()?,
        None => last.split(';').next()?,
    };
    (!id.is_empty() && id.chars().all(|c| c.is_ascii_digit())).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocations_variables_are_left_out_inside_one_only() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let inside = names(&[
            "SLURM_JOB_ID",
            "SLURM_MEM_PER_CPU",
            "SRUN_CPUS_PER_TASK",
            "SLURM_CONF",
            "SLURM_CLUSTERS",
            "SBATCH_ACCOUNT",
            "PATH",
            "OMPI_MCA_btl",
        ]);
        assert_eq!(
            allocation_env(&inside),
            ["SLURM_JOB_ID", "SLURM_MEM_PER_CPU", "SRUN_CPUS_PER_TASK"]
        );
        let outside = names(&["SLURM_CONF", "SLURM_MEM_PER_CPU", "PATH"]);
        assert!(allocation_env(&outside).is_empty());
    }

    #[test]
    fn a_job_id_is_read_past_a_sites_notices() {
        assert_eq!(parse_job_id("1234\n"), Some("1234"));
        assert_eq!(parse_job_id("1234;daint\n"), Some("1234"));
        let notices = "NOTE: jobs on this partition are charged 2x\n\n  88 \n";
        assert_eq!(parse_job_id(notices), Some("88"));
        let plain = "Submitted batch job 5 on cluster daint\n";
        assert_eq!(parse_job_id(plain), Some("5"));
        for bad in ["", "\n", "Submitted batch job \n", "5 ;x", "12\nerror\n"] {
            assert_eq!(parse_job_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_job_queued_by_a_failed_sbatch_is_found_by_its_script() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.sbatch"), d.path().join("b.sbatch"));
        std::fs::write(&a, "").unwrap();
        std::fs::write(&b, "").unwrap();
        let out = format!(
            "7|{a}\n12|{b}\n9|{a}\n13|(null)\nx|{a}\n",
            a = a.display(),
            b = b.display()
        );
        assert_eq!(parse_queued_for(&out, &a), Some("9".into()));
        assert_eq!(parse_queued_for(&out, &b), Some("12".into()));
        assert_eq!(parse_queued_for("", &a), None);
    }

    #[test]
    fn a_submit_limit_is_told_from_limits_no_wait_lifts() {
        let policy = "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)";
        for limit in [
            "QOSMaxSubmitJobPerUserLimit",
            "QOSMaxSubmitJobPerAccountLimit",
            "AssocMaxSubmitJobLimit",
            "AssocGrpSubmitJobsLimit",
            "QOSGrpSubmitJobsLimit",
        ] {
            let err = format!("\"sbatch\" \"--parsable\" \"a.sbatch\" failed (exit status: 1): sbatch: error: {limit}\n{policy}");
            assert_eq!(submit_limit(&err), Some(limit));
        }
        // A time over the QOS's, a bad partition: no wait lifts them.
        assert_eq!(
            submit_limit(&format!(
                "sbatch: error: QOSMaxWallDurationPerJobLimit\n{policy}"
            )),
            None
        );
        assert_eq!(
            submit_limit("sbatch: error: invalid partition specified: gpu"),
            None
        );
    }

    #[test]
    fn sbatch_variables_that_override_the_scripts_options_are_found() {
        let script = "#!/bin/bash\n#SBATCH --partition=gpu\n#SBATCH -t 10\n#SBATCH --output=/r/%x-%j.out\n#SBATCH --mem 64G\n#SBATCH --requeue\n#SBATCH --gpus=4\n# SBATCH --qos=x\necho '#SBATCH --account=a'\n";
        let set = [
            "SBATCH_PARTITION",
            "SBATCH_TIMELIMIT",
            "SBATCH_ERROR",
            "SBATCH_NO_REQUEUE",
            "SBATCH_MEM_PER_CPU",
            "SBATCH_ACCOUNT",
            "SBATCH_QOS",
            "SBATCH_GPUS",
        ];
        assert_eq!(
            overriding_env(script, |n| set.contains(&n)),
            [
                "SBATCH_ERROR",
                "SBATCH_GPUS",
                "SBATCH_MEM_PER_CPU",
                "SBATCH_NO_REQUEUE",
                "SBATCH_PARTITION",
                "SBATCH_TIMELIMIT"
            ]
        );
    }
}
