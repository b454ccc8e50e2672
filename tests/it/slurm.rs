//! Real jobs on the local SLURM cluster (`scripts/local-slurm.sh up`): arrays,
//! dependencies, failures, cancellation, idempotent submission, and
//! `sbatch --test-only` on every script rendered from experiments/.

use super::support::{
    job_id, metrics, project, repo, run_ok, status, stdout, submit_slurm, sweep, wait_for, write,
};
use std::path::Path;
use std::process::Command;

const NEEDS: &str =
    "needs the local SLURM cluster: scripts/local-slurm.sh up (scripts/test.sh does it)";

pub fn require_cluster() {
    if std::env::var_os("SLURM_CONF").is_none() && !Path::new("/etc/slurm/slurm.conf").exists() {
        std::env::set_var("SLURM_CONF", "/tmp/sweep-slurm/etc/slurm.conf");
    }
    let ok = Command::new("scontrol")
        .arg("ping")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("UP"));
    assert!(ok, "{NEEDS}");
}

/// How many jobs SLURM knows by this name.
fn jobs_named(name: &str) -> usize {
    let out = run_ok(
        Command::new("squeue").args(["--me", "-h", "-t", "all", "-r", "-n", name, "-o", "%i"]),
    );
    stdout(&out).lines().count()
}

/// Waits until no job of the study is pending or running; their states.
pub fn wait_until_done(
    root: &Path,
    m: &Path,
    secs: u64,
) -> std::collections::HashMap<String, (String, Option<i64>)> {
    wait_for(secs, "every job to end", || {
        let s = status(root, m);
        s.values()
            .all(|(st, _)| !matches!(st.as_str(), "PENDING" | "RUNNING"))
            .then_some(s)
    })
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn an_array_with_a_failing_task_and_three_submissions_without_duplicates() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    // A name of its own: the count below must not see jobs of another run of the suite.
    let name = format!("sweep-test-arr-{}", std::process::id());
    write(&m, &format!("name = \"arr\"\ncommand = \"echo task {{{{ tag }}}}; exit {{{{ code }}}}\"\n[sweep.grid]\ncode = [0, 3]\ntag = [\"a\", \"b\"]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\narray_throttle = 2\n"));
    let first = submit_slurm(root.path(), &m);
    assert!(first.contains("array of 4 runs"), "{first}");
    for _ in 0..2 {
        let again = submit_slurm(root.path(), &m);
        assert!(again.contains("nothing to submit"), "{again}");
    }
    assert_eq!(jobs_named(&name), 4, "three submissions, four array tasks");
    let s = wait_until_done(root.path(), &m, 60);
    assert_eq!(s["code-0_a"], ("COMPLETED".into(), Some(0)));
    assert_eq!(s["code-3_b"], ("FAILED".into(), Some(3)));
    // Each task logged into its own run directory; the record has the task's id.
    let dir = root.path().join("results/arr/code-3_b");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    let job = rec["jobs"][0]["job_id"].as_str().unwrap().to_string();
    assert!(job.contains('_'), "an array task id: {job}");
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .expect("a job log");
    assert!(std::fs::read_to_string(log.path())
        .unwrap()
        .contains("task b"));
    assert_eq!(
        std::fs::read_to_string(dir.join("exit_code"))
            .unwrap()
            .trim(),
        format!("{job} 3")
    );
    // Only the failed runs go again with --retry-failed.
    let retry = stdout(&run_ok(sweep(root.path()).arg("submit").arg(&m).args([
        "--executor",
        "slurm",
        "--retry-failed",
    ])));
    assert!(retry.contains("array of 2 runs"), "{retry}");
    assert_eq!(jobs_named(&name), 6);
    wait_until_done(root.path(), &m, 60);
}

/// More runs than the cluster's MaxArraySize (the test cluster's is 8, as
/// scripts/local-slurm.sh writes it): several arrays, each after the one
/// before it where a throttle holds, and every run once.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_group_larger_than_max_array_size_goes_out_as_several_arrays() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    let name = format!("sweep-test-big-{}", std::process::id());
    write(&m, &format!("name = \"big\"\ncommand = \"echo run {{{{ x }}}}\"\n[sweep.grid]\nx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\narray_throttle = 3\n"));
    let out = submit_slurm(root.path(), &m);
    let first = out
        .lines()
        .find(|l| l.contains("array of 8 runs"))
        .unwrap_or_else(|| panic!("{out}"));
    let id = first
        .trim_start_matches("submitted job ")
        .split(':')
        .next()
        .unwrap()
        .to_string();
    assert!(
        out.contains(&format!("array of 2 runs after job {id}")),
        "{out}"
    );
    assert_eq!(jobs_named(&name), 10, "ten array tasks");
    let s = wait_until_done(root.path(), &m, 90);
    assert!(
        s.values()
            .all(|(st, code)| st == "COMPLETED" && *code == Some(0)),
        "{s:?}"
    );
    assert_eq!(s.len(), 10);
}

