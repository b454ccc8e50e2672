//! Checkpoints: model and optimizer state (safetensors), a JSON of step, data position, monitor
//! state and model, and last a table of contents (`checkpoint.json`: every file's size and hash),
//! written into a temporary directory renamed into place. The newest whole checkpoint is
//! resumed from; a damaged newer one is skipped, named, with why.

use super::dist::{self, Collective, Ranks};
use super::monitor::MonitorState;
use crate::config::{DataOrder, ModelConfig};
use crate::data::LoaderState;
use crate::train::network::optim::AdamW;
use crate::train::network::params::Params;
use anyhow::{bail, Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod tensors;
pub use tensors::restore;

pub const DIR: &str = crate::layout::CHECKPOINTS_DIR;

const KEEP: usize = 2;

const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
/// Rank r's moments, in a checkpoint of a ZeRO run: `optimizer-rank-<r>.safetensors`.
const SHARD_PREFIX: &str = "optimizer-rank-";
const STATE: &str = "state.json";
/// The table of contents, written last: it and the files agreeing make a checkpoint whole.
const CONTENTS: &str = "checkpoint.json";

fn shard_file(rank: usize) -> String {
    format!("{SHARD_PREFIX}{rank}.safetensors")
}

/// The largest `state.json` read (its buffer holds at most one document's rest).
const MAX_STATE_BYTES: u64 = 1 << 30;
/// The most tokens a saved padding-free buffer may hold: the rest of one document.
const MAX_BUFFER_TOKENS: usize = 1 << 26;
/// The most ranks a checkpoint may say wrote it.
const MAX_WORLD_SIZE: usize = 1 << 20;

/// The model a checkpoint belongs to: its preset and resolved shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub preset: String,
    pub shape: ModelConfig,
}

