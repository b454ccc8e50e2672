//! When things go wrong, nothing is lost: interrupted and killed sweeps
//! continue on a plain re-run, two submits at once run nothing twice,
//! outputs never replace inputs or special files, a damaged checkpoint falls
//! back to the one before, a checkpoint resumes only into its own model, and
//! every option is bounded (tried under `ulimit -v` and `timeout`).

use super::support::{
    mkfifo, project, run_ok, status, stdout, stop_at_work, sweep, wait_for, write, Stopped,
};
use super::train::manifest as train_manifest;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A local study of `runs` command runs, `parallel` at a time: each appends
/// its name to the study's `executions` and then runs `body` (shell).
fn command_study(root: &Path, name: &str, runs: usize, parallel: usize, body: &str) -> PathBuf {
    let m = root.join(format!("{name}.toml"));
    let xs: Vec<String> = (1..=runs).map(|i| i.to_string()).collect();
    write(
        &m,
        &format!(
            "name = \"{name}\"\nexecutor = \"local\"\ncommand = '''echo x-{{{{ x }}}} >> \"$SWEEP_RUN_DIR/../executions\"; {body}'''\n[sweep.grid]\nx = [{}]\n[local]\nparallel = {parallel}\n",
            xs.join(", ")
        ),
    );
    m
}

/// How often each run executed, from the study's `executions`.
fn executions(root: &Path, study: &str) -> std::collections::BTreeMap<String, usize> {
    let text = std::fs::read_to_string(root.join("results").join(study).join("executions"))
        .unwrap_or_default();
    let mut counts = std::collections::BTreeMap::new();
    for l in text.lines() {
        *counts.entry(l.to_string()).or_default() += 1;
    }
    counts
}

fn states(root: &Path, m: &Path) -> Vec<String> {
    let s = status(root, m);
    let mut v: Vec<(String, String)> = s.into_iter().map(|(k, v)| (k, v.0)).collect();
    v.sort();
    v.into_iter().map(|(k, st)| format!("{k}={st}")).collect()
}

/// `sweep run <m>` again, which must succeed and leave every run COMPLETED.
fn rerun_completes(root: &Path, m: &Path, runs: usize) {
    let again = sweep(root).arg("run").arg(m).output().unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let want: Vec<String> = (1..=runs).map(|i| format!("x-{i}=COMPLETED")).collect();
    assert_eq!(states(root, m), want);
}

/// `sweep <verb> <m>` in the background, its output thrown away.
fn start_quietly(root: &Path, verb: &str, m: &Path) -> std::process::Child {
    sweep(root)
        .arg(verb)
        .arg(m)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn signal(child: &std::process::Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// `nohup sweep run …` (SIGHUP ignored from the start): the terminal closing
/// stops nothing, as the user asked; sweep and its jobs keep ignoring it and
/// the study completes (sweep had taken SIGHUP as a closed terminal and
/// stopped every job).
#[test]
fn a_sweep_started_under_nohup_outlives_its_terminal() {
    let root = project();
    let m = command_study(root.path(), "nohup", 2, 2, "sleep 3");
    let child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' HUP; exec {} -C {} run {}",
            env!("CARGO_BIN_EXE_sweep"),
            root.path().display(),
            m.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(30, "two running jobs", || {
        let s = status(root.path(), &m);
        (s.values().filter(|v| v.0 == "RUNNING").count() == 2).then_some(())
    });
    signal(&child, Signal::SIGHUP);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(states(root.path(), &m), ["x-1=COMPLETED", "x-2=COMPLETED"]);
    assert_eq!(executions(root.path(), "nohup").values().sum::<usize>(), 2);
}

/// Ctrl-C and a closed terminal (SIGHUP) on `sweep run`: the running jobs
/// are stopped, nothing is a failure, the message says what to type, and a
/// plain `sweep run` runs exactly what did not complete.
#[test]
fn an_interrupted_local_sweep_continues_on_a_plain_rerun() {
    for (sig, name) in [(Signal::SIGINT, "int"), (Signal::SIGHUP, "hup")] {
        let root = project();
        // The first attempt of each run hangs; the second finishes at once.
        let m = command_study(
            root.path(),
            name,
            3,
            2,
            "test -e \"$SWEEP_RUN_DIR/again\" || { touch \"$SWEEP_RUN_DIR/again\"; sleep 60; }",
        );
        let mut cmd = sweep(root.path());
        // SIGHUP as a terminal gives it, whatever this test inherited (a
        // suite started under `nohup` ignores it, and so would sweep).
        // SAFETY: `signal` is async-signal-safe, as pre_exec asks.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::signal::signal(Signal::SIGHUP, nix::sys::signal::SigHandler::SigDfl)
                    .map(drop)
                    .map_err(std::io::Error::from)
            })
        };
        let child = cmd
            .arg("run")
            .arg(&m)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(30, "two running jobs", || {
            let s = status(root.path(), &m);
            (s.values().filter(|v| v.0 == "RUNNING").count() == 2).then_some(())
        });
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{name}: {err}");
        if sig == Signal::SIGINT {
            assert!(
                err.contains("2 running (stopped; 0 wrote a checkpoint) and 1 not started")
                    && err.contains("INTERRUPTED, not failed")
                    && err.contains(&format!("`sweep run {}`", m.display())),
                "{err}"
            );
        }
        assert_eq!(
            states(root.path(), &m),
            ["x-1=INTERRUPTED", "x-2=INTERRUPTED", "x-3=INTERRUPTED"],
            "{name}"
        );
        rerun_completes(root.path(), &m, 3);
        // The two stopped runs ran twice, the one never started once.
        let runs = executions(root.path(), name);
        assert_eq!(runs.values().sum::<usize>(), 5, "{runs:?}");
        assert_eq!(runs.values().filter(|&&n| n == 2).count(), 2, "{runs:?}");
        // A run started again counts its restart, as a requeue does.
        let logs: Vec<String> = ["x-1", "x-2", "x-3"]
            .iter()
            .map(|r| {
                std::fs::read_to_string(
                    root.path()
                        .join("results")
                        .join(name)
                        .join(r)
                        .join("local.out"),
                )
                .unwrap_or_default()
            })
            .collect();
        assert_eq!(
            logs.iter().filter(|l| l.contains(", restart 1")).count(),
            2,
            "{logs:?}"
        );
    }
}

