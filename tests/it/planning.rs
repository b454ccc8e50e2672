//! Planning and rendering: run counts, stable ids, idempotent rendering.

use super::support::{project, repo, run_ok, stdout, sweep, write};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn plan_json(root: &Path, manifest: &Path) -> Vec<Value> {
    let out = run_ok(sweep(root).arg("plan").arg(manifest).arg("--json"));
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn the_reference_study_plans_eight_runs_and_two_stages() {
    let root = project();
    let m = repo().join("experiments/pretokenization.toml");
    let runs = plan_json(root.path(), &m);
    assert_eq!(runs.len(), 8);
    for r in &runs {
        assert_eq!(r["id"].as_str().unwrap().len(), 8);
        let p = r["params"].as_object().unwrap();
        for key in [
            "dataset_type",
            "pretokenized",
            "batch_size",
            "global_batch_size",
        ] {
            assert!(p.contains_key(key), "{key} missing from {r}");
        }
        assert_eq!(
            p["global_batch_size"], p["batch_size"],
            "one node, one task: global = per-device batch"
        );
    }
    let text = stdout(&run_ok(sweep(root.path()).arg("plan").arg(&m)));
    assert!(text.contains("8 runs, 10 jobs"), "{text}");
    assert!(text.contains("baseline-padded-bs1") && text.contains("pretokenized-padding-free-bs2"));
    // plan writes nothing.
    assert!(!root.path().join("results").exists());
}

#[test]
fn run_ids_ignore_key_order_and_cosmetic_fields() {
    let root = project();
    let a = root.path().join("a.toml");
    let b = root.path().join("b.toml");
    write(&a, "name = \"s\"\ndescription = \"one\"\n[defaults]\ndataset = \"d.parquet\"\nseed = 1\nlearning_rate = 0.001\n[sweep.grid]\nbatch_size = [1, 2]\n");
    write(&b, "name = \"s\"\ndescription = \"two\"\n[sweep]\nname = \"other-{{ batch_size }}\"\n[sweep.grid]\nbatch_size = [1, 2]\n[defaults]\nlearning_rate = 0.001\nseed = 1\ndataset = \"d.parquet\"\n");
    let ids = |m: &Path| -> Vec<String> {
        plan_json(root.path(), m)
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&a), ids(&b));
    // A change of configuration is a new run.
    write(&b, "name = \"s\"\n[defaults]\ndataset = \"d.parquet\"\nseed = 2\nlearning_rate = 0.001\n[sweep.grid]\nbatch_size = [1, 2]\n");
    assert_ne!(ids(&a), ids(&b));
}

#[test]
fn rendering_is_idempotent_and_never_touches_outputs() {
    let root = project();
    let m = root.path().join("m.toml");
    write(
        &m,
        "name = \"s\"\n[defaults]\ndataset = \"d.parquet\"\n[sweep.grid]\nbatch_size = [1, 2]\n",
    );
    let first = stdout(&run_ok(sweep(root.path()).arg("render").arg(&m)));
    assert!(first.contains("6 files written, 0 unchanged"), "{first}");
    let run = root.path().join("results/s/batch_size-1");
    for f in ["config.toml", "job.sbatch", "run.json"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let record: Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["manifest"]["sha256"].as_str().unwrap().len(), 64);
    assert!(record["created_at"].is_string() && record["sweep_version"].is_string());
    write(&run.join("metrics.jsonl"), "{\"step\": 1}\n");
    let snapshot = |d: &Path| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    };
    let before = snapshot(&run);
    let second = stdout(&run_ok(sweep(root.path()).arg("render").arg(&m)));
    assert!(second.contains("0 files written, 6 unchanged"), "{second}");
    assert_eq!(before, snapshot(&run));
    // The config is exactly what the trainer reads.
    let cfg = sweep::config::TrainConfig::load(&run.join("config.toml")).unwrap();
    assert_eq!(cfg.batch_size, 1);
    assert!(cfg.dataset.is_absolute());
}

#[test]
fn a_run_directory_is_never_reused_for_another_configuration() {
    let root = project();
    let m = root.path().join("m.toml");
    write(
        &m,
        "name = \"s\"\n[defaults]\ndataset = \"d.parquet\"\nseed = 1\n",
    );
    run_ok(sweep(root.path()).arg("render").arg(&m));
    let run = root.path().join("results/s/run");
    write(&run.join("metrics.jsonl"), "{\"step\": 1}\n");
    let config = std::fs::read(run.join("config.toml")).unwrap();
    write(
        &m,
        "name = \"s\"\n[defaults]\ndataset = \"d.parquet\"\nseed = 2\n",
    );
    let out = sweep(root.path()).arg("render").arg(&m).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds run") && err.contains("rename the run"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(run.join("config.toml")).unwrap(),
        config,
        "nothing was rewritten"
    );
}

#[test]
fn any_command_values_reach_the_program_as_single_words() {
    let root = project();
    let m = root.path().join("m.toml");
    write(&m, "name = \"c\"\ncommand = \"printf '%s|' --name {{ tag }} --bs {{ batch_size }}\"\n[defaults]\ntag = \"it's $(a) test\"\n[sweep.grid]\nbatch_size = [1, 2]\n");
    run_ok(sweep(root.path()).arg("render").arg(&m));
    let script = root.path().join("results/c/batch_size-1/job.sbatch");
    // Run the script itself, with an `srun` that just runs its command.
    let bin = root.path().join("fakebin");
    write(&bin.join("srun"), "#!/bin/sh\nexec \"$@\"\n");
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(bin.join("srun"))
        .status()
        .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = run_ok(
        std::process::Command::new("bash")
            .arg(&script)
            .env("PATH", path)
            .env("SLURM_JOB_ID", "42")
            .env("SLURM_NTASKS", "1")
            .env("SLURM_PROCID", "0")
            .env("SLURM_LOCALID", "0")
            .env("SLURM_NODEID", "0"),
    );
    assert!(
        stdout(&out).contains("--name|it's $(a) test|--bs|1|"),
        "{}",
        stdout(&out)
    );
    let exit =
        std::fs::read_to_string(root.path().join("results/c/batch_size-1/exit_code")).unwrap();
    assert_eq!(exit.trim(), "42 0");
}