/// `sweep <verb> <manifest> --executor slurm` as `cmd` is set up (a site's
/// PATH, a login profile's variables): how it exited, and all it printed.
fn sweep_slurm(cmd: &mut Command, verb: &str, m: &Path) -> (std::process::Output, String) {
    let out = cmd
        .arg(verb)
        .arg(m)
        .args(["--executor", "slurm"])
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

/// A site's own `tool` (a wrapper around SLURM's, as clusters have) first on
/// a PATH: `body` is its shell script, `REAL` in it the path of SLURM's.
/// Returns that PATH.
fn site_tool(root: &Path, tool: &str, body: &str) -> String {
    let bin = root.join("site-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let real = stdout(&run_ok(
        Command::new("sh").args(["-c", &format!("command -v {tool}")]),
    ));
    let wrapper = bin.join(tool);
    write(
        &wrapper,
        &format!("#!/bin/sh\n{}", body.replace("REAL", real.trim())),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap())
}

/// A site's `sbatch` that prints a notice before the job id (a wrapper, a
/// submit plugin): the job is queued, so its id is read past the notice and
/// recorded, and submitting again sends nothing.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_sites_notice_before_the_job_id_loses_no_job() {
    require_cluster();
    let root = project();
    let path = site_tool(
        root.path(),
        "sbatch",
        "echo 'NOTE: this partition is charged at 2x'\nexec REAL \"$@\"\n",
    );
    let m = root.path().join("m.toml");
    let name = format!("sweep-test-notice-{}", std::process::id());
    write(&m, &format!("name = \"notice\"\ncommand = \"echo run {{{{ x }}}}\"\n[sweep.grid]\nx = [1, 2]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\n"));
    let submit = || {
        stdout(&run_ok(sweep(root.path()).env("PATH", &path).args([
            "submit",
            m.to_str().unwrap(),
            "--executor",
            "slurm",
        ])))
    };
    let first = submit();
    assert!(first.contains("array of 2 runs"), "{first}");
    let s = wait_until_done(root.path(), &m, 60);
    assert!(
        s.values()
            .all(|(st, code)| st == "COMPLETED" && *code == Some(0)),
        "{s:?}"
    );
    let again = submit();
    assert!(!again.contains("submitted job"), "{again}");
    assert_eq!(jobs_named(&name), 2, "each run once");
}

/// Runs wait for their stage; when it fails they are cancelled, and `sweep
/// run` ends — on a site that does not set `kill_invalid_depend` too
/// (SLURM's default: a job whose dependency can never be satisfied stays
/// PENDING for ever). The site's sbatch asks for that default first;
/// sweep's own option, after it, must win.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn runs_wait_for_their_stage_and_are_cancelled_when_it_fails() {
    require_cluster();
    let root = project();
    let path = site_tool(
        root.path(),
        "sbatch",
        "exec REAL --kill-on-invalid-dep=no \"$@\"\n",
    );
    let m = root.path().join("m.toml");
    write(&m, "name = \"dep\"\n[defaults]\ndataset = \"missing.parquet\"\npretokenized = true\n[sweep.grid]\nbatch_size = [1, 2]\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-dep\"\n");
    let out = Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_sweep"))
        .arg("-C")
        .arg(root.path())
        .arg("run")
        .arg(&m)
        .args(["--executor", "slurm"])
        .env("PATH", &path)
        .current_dir(root.path())
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("submitted job ") && text.contains("(2 units)"),
        "{text}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "the runs failed; sweep run ended: {text}"
    );
    let s = status(root.path(), &m);
    let stage = s
        .iter()
        .find(|(k, _)| k.starts_with("pretokenize-"))
        .unwrap()
        .1;
    assert_eq!(stage.0, "FAILED");
    assert_eq!(
        s["batch_size-1"].0, "CANCELLED",
        "afterok on a failed job never runs"
    );
    assert_eq!(s["batch_size-2"].0, "CANCELLED");
}

/// Runs with and without a stage to wait for go out as one array, its
/// tasks in the plan's order (on-the-fly and pretokenized interleaved,
/// repeat by repeat), the array waiting for the stage: split by stage, all
/// the on-the-fly runs would run first.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn runs_with_and_without_a_stage_share_one_array_in_the_plans_order() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"mixed\"\n[defaults]\ndataset = \"missing.parquet\"\n[sweep]\nrepeats = 2\n[sweep.grid]\npretokenized = [false, true]\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-mixed\"\n");
    let out = submit_slurm(root.path(), &m);
    assert!(out.contains("array of 4 runs after job"), "{out}");
    let plan: Vec<serde_json::Value> =
        serde_json::from_slice(&run_ok(sweep(root.path()).args(["plan", "--json"]).arg(&m)).stdout)
            .unwrap();
    let ids: Vec<String> = plan
        .iter()
        .map(|r| {
            job_id(
                &root
                    .path()
                    .join("results/mixed")
                    .join(r["name"].as_str().unwrap()),
            )
        })
        .collect();
    let array = ids[0].split('_').next().unwrap().to_string();
    assert_eq!(
        ids,
        (0..4).map(|k| format!("{array}_{k}")).collect::<Vec<_>>(),
        "one array, tasks in the plan's order: {plan:?}"
    );
    let kinds: Vec<&serde_json::Value> =
        plan.iter().map(|r| &r["params"]["pretokenized"]).collect();
    assert_eq!(
        kinds,
        [
            &serde_json::json!(false),
            &serde_json::json!(true),
            &serde_json::json!(false),
            &serde_json::json!(true)
        ]
    );
    // The stage fails (no dataset): the array never runs.
    let s = wait_until_done(root.path(), &m, 60);
    assert!(
        s.iter()
            .filter(|(k, _)| !k.starts_with("pretokenize-"))
            .all(|(_, v)| v.0 == "CANCELLED"),
        "{s:?}"
    );
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn cancel_stops_a_running_job() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"can\"\ncommand = \"sleep 120\"\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-cancel\"\n");
    submit_slurm(root.path(), &m);
    wait_for(30, "the job to run", || {
        (status(root.path(), &m)["run"].0 == "RUNNING").then_some(())
    });
    let out = stdout(&run_ok(sweep(root.path()).arg("cancel").arg(&m)));
    assert!(out.contains("cancelled 1 jobs"), "{out}");
    let s = wait_until_done(root.path(), &m, 30);
    assert_eq!(s["run"].0, "CANCELLED");
}