/// `sweep run` killed outright: its running job finishes and records its
/// end itself, the jobs it never started are INTERRUPTED, and a re-run
/// follows the job still running and runs the rest, each exactly once.
#[test]
fn a_killed_sweep_leaves_a_truthful_status_and_the_rerun_does_the_rest() {
    let root = project();
    // Each job long enough that `sweep status`, polled on a loaded machine,
    // sees one running and the kill lands while it still runs.
    let m = command_study(root.path(), "killed", 3, 1, "sleep 6");
    let mut child = start_quietly(root.path(), "run", &m);
    wait_for(30, "a running job", || {
        let s = status(root.path(), &m);
        s.values().any(|v| v.0 == "RUNNING").then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let after_kill = states(root.path(), &m);
    assert_eq!(
        after_kill
            .iter()
            .filter(|s| s.ends_with("=RUNNING"))
            .count(),
        1,
        "the orphaned job runs on: {after_kill:?}"
    );
    assert_eq!(
        after_kill
            .iter()
            .filter(|s| s.ends_with("=INTERRUPTED"))
            .count(),
        2,
        "{after_kill:?}"
    );
    // At once, while the orphan still runs: followed, not run again.
    rerun_completes(root.path(), &m, 3);
    let runs = executions(root.path(), "killed");
    assert_eq!(
        runs.values().copied().collect::<Vec<_>>(),
        [1, 1, 1],
        "{runs:?}"
    );

    // An orphan that fails records how: FAILED with its exit code, from
    // the run directory alone.
    let m = command_study(root.path(), "orphan", 1, 1, "sleep 5; exit 3");
    let mut child = start_quietly(root.path(), "submit", &m);
    wait_for(30, "the job to start", || {
        (status(root.path(), &m)["x-1"].0 == "RUNNING").then_some(())
    });
    child.kill().unwrap();
    child.wait().unwrap();
    let ended = wait_for(30, "the orphan to end", || {
        let s = status(root.path(), &m)["x-1"].clone();
        (s.0 != "RUNNING").then_some(s)
    });
    assert_eq!(ended, ("FAILED".into(), Some(3)));
    let exit = std::fs::read_to_string(root.path().join("results/orphan/x-1/exit_code")).unwrap();
    assert!(exit.trim().ends_with(" 3"), "{exit}");
}

/// Two `sweep submit` of one study at the same moment: the second waits for
/// the first (saying who holds the study) and every run executes once.
#[test]
fn two_submits_at_once_run_every_run_once() {
    let root = project();
    let m = command_study(root.path(), "twice", 8, 2, "sleep 0.3");
    let start = || {
        sweep(root.path())
            .arg("submit")
            .arg(&m)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    let runs = executions(root.path(), "twice");
    assert_eq!(runs.len(), 8, "{runs:?}");
    assert!(
        runs.values().all(|&n| n == 1),
        "no run executed twice: {runs:?}"
    );
    let said: String = [&a, &b]
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    assert!(
        said.contains("is held by process") && said.contains("waiting until it is done"),
        "{said}"
    );
    let both: String = [&a, &b].iter().map(|o| stdout(o)).collect();
    assert!(
        both.contains("nothing to submit"),
        "the second found all done: {both}"
    );
}

/// The bundled tokenizer (test projects hold no assets).
fn tokenizer() -> String {
    super::support::repo()
        .join("assets/tokenizers/mistral-7b/tokenizer.json")
        .display()
        .to_string()
}

/// `sweep pretokenize` stopped by SIGTERM (as SLURM cancels): no output and
/// no temporary file is left; one a SIGKILL left behind is removed by the next run.
#[test]
fn a_stopped_pretokenize_leaves_nothing_behind() {
    let root = project();
    let d = root.path();
    // Many small row groups of text, so that the run takes seconds.
    let text: String = (0..200_000)
        .map(|i| {
            format!("Paragraph {i} of a long and repetitive book about training throughput.\n\n")
        })
        .collect();
    write(&d.join("book.txt"), &text);
    run_ok(sweep(d).args([
        "data",
        "import-text",
        "book.txt",
        "--out",
        "book.parquet",
        "--row-group-size",
        "20",
        "--median-kb",
        "0.5",
    ]));
    let out = d.join("pretok");
    let tok = tokenizer();
    let temps = |out: &Path| -> Vec<String> {
        std::fs::read_dir(out)
            .map(|r| {
                r.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let pretokenize = || {
        let mut cmd = sweep(d);
        cmd.args([
            "pretokenize",
            "--input",
            "book.parquet",
            "--out",
            "pretok",
            "--threads",
            "1",
            "--quiet",
            "--sequence-length",
            "64",
            "--tokenizer",
            &tok,
        ]);
        cmd
    };
    let Stopped { code, took, stderr } = stop_at_work(
        pretokenize,
        || temps(&out).iter().any(|n| n.starts_with(".pretokenize-")),
        || drop(std::fs::remove_dir_all(&out)),
        Signal::SIGTERM,
        5,
    )
    .unwrap_or_else(|o| panic!("pretokenize ended before it was seen at work, 5 times: {o:?}"));
    // At once (within five seconds on any load), as SLURM's KillWait expects.
    assert!(
        code == Some(143)
            && stderr.contains("stopped by SIGTERM")
            && took < std::time::Duration::from_secs(5),
        "{code:?} after {took:?}: {stderr}"
    );
    assert_eq!(
        temps(&out),
        Vec::<String>::new(),
        "nothing left in {}",
        out.display()
    );

    // What a SIGKILL leaves (an unlocked temporary) goes at the next run.
    write(&out.join(".pretokenize-left"), "half a file");
    let o = run_ok(sweep(d).args([
        "pretokenize",
        "--input",
        "book.parquet",
        "--out",
        "pretok",
        "--quiet",
        "--sequence-length",
        "64",
        "--format",
        "padded",
        "--tokenizer",
        &tok,
    ]));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("removed")
            && !out.join(".pretokenize-left").exists()
    );
    assert_eq!(temps(&out), ["padded.parquet"]);
}

/// Outputs never replace an input (by identity: another name, a link, a hard
/// link) nor a device, FIFO or other special file; `-` is standard output.
#[test]
fn outputs_never_replace_inputs_or_special_files() {
    let root = project();
    let d = root.path();
    write(
        &d.join("notes.txt"),
        "The only copy of my notes.\n\nA second paragraph.\n",
    );
    std::fs::hard_link(d.join("notes.txt"), d.join("alias.txt")).unwrap();
    std::os::unix::fs::symlink(d.join("notes.txt"), d.join("link.parquet")).unwrap();
    std::os::unix::fs::symlink("/dev/null", d.join("null.parquet")).unwrap();
    let fifo = d.join("fifo.json");
    mkfifo(&fifo);
    let refused = |args: &[&str], why: &str| {
        let o = sweep(d).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(why), "{args:?}: {err}");
    };
    for out in [
        "notes.txt",
        "alias.txt",
        "link.parquet",
        "./sub/../notes.txt",
    ] {
        std::fs::create_dir_all(d.join("sub")).unwrap();
        refused(
            &["data", "import-text", "notes.txt", "--out", out],
            "would destroy the input",
        );
    }
    refused(
        &["data", "import-text", "notes.txt", "--out", "null.parquet"],
        "a device",
    );
    refused(
        &["data", "import-text", "notes.txt", "--out", "fifo.json"],
        "a FIFO",
    );
    assert_eq!(
        std::fs::read_to_string(d.join("notes.txt")).unwrap(),
        "The only copy of my notes.\n\nA second paragraph.\n"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());

    // pretokenize whose input lies at its output path.
    run_ok(sweep(d).args(["data", "import-text", "notes.txt", "--out", "notes.parquet"]));
    let tok = tokenizer();
    run_ok(sweep(d).args([
        "pretokenize",
        "--input",
        "notes.parquet",
        "--out",
        "p",
        "--format",
        "padded",
        "--quiet",
        "--sequence-length",
        "16",
        "--tokenizer",
        &tok,
    ]));
    let before = std::fs::read(d.join("p/padded.parquet")).unwrap();
    refused(
        &[
            "pretokenize",
            "--input",
            "p/padded.parquet",
            "--text-column",
            "input_ids",
            "--out",
            "p",
            "--format",
            "padded",
            "--force",
        ],
        "would destroy the input",
    );
    assert_eq!(std::fs::read(d.join("p/padded.parquet")).unwrap(), before);

    // A report's tables over the logs it imports.
    write(&d.join("logs/summary.md"), "Step: 1 | Loss: 10.0 | Tokens per second: 100.0 | Training tokens per second (%): 50.0 | MFU (%): 1.0 | TFLOPs: 0.1\n");
    refused(
        &[
            "report",
            "--import",
            "logs/summary.md",
            "--log-format",
            "reference",
            "--out",
            "logs",
            "--no-plots",
        ],
        "would destroy the input",
    );
    refused(
        &[
            "bench",
            "kernels",
            "--json",
            "fifo.json",
            "--repeats",
            "1",
            "--tokens",
            "64",
        ],
        "a FIFO",
    );
}

/// A small training run through `sweep train`, with `extra` in its configuration.
fn train_run(root: &Path, name: &str, extra: &str) -> PathBuf {
    run_ok(
        sweep(root)
            .arg("render")
            .arg(train_manifest(root, name, extra, "")),
    );
    root.join("results").join(name).join("run")
}

fn train(root: &Path, run: &Path) -> std::process::Output {
    sweep(root)
        .arg("train")
        .arg("--config")
        .arg(run.join("config.toml"))
        .output()
        .unwrap()
}

fn set_steps(run: &Path, steps: usize) {
    let cfg = run.join("config.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = regex_replace(&text, "training_steps = ", &steps.to_string());
    std::fs::write(&cfg, text).unwrap();
}

/// `key<old value>` → `key<new>` on the line that starts with `key`.
fn regex_replace(text: &str, key: &str, new: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix(key) {
            Some(_) => format!("{key}{new}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The newest checkpoint truncated (or its optimizer file emptied, or its
/// table of contents missing): skipped with a note that
/// names it and why, and the run resumes from the one before.
#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_one_before() {
    let root = project();
    let extra = "training_steps = 4\ncheckpoint_every = 2\nsequence_length = 32";
    for (name, damage) in [
        ("truncated", "model"),
        ("empty", "optimizer"),
        ("unfinished", "contents"),
    ] {
        let run = train_run(root.path(), name, extra);
        let o = train(root.path(), &run);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ckpt = |s: usize| run.join(format!("checkpoints/step-{s:08}"));
        assert!(ckpt(2).join("checkpoint.json").is_file() && ckpt(4).is_dir());
        match damage {
            "model" => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(ckpt(4).join("model.safetensors"))
                    .unwrap();
                let len = f.metadata().unwrap().len();
                f.set_len(len / 2).unwrap();
            }
            "optimizer" => std::fs::write(ckpt(4).join("optimizer.safetensors"), b"").unwrap(),
            _ => {
                // Never finished (or an earlier build's): no table of contents.
                std::fs::remove_file(ckpt(4).join("checkpoint.json")).unwrap();
            }
        }
        set_steps(&run, 6);
        let o = train(root.path(), &run);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!("checkpoint {} skipped:", ckpt(4).display()))
                && err.contains(&format!("resumed from {} (step 2", ckpt(2).display())),
            "{name}: {err}"
        );
        let why = match damage {
            "model" => "model.safetensors is",
            "optimizer" => "optimizer.safetensors is 0 bytes",
            _ => "it has no checkpoint.json",
        };
        assert!(err.contains(why), "{name}: {err}");
        let steps: Vec<u64> = super::support::metrics(&run)
            .iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect();
        assert_eq!(
            steps,
            [1, 2, 3, 4, 5, 6],
            "{name}: steps 3 and 4 trained again, once"
        );
    }
}

/// One process stops between the micro-batches of a step: it abandons the
/// step (of 400 micro-batches), checkpoints the last whole one, and resumes
/// from it.
#[test]
fn a_stop_signal_between_micro_batches_checkpoints_the_last_whole_step() {
    let root = project();
    let run = train_run(
        root.path(),
        "micro",
        "training_steps = 3\nsequence_length = 32\ngradient_accumulation = 400",
    );
    let child = sweep(root.path())
        .arg("train")
        .arg("--config")
        .arg(run.join("config.toml"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(120, "step 1", || {
        (!super::support::metrics(&run).is_empty()).then_some(())
    });
    signal(&child, Signal::SIGTERM);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(99), "{err}");
    assert!(
        err.contains("SIGTERM received during step 2")
            && err.contains(&format!(
                "checkpoint {} written at step 1",
                run.join("checkpoints/step-00000001").display()
            )),
        "{err}"
    );
    // Step 2 was abandoned, not finished: the checkpoint is step 1's.
    assert!(!run.join("checkpoints/step-00000002").exists());
    let o = train(root.path(), &run);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let steps: Vec<u64> = super::support::metrics(&run)
        .iter()
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3]);
}

/// `sweep train` of `run` where no file may grow past `kib` KiB (bash's
/// `ulimit -f`), SIGXFSZ ignored: a write past it fails (EFBIG) as on a
/// full disk.
fn train_within_file_size(root: &Path, run: &Path, kib: u64) -> std::process::Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {kib}; exec {} -C . train --config {}",
            env!("CARGO_BIN_EXE_sweep"),
            run.join("config.toml").display()
        ))
        .current_dir(root)
        .output()
        .unwrap()
}

