//! Anyone's training script, swept as a `command`: a small PyTorch program
//! of ours that logs as nanoGPT does (`iter N: loss L, time T.TTms, mfu
//! M%`, tests/fixtures/torch-train.py), with PyTorch from PyPI in the
//! environment `scripts/setup.sh` makes (`.cache/torch-venv`). Through the
//! local executor and SLURM: tokens/s from its step time, a crash behind a
//! pipe, a command that starts with an assignment, and two processes
//! started by torchrun (gloo, on the CPU); and Hugging Face's Trainer, read
//! by its progress bar.

use super::slurm::{require_cluster, wait_until_done};
use super::support::{json_rows, project, repo, run_ok, skipped, status, stdout, sweep, write};
use std::path::{Path, PathBuf};

/// The environment's bin directory, whose python imports torch; `None`
/// (skipped) where it is missing.
fn torch_bin() -> Option<PathBuf> {
    python_with("torch")
}

/// The environment's bin directory, whose python imports `modules`; `None`
/// (skipped) where it is missing.
fn python_with(modules: &str) -> Option<PathBuf> {
    let bin = std::env::var_os("SWEEP_TEST_TORCH_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".cache/torch-venv"))
        .join("bin");
    let ok = std::process::Command::new(bin.join("python"))
        .args(["-c", &format!("import {modules}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skipped(
            "torch",
            &format!(
                "no python with {modules} at {} (scripts/setup.sh makes it)",
                bin.display()
            ),
        );
        return None;
    }
    Some(bin)
}

/// `sweep` with the environment's bin first on PATH (torchrun, python),
/// as a user who activated it runs it; jobs inherit it.
fn sweep_in(root: &Path, bin: &Path) -> std::process::Command {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut c = sweep(root);
    c.env("PATH", format!("{}:{path}", bin.display()));
    c
}

/// A study of the script: `extra` lines in `[defaults]` (and below it).
fn study(root: &Path, name: &str, command: &str, extra: &str) -> PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            r#"name = "{name}"
command = '''{command}'''
[defaults]
script = "{script}"
block_size = 32
{extra}
[slurm]
time = "5"
job_name = "sweep-test-{name}"
[report]
skip_first = 2
line_pattern = 'iter (?P<step>\d+): loss (?P<loss>[\d.]+), time (?P<time_ms>[\d.]+)ms, mfu (?P<mfu_pct>[-\d.]+)%'
step_time = "time_ms"
tokens_per_step = "batch_size * block_size"
"#,
            script = repo().join("tests/fixtures/torch-train.py").display(),
        ),
    );
    m
}

const TRAIN: &str =
    "python {{ script }} --batch-size {{ batch_size }} --block-size {{ block_size }} --iters 12";

/// Each row's tokens/s against a hand computation from its log: the mean,
/// over the points the report kept (its last `points` lines), of batch ×
/// block over the step's time; to 0.1%.
fn assert_tokens_from_step_times(root: &Path, m: &Path, bin: &Path) {
    let rows = json_rows(
        sweep_in(root, bin)
            .args(["report", "--json", "--no-plots"])
            .arg(m),
    );
    assert!(!rows.is_empty());
    for row in &rows {
        let name = row["run"].as_str().unwrap();
        let dir = std::fs::read_dir(root.join("results").join(m.file_stem().unwrap()))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|f| f == name))
            .unwrap();
        let log: String = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "out"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        let times: Vec<f64> = log
            .lines()
            .filter(|l| l.starts_with("iter "))
            .map(|l| {
                let ms = l.split("time ").nth(1).unwrap().split("ms").next().unwrap();
                ms.parse::<f64>().unwrap()
            })
            .collect();
        let kept = row["points"].as_u64().unwrap() as usize;
        assert!(
            kept >= 5 && kept <= times.len(),
            "{kept} of {}: {row}",
            times.len()
        );
        let tokens = row["tokens_per_step"].as_f64().unwrap();
        let tail = &times[times.len() - kept..];
        let want = tail.iter().map(|ms| tokens / (ms / 1e3)).sum::<f64>() / kept as f64;
        let got = row["tokens_per_second_mean"].as_f64().unwrap();
        assert!(
            (got / want - 1.0).abs() < 1e-3,
            "{name}: {got} vs {want} by hand: {row}"
        );
        assert!(
            row["mfu_pct_mean"].as_f64().is_some_and(|m| m > 0.0),
            "the log's MFU: {row}"
        );
    }
}

