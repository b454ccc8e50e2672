//! Checkpoints: model and optimizer state (safetensors) plus a small JSON with
//! the step, the data loader's position and the monitor's state. Written into
//! a temporary directory renamed into place, so a checkpoint exists
//! completely or not at all; the latest valid one is found at start.

use super::dist::{self, Collective, Ranks};
use super::monitor::MonitorState;
use super::optim::AdamW;
use super::params::Params;
use crate::config::DataOrder;
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
    /// Rank 0's data position; in the global order, every rank's.
    pub loader: LoaderState,
    /// The ranks that wrote this checkpoint together.
    #[serde(default = "one")]
    pub world_size: usize,
    /// The data positions of ranks 1, 2, … (contiguous order only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_ranks: Vec<LoaderState>,
    /// How the ranks shared the data (checkpoints from before the global
    /// order were contiguous).
    #[serde(default = "contiguous")]
    pub data_order: DataOrder,
    /// Samples per step over all ranks: world size × batch × accumulation
    /// (0: not recorded, from before elastic resume).
    #[serde(default)]
    pub global_batch: usize,
    pub monitor: MonitorState,
    /// Seconds of training before this checkpoint (the metrics' elapsed_s continues from it).
    pub elapsed_s: f64,
    pub sweep_version: String,
}

fn one() -> usize {
    1
}

fn contiguous() -> DataOrder {
    DataOrder::Contiguous
}

/// How a job continues from a checkpoint: its rank's data position and the
/// gradient accumulation that keeps the checkpoint's global batch.
#[derive(Debug)]
pub struct Resume<'a> {
    pub loader: &'a LoaderState,
    pub gradient_accumulation: usize,
    /// What changed, for the log (None: the same world size).
    pub change: Option<String>,
}

impl State {
    /// How the job of `ranks` (at `batch` samples per rank and micro-batch,
    /// `accumulation` micro-batches per step, reading in `order`) continues
    /// from this checkpoint. A global position (or one rank's) continues on
    /// any world size, with the accumulation that keeps the global batch;
    /// per-rank shards continue only on as many ranks.
    pub fn resume(
        &self,
        ranks: Ranks,
        order: DataOrder,
        batch: usize,
        accumulation: usize,
        dir: &Path,
    ) -> Result<Resume<'_>> {
        let same = self.world_size == ranks.world_size && self.data_order == order;
        // A single rank's range is every training document: the same
        // position as the global order's.
        let shared = |order: DataOrder, world: usize| order == DataOrder::Global || world == 1;
        if same {
            let loader = match ranks.rank {
                0 => &self.loader,
                _ if shared(order, ranks.world_size) => &self.loader,
                r => self.other_ranks.get(r - 1).with_context(|| {
                    format!(
                        "{} has no data position for rank {r} (it lists {} of {} ranks): the checkpoint is damaged; delete it to resume from the one before",
                        dir.display(),
                        self.other_ranks.len() + 1,
                        self.world_size
                    )
                })?,
            };
            return Ok(Resume {
                loader,
                gradient_accumulation: accumulation,
                change: None,
            });
        }
        if !shared(self.data_order, self.world_size) || !shared(order, ranks.world_size) {
            bail!(
                "{} was written by {} rank(s) in the {} data order and this job has {} in the {}: \
                 in the contiguous order each rank's position belongs to its own shard, so resume with the same world size \
                 (slurm.nodes × ntasks_per_node) and data order, train in data_order = \"global\" \
                 (whose position any world size continues), or delete the run's checkpoints to start over",
                dir.display(),
                self.world_size,
                self.data_order.as_str(),
                ranks.world_size,
                order.as_str()
            );
        }
        let per_step = ranks
            .world_size
            .checked_mul(batch)
            .context("the world size × batch overflows")?;
        let mut gradient_accumulation = accumulation;
        let mut change = format!(
            "world size {} → {}, {} order",
            self.world_size,
            ranks.world_size,
            order.as_str()
        );
        if self.global_batch > 0 {
            if !self.global_batch.is_multiple_of(per_step) {
                bail!(
                    "{} was written at a global batch of {} samples, which {} rank(s) at batch {batch} \
                     cannot keep ({} × {batch} does not divide it): resume on a world size that does, \
                     or delete the run's checkpoints to start over",
                    dir.display(),
                    self.global_batch,
                    ranks.world_size,
                    ranks.world_size
                );
            }
            gradient_accumulation = self.global_batch / per_step;
            change += &format!(
                ", global batch {} kept (gradient accumulation {accumulation} → {gradient_accumulation})",
                self.global_batch
            );
        }
        Ok(Resume {
            loader: &self.loader,
            gradient_accumulation,
            change: Some(change),
        })
    }
}

fn step_dir(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join(DIR).join(format!("step-{step:08}"))
}