impl ModelIdentity {
    pub fn describe(&self) -> String {
        let s = &self.shape;
        format!(
            "`{}` (dim {}, {} layers, {} heads, {} KV heads, vocabulary {})",
            self.preset, s.dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainState {
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
    /// How the ranks shared the data (older checkpoints: contiguous).
    #[serde(default = "contiguous")]
    pub data_order: DataOrder,
    /// Samples per step over all ranks (0: not recorded, from before elastic resume).
    #[serde(default)]
    pub global_batch: usize,
    /// The model these parameters belong to (older checkpoints: checked by shapes alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelIdentity>,
    pub monitor: MonitorState,
    /// Seconds of training before this checkpoint (the metrics' elapsed_s continues from it).
    pub elapsed_s: f64,
    /// ZeRO: the moments are in this many files, one per rank ([`shard_file`]); 0: one file.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub optimizer_shards: usize,
    pub sweep_version: String,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl TrainState {
    /// The files a checkpoint of this state holds the moments in.
    fn optimizer_files(&self) -> Vec<String> {
        match self.optimizer_shards {
            0 => vec![OPTIMIZER.to_string()],
            n => (0..n).map(shard_file).collect(),
        }
    }
}

fn one() -> usize {
    1
}

fn contiguous() -> DataOrder {
    DataOrder::Contiguous
}

/// How a job continues: its rank's data position and the accumulation keeping the global batch.
#[derive(Debug)]
pub struct Resume<'a> {
    pub loader: &'a LoaderState,
    pub gradient_accumulation: usize,
    /// What changed, for the log (None: the same world size).
    pub change: Option<String>,
}

impl TrainState {
    /// Checks this checkpoint belongs to the run resuming and holds only values a trainer writes.
    pub fn check(&self, model: &ModelIdentity, training_steps: usize, dir: &Path) -> Result<()> {
        let at = dir.display();
        if let Some(m) = self.model.as_ref().filter(|m| *m != model) {
            bail!(
                "{at} was written by the model {} and this run trains {}: a checkpoint resumes only into its own model; \
                 delete the run's checkpoints (or give the run another name) to start this model afresh",
                m.describe(),
                model.describe()
            );
        }
        if self.step > training_steps {
            bail!(
                "{at} is at step {}, beyond this run's {training_steps} training steps: it belongs to another run",
                self.step
            );
        }
        if self.optimizer_steps > self.step as u64 {
            bail!(
                "{at} records {} optimizer steps after {} training steps: the checkpoint is damaged",
                self.optimizer_steps,
                self.step
            );
        }
        if self.world_size == 0
            || self.world_size > MAX_WORLD_SIZE
            || self.other_ranks.len() >= self.world_size
        {
            bail!(
                "{at} says {} rank(s) wrote it (with {} other data positions): the checkpoint is damaged",
                self.world_size,
                self.other_ranks.len()
            );
        }
        if !(self.elapsed_s.is_finite() && self.elapsed_s >= 0.0) {
            bail!(
                "{at} records {} s of training: the checkpoint is damaged",
                self.elapsed_s
            );
        }
        let vocab = model.shape.vocab_size;
        for (rank, loader) in std::iter::once(&self.loader)
            .chain(&self.other_ranks)
            .enumerate()
        {
            if loader.buffer.len() > MAX_BUFFER_TOKENS {
                bail!(
                    "{at}: rank {rank}'s data position holds {} buffered tokens, more than the {MAX_BUFFER_TOKENS} a document leaves: the checkpoint is damaged",
                    loader.buffer.len()
                );
            }
            if let Some(id) = loader.buffer.iter().find(|&&id| id as usize >= vocab) {
                bail!(
                    "{at}: rank {rank}'s data position holds the token id {id}, outside the vocabulary of {vocab}: the checkpoint is damaged or from another tokenizer"
                );
            }
        }
        Ok(())
    }

    /// How the job of `ranks` continues from this checkpoint: a global position (or one rank's) on
    /// any world size, with the accumulation keeping the global batch; per-rank shards only on as
    /// many ranks.
    pub fn resume(
        &self,
        ranks: Ranks,
        order: DataOrder,
        batch: usize,
        accumulation: usize,
        dir: &Path,
    ) -> Result<Resume<'_>> {
        let same = self.world_size == ranks.world_size && self.data_order == order;
        // A single rank's range is every document: the global order's position.
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
            if gradient_accumulation > crate::config::MAX_GRADIENT_ACCUMULATION {
                bail!(
                    "{} was written at a global batch of {} samples, which {} rank(s) at batch {batch} \
                     would keep only with a gradient accumulation of {gradient_accumulation} \
                     (at most {} is allowed): the checkpoint is damaged, or resume on more ranks",
                    dir.display(),
                    self.global_batch,
                    ranks.world_size,
                    crate::config::MAX_GRADIENT_ACCUMULATION
                );
            }
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

/// Writes a checkpoint of every rank's state (rank 0 the model; the moments, or each rank its
/// share under ZeRO; the data positions). Every rank returns once it is complete.
pub fn save_all_ranks(
    run_dir: &Path,
    params: &Params,
    (opt, sharded): (&AdamW, bool),
    mut state: TrainState,
    comm: &dyn Collective,
    device: &Device,
) -> Result<PathBuf> {
    let ranks = comm.ranks();
    let root = run_dir.join(DIR);
    let rank_file = |r: usize| root.join(format!(".rank-{r}-step-{:08}.json", state.step));
    let shard_path = |r: usize| root.join(format!(".rank-{r}-step-{:08}.safetensors", state.step));
    // In the global order every rank stands at rank 0's position.
    let per_rank = state.data_order == DataOrder::Contiguous && ranks.world_size > 1;
    if !ranks.is_main() && (per_rank || sharded) {
        crate::util::fs::make_dir(&root)?;
        if per_rank {
            crate::util::fs::write_atomic(
                &rank_file(ranks.rank),
                &serde_json::to_vec(&state.loader)?,
            )?;
        }
        if sharded {
            tensors::write_optimizer(&shard_path(ranks.rank), opt).with_context(|| {
                format!(
                    "writing rank {}'s share of the optimizer's moments",
                    ranks.rank
                )
            })?;
        }
    }
    dist::barrier(comm, device)?;
    let dest = step_dir(run_dir, state.step);
    if ranks.is_main() {
        state.world_size = ranks.world_size;
        state.optimizer_shards = if sharded { ranks.world_size } else { 0 };
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
        let moments = match sharded {
            false => Moments::Whole(opt),
            true => Moments::Shards(opt, (1..ranks.world_size).map(shard_path).collect()),
        };
        save_with(run_dir, params, moments, &state)?;
        for r in others {
            let _ = std::fs::remove_file(rank_file(r));
        }
    }
    dist::barrier(comm, device)?;
    Ok(dest)
}

/// Where a checkpoint's moments come from: rank 0's optimizer, or every rank's share (ZeRO).
enum Moments<'a> {
    Whole(&'a AdamW),
    Shards(&'a AdamW, Vec<PathBuf>),
}

#[cfg(test)]
pub fn save(run_dir: &Path, params: &Params, opt: &AdamW, state: &TrainState) -> Result<PathBuf> {
    save_with(run_dir, params, Moments::Whole(opt), state)
}

fn save_with(
    run_dir: &Path,
    params: &Params,
    moments: Moments<'_>,
    state: &TrainState,
) -> Result<PathBuf> {
    let root = run_dir.join(DIR);
    let dest = step_dir(run_dir, state.step);
    // A full disk (or any failure) names the checkpoint and the file.
    let writing = |file: &str| format!("writing checkpoint {}: {file}", dest.display());
    crate::util::fs::make_dir(&root)?;
    let tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempdir_in(&root)
        .with_context(|| format!("creating a checkpoint in {}", root.display()))?;
    tensors::write_model(&tmp.path().join(MODEL), params).with_context(|| writing(MODEL))?;
    let optimizer = state.optimizer_files();
    match moments {
        Moments::Whole(opt) => tensors::write_optimizer(&tmp.path().join(OPTIMIZER), opt)
            .with_context(|| writing(OPTIMIZER))?,
        Moments::Shards(opt, others) => {
            tensors::write_optimizer(&tmp.path().join(&optimizer[0]), opt)
                .with_context(|| writing(&optimizer[0]))?;
            for (from, name) in others.iter().zip(&optimizer[1..]) {
                std::fs::rename(from, tmp.path().join(name))
                    .with_context(|| format!("moving {} into {}", from.display(), writing(name)))?;
            }
        }
    }
    std::fs::write(tmp.path().join(STATE), serde_json::to_vec_pretty(state)?)
        .with_context(|| writing(STATE))?;
    // The table of contents last: it vouches for the files above.
    let mut files = vec![MODEL, STATE];
    files.extend(optimizer.iter().map(String::as_str));
    let contents = Contents::of(tmp.path(), &files).with_context(|| writing(CONTENTS))?;
    std::fs::write(
        tmp.path().join(CONTENTS),
        serde_json::to_vec_pretty(&contents)?,
    )
    .with_context(|| writing(CONTENTS))?;
    if dest.exists() {
        std::fs::remove_dir_all(&dest).with_context(|| format!("replacing {}", dest.display()))?;
    }
    std::fs::rename(tmp.keep(), &dest)
        .with_context(|| format!("moving the checkpoint into {}", dest.display()))?;
    prune(&root)?;
    Ok(dest)
}

/// What a checkpoint is called while it is written, inside `checkpoints/`.
const TEMP_PREFIX: &str = ".tmp-";

/// Removes what checkpoints being written when a run was killed left behind
/// (only the rank that writes checkpoints calls this, before it writes any).
pub fn remove_partial(run_dir: &Path) {
    for e in std::fs::read_dir(run_dir.join(DIR))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let is = |dir: bool| {
            e.file_type()
                .is_ok_and(|t| t.is_dir() == dir && !t.is_symlink())
        };
        if name.starts_with(TEMP_PREFIX) && is(true) {
            let _ = std::fs::remove_dir_all(e.path());
        } else if name.starts_with(".rank-") && is(false) {
            // A rank's share written for a checkpoint that never finished.
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A checkpoint's table of contents: every file's size and hash.
#[derive(Debug, Serialize, Deserialize)]
struct Contents {
    files: BTreeMap<String, FileEntry>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct FileEntry {
    bytes: u64,
    /// XXH3-64 of the file, in hex: fast enough for a 100 GB checkpoint
    /// inside SLURM's warning time, and what truncation or a flipped block
    /// changes (this is no defence against tampering, which needs none here).
    xxh3_64: String,
}

impl Contents {
    fn of(dir: &Path, files: &[&str]) -> Result<Contents> {
        let files = files
            .iter()
            .map(|&f| Ok((f.to_string(), FileEntry::of(&dir.join(f))?)))
            .collect::<Result<_>>()?;
        Ok(Contents { files })
    }
}

impl FileEntry {
    fn of(path: &Path) -> Result<FileEntry> {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let bytes = crate::util::hash::stream_file(path, |chunk| hasher.update(chunk))?;
        Ok(FileEntry {
            bytes,
            xxh3_64: format!("{:016x}", hasher.digest()),
        })
    }
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

/// Keeps the newest [`KEEP`] checkpoints that are whole: a damaged one never
/// pushes out the last one a run can resume from.
fn prune(root: &Path) -> Result<()> {
    let all = checkpoints(root);
    let mut whole = 0;
    for (_, p) in all.iter().rev() {
        if whole >= KEEP {
            std::fs::remove_dir_all(p).with_context(|| format!("removing {}", p.display()))?;
        } else if read_whole(p).is_ok() {
            whole += 1;
        }
    }
    Ok(())
}

/// A checkpoint passed over at resume, and why.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub dir: PathBuf,
    pub why: String,
}

/// The newest whole checkpoint, if any, and the newer ones passed over
/// (damaged, truncated, killed mid-write), newest first.
pub fn latest(run_dir: &Path) -> (Option<(PathBuf, TrainState)>, Vec<Skipped>) {
    let mut skipped = Vec::new();
    for (_, dir) in checkpoints(&run_dir.join(DIR)).into_iter().rev() {
        match read_whole(&dir) {
            Ok(state) => return (Some((dir, state)), skipped),
            Err(why) => skipped.push(Skipped { dir, why }),
        }
    }
    (None, skipped)
}

/// The checkpoint at `step`, when it is whole (what the other ranks take
/// once the first has chosen it).
pub fn at_step(run_dir: &Path, step: usize) -> Result<(PathBuf, TrainState)> {
    let dir = step_dir(run_dir, step);
    let state =
        read_whole(&dir).map_err(|why| anyhow::anyhow!("checkpoint {}: {why}", dir.display()))?;
    Ok((dir, state))
}

/// The state of a whole checkpoint, or why it is not one.
fn read_whole(dir: &Path) -> std::result::Result<TrainState, String> {
    use crate::util::fs::read_regular;
    let contents: Contents = match read_regular(&dir.join(CONTENTS), 1 << 20, None) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("its {CONTENTS} is damaged ({e})"))?,
        // Written last: without it the checkpoint was never finished (or
        // an earlier build wrote it), and nothing vouches for its files.
        Err(crate::util::fs::ReadError::NotFound) => {
            return Err(format!(
                "it has no {CONTENTS}: it was never finished, or an earlier build of sweep wrote it"
            ))
        }
        Err(e) => return Err(format!("{CONTENTS} {e}")),
    };
    for f in [MODEL, STATE] {
        if !contents.files.contains_key(f) {
            return Err(format!("its {CONTENTS} does not list {f}"));
        }
    }
    for (f, want) in &contents.files {
        let shard = f
            .strip_prefix(SHARD_PREFIX)
            .and_then(|r| r.split_once('.')?.0.parse().ok())
            .is_some_and(|r| shard_file(r) == *f);
        if !shard && ![MODEL, STATE, OPTIMIZER].contains(&f.as_str()) {
            return Err(format!(
                "its {CONTENTS} lists {f:?}, which no checkpoint holds"
            ));
        }
        let path = dir.join(f);
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("{f}: {e}"))?
            .len();
        if size != want.bytes {
            return Err(format!(
                "{f} is {size} bytes, and {CONTENTS} says it was written with {} (truncated?)",
                want.bytes
            ));
        }
        let got = FileEntry::of(&path).map_err(|e| format!("{e:#}"))?;
        if got != *want {
            return Err(format!(
                "{f} does not hash to what {CONTENTS} recorded (damaged since it was written)"
            ));
        }
    }
    let path = dir.join(STATE);
    let bytes = read_regular(&path, MAX_STATE_BYTES, None).map_err(|e| format!("{STATE} {e}"))?;
    let state: TrainState = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{STATE} is not a checkpoint state: {e}"))?;
    if state.optimizer_shards > MAX_WORLD_SIZE {
        return Err(format!(
            "{STATE} says {} ranks share the optimizer: the checkpoint is damaged",
            state.optimizer_shards
        ));
    }
    match state
        .optimizer_files()
        .into_iter()
        .find(|f| !contents.files.contains_key(f))
    {
        Some(f) => Err(format!("its {CONTENTS} does not list {f}")),
        None => Ok(state),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn state(world_size: usize, data_order: DataOrder) -> TrainState {
        let at = |next_doc| LoaderState {
            next_doc,
            ..Default::default()
        };
        let per_rank = data_order == DataOrder::Contiguous;
        TrainState {
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
            model: None,
            monitor: Default::default(),
            elapsed_s: 1.0,
            sweep_version: "0".into(),
            optimizer_shards: 0,
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

    fn identity(n_layers: usize) -> ModelIdentity {
        let mut shape = ModelConfig::preset("tiny").unwrap();
        shape.n_layers = n_layers;
        shape.vocab_size = 100;
        ModelIdentity {
            preset: "tiny".into(),
            shape,
        }
    }

    #[test]
    fn a_state_no_run_of_this_model_wrote_is_an_error() {
        let dir = Path::new(DIR);
        let ok = TrainState {
            model: Some(identity(4)),
            ..state(1, DataOrder::Global)
        };
        ok.check(&identity(4), 10, dir).unwrap();
        let err = |s: &TrainState, steps: usize| {
            s.check(&identity(4), steps, dir).unwrap_err().to_string()
        };
        let other = TrainState {
            model: Some(identity(2)),
            ..ok.clone()
        };
        let e = err(&other, 10);
        assert!(
            e.contains("model `tiny` (dim 128, 2 layers")
                && e.contains("trains `tiny` (dim 128, 4 layers"),
            "{e}"
        );
        assert!(err(&ok, 9).contains("beyond this run's 9 training steps"));
        let wrapped = TrainState {
            step: usize::MAX,
            ..ok.clone()
        };
        assert!(err(&wrapped, 10).contains("beyond"));
        let mut bad_token = ok.clone();
        bad_token.loader.buffer = vec![1, 100];
        assert!(err(&bad_token, 10).contains("token id 100, outside the vocabulary of 100"));
        let mut huge = ok.clone();
        huge.loader.buffer = vec![0; MAX_BUFFER_TOKENS + 1];
        assert!(err(&huge, 10).contains("buffered tokens"));
        let ahead = TrainState {
            optimizer_steps: 11,
            ..ok.clone()
        };
        assert!(err(&ahead, 10).contains("11 optimizer steps"));
        let ranks = TrainState {
            world_size: 0,
            ..ok.clone()
        };
        assert!(err(&ranks, 10).contains("0 rank(s)"));
        // Checkpoints from before the model was recorded resume by their tensors alone.
        state(1, DataOrder::Global)
            .check(&identity(4), 10, dir)
            .unwrap();
        // A global batch that only a huge accumulation keeps is refused, not looped over.
        let big = TrainState {
            global_batch: 1 << 40,
            ..state(2, DataOrder::Global)
        };
        let e = big
            .resume(Ranks::SINGLE, DataOrder::Global, 1, 1, dir)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("gradient accumulation of 1099511627776"),
            "{e}"
        );
    }

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
        let old: TrainState = serde_json::from_value(serde_json::json!({
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