#[test]
fn a_steps_products_are_timed_beside_pytorchs_on_the_same_shapes() {
    let Some(bin) = torch_bin() else { return };
    let root = project();
    let (ours, theirs) = (root.path().join("g.json"), root.path().join("t.json"));
    run_ok(
        sweep(root.path())
            .args(["bench", "gemms", "--model", "tiny", "--batch", "1"])
            .args(["--seq-len", "8", "--repeats", "1", "--json"])
            .arg(&ours),
    );
    run_ok(
        std::process::Command::new(bin.join("python"))
            .arg(repo().join("scripts/torch-gemms.py"))
            .args([&ours, &theirs]),
    );
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let (ours, theirs) = (read(&ours), read(&theirs));
    let rows = ours["rows"].as_array().unwrap();
    // tiny: four block shapes and the head's one slice, three products each.
    assert_eq!(rows.len(), 15, "{ours}");
    assert_eq!(theirs["rows"].as_array().unwrap().len(), rows.len());
    for (a, b) in rows.iter().zip(theirs["rows"].as_array().unwrap()) {
        for key in ["part", "product", "rows", "inp", "out", "count"] {
            assert_eq!(a[key], b[key], "{key}: {a} against {b}");
        }
        assert_eq!(a["ms_each"], b["sweep_ms_each"]);
        assert!(b["ms_each"].as_f64().unwrap() > 0.0, "{b}");
    }
    assert_eq!(ours["floor_ms"], theirs["sweep_floor_ms"]);
}