/// Writes a checkpoint of every rank's state: in the contiguous order ranks
/// other than 0 leave their data position beside the checkpoints and rank 0
/// gathers them into its `state.json`; rank 0 writes the model and optimizer
/// (identical on every rank). Every rank returns once the checkpoint is complete, so a rank that
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
    // In the global order every rank stands at the same position: rank 0's
    // is everyone's.
    let per_rank = state.data_order == DataOrder::Contiguous && ranks.world_size > 1;
    if !ranks.is_main() && per_rank {
        std::fs::create_dir_all(&root)?;
        crate::util::fs::write_atomic(&rank_file(ranks.rank), &serde_json::to_vec(&state.loader)?)?;
    }
    dist::barrier(comm, device)?;
    let dest = step_dir(run_dir, state.step);
    if ranks.is_main() {
        state.world_size = ranks.world_size;
        let others = if per_rank { 1..ranks.world_size } else { 0..0 };
        state.other_ranks = others
            .clone()
            .map(|r| {
                let path = rank_file(r);
                let bytes = std::fs::read(&path).with_context(|| {
                    format!("reading rank {r}'s data position {}", path.display())
                })?;
                Ok(serde_json::from_slice(&bytes)?)
            })
            .collect::<Result<_>>()?;
        save(run_dir, params, opt, &state)?;
        for r in others {
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

    fn state(world_size: usize, data_order: DataOrder) -> State {
        let at = |next_doc| LoaderState {
            next_doc,
            ..Default::default()
        };
        let per_rank = data_order == DataOrder::Contiguous;
        State {
            step: 10,
            optimizer_steps: 10,
            loader: at(3),
            world_size,
            other_ranks: (1..world_size)
                .filter(|_| per_rank)
                .map(|r| at(100 * r + 3))
                .collect(),
            data_order,
            global_batch: 4 * world_size,
            monitor: Default::default(),
            elapsed_s: 1.0,
            sweep_version: "0".into(),
        }
    }

    fn rank(rank: usize, world_size: usize) -> Ranks {
        Ranks {
            rank,
            world_size,
            local_rank: rank,
        }
    }

    const DIR: &str = "/run/checkpoints/step-00000010";

    #[test]
    fn in_the_contiguous_order_each_rank_resumes_its_own_shard_on_as_many_ranks() {
        let s = state(3, DataOrder::Contiguous);
        let dir = Path::new(DIR);
        for r in 0..3 {
            let resume = s
                .resume(rank(r, 3), DataOrder::Contiguous, 2, 2, dir)
                .unwrap();
            assert_eq!(resume.loader.next_doc, 100 * r + 3);
            assert_eq!((resume.gradient_accumulation, resume.change), (2, None));
        }
        for (world, order) in [
            (1, DataOrder::Contiguous),
            (1, DataOrder::Global),
            (3, DataOrder::Global),
        ] {
            let err = s
                .resume(rank(0, world), order, 2, 2, dir)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("written by 3 rank(s) in the contiguous data order")
                    && err.contains("same world size")
                    && err.contains("data_order = \"global\""),
                "{err}"
            );
        }
        // A damaged list of positions is an error, not a panic.
        let mut damaged = s.clone();
        damaged.other_ranks.pop();
        let err = damaged
            .resume(rank(2, 3), DataOrder::Contiguous, 2, 2, dir)
            .unwrap_err();
        assert!(
            err.to_string().contains("no data position for rank 2"),
            "{err}"
        );
        // Checkpoints from before data parallelism are one rank's, and
        // continue in either order on any world size.
        let old: State = serde_json::from_value(serde_json::json!({
            "step": 5, "optimizer_steps": 5,
            "loader": {"epoch": 0, "next_doc": 7, "buffer": [], "samples": 5},
            "monitor": MonitorState::default(), "elapsed_s": 2.0, "sweep_version": "0.1.0"
        }))
        .unwrap();
        assert_eq!(
            (old.data_order, old.global_batch),
            (DataOrder::Contiguous, 0)
        );
        let r = old
            .resume(Ranks::SINGLE, DataOrder::Global, 2, 1, dir)
            .unwrap();
        assert_eq!((r.loader.next_doc, r.gradient_accumulation), (7, 1));
        let r = old
            .resume(rank(1, 2), DataOrder::Global, 2, 1, dir)
            .unwrap();
        assert_eq!(
            (r.loader.next_doc, r.gradient_accumulation),
            (7, 1),
            "no global batch recorded: the configured accumulation"
        );
    }

    #[test]
    fn a_global_position_resumes_on_any_world_size_keeping_the_global_batch() {
        // 2 ranks at batch 2, accumulation 2: a global batch of 8.
        let s = state(2, DataOrder::Global);
        assert_eq!((s.other_ranks.len(), s.global_batch), (0, 8));
        let dir = Path::new(DIR);
        for (world, batch, accumulation) in [(1, 2, 4), (4, 2, 1), (1, 1, 8), (8, 1, 1)] {
            for r in [0, world - 1] {
                let resume = s
                    .resume(rank(r, world), DataOrder::Global, batch, 2, dir)
                    .unwrap();
                assert_eq!(
                    resume.loader.next_doc, 3,
                    "every rank from the one position"
                );
                assert_eq!(
                    resume.gradient_accumulation, accumulation,
                    "{world} × {batch}"
                );
                let change = resume.change.unwrap();
                assert!(
                    change.contains(&format!("world size 2 → {world}"))
                        && change.contains(&format!(
                            "global batch 8 kept (gradient accumulation 2 → {accumulation})"
                        )),
                    "{change}"
                );
            }
        }
        for (world, batch) in [(3, 1), (16, 1), (1, 3)] {
            let err = s
                .resume(rank(0, world), DataOrder::Global, batch, 1, dir)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("global batch of 8 samples") && err.contains("cannot keep"),
                "{err}"
            );
        }
        // Into the contiguous order on one rank (every document): the same position.
        let r = s
            .resume(Ranks::SINGLE, DataOrder::Contiguous, 8, 1, dir)
            .unwrap();
        assert_eq!((r.loader.next_doc, r.gradient_accumulation), (3, 1));
        let err = s
            .resume(rank(0, 2), DataOrder::Contiguous, 2, 2, dir)
            .unwrap_err();
        assert!(
            err.to_string().contains(
                "2 rank(s) in the global data order and this job has 2 in the contiguous"
            ),
            "{err}"
        );
    }
}