/// A disk that fills while a checkpoint is written (a file-size limit here):
/// the error names the checkpoint and the file, and no partial checkpoint stays.
#[test]
fn a_full_disk_names_the_checkpoint_and_the_file() {
    let root = project();
    let run = train_run(
        root.path(),
        "full",
        "training_steps = 2\nsequence_length = 32",
    );
    // 2 MiB: the metrics log fits, the model's 8 MB do not.
    let o = train_within_file_size(root.path(), &run, 2048);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "writing checkpoint {}",
            run.join("checkpoints/step-00000002").display()
        )) && err.contains("model.safetensors")
            && err.contains("File too large"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "no partial checkpoint: {left:?}");
}

/// A disk already full when the trainer starts: the first thing it writes is
/// who holds the run's lock, and the error says so, with the system's reason
/// (it had said that two trainers of one run would write the same log).
#[test]
fn a_full_disk_at_the_start_names_the_lock_it_could_not_write() {
    let root = project();
    let run = train_run(root.path(), "full-at-start", "training_steps = 2");
    let o = train_within_file_size(root.path(), &run, 0);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "writing who holds the lock {}",
            run.join(".train.lock").display()
        )) && err.contains("File too large"),
        "{err}"
    );
    assert!(super::support::metrics(&run).is_empty());
}

