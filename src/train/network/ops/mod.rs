//! Fused kernels with hand-written backward passes, where candle's ops drop gradients or spend
//! their time allocating intermediates and launching small kernels. Each op's file holds its
//! CPU kernel (f32, rayon), its CUDA launch (`kernels/<op>.cu`, the CPU kernel its reference)
//! and a composed twin from candle ops the tests check both against. Their cases are in
//! [`cases`], the rule that judges them in [`check`].

pub mod accumulate;
pub mod adamw;
pub mod attention;
/// Every op's cases: what `sweep bench kernels` times and the self-check runs (docs/extending.md).
pub mod cases {
    mod accumulate;
    mod adamw;
    mod attention;
    mod cross_entropy;
    mod embedding;
    mod grad_norm;
    mod linear;
    mod rms_norm;
    mod rope;
    mod silu_mul;

    use super::check::{Case, Shapes};
    use anyhow::Result;

    /// Every op's cases, in the table's order.
    pub fn all(s: &Shapes) -> Result<Vec<Case>> {
        all_with(s, s)
    }

    /// [`all`], the loss's at `loss`'s shapes (its vocabulary is a width).
    pub fn all_with(s: &Shapes, loss: &Shapes) -> Result<Vec<Case>> {
        let mut cases = Vec::new();
        cases.extend(rms_norm::cases(s)?);
        cases.extend(silu_mul::cases(s)?);
        cases.extend(rope::cases(s)?);
        cases.extend(cross_entropy::cases(loss)?);
        cases.extend(embedding::cases(s)?);
        cases.extend(attention::softmax_cases(s)?);
        cases.extend(attention::cases(s)?);
        cases.extend(linear::cases(s)?);
        cases.extend(grad_norm::cases(s)?);
        cases.extend(adamw::cases(s)?);
        cases.extend(accumulate::cases(s)?);
        Ok(cases)
    }
}
pub mod check;
pub mod cross_entropy;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod embedding;
pub(crate) mod emulated;
pub mod exp;
pub mod grad_norm;
pub mod linear;
pub mod rms_norm;
pub mod rope;
pub mod selfcheck;
pub mod silu_mul;
pub mod softmax;
pub(crate) mod store;

pub use crate::config::runtime::CudaKernels;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Tensor};

/// The dtype an op's backward computes in off the fused path: f64 for f64 (the oracle), else
/// f32 (bf16 reductions lose too much).
pub(crate) fn work_dtype(t: &Tensor) -> DType {
    if t.dtype() == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Whether the fused CPU kernels apply (contiguous f32 on the CPU).
pub fn fused(t: &Tensor) -> bool {
    !gpu_path(t.device()) && t.dtype() == DType::F32
}

/// Whether ops on `device` take their GPU paths: on a GPU, or the tests' emulated device.
pub fn gpu_path(device: &candle_core::Device) -> bool {
    device.is_cuda() || emulating()
}

/// Whether this thread's CPU tensors are on the emulated device (tests only).
pub(crate) fn emulating() -> bool {
    emulated::active()
}

/// The kernels an op may run instead of its composed twin, each checked against it when a CUDA
/// device opens ([`selfcheck`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Kernel {
    RmsNorm,
    SiluMul,
    Rope,
    CrossEntropy,
    Embedding,
    Softmax,
    #[strum(serialize = "weight_gradient")]
    WeightGrad,
    GradNorm,
    #[strum(serialize = "adamw")]
    AdamW,
    #[strum(serialize = "flash_attention")]
    Flash,
    Accumulate,
    AttentionBackward,
}

