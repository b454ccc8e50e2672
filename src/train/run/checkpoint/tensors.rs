//! A checkpoint's tensor files (safetensors), the model's and the
//! optimizer's: written from the buffers the trainer holds and read back one
//! tensor at a time, in place where it can, so that saving or resuming a
//! large model never holds its weights or optimizer state twice (on a CPU,
//! whose memory the run already fills, a second copy of AdamW's moments is
//! what the kernel's out-of-memory killer ends).

use super::{TrainState, MODEL};
use crate::train::network::optim::{AdamW, MomentsMut, MomentsRef};
use crate::train::network::params::Params;
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, TensorInfo, View};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

// The files are little-endian, as are the hosts sweep runs on (x86-64,
// aarch64): host buffers are written and read as their bytes.
const _: () = assert!(cfg!(target_endian = "little"));

/// What one header may take (safetensors' own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor to write.
pub enum Entry<'a> {
    /// f32 values on the host, written as they lie.
    Host {
        values: &'a [f32],
        shape: &'a [usize],
    },
    /// A tensor on any device, copied to the host as it is written.
    Tensor(&'a Tensor),
}

impl View for Entry<'_> {
    fn dtype(&self) -> Dtype {
        match self {
            Entry::Host { .. } => Dtype::F32,
            Entry::Tensor(t) => View::dtype(t),
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            Entry::Host { shape, .. } => shape,
            Entry::Tensor(t) => t.dims(),
        }
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            Entry::Host { values, .. } => Cow::Borrowed(bytemuck::cast_slice(values)),
            Entry::Tensor(t) => View::data(t),
        }
    }

    fn data_len(&self) -> usize {
        match self {
            Entry::Host { values, .. } => std::mem::size_of_val(*values),
            Entry::Tensor(t) => View::data_len(t),
        }
    }
}