/// A checkpoint of a 4-layer model never resumes into a 2-layer configuration.
#[test]
fn a_checkpoint_resumes_only_into_its_own_model() {
    let root = project();
    let run = train_run(
        root.path(),
        "deep",
        "training_steps = 2\nsequence_length = 32",
    );
    let cfg = run.join("config.toml");
    let layers = |n: usize| {
        let text = std::fs::read_to_string(&cfg).unwrap();
        let text = regex_replace(&text, "n_layers = ", &n.to_string());
        std::fs::write(&cfg, text).unwrap();
    };
    layers(4);
    let o = train(root.path(), &run);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    layers(2);
    set_steps(&run, 4);
    let o = train(root.path(), &run);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("was written by the model `tiny` (dim 32, 4 layers")
            && err.contains("this run trains `tiny` (dim 32, 2 layers"),
        "{err}"
    );
}

/// Runs `sweep <args>` under a 4 GB address-space limit and a 60 s timeout.
fn bounded(root: &Path, args: &[&str]) -> std::process::Output {
    // `sweep-bench` for the benchmarks of sweep's own tooling.
    let (bin, args) = match args {
        ["sweep-bench", rest @ ..] => (env!("CARGO_BIN_EXE_sweep-bench").to_string(), rest),
        _ => (format!("{} -C .", env!("CARGO_BIN_EXE_sweep")), args),
    };
    let quoted: Vec<String> = args
        .iter()
        .map(|a| shlex::try_quote(a).unwrap().into_owned())
        .collect();
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -v 4000000; exec timeout 60 {bin} {}",
            quoted.join(" ")
        ))
        .current_dir(root)
        .output()
        .unwrap()
}