#[test]
fn a_pytorch_script_sweeps_through_the_local_executor() {
    let Some(bin) = torch_bin() else { return };
    let root = project();
    let m = study(
        root.path(),
        "torch",
        TRAIN,
        "[sweep.grid]\nbatch_size = [4, 8]\n",
    );
    let m = {
        let text = std::fs::read_to_string(&m).unwrap();
        write(&m, &format!("executor = \"local\"\n{text}"));
        m
    };
    run_ok(sweep_in(root.path(), &bin).arg("run").arg(&m));
    assert_tokens_from_step_times(root.path(), &m, &bin);

    // A crash behind a pipe fails the run; a leading assignment works.
    let crash = study(
        root.path(),
        "crash",
        "python {{ script }} --crash-at 3 | tee -a {{ run.dir }}/train.log",
        "batch_size = 2",
    );
    let omp = study(
        root.path(),
        "omp",
        &format!("OMP_NUM_THREADS=1 {TRAIN}"),
        "batch_size = 2",
    );
    for m in [&crash, &omp] {
        let text = std::fs::read_to_string(m).unwrap();
        write(m, &format!("executor = \"local\"\n{text}"));
        let _ = sweep_in(root.path(), &bin)
            .arg("submit")
            .arg(m)
            .output()
            .unwrap();
    }
    assert_eq!(
        status(root.path(), &crash)["run"],
        ("FAILED".into(), Some(3))
    );
    assert_eq!(status(root.path(), &omp)["run"].0, "COMPLETED");

    // Two processes started by torchrun, summing gradients with gloo.
    let ddp = study(
        root.path(),
        "torchrun",
        TRAIN,
        "batch_size = 4\nlauncher = \"torchrun\"\n[sweep.grid]\n\"slurm.ntasks_per_node\" = [2]\n",
    );
    let text = std::fs::read_to_string(&ddp).unwrap();
    write(&ddp, &format!("executor = \"local\"\n{text}"));
    run_ok(sweep_in(root.path(), &bin).arg("run").arg(&ddp));
    let runs = status(root.path(), &ddp);
    let (name, (state, _)) = runs.iter().next().unwrap();
    assert_eq!(state, "COMPLETED");
    let log = std::fs::read_to_string(
        root.path()
            .join("results/torchrun")
            .join(name)
            .join("local.out"),
    )
    .unwrap();
    assert!(log.contains("world size 2,"), "{log}");
    assert_tokens_from_step_times(root.path(), &ddp, &bin);
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_pytorch_script_sweeps_through_slurm_with_torchrun() {
    require_cluster();
    let Some(bin) = torch_bin() else { return };
    let root = project();
    let m = study(
        root.path(),
        "torch-slurm",
        TRAIN,
        "launcher = \"torchrun\"\n[sweep.grid]\nbatch_size = [4, 8]\n\"slurm.ntasks_per_node\" = [2]\n",
    );
    run_ok(
        sweep_in(root.path(), &bin)
            .args(["submit", "--executor", "slurm"])
            .arg(&m),
    );
    let s = wait_until_done(root.path(), &m, 300);
    assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{s:?}");
    assert_tokens_from_step_times(root.path(), &m, &bin);
}

/// Hugging Face's Trainer (tests/fixtures/hf-train.py), swept by what it
/// logs anyway: its tqdm bar's pace (`4.98it/s`, `1.23s/it`) is a step's
/// time, so tokens/s come from the tokens of a step, and its `{'loss': …}`
/// lines, which say no step, are the loss of the step the bar drew last.
/// The bar redrawn after each of them, and closed at the end with its
/// overall rate, adds no point and no problem.
#[test]
fn a_hugging_face_trainer_sweeps_by_its_progress_bar() {
    let Some(bin) = python_with("torch, transformers, accelerate") else {
        return;
    };
    let root = project();
    let m = root.path().join("hf.toml");
    write(
        &m,
        &format!(
            r#"name = "hf"
executor = "local"
# Every step drawn (tqdm draws at most ten a second otherwise).
command = '''TQDM_MININTERVAL=0 python {{{{ script }}}} --batch-size {{{{ batch_size }}}} --block-size {{{{ block_size }}}} --output-dir {{{{ run.dir }}}}/hf'''
[defaults]
script = "{script}"
block_size = 64
[sweep.grid]
batch_size = [2, 4]
[report]
skip_first = 2
line_pattern = '''(?P<step>\d+)/\d+ \[[^\]]*, *(?P<pace>[\d.]+(?:it/s|s/it))\]|\{{'loss': (?P<loss>[\d.]+)'''
step_time = "pace"
tokens_per_step = "batch_size * block_size"
"#,
            script = repo().join("tests/fixtures/hf-train.py").display(),
        ),
    );
    run_ok(sweep_in(root.path(), &bin).arg("run").arg(&m));
    let text = stdout(&run_ok(
        sweep_in(root.path(), &bin)
            .args(["report", "--no-plots"])
            .arg(&m),
    ));
    assert!(!text.contains("note:"), "{text}");
    let rows = json_rows(
        sweep_in(root.path(), &bin)
            .args(["report", "--json", "--no-plots"])
            .arg(&m),
    );
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        let name = row["run"].as_str().unwrap();
        let log =
            std::fs::read_to_string(root.path().join("results/hf").join(name).join("local.out"))
                .unwrap();
        // (figure, its unit) after each `after`, up to `until`.
        let figures = |after: &str, until: char| -> Vec<(f64, String)> {
            log.split(['\r', '\n'])
                .filter_map(|l| l.split_once(after))
                .filter_map(|(_, rest)| {
                    let figure = rest.split(until).next()?;
                    let end = figure
                        .find(|c: char| c.is_alphabetic())
                        .unwrap_or(figure.len());
                    Some((
                        figure[..end].trim().parse().ok()?,
                        figure[end..].to_string(),
                    ))
                })
                .collect()
        };
        let tokens = row["tokens_per_step"].as_f64().unwrap();
        let rates: Vec<f64> = figures(", ", ']')
            .into_iter()
            .map(|(v, unit)| match unit.as_str() {
                "it/s" => tokens * v,
                "s/it" => tokens / v,
                other => panic!("{other}"),
            })
            .collect();
        let losses: Vec<f64> = figures("{'loss': ", ',')
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        assert_eq!(losses.len(), 40 / 5, "{log}");
        let within = |v: f64, of: &[f64]| {
            of.iter().any(|&x| x <= v * (1.0 + 1e-9)) && of.iter().any(|&x| x >= v * (1.0 - 1e-9))
        };
        let got = row["tokens_per_second_mean"].as_f64().unwrap();
        assert!(
            within(got, &rates),
            "{name}: {got} against the bar's {rates:?}"
        );
        assert_eq!(row["final_loss"].as_f64(), losses.last().copied(), "{row}");
        assert!(
            row["points"].as_u64().unwrap() >= 30,
            "one point per step the bar drew, less the first 2: {row}"
        );
    }
}