/// Pending jobs cancelled before they start: CANCELLED, and recorded in
/// their run directories, so that they stay CANCELLED once SLURM forgets them.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn cancel_records_jobs_that_never_started() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"never\"\ncommand = \"sleep 120\"\n[sweep.grid]\nx = [1, 2]\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-never\"\narray_throttle = 1\n");
    submit_slurm(root.path(), &m);
    wait_for(30, "one job running, one held back", || {
        let s = status(root.path(), &m);
        (s["x-1"].0 == "RUNNING" && s["x-2"].0 == "PENDING").then_some(())
    });
    run_ok(sweep(root.path()).arg("cancel").arg(&m));
    let s = wait_until_done(root.path(), &m, 30);
    assert_eq!(
        (s["x-1"].0.as_str(), s["x-2"].0.as_str()),
        ("CANCELLED", "CANCELLED")
    );
    for run in ["x-1", "x-2"] {
        let dir = root.path().join("results/never").join(run);
        let recorded = std::fs::read_to_string(dir.join("cancelled")).unwrap();
        assert_eq!(recorded.trim(), super::support::job_id(&dir));
    }
}

/// `sbatch` that fails after the controller queued the job (it timed out
/// answering): the job SLURM holds is found by its script and recorded, so
/// submitting again does not run it twice.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_job_queued_by_an_sbatch_that_failed_is_recorded_not_sent_again() {
    require_cluster();
    let root = project();
    let path = site_tool(
        root.path(),
        "sbatch",
        "REAL \"$@\" > /dev/null || exit 1\necho 'sbatch: error: Batch job submission failed: Socket timed out on send/recv operation' >&2\nexit 1\n",
    );
    let m = root.path().join("m.toml");
    let name = format!("sweep-test-timedout-{}", std::process::id());
    write(&m, &format!("name = \"timedout\"\ncommand = \"sleep 2\"\n[sweep.grid]\nx = [1, 2]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\n"));
    let submit = || {
        sweep(root.path())
            .env("PATH", &path)
            .args(["submit", m.to_str().unwrap(), "--executor", "slurm"])
            .output()
            .unwrap()
    };
    let first = submit();
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{err}");
    assert!(
        err.contains("sbatch failed (")
            && err.contains("Socket timed out")
            && err.contains("but SLURM holds job"),
        "{err}"
    );
    let again = submit();
    assert!(
        again.status.success() && !stdout(&again).contains("submitted job"),
        "{again:?}"
    );
    assert_eq!(jobs_named(&name), 2, "each run once");
    let s = wait_until_done(root.path(), &m, 60);
    assert!(
        s.values()
            .all(|(st, code)| st == "COMPLETED" && *code == Some(0)),
        "{s:?}"
    );
}

/// A busy controller times out (`slurm_load_jobs error: Socket timed out`)
/// while `sweep run` follows its jobs: it says so, asks again a little later,
/// and follows the jobs to their end and the report.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_scheduler_that_times_out_for_a_while_is_asked_again() {
    require_cluster();
    let root = project();
    let running = root.path().join("running");
    let failed = root.path().join("failed");
    // Once the job runs, the next two queries fail as a busy slurmctld's do.
    let path = site_tool(
        root.path(),
        "squeue",
        &format!(
            "if [ -e {r} ] && [ $(cat {f} 2>/dev/null | wc -l) -lt 2 ]; then\n  echo x >> {f}\n  echo 'squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation' >&2\n  exit 1\nfi\nexec REAL \"$@\"\n",
            r = running.display(),
            f = failed.display(),
        ),
    );
    let m = root.path().join("m.toml");
    write(
        &m,
        &format!(
            "name = \"busy\"\ncommand = \"touch {} && sleep 10\"\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-busy\"\n",
            running.display()
        ),
    );
    let (out, text) = sweep_slurm(sweep(root.path()).env("PATH", &path), "run", &m);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        std::fs::read_to_string(&failed).unwrap().lines().count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("sweep: asking the scheduler failed (")
            && text.contains("Socket timed out")
            && text.contains("asking again in 4 s")
            && text.contains("the scheduler answers again")
            && text.contains("the report, one page"),
        "{text}"
    );
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED");
}

/// A site's sbatch whose QOS takes at most `limit` queued jobs of the
/// user's (`MaxSubmitJobs`: each array task counts), refusing as SLURM does;
/// it counts the jobs named `name` only (the suite submits others). Returns
/// the PATH with it first.
fn qos_sbatch(root: &Path, name: &str, limit: usize) -> String {
    site_tool(
        root,
        "sbatch",
        &format!(
            "queued=$(squeue --me -h -r -n {name} | wc -l)\nwant=1\nfor a in \"$@\"; do case \"$a\" in --array=*) r=${{a#--array=}}; r=${{r%%%*}}; want=$(( ${{r#*-}} - ${{r%-*}} + 1 ));; esac; done\nif [ $((queued + want)) -gt {limit} ]; then\n  echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2\n  echo \"sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)\" >&2\n  exit 1\nfi\nexec REAL \"$@\"\n"
        ),
    )
}