/// What a local job leaves running when its shell exits (`cmd &`) is
/// stopped, as SLURM stops a job's processes at its end, and said in the
/// job's log: it would otherwise take cores from the runs measured after it.
#[test]
fn a_local_jobs_leftover_processes_are_stopped_and_said() {
    let root = project();
    let body = "sleep 300 & echo $! > \"$SWEEP_RUN_DIR/left.pid\"";
    let m = command_study(root.path(), "left", 1, 1, body);
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let run = root.path().join("results/left/x-1");
    let pid: i32 = std::fs::read_to_string(run.join("left.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
        })
    };
    assert!(gone(pid), "the job's `sleep 300 &` still runs");
    let log = std::fs::read_to_string(run.join("local.out")).unwrap();
    assert!(
        log.contains(&format!(
            "the job ended leaving 1 process(es) of its own running (pid {pid}); stopped them (SIGTERM"
        )),
        "{log}"
    );
    assert_eq!(status(root.path(), &m)["x-1"].0, "COMPLETED");
}

/// Two trainers of one run never write its log at once: the second waits
/// for the first (here the test, holding the run's lock as a trainer would)
/// and then trains, each step logged once.
#[test]
fn a_second_trainer_of_a_run_waits_for_the_first() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let root = project();
    let run = train_run(
        root.path(),
        "twice",
        "training_steps = 4\nsequence_length = 32",
    );
    let mut held = std::fs::File::create(run.join(".train.lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    writeln!(held, "process 1 on elsewhere (sweep train, job 7)").unwrap();
    let errors = root.path().join("second.err");
    let mut second = sweep(root.path())
        .args(["train", "--config"])
        .arg(run.join("config.toml"))
        .stderr(std::fs::File::create(&errors).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(60, "the second trainer to wait", || {
        let said = std::fs::read_to_string(&errors).unwrap_or_default();
        said.contains(
            "this run is being trained by process 1 on elsewhere (sweep train, job 7); waiting",
        )
        .then_some(())
    });
    assert!(second.try_wait().unwrap().is_none(), "it waits");
    assert!(
        !run.join("metrics.jsonl").exists(),
        "and writes nothing meanwhile"
    );
    drop(held);
    let status = second.wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&errors).unwrap()
    );
    let steps: Vec<u64> = super::support::metrics(&run)
        .iter()
        .filter_map(|m| m["step"].as_u64())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4]);
}

