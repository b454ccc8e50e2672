//! Ranks on this machine through Open MPI's (or MPICH's) `mpirun`: the local
//! executor's multi-rank runs and `sweep bench ddp`.

use crate::util::process::find_in_path;
use anyhow::{bail, Result};
use std::process::Command;

/// `mpirun -n N <argv>` for ranks on this machine, with the settings that let
/// Open MPI run in containers and VMs.
pub fn mpirun(ranks: u32, argv: &[&str]) -> Result<Command> {
    if find_in_path("mpirun").is_none() {
        bail!("{ranks} ranks on this machine are started with `mpirun`, and there is none on PATH: install Open MPI (apt-get install openmpi-bin) or MPICH");
    }
    let mut c = Command::new("mpirun");
    c.args(["-n", &ranks.to_string()])
        .args(argv)
        .env("WORLD_SIZE", ranks.to_string())
        .env_remove("RANK")
        .env_remove("LOCAL_RANK");
    // Open MPI on one machine: oversubscribed, unpinned, as root, yielding
    // while waiting (the summing thread shares the cores), single-copy only
    // where cross-memory attach works, and never through an allocation's
    // srun. A setting already in the environment wins; MPICH ignores these.
    let unset = |key: &str| std::env::var_os(key).is_none();
    for (key, value) in [
        ("OMPI_MCA_ras", "^slurm"),
        ("OMPI_MCA_plm", "^slurm"),
        ("OMPI_MCA_mpi_yield_when_idle", "1"),
        ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
        ("OMPI_MCA_hwloc_base_binding_policy", "none"),
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    ] {
        if unset(key) {
            c.env(key, value);
        }
    }
    // Probed (a fork) only when the environment leaves it to us.
    const SINGLE_COPY: &str = "OMPI_MCA_btl_vader_single_copy_mechanism";
    if unset(SINGLE_COPY) {
        let cma = crate::util::process::cross_memory_attach();
        c.env(SINGLE_COPY, if cma { "cma" } else { "none" });
    }
    Ok(c)
}