/// A site whose QOS takes at most four queued jobs of yours: what SLURM
/// took is printed and recorded, the rest held back (`submit` exits 75);
/// `sweep run` offers it again as jobs end, and every run runs once.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn runs_a_submit_limit_holds_back_go_out_as_jobs_end() {
    require_cluster();
    let root = project();
    let name = format!("sweep-test-qos-{}", std::process::id());
    let path = qos_sbatch(root.path(), &name, 4);
    let m = root.path().join("m.toml");
    // Two headers (two time limits): two arrays of three runs.
    write(&m, &format!("name = \"qos\"\ncommand = \"sleep 2; echo ran {{{{ x }}}} >> $SWEEP_RUN_DIR/count\"\n[sweep.grid]\nx = [1, 2, 3]\n\"slurm.time\" = [\"5\", \"6\"]\n[slurm]\njob_name = \"{name}\"\n"));
    let sweep_with = |verb: &str| {
        let (out, text) = sweep_slurm(sweep(root.path()).env("PATH", &path), verb, &m);
        (out.status.code(), text)
    };
    let (code, text) = sweep_with("submit");
    assert_eq!(code, Some(75), "{text}");
    // The first array fits; of the second, the first part that fits.
    assert!(
        text.contains("array of 3 runs")
            && text.contains("(QOSMaxSubmitJobPerUserLimit): 2 run(s) not submitted")
            && text.contains("`sweep run "),
        "{text}"
    );
    assert_eq!(text.matches("submitted job ").count(), 2, "{text}");
    assert_eq!(jobs_named(&name), 4);
    let (code, text) = sweep_with("run");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("2 run(s) wait, and go out as jobs end")
            && text.contains("sweep: every run is submitted"),
        "{text}"
    );
    assert_eq!(jobs_named(&name), 6, "each run once");
    let s = status(root.path(), &m);
    assert_eq!(s.len(), 6);
    for (run, (state, _)) in s {
        assert_eq!(state, "COMPLETED", "{run}");
        let count = root.path().join("results/qos").join(&run).join("count");
        let x = &run[2..3];
        assert_eq!(
            std::fs::read_to_string(count).unwrap(),
            format!("ran {x}\n"),
            "{run}"
        );
    }
}

/// A login profile's SLURM defaults (`SBATCH_PARTITION`, `SBATCH_TIMELIMIT`,
/// `SBATCH_OUTPUT`, `SBATCH_ERROR`; `SQUEUE_PARTITION`) neither move a run
/// away from its manifest's partition, time limit and log, nor hide its job
/// from sweep; a default the manifest does not set still applies.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_login_profiles_slurm_defaults_change_no_run() {
    require_cluster();
    let root = project();
    let name = format!("sweep-test-profile-{}", std::process::id());
    let m = root.path().join("m.toml");
    write(&m, &format!("name = \"profile\"\ncommand = \"echo step 1 tps {{{{ x }}}}; echo step 2 tps {{{{ x }}}} >&2\"\n[sweep.grid]\nx = [100, 200]\n[slurm]\npartition = \"debug\"\ntime = \"5\"\njob_name = \"{name}\"\n[report]\nskip_first = 0\nline_pattern = 'step (?P<step>\\d+) tps (?P<tokens_per_second>\\d+)'\n"));
    let elsewhere = root.path().join("elsewhere");
    let (out, text) = sweep_slurm(
        sweep(root.path())
            .env("SBATCH_PARTITION", "short")
            .env("SBATCH_TIMELIMIT", "7")
            .env("SBATCH_OUTPUT", elsewhere.join("%j.out"))
            .env("SBATCH_ERROR", elsewhere.join("%j.err"))
            .env("SBATCH_EXCLUSIVE", "user")
            .env("SQUEUE_PARTITION", "normal"),
        "run",
        &m,
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("sweep: SBATCH_PARTITION=short in your environment is left out of sbatch's")
            && !text.contains("SBATCH_EXCLUSIVE"),
        "{text}"
    );
    assert!(!elsewhere.exists(), "{text}");
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("results/profile/x-100/run.json")).unwrap(),
    )
    .unwrap();
    let job = rec["jobs"][0]["job_id"].as_str().unwrap().to_string();
    let shown = stdout(&run_ok(
        Command::new("squeue").args(["-h", "-t", "all", "-j", &job, "-o", "%P %l"]),
    ));
    assert_eq!(shown.trim(), "debug 5:00", "{text}");
    // Both streams in the run's log: both points read.
    let summary = std::fs::read_to_string(root.path().join("results/profile/summary.csv")).unwrap();
    assert!(
        summary.contains("x-200") && summary.contains("200"),
        "{summary}"
    );
    let log = std::fs::read_dir(root.path().join("results/profile/x-200"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with(".out"))
        .expect("the job's log in its run directory");
    let log = std::fs::read_to_string(log.path()).unwrap();
    assert!(
        log.contains("step 1 tps 200") && log.contains("step 2 tps 200"),
        "{log}"
    );
}