/// A device, a FIFO or a directory named where a file is read — the
/// manifest, a run's configuration, its dataset, its tokenizer — is refused
/// at once with what it is: never read until memory runs out (`/dev/zero`)
/// nor waited on forever (a FIFO nobody writes).
#[test]
fn special_files_named_as_inputs_are_refused_not_read() {
    let root = project();
    let d = root.path();
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    let refused = |args: &[&str], why: &str| {
        let o = bounded(d, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    refused(
        &["plan", "/dev/zero"],
        "cannot read the manifest: it is a device",
    );
    refused(&["plan", &fifo], "cannot read the manifest: it is a FIFO");
    refused(
        &["train", "--config", "/dev/zero"],
        "is a device, not a regular file",
    );
    refused(
        &["train", "--config", &fifo],
        "is a FIFO, not a regular file",
    );

    let run = train_run(d, "special", "training_steps = 2\nsequence_length = 32");
    let cfg = run.join("config.toml");
    let good = std::fs::read_to_string(&cfg).unwrap();
    let config = cfg.display().to_string();
    for (key, path, why) in [
        (
            "dataset = ",
            "/dev/zero",
            "the dataset /dev/zero is a device",
        ),
        ("dataset = ", fifo.as_str(), "is a FIFO, not a regular file"),
        ("dataset = ", "/tmp", "the dataset /tmp is a directory"),
        (
            "tokenizer = ",
            "/dev/zero",
            "the tokenizer /dev/zero is a device",
        ),
        (
            "tokenizer = ",
            fifo.as_str(),
            "is a FIFO, not a regular file",
        ),
    ] {
        std::fs::write(&cfg, regex_replace(&good, key, &format!("{path:?}"))).unwrap();
        refused(&["train", "--config", &config], why);
    }

    // Planning reads a tokenizer for its vocabulary: a special file is not
    // read, and the plan's warning says what it is.
    let m = train_manifest(d, "special-plan", "", "");
    let text = std::fs::read_to_string(&m).unwrap();
    for (path, what) in [("/dev/zero", "a device"), (fifo.as_str(), "a FIFO")] {
        let line = format!("{path:?}");
        std::fs::write(&m, regex_replace(&text, "tokenizer = ", &line)).unwrap();
        let o = bounded(d, &["plan", &m.display().to_string()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{path}: {err}");
        let warning = format!("`tokenizer` {path} is {what}, not a regular file (1 run(s)");
        assert!(err.contains(&warning), "{path}: {err}");
    }
}

/// Absurd values in a checkpoint's state are errors, not allocations, wraps or hangs.
#[test]
fn absurd_checkpoint_values_are_errors() {
    let root = project();
    let run = train_run(
        root.path(),
        "absurd",
        "training_steps = 2\nsequence_length = 32\ndataset_type = \"padding-free\"",
    );
    assert!(train(root.path(), &run).status.success());
    let state_path = run.join("checkpoints/step-00000002/state.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state_path).unwrap()).unwrap();
    let contents_path = run.join("checkpoints/step-00000002/checkpoint.json");
    let contents = std::fs::read(&contents_path).unwrap();
    set_steps(&run, 4);
    // (what the state says, what the error says)
    let cases: [(serde_json::Value, &str); 3] = [
        // Written by 2 ranks, resumed on 1: the global batch sets the accumulation.
        (
            serde_json::json!({"world_size": 2, "data_order": "global", "global_batch": 1_000_000_000_000_000u64}),
            "gradient accumulation of 1000000000000000",
        ),
        (
            serde_json::json!({"step": u64::MAX}),
            "beyond this run's 4 training steps",
        ),
        (
            serde_json::json!({"loader": {"epoch": 0, "next_doc": 1, "buffer": [1, 4_000_000_000u64], "samples": 2}}),
            "token id 4000000000, outside the vocabulary",
        ),
    ];
    for (patch, want) in cases {
        let key = patch.to_string();
        let mut state = original.clone();
        for (k, v) in patch.as_object().unwrap() {
            state[k] = v.clone();
        }
        std::fs::write(&state_path, serde_json::to_vec(&state).unwrap()).unwrap();
        // The table of contents vouches for the state as edited: the values
        // themselves are what is checked.
        let mut table: serde_json::Value = serde_json::from_slice(&contents).unwrap();
        table["files"]["state.json"] = serde_json::json!({
            "bytes": std::fs::metadata(&state_path).unwrap().len(),
            "xxh3_64": format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&std::fs::read(&state_path).unwrap())),
        });
        std::fs::write(&contents_path, serde_json::to_vec(&table).unwrap()).unwrap();
        let o = bounded(
            root.path(),
            &[
                "train",
                "--config",
                &run.join("config.toml").display().to_string(),
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{key}: {err}");
        assert!(err.contains(want), "{key}: {err}");
    }
}

/// Every count a flag or a manifest key gives is bounded where it is read:
/// an error naming it and its range, never a panic, an abort or a hang.
#[test]
fn every_option_is_bounded() {
    let root = project();
    let d = root.path();
    // (the command line, the flag its error names)
    let flags: &[(&str, &str)] = &[
        (
            "pretokenize --input x.parquet --out o --sequence-length 1099511627776",
            "--sequence-length",
        ),
        (
            "pretokenize --input x.parquet --out o --sequence-length 18446744073709551615",
            "--sequence-length",
        ),
        (
            "pretokenize --input x.parquet --out o --sequence-length 0",
            "--sequence-length",
        ),
        (
            "pretokenize --input x.parquet --out o --threads 100000",
            "--threads",
        ),
        (
            "pretokenize --input x.parquet --out o --row-group-size 0",
            "--row-group-size",
        ),
        (
            "data import-text x.txt --out o --median-kb NaN",
            "--median-kb",
        ),
        (
            "data import-text x.txt --out o --median-kb=-1",
            "--median-kb",
        ),
        (
            "data dump --dataset x --dataset-type padded --seq-len 0",
            "--seq-len",
        ),
        (
            "data dump --dataset x --dataset-type padded --seq-len 8 --world-size 0",
            "--world-size",
        ),
        ("bench train --threads 100000", "--threads"),
        ("bench train --steps 0", "--steps"),
        ("sweep-bench plan --runs 10000000000", "--runs"),
        ("sweep-bench report --runs 0", "--runs"),
        ("sweep-bench report --lines 100000000", "--lines"),
        ("sweep-bench history --rows 9999", "--rows"),
        ("bench ddp --ranks 0", "--ranks"),
        ("bench ddp --ranks 1,100000", "--ranks"),
        ("bench ddp --nodes 0", "--nodes"),
        ("bench ddp --inter-node-gbps 1e-300", "--inter-node-gbps"),
        ("bench ddp --intra-node-gbps NaN", "--intra-node-gbps"),
        ("bench max-batch --config c.toml --max 0", "--max"),
        ("sweep-bench data --samples 0", "--samples"),
        ("bench kernels --repeats 0", "--repeats"),
        ("bench kernels --tokens 1099511627776", "--tokens"),
        ("sweep-bench pretokenize --threads 0", "--threads"),
        ("report x --skip-first 99999999999", "--skip-first"),
        ("submit m.toml --parallel 0", "--parallel"),
        ("check m.toml --threshold 1e308", "--threshold"),
        ("check m.toml --threshold NaN", "--threshold"),
        ("compare a b --threshold 100", "--threshold"),
    ];
    for (line, flag) in flags {
        let args: Vec<&str> = line.split_whitespace().collect();
        let o = bounded(d, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{line}: {err}");
        assert!(
            err.contains(flag) && (err.contains("is not in") || err.contains("not in [")),
            "{line}: {err}"
        );
    }
    // A product of flags: checked before anything is written.
    let o = bounded(
        d,
        &[
            "sweep-bench",
            "report",
            "--runs",
            "100000",
            "--lines",
            "1000000",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(1) && err.contains("--runs × --lines"),
        "{err}"
    );
    assert!(!d.join("results").exists(), "nothing written");

    // Manifest keys: refused by `sweep plan`, naming the key and its range.
    let keys: &[(&str, &str)] = &[
        (
            "threads = 100000",
            "`threads` must be a whole number in 0..=4096",
        ),
        (
            "prefetch = 1000000000",
            "`prefetch` must be a whole number in 0..=64",
        ),
        (
            "sequence_length = 1099511627776",
            "`sequence_length` must be a whole number in 1..=1048576",
        ),
        (
            "gradient_accumulation = 1000000",
            "`gradient_accumulation` must be a whole number in 1..=65536",
        ),
        (
            "peak_flops = 1e-300",
            "`peak_flops` must lie in [1e9, 1e18]",
        ),
        (
            "[plan]\ninter_node_gbps = 1e-300",
            "`inter_node_gbps` must lie in [1e-2, 1e5]",
        ),
        (
            "monitor = { window = 0 }",
            "`monitor` must be a whole number in 1..=100000",
        ),
        (
            "architecture = { dim = 32, n_layers = 1, rope_theta = -1.0 }",
            "rope_theta must lie in [1, 1e12]",
        ),
    ];
    for (line, want) in keys {
        let m = d.join("bounds.toml");
        write(
            &m,
            &format!(
                "name = \"bounds\"\n[defaults]\ndataset = \"{}\"\ntokenizer = \"{}\"\n{line}\n",
                super::support::repo()
                    .join("assets/data/quickstart.parquet")
                    .display(),
                super::support::repo()
                    .join("assets/tokenizers/mistral-7b/tokenizer.json")
                    .display()
            ),
        );
        let o = bounded(d, &["plan", &m.display().to_string()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{line}: {err}");
        assert!(err.contains(want), "{line}: {err}");
    }
    let m = d.join("local.toml");
    write(&m, "name = \"l\"\ncommand = \"true\"\n[local]\nparallel = 100000\nthreads = 100000\n[stages.pretokenize]\nrow_group_size = 0\n");
    let o = bounded(d, &["plan", &m.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [
        "`parallel` must be a whole number in 1..=1024",
        "`threads` must be a whole number in 0..=4096",
        "`row_group_size` must be a whole number in 1..=1000000",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let m = d.join("slurm.toml");
    write(
        &m,
        "name = \"s\"\ncommand = \"true\"\n[slurm]\ngpus_per_node = 1000\n",
    );
    let o = bounded(d, &["plan", &m.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("`slurm.gpus_per_node` must be a whole number in 0..=64"),
        "{err}"
    );
}

/// A command run stopped at step 10 of 25 by Ctrl-C, then run again: its
/// figures are its second attempt's 25 points alone (100 tokens/s), in the
/// report and the history (the report had averaged 35 points, the first
/// attempt's 1000 tokens/s among them), and the first attempt's lines are
/// kept in its log.
#[test]
fn a_rerun_after_an_interrupt_never_mixes_its_attempts() {
    let root = project();
    let m = root.path().join("again.toml");
    write(
        &m,
        r#"name = "again"
executor = "local"
command = '''
first=0; [ -e "$SWEEP_RUN_DIR/tried" ] || { touch "$SWEEP_RUN_DIR/tried"; first=1; }
for i in $(seq 1 25); do
  echo "step $i: $((first ? 1000 : 100)) tokens/s"
  if [ $first = 1 ] && [ $i = 10 ]; then sleep 600; fi
done
'''
[report]
skip_first = 0
line_pattern = 'step (?P<step>\d+): (?P<tokens_per_second>[0-9.]+) tokens/s'
"#,
    );
    let child = start_quietly(root.path(), "run", &m);
    let log = root.path().join("results/again/run/local.out");
    wait_for(60, "step 10", || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("step 10:")
            .then_some(())
    });
    signal(&child, Signal::SIGINT);
    let _ = child.wait_with_output();
    run_ok(sweep(root.path()).arg("run").arg(&m));
    let rows = super::support::json_rows(sweep(root.path()).args([
        "report",
        m.to_str().unwrap(),
        "--json",
        "--no-plots",
    ]));
    assert_eq!(rows[0]["points"].as_u64(), Some(25), "{rows:?}");
    assert_eq!(rows[0]["tokens_per_second_mean"].as_f64(), Some(100.0));
    let history = super::support::json_rows(sweep(root.path()).args(["history", "--json"]));
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(
        history[0]["tokens_per_second"].as_f64(),
        Some(100.0),
        "{history:?}"
    );
    let kept = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        kept.matches("step 10:").count(),
        2,
        "both attempts kept: {kept}"
    );
}
