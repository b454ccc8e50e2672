//! Checkpoints: model and optimizer state (safetensors) plus a small JSON with
//! the step, the data loader's position and the monitor's state. Written into
//! a temporary directory renamed into place, so a checkpoint exists
//! completely or not at all; the latest valid one is found at start.

use super::dist::{self, Collective, Ranks};
use super::monitor::MonitorState;
use super::optim::AdamW;
use super::params::Params;
use crate::data::LoaderState;
use anyhow::{bail, Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const DIR: &str = "checkpoints";
const KEEP: usize = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub step: usize,
    pub optimizer_steps: u64,
    /// Rank 0's data position.
    pub loader: LoaderState,
    /// The ranks that wrote this checkpoint together.
    #[serde(default = "one")]
    pub world_size: usize,
    /// The data positions of ranks 1, 2, …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_ranks: Vec<LoaderState>,
    pub monitor: MonitorState,
    /// Seconds of training before this checkpoint (the metrics' elapsed_s continues from it).
    pub elapsed_s: f64,
    pub sweep_version: String,
}

fn one() -> usize {
    1
}

impl State {
    /// The data position of `ranks.rank`, if the checkpoint was written by as
    /// many ranks as this job has.
    pub fn loader_of(&self, ranks: Ranks, dir: &Path) -> Result<&LoaderState> {
        if self.world_size != ranks.world_size {
            bail!(
                "{} was written by {} rank(s) and this job has {}: each rank's data position \
                 belongs to its shard, so resume with the same world size (slurm.nodes × \
                 ntasks_per_node), or delete the run's checkpoints to start over",
                dir.display(),
                self.world_size,
                ranks.world_size
            );
        }
        Ok(match ranks.rank {
            0 => &self.loader,
            r => &self.other_ranks[r - 1],
        })
    }
}

fn step_dir(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join(DIR).join(format!("step-{step:08}"))
}

/// Writes a checkpoint of every rank's state: ranks other than 0 leave their
/// data position beside the checkpoints, rank 0 gathers them into its
/// `state.json` and writes the model and optimizer (identical on every
/// rank). Every rank returns once the checkpoint is complete, so a rank that
/// exits afterwards (to be requeued) cannot leave it half-written.
pub fn save_all_ranks(
    run_dir: &Path,
    params: &Params,
    opt: &AdamW,
    mut state: State,
    comm: &dyn Collective,
    device: &Device,
) -> Result<PathBuf> {
    let ranks = comm.ranks();
    let root = run_dir.join(DIR);
    let rank_file = |r: usize| root.join(format!(".rank-{r}-step-{:08}.json", state.step));
    if !ranks.is_main() {
        std::fs::create_dir_all(&root)?;
        crate::util::fs::write_atomic(&rank_file(ranks.rank), &serde_json::to_vec(&state.loader)?)?;
    }
    dist::barrier(comm, device)?;
    let dest = step_dir(run_dir, state.step);
    if ranks.is_main() {
        state.world_size = ranks.world_size;
        state.other_ranks = (1..ranks.world_size)
            .map(|r| {
                let path = rank_file(r);
                let bytes = std::fs::read(&path).with_context(|| {
                    format!("reading rank {r}'s data position {}", path.display())
                })?;
                Ok(serde_json::from_slice(&bytes)?)
            })
            .collect::<Result<_>>()?;
        save(run_dir, params, opt, &state)?;
        for r in 1..ranks.world_size {
            let _ = std::fs::remove_file(rank_file(r));
        }
    }
    dist::barrier(comm, device)?;
    Ok(dest)
}