/// A login profile's `SBATCH_WAIT` and `SBATCH_ARRAY_INX` neither keep
/// `sweep submit` waiting for each job to end (sbatch's `--wait`) nor make a
/// single run's job an array: sweep leaves them out of sbatch's environment,
/// and says so.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_profiles_sbatch_wait_and_array_leave_the_submit_as_planned() {
    require_cluster();
    let root = project();
    let name = format!("sweep-test-wait-{}", std::process::id());
    let m = root.path().join("m.toml");
    write(&m, &format!("name = \"wait\"\ncommand = \"while [ ! -e go ]; do sleep 0.2; done; echo step 1 tps 5\"\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\n[report]\nskip_first = 0\nline_pattern = 'step (?P<step>\\d+) tps (?P<tokens_per_second>\\d+)'\n"));
    let mut submit = sweep(root.path())
        .env("SBATCH_WAIT", "1")
        .env("SBATCH_ARRAY_INX", "0-2")
        .args(["submit", "--executor", "slurm"])
        .arg(&m)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its job waits for `go`: a submit that waited for it would never end.
    wait_for(120, "sweep submit to return while its job waits", || {
        submit.try_wait().unwrap()
    });
    let out = submit.wait_with_output().unwrap();
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    for v in ["SBATCH_WAIT", "SBATCH_ARRAY_INX"] {
        assert!(
            text.contains(&format!(
                "sweep: {v} in your environment is left out of sbatch's"
            )),
            "{text}"
        );
    }
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("results/wait/run/run.json")).unwrap(),
    )
    .unwrap();
    let job = rec["jobs"][0]["job_id"].as_str().unwrap().to_string();
    let shown = stdout(&run_ok(
        Command::new("squeue").args(["-h", "-t", "all", "-j", &job, "-o", "%i"]),
    ));
    assert_eq!(shown.trim(), job, "one job, not an array: {text}");
    std::fs::write(root.path().join("go"), "").unwrap();
    let (out, text) = sweep_slurm(&mut sweep(root.path()), "run", &m);
    assert!(out.status.success(), "{text}");
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED", "{text}");
}

/// A job whose log cannot be opened on its node (as where the compute
/// nodes do not see the run directory: a login node's /tmp) fails at its
/// launch with nothing written: the report says what that means, not
/// `signal 53`. The site's sbatch makes the log's path a directory before
/// the job may start.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_job_slurm_could_not_launch_is_explained() {
    require_cluster();
    let root = project();
    let study = root.path().join("results/nolog/run");
    let path = site_tool(
        root.path(),
        "sbatch",
        &format!("id=$(REAL --hold \"$@\") || exit 1\njob=${{id%%;*}}\nmkdir -p {}/sweep-test-nolog-$job.out\nscontrol release $job\necho $id\n", study.display()),
    );
    let m = root.path().join("m.toml");
    write(&m, "name = \"nolog\"\ncommand = \"echo step 1 tps 100\"\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-nolog\"\n");
    let (out, text) = sweep_slurm(sweep(root.path()).env("PATH", &path), "run", &m);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("note: run: FAILED (JobLaunchFailure), its job ")
            && text.contains("left no log in the run directory: SLURM could not start it there")
            && !text.contains("signal 53"),
        "{text}"
    );
}

/// A job held (by its user, an administrator, or SLURM after a launch
/// failed) never starts by itself: `sweep run` names it and how it goes
/// on, and follows it once released.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_held_job_is_named_and_followed_once_released() {
    require_cluster();
    let root = project();
    let path = site_tool(root.path(), "sbatch", "exec REAL --hold \"$@\"\n");
    let m = root.path().join("m.toml");
    write(&m, "name = \"held\"\ncommand = \"echo step 1 tps 100\"\n[slurm]\ntime = \"5\"\njob_name = \"sweep-test-held\"\n");
    let (out, err) = (root.path().join("run.out"), root.path().join("run.err"));
    let mut run = sweep(root.path())
        .env("PATH", &path)
        .args(["run", m.to_str().unwrap(), "--executor", "slurm"])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&out).unwrap() + &std::fs::read_to_string(&err).unwrap();
    let job = wait_for(60, "the held job named", || {
        let text = said();
        let at = text.find("sweep: job ")?;
        let rest = &text[at + "sweep: job ".len()..];
        rest.contains(" is held (JobHeldUser): it starts only once released (`scontrol release ")
            .then(|| rest.split(' ').next().unwrap().to_string())
    });
    assert!(said().contains("1 pending (JobHeldUser)"), "{}", said());
    run_ok(Command::new("scontrol").args(["release", &job]));
    let code = wait_for(60, "sweep run to end", || run.try_wait().unwrap());
    assert!(code.success(), "{}", said());
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED");
}