impl Kernel {
    /// Its name in messages and in the run's metrics.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether it is sweep's own kernel (`SWEEP_CUDA_KERNELS` chooses): all but candle-flash-attn's.
    pub fn own(self) -> bool {
        self != Kernel::Flash
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// The kernels that failed their self-check on this GPU (bits of [`Kernel`]).
static FALLEN_BACK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Makes `kernels` take their composed twins on GPUs from now on.
pub(crate) fn fall_back(kernels: &[Kernel]) {
    let bits = kernels.iter().fold(0, |b, k| b | k.bit());
    FALLEN_BACK.fetch_or(bits, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `kernel` runs on a GPU: chosen by `SWEEP_CUDA_KERNELS` and not fallen back.
pub fn on_gpu(kernel: Kernel) -> bool {
    let fallen = FALLEN_BACK.load(std::sync::atomic::Ordering::Relaxed) & kernel.bit() != 0;
    let left_out = kernel.own() && cuda_kernels() == CudaKernels::Composed;
    !(fallen || left_out)
}

/// Whether an op runs `kernel` on these operands: the CPU's in f32, or the CUDA one when all
/// are f32 or all bf16 on a GPU and [`on_gpu`] says so.
pub fn own_kernel(kernel: Kernel, operands: &[&Tensor]) -> bool {
    let Some(first) = operands.first() else {
        return false;
    };
    if COMPOSED_HERE.with(|c| c.get()) {
        return false;
    }
    if operands.iter().all(|t| fused(t)) {
        return true;
    }
    let dtype = first.dtype();
    (cfg!(feature = "cuda") || cfg!(test))
        && matches!(dtype, DType::F32 | DType::BF16)
        && operands
            .iter()
            .all(|t| gpu_path(t.device()) && t.dtype() == dtype)
        && on_gpu(kernel)
}

thread_local! {
    /// Set by [`composed_here`]: this thread's ops take their composed twins.
    static COMPOSED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with ops taking their composed twins on this thread (`sweep bench kernels`).
pub fn composed_here<T>(f: impl FnOnce() -> T) -> T {
    let before = COMPOSED_HERE.with(|c| c.replace(true));
    let out = f();
    COMPOSED_HERE.with(|c| c.set(before));
    out
}

/// A run's `kernels`, where it set one: over the process's option.
static RUN_KERNELS: std::sync::OnceLock<CudaKernels> = std::sync::OnceLock::new();

/// Makes a run's `kernels` this process's choice (once: a process trains one run).
pub(crate) fn set_run_kernels(k: CudaKernels) {
    let _ = RUN_KERNELS.set(k);
}

/// Which implementation the ops with CUDA kernels use: the run's `kernels`, else
/// `SWEEP_CUDA_KERNELS`.
pub fn cuda_kernels() -> CudaKernels {
    RUN_KERNELS
        .get()
        .copied()
        .unwrap_or_else(|| crate::config::RuntimeOptions::current().cuda_kernels)
}

/// Whether the in-place CPU kernels apply to a buffer and its operands.
pub(crate) fn in_place(buf: &Tensor, operands: &[&Tensor]) -> bool {
    fused(buf) && buf.is_contiguous() && operands.iter().all(|t| fused(t))
}

/// The contiguous f32 data of a CPU storage.
pub(crate) fn f32s<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("expected f32 data")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("expected contiguous data"),
    }
}

/// The contiguous values of an f32 or bf16 CPU storage, as f32.
pub(crate) fn f32_values<'a>(s: &'a CpuStorage, l: &Layout) -> Result<std::borrow::Cow<'a, [f32]>> {
    match s {
        CpuStorage::BF16(v) => match l.contiguous_offsets() {
            Some((a, b)) => Ok(v[a..b].iter().map(|x| x.to_f32()).collect()),
            None => bail!("expected contiguous data"),
        },
        _ => Ok(f32s(s, l)?.into()),
    }
}

/// All the f32 data of a CPU storage (for ops that read through strides).
pub(crate) fn f32s_any(s: &CpuStorage) -> Result<&[f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        _ => bail!("expected f32 data"),
    }
}

/// Rows per parallel task: enough work per task to amortise scheduling.
pub(crate) fn rows_per_task(rows: usize, row_len: usize) -> usize {
    (16_384 / row_len.max(1)).clamp(1, rows.max(1))
}

