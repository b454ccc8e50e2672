//! A checkpoint's tensor files (safetensors), written from the buffers the
//! trainer holds and read back one tensor at a time, in place where it can:
//! saving or resuming a large model never holds its weights or optimizer
//! state twice (on a CPU, whose memory the run already fills, a second copy
//! of AdamW's moments is what the kernel's out-of-memory killer ends).

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

    /// Reads f32 tensor `name`, of `shape`, into `into`.
    pub fn read_f32_into(&self, name: &str, shape: &[usize], into: &mut [f32]) -> Result<()> {
        let info = self.info(name)?;
        if info.dtype != Dtype::F32 || info.shape != shape {
            bail!(
                "{}: `{name}` is {:?} {:?}, not F32 {shape:?}",
                self.path.display(),
                info.dtype,
                info.shape
            );
        }
        ensure!(
            into.len() == shape.iter().product::<usize>(),
            "`{name}`: buffer size"
        );
        self.read_at(info, bytemuck::cast_slice_mut(into))
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
    use super::*;

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
        f.read_f32_into("m.w", &[3, 4], &mut back).unwrap();
        assert_eq!(back, values);
        let ids = f.load("ids", &Device::Cpu).unwrap();
        assert_eq!(ids.to_vec2::<u32>().unwrap(), [[0, 1, 2], [3, 4, 5]]);
        let wrong = f.read_f32_into("m.w", &[4, 3], &mut back).unwrap_err();
        assert!(wrong.to_string().contains("not F32 [4, 3]"), "{wrong}");
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