/// `sweep run` typed inside an allocation (`salloc --mem-per-cpu=…`, an
/// interactive `srun --pty bash`): its variables are the environment sweep
/// submits from, and must not reach the jobs, whose `srun` would read them
/// (`srun: fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and
/// SLURM_MEM_PER_NODE are mutually exclusive`).
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_study_submitted_from_inside_an_allocation_runs() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"alloc\"\ncommand = \"echo step 1 tps 100\"\n[defaults]\nlauncher = \"srun\"\n[slurm]\ntime = \"5\"\nmem = \"500M\"\ncpus_per_task = 1\njob_name = \"sweep-test-alloc\"\n");
    // What `salloc -n1 --mem-per-cpu=100 --cpus-per-task=2` exports.
    let (out, text) = sweep_slurm(
        sweep(root.path())
            .env("SLURM_JOB_ID", "999999")
            .env("SLURM_MEM_PER_CPU", "100")
            .env("SRUN_CPUS_PER_TASK", "2"),
        "run",
        &m,
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("sweep: submitting from inside SLURM job 999999: its SLURM_* and SRUN_* variables are left out"),
        "{text}"
    );
    assert_eq!(status(root.path(), &m)["run"].0, "COMPLETED", "{text}");
}

/// `array_throttle = 1` holds across the arrays a submit limit splits a
/// group into, and across the held runs sent later: never two runs at once.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_throttle_holds_across_the_arrays_a_submit_limit_makes() {
    require_cluster();
    let root = project();
    let name = format!("sweep-test-qos-throttle-{}", std::process::id());
    let path = qos_sbatch(root.path(), &name, 4);
    let m = root.path().join("m.toml");
    write(&m, &format!("name = \"qost\"\ncommand = \"date +%s.%N > $SWEEP_RUN_DIR/start; echo {{{{ x }}}}; sleep 1; date +%s.%N > $SWEEP_RUN_DIR/end\"\n[sweep.grid]\nx = [1, 2, 3, 4, 5, 6]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\narray_throttle = 1\n"));
    let (out, text) = sweep_slurm(sweep(root.path()).env("PATH", &path), "run", &m);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("run(s) wait"), "{text}");
    let dir = root.path().join("results/qost");
    let read = |run: &str, what: &str| -> f64 {
        std::fs::read_to_string(dir.join(run).join(what))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let mut spans: Vec<(f64, f64, String)> = (1..=6)
        .map(|x| format!("x-{x}"))
        .map(|r| (read(&r, "start"), read(&r, "end"), r))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for w in spans.windows(2) {
        assert!(
            w[1].0 >= w[0].1,
            "{} started before {} ended: {spans:?}\n{text}",
            w[1].2,
            w[0].2
        );
    }
}

/// `sweep cancel` while a `sweep run` holds runs back for a submit limit:
/// the cancelled jobs' end makes room, and the runs held back must not go
/// out then.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_cancel_stops_what_a_submit_limit_held_back() {
    require_cluster();
    let root = project();
    let name = format!("sweep-test-qos-cancel-{}", std::process::id());
    let path = qos_sbatch(root.path(), &name, 2);
    let m = root.path().join("m.toml");
    write(&m, &format!("name = \"qosc\"\ncommand = \"echo {{{{ x }}}}; sleep 60\"\n[sweep.grid]\nx = [1, 2, 3, 4, 5, 6]\n[slurm]\ntime = \"5\"\njob_name = \"{name}\"\n"));
    let log = root.path().join("run.log");
    let mut run = sweep(root.path())
        .env("PATH", &path)
        .args(["run", m.to_str().unwrap(), "--executor", "slurm"])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(root.path().join("run.err")).unwrap())
        .spawn()
        .unwrap();
    let said = || {
        std::fs::read_to_string(&log).unwrap()
            + &std::fs::read_to_string(root.path().join("run.err")).unwrap()
    };
    wait_for(60, "the runs held back", || {
        said().contains("4 run(s) wait").then_some(())
    });
    run_ok(sweep(root.path()).env("PATH", &path).arg("cancel").arg(&m));
    let code = wait_for(60, "sweep run to end", || run.try_wait().unwrap());
    let text = said();
    assert_eq!(code.code(), Some(1), "{text}");
    assert!(
        text.contains("`sweep cancel` cancelled the study's jobs: the 4 run(s) SLURM held back are not submitted"),
        "{text}"
    );
    assert_eq!(
        text.matches("submitted job ").count(),
        1,
        "nothing sent after the cancel: {text}"
    );
    let s = status(root.path(), &m);
    let count = |state: &str| s.values().filter(|(st, _)| st == state).count();
    assert_eq!((count("CANCELLED"), count("UNSUBMITTED")), (2, 4), "{s:?}");
}