#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{Device, Result, Tensor};

    /// Deterministic pseudo-random data in [-1, 1): the benchmark's and the
    /// self-check's generator ([`super::check::random`]).
    pub fn rand(shape: &[usize], seed: u64) -> Tensor {
        super::check::random(shape, seed, 1.0).expect("a CPU tensor")
    }

    /// The largest |a − b| over two tensors of one shape; infinite where
    /// one holds a NaN and the other does not (candle's max passes NaNs
    /// over, and a kernel that leaves NaNs must not pass a test).
    pub fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        if a.shape() != b.shape() {
            candle_core::bail!("max_diff: shapes {:?} and {:?}", a.shape(), b.shape());
        }
        let values = |t: &Tensor| -> Result<Vec<f32>> {
            t.to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()
        };
        let worst = values(a)?
            .iter()
            .zip(values(b)?)
            .map(|(&x, y)| match (x.is_nan(), y.is_nan()) {
                (true, true) => 0.0,
                (false, false) if x == y => 0.0,
                (false, false) => (x - y).abs(),
                _ => f32::INFINITY,
            })
            .fold(0.0, f32::max);
        Ok(worst)
    }

    use crate::train::network::kernels::emulator::{Buffer, Emulator, Flavor};
    use crate::train::network::kernels::{LaunchPlan, Ty};

    /// A kernel's bf16 stores against its twin's f32 values `want`: each the
    /// value rounded to nearest even, bit for bit, but where the value lies
    /// within `rel` (relative) or `abs` of a tie between two bf16 values,
    /// which the kernel's own f32 arithmetic (another order of additions)
    /// may round the other way (`abs` for outputs that cancel). A store that
    /// truncates differs on about half the values, and passes any tolerance
    /// (one bf16 step, 2^-8 relative). f32 buffers pass (their tolerance is
    /// the caller's).
    pub fn assert_rounded(got: &Buffer, want: &Tensor, rel: f32, abs: f32) {
        let want: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
        if let Err(e) = rounded(got, &want, rel, abs) {
            panic!("{e}");
        }
    }

    /// [`assert_rounded`]'s rule, as a result.
    pub fn rounded(
        got: &Buffer,
        want: &[f32],
        rel: f32,
        abs: f32,
    ) -> std::result::Result<(), String> {
        if got.ty != Ty::Bf16 {
            return Ok(());
        }
        let got: Vec<half::bf16> = got
            .bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
            .collect();
        if got.len() != want.len() {
            return Err(format!(
                "{} values stored, {} expected",
                got.len(),
                want.len()
            ));
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let r = half::bf16::from_f32(w);
            if g.to_bits() == r.to_bits() || (g.is_nan() && w.is_nan()) {
                continue;
            }
            let neighbours = g.to_bits().abs_diff(r.to_bits()) == 1;
            let tie = (g.to_f32() + r.to_f32()) / 2.0;
            if !(neighbours && (w - tie).abs() <= rel * w.abs() + abs) {
                return Err(format!(
                    "value {i}: stored {g} ({:#06x}), its twin's {w:e} rounds to {r} ({:#06x})",
                    g.to_bits(),
                    r.to_bits()
                ));
            }
        }
        Ok(())
    }

    /// A CPU tensor's values as an emulator buffer of storage type `ty`
    /// (f32 data rounded to bf16 for Bf16).
    pub fn buffer(t: &Tensor, ty: Ty) -> Buffer {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        match ty {
            Ty::F32 => Buffer::f32(&v),
            Ty::Bf16 => Buffer::bf16(
                &v.iter()
                    .map(|&x| half::bf16::from_f32(x))
                    .collect::<Vec<_>>(),
            ),
            Ty::U32 => panic!("u32 data is built with Buffer::u32"),
        }
    }

    /// A buffer's values as an f32 CPU tensor of `shape`.
    pub fn tensor(b: &Buffer, shape: &[usize]) -> Tensor {
        Tensor::from_vec(b.to_f32(), shape, &Device::Cpu).unwrap()
    }

    /// Runs a plan on `operands` under the host emulation of CUDA, with
    /// AddressSanitizer and UndefinedBehaviorSanitizer, and where `race`,
    /// with ThreadSanitizer too (its barriers and shuffles: slow, so once
    /// per kernel), which must give the same bits (the kernels' results
    /// depend on nothing but the launch shape). Returns the outputs and the
    /// operands after; none where g++ is missing (the test is then skipped).
    pub fn emulate(
        plan: &LaunchPlan,
        operands: &[Buffer],
        race: bool,
    ) -> Option<(Vec<Buffer>, Vec<Buffer>)> {
        let address = Emulator::get(Flavor::Address)?;
        let mut a = operands.to_vec();
        let out = address.run(plan, &mut a).unwrap();
        if race {
            let thread = Emulator::get(Flavor::Thread)?;
            let mut t = operands.to_vec();
            let out_t = thread.run(plan, &mut t).unwrap();
            assert!(
                out == out_t && a == t,
                "ThreadSanitizer's run gave other bits"
            );
        }
        Some((out, a))
    }

    /// Runs `plan` under the emulation (AddressSanitizer and UBSan) with
    /// every operand one value further in, off the 16-byte alignment the
    /// kernels' wide path needs: returns the outputs and the operands after,
    /// without the value in front, which must be untouched. Called after
    /// [`emulate`] ran (g++ is there).
    pub fn emulate_off_alignment(
        plan: &LaunchPlan,
        operands: &[Buffer],
    ) -> (Vec<Buffer>, Vec<Buffer>) {
        use crate::train::network::kernels::{Mem, Value};
        let mut plan = plan.clone();
        for arg in plan.launches.iter_mut().flat_map(|l| l.args.iter_mut()) {
            if let Value::Ptr(Mem::Operand(i), offset) = *arg {
                *arg = Value::Ptr(Mem::Operand(i), offset + 1);
            }
        }
        let shifted: Vec<Buffer> = operands
            .iter()
            .map(|b| {
                let mut bytes = vec![0xff; b.ty.size()];
                bytes.extend_from_slice(&b.bytes);
                Buffer { ty: b.ty, bytes }
            })
            .collect();
        let (out, after) = emulate(&plan, &shifted, false).unwrap();
        let after = after
            .into_iter()
            .map(|b| {
                let (front, rest) = b.bytes.split_at(b.ty.size());
                assert!(
                    front.iter().all(|&x| x == 0xff),
                    "the value in front was written"
                );
                Buffer {
                    ty: b.ty,
                    bytes: rest.to_vec(),
                }
            })
            .collect();
        (out, after)
    }
}