pub fn save(run_dir: &Path, params: &Params, opt: &AdamW, state: &State) -> Result<PathBuf> {
    let root = run_dir.join(DIR);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let tmp = tempfile::Builder::new().prefix(".tmp-").tempdir_in(&root)?;
    let model: HashMap<String, candle_core::Tensor> = params
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&model, tmp.path().join("model.safetensors"))?;
    candle_core::safetensors::save(&opt.state()?, tmp.path().join("optimizer.safetensors"))?;
    // state.json last: its presence marks a complete checkpoint.
    std::fs::write(
        tmp.path().join("state.json"),
        serde_json::to_vec_pretty(state)?,
    )?;
    let dest = step_dir(run_dir, state.step);
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    std::fs::rename(tmp.keep(), &dest)
        .with_context(|| format!("moving the checkpoint into {}", dest.display()))?;
    prune(&root)?;
    Ok(dest)
}

fn checkpoints(root: &Path) -> Vec<(usize, PathBuf)> {
    let mut v: Vec<(usize, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort();
    v
}

fn prune(root: &Path) -> Result<()> {
    let all = checkpoints(root);
    for (_, p) in all.iter().take(all.len().saturating_sub(KEEP)) {
        std::fs::remove_dir_all(p)?;
    }
    Ok(())
}

/// The newest checkpoint whose state reads back, if any. A newer one that
/// does not (written by a run killed mid-way through its rename, or damaged
/// since) is passed over with a warning that names it and why.
pub fn latest(run_dir: &Path) -> Option<(PathBuf, State)> {
    checkpoints(&run_dir.join(DIR))
        .into_iter()
        .rev()
        .find_map(|(_, p)| match read_complete(&p) {
            Ok(state) => Some((p, state)),
            Err(why) => {
                eprintln!("warning: checkpoint {} is passed over: {why}", p.display());
                None
            }
        })
}

fn read_complete(dir: &Path) -> std::result::Result<State, String> {
    let path = dir.join("state.json");
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let state: State = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not a checkpoint state: {e}", path.display()))?;
    for f in ["model.safetensors", "optimizer.safetensors"] {
        if !dir.join(f).is_file() {
            return Err(format!("it has no {f}"));
        }
    }
    Ok(state)
}

/// Loads a checkpoint's tensors into the model and optimizer.
pub fn restore(
    dir: &Path,
    state: &State,
    params: &Params,
    opt: &mut AdamW,
    device: &Device,
) -> Result<()> {
    let model = candle_core::safetensors::load(dir.join("model.safetensors"), device)
        .with_context(|| format!("reading {}", dir.display()))?;
    params.load(&model)?;
    let optim = candle_core::safetensors::load(dir.join("optimizer.safetensors"), device)?;
    opt.load_state(state.optimizer_steps, &optim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(world_size: usize) -> State {
        let at = |next_doc| LoaderState {
            next_doc,
            ..Default::default()
        };
        State {
            step: 10,
            optimizer_steps: 10,
            loader: at(3),
            world_size,
            other_ranks: (1..world_size).map(|r| at(100 * r + 3)).collect(),
            monitor: Default::default(),
            elapsed_s: 1.0,
            sweep_version: "0".into(),
        }
    }

    #[test]
    fn each_rank_resumes_its_own_position_and_another_world_size_is_refused() {
        let s = state(3);
        let dir = Path::new("/run/checkpoints/step-00000010");
        for rank in 0..3 {
            let r = Ranks {
                rank,
                world_size: 3,
                local_rank: rank,
            };
            assert_eq!(s.loader_of(r, dir).unwrap().next_doc, 100 * rank + 3);
        }
        let err = s.loader_of(Ranks::SINGLE, dir).unwrap_err().to_string();
        assert!(
            err.contains("written by 3 rank(s) and this job has 1")
                && err.contains("same world size"),
            "{err}"
        );
        // Checkpoints from before data parallelism are one rank's.
        let old: State = serde_json::from_value(serde_json::json!({
            "step": 5, "optimizer_steps": 5,
            "loader": {"epoch": 0, "next_doc": 7, "buffer": [], "samples": 5},
            "monitor": MonitorState::default(), "elapsed_s": 2.0, "sweep_version": "0.1.0"
        }))
        .unwrap();
        assert_eq!(old.loader_of(Ranks::SINGLE, dir).unwrap().next_doc, 7);
    }
}