/// Ctrl-C on `sweep run` on SLURM stops the watching, not the jobs; `sweep
/// run` again follows the jobs still going until they end, then reports.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_rerun_follows_the_jobs_still_going_then_reports() {
    require_cluster();
    let root = project();
    let m = super::train::manifest(
        root.path(),
        "follow",
        "training_steps = 60\nsequence_length = 32",
        "[sweep.grid]\nbatch_size = [1, 2]",
    );
    let child = sweep(root.path())
        .arg("run")
        .arg(&m)
        .args(["--executor", "slurm"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(60, "the jobs to run", || {
        let s = status(root.path(), &m);
        s.values().any(|v| v.0 == "RUNNING").then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(
        err.contains("the jobs go on") && err.contains("again follows them"),
        "{err}"
    );
    let again = sweep(root.path())
        .arg("run")
        .arg(&m)
        .args(["--executor", "slurm"])
        .output()
        .unwrap();
    let text = stdout(&again);
    assert!(
        again.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(
        text.contains("batch_size-2") && text.contains("the report, one page"),
        "{text}"
    );
    let s = status(root.path(), &m);
    assert!(s.values().all(|v| v.0 == "COMPLETED"), "{s:?}");
    for run in ["batch_size-1", "batch_size-2"] {
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                root.path()
                    .join("results/follow")
                    .join(run)
                    .join("run.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            record["jobs"].as_array().unwrap().len(),
            1,
            "{run} submitted once"
        );
        // The job script wrote what it ran on: the cluster and partition
        // are the history's system.
        let fp: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                root.path()
                    .join("results/follow")
                    .join(run)
                    .join("environment.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(fp["system"], "sweeplocal/debug", "{fp}");
        assert_eq!(fp["slurm_job"], record["jobs"][0]["job_id"], "{fp}");
        assert!(!fp["nodes"].as_array().unwrap().is_empty(), "{fp}");
        // A build with MPI names the Open MPI library file it loaded.
        if cfg!(feature = "mpi") {
            let mpi = fp["libraries"]["libmpi"].as_str().unwrap_or_default();
            assert!(mpi.contains("libmpi.so."), "{fp}");
        }
    }
    let history: Vec<serde_json::Value> = serde_json::from_slice(
        &run_ok(sweep(root.path()).args(["history", "results/follow", "--json"])).stdout,
    )
    .unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    assert!(history.iter().all(|h| h["system"] == "sweeplocal/debug"));
}

/// `sbatch --test-only` on every job script rendered from experiments/. The
/// scripts are submitted as rendered; only resources this 2-core machine
/// lacks (GPUs beyond its two fake ones, CPUs beyond its cores) are lowered on
/// the command line, which sbatch applies over the #SBATCH lines.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn every_script_rendered_from_experiments_passes_sbatch_test_only() {
    require_cluster();
    let root = project();
    let mut scripts = Vec::new();
    for e in std::fs::read_dir(repo().join("experiments")).unwrap() {
        let m = e.unwrap().path();
        // The reference study's GPU runs are rendered for a GPU build of
        // sweep elsewhere (this one has no CUDA).
        run_ok(
            sweep(root.path())
                .arg("render")
                .arg(&m)
                .env("SWEEP_BIN", "/opt/sweep-gpu/bin/sweep"),
        );
    }
    collect_scripts(&root.path().join("results"), &mut scripts);
    assert!(
        scripts.len() >= 8 + 2 + 8 + 6 + 8 + 24,
        "{} scripts",
        scripts.len()
    );
    let cores = std::thread::available_parallelism().unwrap().get();
    for s in scripts {
        let text = std::fs::read_to_string(&s).unwrap();
        let mut cmd = Command::new("sbatch");
        cmd.arg("--test-only");
        if sbatch_value(&text, "--gpus-per-node").is_some_and(|g| g > 2) {
            cmd.arg("--gpus-per-node=2");
        }
        if sbatch_value(&text, "--cpus-per-task").is_some_and(|c| c > cores) {
            cmd.arg("--cpus-per-task=1");
        }
        if sbatch_value(&text, "--nodes").is_some_and(|n| n > 1) {
            cmd.arg("--nodes=1");
        }
        if sbatch_value(&text, "--ntasks-per-node").is_some_and(|n| n > cores) {
            cmd.arg(format!("--ntasks-per-node={cores}"));
        }
        let out = cmd.arg(&s).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.contains("to start at"),
            "{}: {err}",
            s.display()
        );
    }
}

/// A whole local study inside one allocation (`sbatch --ntasks=2 --wrap
/// "sweep run --executor local …"`, a study on one node without a job per
/// run): the batch step's task variables (SLURM_PROCID 0 of SLURM_NTASKS 2)
/// are sweep's own, not its runs': each one-rank run trains as one rank.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_local_study_inside_an_allocation_trains_each_run_as_one_rank() {
    require_cluster();
    let root = project();
    let m = super::train::manifest(
        root.path(),
        "inside",
        "training_steps = 4\nsequence_length = 32",
        "[sweep.grid]\nseed = [1, 2]",
    );
    let (out, said) = super::support::sweep_run_in_allocation(
        &mut Command::new("sbatch"),
        root.path(),
        &m,
        &["--ntasks=2", "--time=5", "--job-name=sweep-test-inside"],
    );
    assert!(
        out.status.success(),
        "the allocation's sweep run: {}\n{said}",
        String::from_utf8_lossy(&out.stderr)
    );
    let states = status(root.path(), &m);
    assert_eq!(states.len(), 2, "{states:?}");
    for (run, (state, _)) in &states {
        assert_eq!(state, "COMPLETED", "{run}: {said}");
        let last = metrics(&root.path().join("results/inside").join(run))
            .last()
            .cloned()
            .unwrap();
        assert_eq!(last["world_size"], 1, "{run}: {last}");
    }
}

fn sbatch_value(script: &str, flag: &str) -> Option<usize> {
    script.lines().find_map(|l| {
        l.strip_prefix(&format!("#SBATCH {flag}="))?
            .trim()
            .parse()
            .ok()
    })
}

fn collect_scripts(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect_scripts(&p, out);
        } else if p.file_name().is_some_and(|n| n == "job.sbatch") {
            out.push(p);
        }
    }
}