/// Writes `entries` to `path`, one tensor's bytes at a time.
pub fn write(path: &Path, entries: Vec<(String, Entry<'_>)>) -> Result<()> {
    use safetensors::SafeTensorError;
    safetensors::tensor::serialize_to_file(entries, None, path).map_err(|e| match e {
        // Said once: the library's wrapper repeats the system's words.
        SafeTensorError::IoError(io) => anyhow::Error::new(io),
        e => anyhow::anyhow!("{e}"),
    })
}

/// The model's parameters, by name.
pub fn write_model(path: &Path, params: &Params) -> Result<()> {
    let entries = params
        .iter()
        .map(|(n, v)| (n.clone(), Entry::Tensor(v.as_tensor())))
        .collect();
    write(path, entries)
}

/// The optimizer's moments, named `m.<param>` and `v.<param>`.
pub fn write_optimizer(path: &Path, opt: &AdamW) -> Result<()> {
    let mut entries = Vec::new();
    for (name, shape, moments) in opt.moments() {
        let (m, v) = match moments {
            MomentsRef::Host { m, v } => (
                Entry::Host { values: m, shape },
                Entry::Host { values: v, shape },
            ),
            MomentsRef::Device { m, v } => (Entry::Tensor(m), Entry::Tensor(v)),
        };
        entries.push((format!("m.{name}"), m));
        entries.push((format!("v.{name}"), v));
    }
    write(path, entries)
}

/// Loads a checkpoint's tensors into the model and optimizer, one tensor at
/// a time (the optimizer's host buffers in place). The moments are read by
/// range from wherever the checkpoint holds them — one file, or one per rank
/// of a ZeRO run — so a checkpoint resumes on any world size and any `zero`.
pub fn restore(
    dir: &Path,
    state: &TrainState,
    params: &Params,
    opt: &mut AdamW,
    device: &Device,
) -> Result<()> {
    let resuming = || format!("resuming from {}", dir.display());
    let model = TensorFile::open(&dir.join(MODEL))?;
    params
        .load(model.names(), |name| model.load(name, device))
        .with_context(resuming)?;
    let files = state
        .optimizer_files()
        .iter()
        .map(|f| TensorFile::open(&dir.join(f)))
        .collect::<Result<Vec<_>>>()?;
    read_moments(&files, state.optimizer_steps, opt).with_context(resuming)
}

/// Sets `opt`'s step count to `t` and each of its variables' moments from
/// `files`, by the ranges its variables name.
fn read_moments(files: &[TensorFile], t: u64, opt: &mut AdamW) -> Result<()> {
    let moments = Pieces::index(files)?;
    opt.load_moments(t, |slot, shape, into| {
        let (param, range) = piece_of(slot, shape.iter().product())?;
        match into {
            MomentsMut::Host { m, v } => {
                moments.read('m', param, &range, m)?;
                moments.read('v', param, &range, v)
            }
            MomentsMut::Device { m, v, dtype } => {
                for (kind, t) in [('m', m), ('v', v)] {
                    let mut values = vec![0f32; range.len()];
                    moments.read(kind, param, &range, &mut values)?;
                    *t = Tensor::from_vec(values, shape, t.device())?.to_dtype(dtype)?;
                }
                Ok(())
            }
        }
    })
}

/// The parameter and its element range an optimizer slot or a checkpoint
/// entry names: `name` (the whole of its `len` elements) or ZeRO's piece
/// `name[a..b]`.
fn piece_of(slot: &str, len: usize) -> Result<(&str, std::ops::Range<usize>)> {
    let Some(inner) = slot.strip_suffix(']') else {
        return Ok((slot, 0..len));
    };
    let parsed = inner.rsplit_once('[').and_then(|(name, range)| {
        let (a, b) = range.split_once("..")?;
        Some((name, a.parse().ok()?..b.parse().ok()?))
    });
    match parsed {
        Some((name, r)) if r.start <= r.end && r.len() == len => Ok((name, r)),
        _ => bail!("`{slot}` ({len} values) names no part of a parameter"),
    }
}

/// Where each parameter's moments lie in a checkpoint's optimizer files: by
/// moment (`m`, `v`) and parameter, the entries holding its ranges.
struct Pieces<'a> {
    by_param: BTreeMap<(char, &'a str), Vec<Held<'a>>>,
}

/// A range of a parameter's moment, and the file and entry holding it.
type Held<'a> = (std::ops::Range<usize>, &'a TensorFile, &'a str);

impl<'a> Pieces<'a> {
    fn index(files: &'a [TensorFile]) -> Result<Pieces<'a>> {
        let mut by_param: BTreeMap<_, Vec<_>> = BTreeMap::new();
        for file in files {
            for (entry, info) in &file.tensors {
                let kind = match entry.split_at_checked(2) {
                    Some(("m.", _)) => 'm',
                    Some(("v.", _)) => 'v',
                    _ => continue,
                };
                let (param, range) = piece_of(&entry[2..], info.shape.iter().product())
                    .with_context(|| format!("{}", file.path.display()))?;
                by_param
                    .entry((kind, param))
                    .or_default()
                    .push((range, file, entry.as_str()));
            }
        }
        by_param
            .values_mut()
            .for_each(|v| v.sort_by_key(|(r, ..)| r.start));
        Ok(Pieces { by_param })
    }

    /// Moment `kind`'s values of `param` over `range`, into `into`: every
    /// value from exactly one entry, or an error.
    fn read(
        &self,
        kind: char,
        param: &str,
        range: &std::ops::Range<usize>,
        into: &mut [f32],
    ) -> Result<()> {
        let mut next = range.start;
        for (r, file, entry) in self.by_param.get(&(kind, param)).into_iter().flatten() {
            if r.end <= next || next == range.end {
                continue;
            }
            ensure!(
                r.start <= next,
                "the checkpoint lacks {kind}.{param}[{next}..{}]",
                r.start
            );
            let end = r.end.min(range.end);
            file.read_f32_range(
                entry,
                next - r.start,
                &mut into[next - range.start..end - range.start],
            )?;
            next = end;
        }
        ensure!(
            next == range.end && into.len() == range.len(),
            "the checkpoint lacks {kind}.{param}[{next}..{}]: is it from another model?",
            range.end
        );
        Ok(())
    }
}

/// A tensor file opened for reading: its table of tensors, checked against
/// the file's length.
pub struct TensorFile {
    path: PathBuf,
    file: std::fs::File,
    /// Where the tensors' bytes begin.
    data_start: u64,
    tensors: BTreeMap<String, TensorInfo>,
}

impl TensorFile {
    pub fn open(path: &Path) -> Result<TensorFile> {
        let file = crate::util::fs::open_input("the tensor file", path)?;
        let len = file.metadata()?.len();
        let mut n = [0u8; 8];
        file.read_exact_at(&mut n, 0)
            .with_context(|| format!("{} is too short for a tensor file", path.display()))?;
        let n = u64::from_le_bytes(n);
        ensure!(
            n <= MAX_HEADER_BYTES && 8 + n <= len,
            "{} is not a tensor file: its header would take {n} bytes of {len}",
            path.display()
        );
        let mut header = vec![0u8; n as usize];
        file.read_exact_at(&mut header, 8)?;
        let mut table: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .with_context(|| format!("{} has no readable header", path.display()))?;
        table.remove("__metadata__");
        let data_start = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, info) in table {
            let info: TensorInfo = serde_json::from_value(info)
                .with_context(|| format!("{}: the entry of `{name}`", path.display()))?;
            let (begin, end) = info.data_offsets;
            let bytes = info
                .shape
                .iter()
                .try_fold(info.dtype.bitsize() / 8, |n, &d| n.checked_mul(d));
            ensure!(
                info.dtype.bitsize().is_multiple_of(8)
                    && begin <= end
                    && bytes == Some(end - begin)
                    && data_start.checked_add(end as u64).is_some_and(|e| e <= len),
                "{}: `{name}` ({:?} {:?}) does not fit where the header puts it (bytes {begin}..{end} of {})",
                path.display(),
                info.dtype,
                info.shape,
                len - data_start
            );
            tensors.insert(name, info);
        }
        Ok(TensorFile {
            path: path.to_path_buf(),
            file,
            data_start,
            tensors,
        })
    }

    /// The names of the tensors the file holds.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors
            .get(name)
            .with_context(|| format!("{} lacks `{name}`", self.path.display()))
    }

    fn read_at(&self, info: &TensorInfo, into: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(into, self.data_start + info.data_offsets.0 as u64)
            .with_context(|| format!("reading {}", self.path.display()))
    }

    /// Values `from`.. of tensor `name` (f32 or bf16) as f32, into `into`.
    fn read_f32_range(&self, name: &str, from: usize, into: &mut [f32]) -> Result<()> {
        let info = self.info(name)?;
        let len: usize = info.shape.iter().product();
        ensure!(
            from + into.len() <= len,
            "{}: `{name}` has {len} values",
            self.path.display()
        );
        let at = |size: usize| self.data_start + (info.data_offsets.0 + from * size) as u64;
        let reading = || format!("reading {}", self.path.display());
        match info.dtype {
            Dtype::F32 => self
                .file
                .read_exact_at(bytemuck::cast_slice_mut(into), at(4))
                .with_context(reading),
            Dtype::BF16 => {
                let mut raw = vec![0u16; into.len()];
                self.file
                    .read_exact_at(bytemuck::cast_slice_mut(&mut raw), at(2))
                    .with_context(reading)?;
                for (x, b) in into.iter_mut().zip(raw) {
                    *x = half::bf16::from_bits(b).to_f32();
                }
                Ok(())
            }
            other => bail!(
                "{}: `{name}` is {other:?}, not F32 or BF16",
                self.path.display()
            ),
        }
    }

    /// Tensor `name` on `device`.
    pub fn load(&self, name: &str, device: &Device) -> Result<Tensor> {
        let info = self.info(name)?;
        let dtype = DType::try_from(info.dtype)
            .with_context(|| format!("{}: `{name}`", self.path.display()))?;
        let mut bytes = vec![0u8; info.data_offsets.1 - info.data_offsets.0];
        self.read_at(info, &mut bytes)?;
        Ok(Tensor::from_raw_buffer(&bytes, dtype, &info.shape, device)?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{save, tests::state};
    use super::*;
    use crate::config::DataOrder;

    /// Moments written by three ZeRO ranks are read back by a plain run and
    /// by each rank of two, and a plain run's by each of three ranks: every
    /// value from the file that held it.
    #[test]
    fn moments_resume_across_world_sizes_and_zero_values() -> Result<()> {
        use crate::train::run::dist::{GradientLayout, Sharded};
        let (model, grads, params) = crate::train::run::dist::buckets::tests::tiny_model();
        let layout = GradientLayout::new(&grads, &model.stages())?;
        let cfg = crate::config::TrainConfig::default();
        // Each value's moments say where they belong.
        let planted = |param: &str, i: usize| (param.len() * 1000 + i) as f32;
        let fill = |slot: &str, into: MomentsMut<'_>| -> Result<()> {
            let MomentsMut::Host { m, v } = into else {
                bail!("host moments")
            };
            let (param, range) = piece_of(slot, m.len())?;
            for (k, i) in range.enumerate() {
                (m[k], v[k]) = (planted(param, i), -planted(param, i));
            }
            Ok(())
        };
        let dir = tempfile::tempdir()?;
        let mut paths = Vec::new();
        for rank in 0..3 {
            let mut z = Sharded::new(&layout, &params, &cfg, (rank, 3))?;
            z.opt.load_moments(7, |slot, _, into| fill(slot, into))?;
            paths.push(dir.path().join(format!("rank-{rank}")));
            write_optimizer(paths.last().unwrap(), &z.opt)?;
        }
        let files = paths
            .iter()
            .map(|p| TensorFile::open(p))
            .collect::<Result<Vec<_>>>()?;
        let check = |opt: &AdamW| {
            for (slot, _, moments) in opt.moments() {
                let MomentsRef::Host { m, v } = moments else {
                    panic!("host moments")
                };
                let (param, range) = piece_of(slot, m.len()).unwrap();
                for (k, i) in range.enumerate() {
                    assert_eq!(
                        (m[k], v[k]),
                        (planted(param, i), -planted(param, i)),
                        "{slot}"
                    );
                }
            }
        };
        let mut plain = AdamW::new(&params, &cfg)?;
        read_moments(&files, 7, &mut plain)?;
        assert_eq!(plain.t, 7);
        check(&plain);
        for rank in 0..2 {
            let mut z = Sharded::new(&layout, &params, &cfg, (rank, 2))?;
            read_moments(&files, 7, &mut z.opt)?;
            check(&z.opt);
        }
        // And back: the plain optimizer's one file, read by each of three ranks.
        let whole = dir.path().join("plain");
        write_optimizer(&whole, &plain)?;
        let files = [TensorFile::open(&whole)?];
        for rank in 0..3 {
            let mut z = Sharded::new(&layout, &params, &cfg, (rank, 3))?;
            read_moments(&files, 7, &mut z.opt)?;
            check(&z.opt);
        }
        let files = paths
            .iter()
            .map(|p| TensorFile::open(p))
            .collect::<Result<Vec<_>>>()?;
        // A missing rank's file leaves values no file holds: an error.
        let err = read_moments(&files[..2], 7, &mut plain).unwrap_err();
        assert!(
            format!("{err:#}").contains("the checkpoint lacks"),
            "{err:#}"
        );
        Ok(())
    }

    /// A tensor's values as f32.
    fn values(t: &candle_core::Tensor) -> Vec<f32> {
        let t = t.to_dtype(candle_core::DType::F32).unwrap();
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    /// Each parameter's moments, as f32 values.
    fn moments_of(opt: &AdamW) -> Vec<(String, Vec<f32>, Vec<f32>)> {
        opt.moments()
            .map(|(name, _, m)| match m {
                MomentsRef::Host { m, v } => (name.into(), m.to_vec(), v.to_vec()),
                MomentsRef::Device { m, v } => (name.into(), values(m), values(v)),
            })
            .collect()
    }

    /// The model and the optimizer come back as they were saved, with AdamW's
    /// moments in f32 host buffers (an f32 model on the CPU) and as tensors
    /// (bf16 here, as on a GPU), each read a tensor at a time.
    #[test]
    fn a_checkpoint_restores_the_weights_and_both_kinds_of_moments() {
        use crate::train::network::params::{Declare, Init, ParamSource};
        for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
            let model = |seed| {
                let mut d = Declare::new(&Device::Cpu).unwrap();
                d.param("a.weight", &[3, 5], Init::Normal(0.02)).unwrap();
                d.param("b.weight", &[7], Init::Ones).unwrap();
                Params::init(d, seed, &Device::Cpu, dtype).unwrap()
            };
            let cfg = crate::config::TrainConfig::default();
            let params = model(1);
            let mut saved = AdamW::new(&params, &cfg).unwrap();
            let mut k = 0.0f32;
            saved
                .load_moments(5, |_, shape, moments| {
                    let n: usize = shape.iter().product();
                    let mut next = || {
                        k += 0.25;
                        (0..n).map(|i| k + i as f32).collect::<Vec<f32>>()
                    };
                    match moments {
                        MomentsMut::Host { m, v } => {
                            m.copy_from_slice(&next());
                            v.copy_from_slice(&next());
                        }
                        MomentsMut::Device { m, v, dtype } => {
                            let t = |x: Vec<f32>| {
                                candle_core::Tensor::from_vec(x, shape, &Device::Cpu)?
                                    .to_dtype(dtype)
                            };
                            *m = t(next())?;
                            *v = t(next())?;
                        }
                    }
                    Ok(())
                })
                .unwrap();
            let run = tempfile::tempdir().unwrap();
            let state = TrainState {
                optimizer_steps: 5,
                ..state(1, DataOrder::Global)
            };
            let dir = save(run.path(), &params, &saved, &state).unwrap();

            let other = model(2);
            let mut fresh = AdamW::new(&other, &cfg).unwrap();
            restore(&dir, &state, &other, &mut fresh, &Device::Cpu).unwrap();
            assert_eq!(fresh.t, 5);
            assert_eq!(moments_of(&fresh), moments_of(&saved), "{dtype:?}");
            for ((n, a), (_, b)) in params.iter().zip(other.iter()) {
                assert_eq!(
                    values(a.as_tensor()),
                    values(b.as_tensor()),
                    "{n} {dtype:?}"
                );
            }
        }
    }

    #[test]
    fn host_buffers_and_tensors_are_written_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
        let t = Tensor::arange(0u32, 6, &Device::Cpu)
            .unwrap()
            .reshape((2, 3))
            .unwrap();
        write(
            &path,
            vec![
                (
                    "m.w".into(),
                    Entry::Host {
                        values: &values,
                        shape: &[3, 4],
                    },
                ),
                ("ids".into(), Entry::Tensor(&t)),
            ],
        )
        .unwrap();
        // candle reads what was written, as any safetensors reader would.
        let theirs = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
        assert_eq!(
            theirs["m.w"]
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            values
        );

        let f = TensorFile::open(&path).unwrap();
        assert_eq!(f.names().collect::<Vec<_>>(), ["ids", "m.w"]);
        let mut back = vec![0f32; 12];
        f.read_f32_range("m.w", 0, &mut back).unwrap();
        assert_eq!(back, values);
        let mut tail = vec![0f32; 5];
        f.read_f32_range("m.w", 7, &mut tail).unwrap();
        assert_eq!(tail, values[7..]);
        let ids = f.load("ids", &Device::Cpu).unwrap();
        assert_eq!(ids.to_vec2::<u32>().unwrap(), [[0, 1, 2], [3, 4, 5]]);
        let past = f.read_f32_range("m.w", 8, &mut tail).unwrap_err();
        assert!(past.to_string().contains("has 12 values"), "{past}");
        let wrong = f.read_f32_range("ids", 0, &mut tail).unwrap_err();
        assert!(wrong.to_string().contains("not F32 or BF16"), "{wrong}");
        assert!(f
            .load("v.w", &Device::Cpu)
            .unwrap_err()
            .to_string()
            .contains("lacks `v.w`"));
    }

    #[test]
    fn a_header_that_points_past_the_file_is_refused_before_anything_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let header = br#"{"w":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}"#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0; 16]);
        std::fs::write(&path, &bytes).unwrap();
        let e = TensorFile::open(&path).err().unwrap().to_string();
        assert!(e.contains("does not fit where the header puts it"), "{e}");
        std::fs::write(&path, u64::MAX.to_le_bytes()).unwrap();
        let e = TensorFile::open(&path).err().unwrap().to_string();
        assert!(e.contains("is not a tensor file"), "{e}");
    }
}
