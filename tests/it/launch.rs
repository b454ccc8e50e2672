//! What a `command` sees: the rank variables its launcher gives each of its
//! processes (all of them), or none at all without one, on this machine and
//! on SLURM alike.

use super::slurm::{require_cluster, wait_until_done};
use super::support::{project, run_err, run_ok, status, submit_slurm, sweep, write};
use std::collections::BTreeMap;
use std::path::Path;

/// Each process writes the rank variables it sees into a file of its own.
const COMMAND: &str = r#"command = '''env | grep -E '^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|NODE_RANK)=' | sort > "$SWEEP_RUN_DIR/env-${RANK:-none}-$$"; true'''"#;

fn study(root: &Path, name: &str, executor: &str, extra: &str) -> std::path::PathBuf {
    let m = root.join(format!("{name}.toml"));
    write(
        &m,
        &format!(
            "name = \"{name}\"\n{executor}\n{COMMAND}\n[defaults]\n{extra}\n\
             [sweep]\nname = \"tasks-{{{{ slurm.ntasks_per_node }}}}\"\n\
             [sweep.grid]\n\"slurm.ntasks_per_node\" = [1, 2]\n\
             [slurm]\ntime = \"5\"\njob_name = \"sweep-test-{name}\"\n"
        ),
    );
    m
}

/// The variables each process of a run saw, by the rank it saw (`none`).
fn seen(run: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(run).unwrap().flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix("env-") else {
            continue;
        };
        let rank = rest.rsplit_once('-').unwrap().0.to_string();
        let vars = std::fs::read_to_string(e.path())
            .unwrap()
            .lines()
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect();
        assert!(
            out.insert(rank, vars).is_none(),
            "two processes of one rank"
        );
    }
    out
}

/// Two processes with all seven variables, one rendezvous between them.
fn assert_two_ranks(run: &Path, master: Option<&str>) {
    let seen = seen(run);
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["0", "1"], "{seen:?}");
    let port = &seen["0"]["MASTER_PORT"];
    assert!(port.parse::<u16>().is_ok(), "{seen:?}");
    for (rank, vars) in &seen {
        let want: BTreeMap<String, String> = [
            ("LOCAL_RANK", rank.as_str()),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", master.unwrap_or(&vars["MASTER_ADDR"])),
            ("MASTER_PORT", port),
            ("NODE_RANK", "0"),
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(vars, &want, "rank {rank}");
    }
}

/// One process, and not one rank variable, though sweep itself was started
/// with some.
fn assert_no_ranks(run: &Path) {
    let seen = seen(run);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen["none"].is_empty(), "{seen:?}");
}

#[test]
fn a_local_command_sees_every_rank_variable_from_its_launcher_or_none() {
    let root = project();
    let m = study(root.path(), "env", "executor = \"local\"", "");
    run_ok(
        sweep(root.path())
            .arg("submit")
            .arg(&m)
            .env("RANK", "5")
            .env("WORLD_SIZE", "9")
            .env("MASTER_ADDR", "elsewhere"),
    );
    let dir = root.path().join("results/env");
    assert_no_ranks(&dir.join("tasks-1"));
    // Two tasks, no launcher named: mpirun, this machine's own.
    assert_two_ranks(&dir.join("tasks-2"), Some("127.0.0.1"));

    // `none`: the command once, as written, whatever the tasks.
    let m = study(
        root.path(),
        "none",
        "executor = \"local\"",
        "launcher = \"none\"",
    );
    run_ok(sweep(root.path()).arg("submit").arg(&m));
    let dir = root.path().join("results/none");
    assert_no_ranks(&dir.join("tasks-1"));
    assert_no_ranks(&dir.join("tasks-2"));

    // srun cannot start ranks here; a misspelt launcher is named.
    let m = study(
        root.path(),
        "srun",
        "executor = \"local\"",
        "launcher = \"srun\"",
    );
    let err = run_err(sweep(root.path()).arg("plan").arg(&m));
    assert!(err.contains("starts ranks on a SLURM cluster"), "{err}");
    let m = study(
        root.path(),
        "typo",
        "executor = \"local\"",
        "launcher = \"torchrn\"",
    );
    let err = run_err(sweep(root.path()).arg("plan").arg(&m));
    assert!(err.contains("did you mean `torchrun`?"), "{err}");
    // A study planned for SLURM, started here with `--executor local`.
    let m = study(root.path(), "later", "", "launcher = \"srun\"");
    let err = run_err(
        sweep(root.path())
            .args(["submit", "--executor", "local"])
            .arg(&m),
    );
    assert!(err.contains("starts ranks on a SLURM cluster"), "{err}");
    assert!(status(root.path(), &m)
        .values()
        .all(|(s, _)| s == "UNSUBMITTED"));
}

#[test]
#[ignore = "needs the local SLURM cluster"]
fn a_slurm_command_sees_every_rank_variable_from_its_launcher_or_none() {
    require_cluster();
    let root = project();
    let cases = [
        ("env", ""),
        ("mpi", "launcher = \"mpirun\""),
        ("none", "launcher = \"none\""),
    ];
    for (name, extra) in cases {
        let m = study(root.path(), name, "", extra);
        submit_slurm(root.path(), &m);
        let s = wait_until_done(root.path(), &m, 120);
        assert!(s.values().all(|(st, _)| st == "COMPLETED"), "{name}: {s:?}");
        let dir = root.path().join("results").join(name);
        match name {
            "none" => assert_no_ranks(&dir.join("tasks-2")),
            // One node: the rendezvous is on it.
            _ => assert_two_ranks(&dir.join("tasks-2"), Some("localhost")),
        }
        match name {
            // A launcher named: one process, and every variable.
            "mpi" => {
                let one = seen(&dir.join("tasks-1"));
                assert_eq!(one.keys().collect::<Vec<_>>(), ["0"], "{one:?}");
                assert_eq!(one["0"]["WORLD_SIZE"], "1");
                assert_eq!(one["0"].len(), 7, "{one:?}");
            }
            _ => assert_no_ranks(&dir.join("tasks-1")),
        }
    }
}