/// A blocked study packed on SLURM: 4 configurations × 3 blocks go out as
/// 3 jobs that run 12 runs, each block's runs one after another in the
/// order `order_seed` draws (another order per block), each run with a
/// directory of its own; a run that fails does not end its block.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_packed_blocked_study_runs_each_block_as_one_job() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    let name = format!("sweep-test-packed-{}", std::process::id());
    write(
        &m,
        &format!(
            r#"name = "packed"
command = "echo config {{{{ cfg }}}} of block {{{{ repeat }}}}; exit {{{{ 3 if cfg == 'c' else 0 }}}}"
[sweep]
design = "blocks"
repeats = 3
order_seed = 4
name = "{{{{ cfg }}}}"
[sweep.grid]
cfg = ["a", "b", "c", "d"]
[slurm]
time = "2"
pack = true
job_name = "{name}"
"#
        ),
    );
    let plan: Vec<serde_json::Value> =
        serde_json::from_slice(&run_ok(sweep(root.path()).args(["plan", "--json"]).arg(&m)).stdout)
            .unwrap();
    let shown = stdout(&run_ok(sweep(root.path()).arg("plan").arg(&m)));
    assert!(
        shown.contains("3 jobs from     3 sbatch submissions")
            && shown.contains("12 jobs from     1 sbatch submissions"),
        "both designs' costs: {shown}"
    );
    let out = submit_slurm(root.path(), &m);
    for b in 1..=3 {
        assert!(
            out.contains(&format!("block {b} of 4 runs, packed")),
            "{out}"
        );
    }
    assert_eq!(jobs_named(&name), 3, "a job per block");
    let s = wait_until_done(root.path(), &m, 90);
    assert_eq!(s.len(), 12);
    let study = root.path().join("results/packed");
    // Each block ran its runs in the plan's order, which the seed drew.
    let logs = std::fs::read_dir(study.join("logs")).unwrap();
    let mut ran: Vec<Vec<String>> = logs
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            text.lines()
                .filter_map(|l| l.strip_prefix("sweep: block "))
                .filter_map(|l| Some(l.split_once(": ")?.1.split_once(" on ")?.0))
                .map(|dir| {
                    Path::new(dir)
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        })
        .collect();
    ran.sort_by_key(|names| {
        plan.iter()
            .find(|r| r["name"] == names[0].as_str())
            .map(|r| r["block"]["block"].as_u64().unwrap())
    });
    let planned: Vec<Vec<String>> = (1..=3)
        .map(|b| {
            plan.iter()
                .filter(|r| r["block"]["block"] == b)
                .map(|r| r["name"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(ran, planned, "each block in its planned order");
    let configs =
        |names: &Vec<String>| -> Vec<String> { names.iter().map(|n| n[..1].to_string()).collect() };
    let orders: Vec<Vec<String>> = ran.iter().map(configs).collect();
    assert!(
        orders[0] != orders[1] && orders[1] != orders[2] && orders[0] != orders[2],
        "another order per block: {orders:?}"
    );
    for r in &plan {
        let run = r["name"].as_str().unwrap();
        let dir = study.join(run);
        let cfg = r["params"]["cfg"].as_str().unwrap();
        let want = if cfg == "c" {
            ("FAILED".to_string(), Some(3))
        } else {
            ("COMPLETED".to_string(), Some(0))
        };
        assert_eq!(s[run], want, "{run}");
        for f in [
            "run.json",
            "config.toml",
            "job.sbatch",
            "exit_code",
            "started",
            "environment.json",
        ] {
            assert!(dir.join(f).is_file(), "{run}: {f}");
        }
        let log = super::support::job_logs(&dir);
        assert_eq!(log.matches("config ").count(), 1, "{run} ran once: {log}");
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
        assert_eq!(record["jobs"][0]["block"], r["block"]["block"], "{record}");
    }
    // The blocks' jobs ended with their failed run reported, not the block.
    let json: Vec<serde_json::Value> = serde_json::from_slice(
        &run_ok(sweep(root.path()).arg("status").arg(&m).arg("--json")).stdout,
    )
    .unwrap();
    assert!(json.iter().all(|r| r["packed_block"].is_u64()), "{json:?}");
}

/// A block of a packed study over a partition's time limit is refused at
/// plan time, with the block and the limit.
#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_packed_block_longer_than_its_partition_allows_is_refused_at_plan_time() {
    require_cluster();
    let root = project();
    let m = root.path().join("m.toml");
    let manifest = |configs: &str| {
        format!("name = \"long\"\ncommand = \"true\"\n[sweep]\ndesign = \"blocks\"\n[sweep.grid]\ncfg = [{configs}]\n[slurm]\ntime = \"4\"\npartition = \"short\"\npack = true\n")
    };
    // Three runs of 4 minutes and a 5-minute margin: 17 minutes > 10.
    write(&m, &manifest("1, 2, 3"));
    let err = super::support::run_err(sweep(root.path()).arg("plan").arg(&m));
    assert!(
        err.contains("partition `short` allows (0-00:10:00)")
            && err.contains("block 1 asks for 0-00:17:00"),
        "{err}"
    );
    let err = super::support::run_err(sweep(root.path()).arg("submit").arg(&m));
    assert!(err.contains("partition `short`"), "{err}");
    assert!(
        !root.path().join("results/long/blocks").exists(),
        "nothing submitted"
    );
    // One run: 4 + 5 minutes fit.
    write(&m, &manifest("1"));
    run_ok(sweep(root.path()).arg("plan").arg(&m));
}
