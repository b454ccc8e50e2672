//! The trainer's own CUDA kernels (the `.cu` files beside this one) as
//! data, in every build: each source, how NVRTC compiles it, and each entry
//! point's signature. The signatures are one table that two checks hold to:
//! every launch pushes exactly its kernel's parameters, asserted before
//! `cuLaunchKernel` (`ops::cuda`, CUDA builds), and every compiled CUBIN
//! has exactly these entry points with parameters of these sizes, checked
//! without a GPU by `scripts/check-gpu-offline.sh` (the test in
//! `offline`), which compiles the sources with NVRTC exactly as the
//! trainer does.

#[cfg(test)]
pub mod emulator;
#[cfg(test)]
mod offline;

/// One kernel source: its module name on the device and its text.
#[derive(Debug)]
pub struct KernelSource {
    pub module: &'static str,
    pub text: &'static str,
}

macro_rules! source {
    ($name:literal) => {
        KernelSource {
            module: concat!("sweep_", $name),
            text: include_str!(concat!($name, ".cu")),
        }
    };
}

pub const ADAMW: KernelSource = source!("adamw");
pub const ATTENTION: KernelSource = source!("attention");
pub const CROSS_ENTROPY: KernelSource = source!("cross_entropy");
pub const EMBEDDING: KernelSource = source!("embedding");
pub const GRAD_NORM: KernelSource = source!("grad_norm");
pub const RMS_NORM: KernelSource = source!("rms_norm");
pub const ROPE: KernelSource = source!("rope");
pub const SILU_MUL: KernelSource = source!("silu_mul");
pub const SOFTMAX: KernelSource = source!("softmax");

/// Every source.
pub const SOURCES: [&KernelSource; 9] = [
    &ADAMW,
    &ATTENTION,
    &CROSS_ENTROPY,
    &EMBEDDING,
    &GRAD_NORM,
    &RMS_NORM,
    &ROPE,
    &SILU_MUL,
    &SOFTMAX,
];

/// What every source is compiled behind: types, loads and stores, warp and
/// block reductions.
pub const COMMON: &str = include_str!("common.cuh");

/// The program NVRTC compiles for a source: `common.cuh`, then the file.
pub fn program(source: &KernelSource) -> String {
    format!("{COMMON}{}", source.text)
}

/// NVRTC's options for compute capability `major.minor`: CUBIN for that
/// architecture (the trainer asks for CUBIN, not PTX), with line information,
/// so that compute-sanitizer and the profilers name a kernel's source line.
pub fn nvrtc_options((major, minor): (i32, i32)) -> Vec<String> {
    vec![
        format!("--gpu-architecture=sm_{major}{minor}"),
        "--generate-line-info".to_string(),
    ]
}

/// The element type of a pointer parameter: the entry point's own storage
/// type (f32 for `name_f32`, bf16 for `name_bf16`), or always f32 or u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    Own,
    F32,
    U32,
}

/// A kernel parameter as declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    Ptr(Elem),
    U32,
    U64,
    F32,
}

/// A storage type a kernel reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F32,
    Bf16,
    U32,
}

impl Ty {
    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            Ty::F32 | Ty::U32 => 4,
            Ty::Bf16 => 2,
        }
    }
}

/// A parameter of one entry point (its `Own` resolved): what a launch must
/// push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    Ptr(Ty),
    U32,
    U64,
    F32,
}

impl Arg {
    /// Its size in the kernel's parameter buffer, in bytes.
    pub fn size(self) -> usize {
        match self {
            Arg::Ptr(_) | Arg::U64 => 8,
            Arg::U32 | Arg::F32 => 4,
        }
    }
}

/// A kernel: its source, its name without the type suffix, whether it has a
/// bf16 entry point besides the f32 one, and its parameters in order.
#[derive(Debug)]
pub struct Kernel {
    pub source: &'static KernelSource,
    pub name: &'static str,
    pub bf16: bool,
    pub params: &'static [Param],
}

impl Kernel {
    /// Its entry points: (`name_f32`, F32) and, where it has one, (`name_bf16`, Bf16).
    pub fn entry_points(&self) -> Vec<(String, Ty)> {
        let mut out = vec![(format!("{}_f32", self.name), Ty::F32)];
        if self.bf16 {
            out.push((format!("{}_bf16", self.name), Ty::Bf16));
        }
        out
    }

    /// Its parameters for the entry point of storage type `own`.
    pub fn args(&self, own: Ty) -> Vec<Arg> {
        self.params
            .iter()
            .map(|p| match p {
                Param::Ptr(Elem::Own) => Arg::Ptr(own),
                Param::Ptr(Elem::F32) => Arg::Ptr(Ty::F32),
                Param::Ptr(Elem::U32) => Arg::Ptr(Ty::U32),
                Param::U32 => Arg::U32,
                Param::U64 => Arg::U64,
                Param::F32 => Arg::F32,
            })
            .collect()
    }
}

use Elem::{Own, F32 as PF32, U32 as PU32};
use Param::{Ptr, F32, U32, U64};

/// Every kernel the trainer launches, as its `.cu` file declares it (the
/// offline check holds the CUBINs to this table, the launches too).
pub const KERNELS: &[Kernel] = &[
    Kernel {
        source: &ADAMW,
        name: "adamw",
        bf16: true,
        // p, g, m, v, clip [norm, scale], n, lr, b1, b2, bc1, bc2, eps, wd
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(PF32),
            U64,
            F32,
            F32,
            F32,
            F32,
            F32,
            F32,
            F32,
        ],
    },
    Kernel {
        source: &ATTENTION,
        name: "attention_bwd_dq",
        bf16: true,
        // q, k, v, d_o, dq, lse, delta, t, d, heads, kv_heads, causal, scale
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(PF32),
            Ptr(PF32),
            U32,
            U32,
            U32,
            U32,
            U32,
            F32,
        ],
    },
    Kernel {
        source: &ATTENTION,
        name: "attention_bwd_dkdv",
        bf16: true,
        // q, k, v, d_o, lse, delta, dk, dv, t, d, heads, kv_heads, causal, scale
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(PF32),
            Ptr(PF32),
            Ptr(Own),
            Ptr(Own),
            U32,
            U32,
            U32,
            U32,
            U32,
            F32,
        ],
    },
    Kernel {
        source: &CROSS_ENTROPY,
        name: "loss_and_grad",
        bf16: true,
        // logits (the gradient written over them), labels, row_loss, v, scale
        params: &[Ptr(Own), Ptr(PU32), Ptr(PF32), U32, F32],
    },
    Kernel {
        source: &EMBEDDING,
        name: "add_rows",
        bf16: true,
        // buf, dy, plan, n, u, d
        params: &[Ptr(Own), Ptr(Own), Ptr(PU32), U32, U32, U32],
    },
    Kernel {
        source: &GRAD_NORM,
        name: "sum_squares",
        bf16: true,
        // g, n, partial
        params: &[Ptr(Own), U64, Ptr(PF32)],
    },
    Kernel {
        source: &GRAD_NORM,
        name: "clip_scale",
        bf16: false,
        // partial, count, max_norm, out [norm, scale]
        params: &[Ptr(PF32), U32, F32, Ptr(PF32)],
    },
    Kernel {
        source: &RMS_NORM,
        name: "rms_norm_fwd",
        bf16: true,
        // x, w, y, rows, d, eps
        params: &[Ptr(Own), Ptr(Own), Ptr(Own), U32, U32, F32],
    },
    Kernel {
        source: &RMS_NORM,
        name: "rms_norm_bwd",
        bf16: true,
        // x, w, dy, dx, partial, rows, d, per, eps
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(PF32),
            U32,
            U32,
            U32,
            F32,
        ],
    },
    Kernel {
        source: &RMS_NORM,
        name: "rms_norm_bwd_dw_sum",
        bf16: true,
        // partial, dw, slabs, d
        params: &[Ptr(PF32), Ptr(Own), U32, U32],
    },
    Kernel {
        source: &ROPE,
        name: "rope",
        bf16: true,
        // x, y, cos, sin, b, d1, d2, q, sign, rotate, forward
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(PF32),
            Ptr(PF32),
            U32,
            U32,
            U32,
            U32,
            F32,
            U32,
            U32,
        ],
    },
    Kernel {
        source: &SILU_MUL,
        name: "silu_mul_fwd",
        bf16: true,
        // a, b, y, n
        params: &[Ptr(Own), Ptr(Own), Ptr(Own), U64],
    },
    Kernel {
        source: &SILU_MUL,
        name: "silu_mul_bwd",
        bf16: true,
        // a, b, dy, out [da; db], n
        params: &[Ptr(Own), Ptr(Own), Ptr(Own), Ptr(Own), U64],
    },
    Kernel {
        source: &SOFTMAX,
        name: "softmax_fwd",
        bf16: true,
        // scores, probs, keys, period, offset, causal, scale
        params: &[Ptr(Own), Ptr(Own), U32, U32, U32, U32, F32],
    },
    Kernel {
        source: &SOFTMAX,
        name: "softmax_bwd",
        bf16: true,
        // probs, dprobs, dscores, keys, scale
        params: &[Ptr(Own), Ptr(Own), Ptr(Own), U32, F32],
    },
    Kernel {
        source: &SOFTMAX,
        name: "softmax_fwd_bwd",
        bf16: true,
        // scores, dprobs, probs, dscores, keys, period, offset, causal, scale
        params: &[
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            Ptr(Own),
            U32,
            U32,
            U32,
            U32,
            F32,
        ],
    },
];

/// The kernel of `source` called `name` (without its type suffix).
pub fn kernel(source: &KernelSource, name: &str) -> Option<&'static Kernel> {
    KERNELS
        .iter()
        .find(|k| k.source.module == source.module && k.name == name)
}

/// Threads per block of every launch.
pub const THREADS: u32 = 256;

/// One warp per row, 8 rows per block (no block for no rows: the executors
/// launch nothing for an empty grid).
pub fn warp_per_row(rows: usize) -> (u32, u32) {
    let warps = THREADS as usize / 32;
    (rows.div_ceil(warps) as u32, 1)
}

/// One block per row (none for no rows: the row kernels read row
/// `blockIdx.x` unchecked).
pub fn block_per_row(rows: u32) -> (u32, u32) {
    (rows, 1)
}

/// A grid-stride loop over n elements: enough blocks to fill a large GPU
/// (132 SMs × 16), fewer for small n.
pub fn grid_stride(n: usize) -> (u32, u32) {
    (n.div_ceil(THREADS as usize).clamp(1, 132 * 16) as u32, 1)
}

/// Blocks of [`THREADS`] columns over `cols` (one for none).
pub fn column_blocks(cols: usize) -> u32 {
    cols.div_ceil(THREADS as usize).max(1) as u32
}

/// A size as the kernels' 32-bit count, or why not.
pub fn u32_of(n: usize, what: &str) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("{what} = {n} is too large for sweep's CUDA kernels"))
}

/// Memory a planned launch points into: an operand of the op (by index, in
/// the order its executor is given them), one of the outputs or the scratch
/// buffers the plan declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mem {
    Operand(usize),
    Output(usize),
    Scratch(usize),
}

/// An argument of a planned launch: memory from an element offset, or a
/// scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Ptr(Mem, usize),
    U32(u32),
    U64(u64),
    F32(f32),
}

/// One launch of a plan: a kernel's entry point (by its storage type), its
/// grid of [`THREADS`]-thread blocks, and its arguments in order.
#[derive(Debug, Clone)]
pub struct Launch {
    pub kernel: &'static Kernel,
    pub own: Ty,
    pub grid: (u32, u32),
    pub args: Vec<Value>,
}

impl Launch {
    /// Its entry point's name (`rms_norm_fwd_bf16`).
    pub fn entry(&self) -> String {
        let suffix = match self.own {
            Ty::F32 => "f32",
            Ty::Bf16 => "bf16",
            Ty::U32 => "u32",
        };
        format!("{}_{suffix}", self.kernel.name)
    }
}

/// An op's work on a GPU as data: the outputs and scratch buffers it
/// allocates (type, values) and its launches in order. The CUDA executor
/// (`ops::cuda::execute`) runs it on candle's stream, and
/// the tests run the same plan on a CPU (the host emulation of the
/// kernels, `emulator`) against the op's CPU twin: the grid sizes,
/// offsets and the order of the arguments are the ones the GPU gets.
#[derive(Debug, Clone, Default)]
pub struct LaunchPlan {
    pub outputs: Vec<(Ty, usize)>,
    pub scratch: Vec<(Ty, usize)>,
    pub launches: Vec<Launch>,
}

impl LaunchPlan {
    /// Declares an output of `n` values (every one written by a launch).
    pub fn output(&mut self, ty: Ty, n: usize) -> Mem {
        self.outputs.push((ty, n));
        Mem::Output(self.outputs.len() - 1)
    }

    /// Declares a scratch buffer of `n` values.
    pub fn scratch(&mut self, ty: Ty, n: usize) -> Mem {
        self.scratch.push((ty, n));
        Mem::Scratch(self.scratch.len() - 1)
    }

    /// Adds a launch of `source`'s kernel `name` for storage type `own`
    /// (none for an empty grid).
    pub fn launch(
        &mut self,
        source: &KernelSource,
        name: &str,
        own: Ty,
        grid: (u32, u32),
        args: Vec<Value>,
    ) -> Result<(), String> {
        let kernel = kernel(source, name)
            .ok_or_else(|| format!("sweep's `{name}` kernel is not in the kernels' table"))?;
        if grid.0 == 0 || grid.1 == 0 {
            return Ok(());
        }
        self.launches.push(Launch {
            kernel,
            own,
            grid,
            args,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel's source declares exactly its table's entry points,
    /// with as many parameters (read from the text; the CUBIN check in
    /// [`offline`] reads the compiled parameter sizes).
    #[test]
    fn the_table_names_every_entry_point_of_every_source() {
        for source in SOURCES {
            let text = program(source).replace("\\\n", " ");
            let mut declared: Vec<(String, usize)> = Vec::new();
            // Entry points are written out (`adamw_f32`) or by a macro over
            // (NAME, T) (`rms_norm_fwd_##NAME`): their stems are compared.
            for line in text.split("extern \"C\" __global__ void ").skip(1) {
                let name = line.split('(').next().unwrap_or("").trim().to_string();
                let params = line
                    .split_once('(')
                    .and_then(|(_, p)| p.split_once(')'))
                    .map_or(0, |(p, _)| {
                        p.split(',').filter(|s| !s.trim().is_empty()).count()
                    });
                declared.push((name, params));
            }
            let mut want: Vec<(String, usize)> = Vec::new();
            for k in KERNELS.iter().filter(|k| k.source.module == source.module) {
                for (entry, _) in k.entry_points() {
                    want.push((entry, k.params.len()));
                }
            }
            // A macro writes `name_##NAME`: compare the stems and counts.
            let stem = |n: &str| {
                n.replace("_##NAME", "")
                    .replace("_f32", "")
                    .replace("_bf16", "")
            };
            let mut have: Vec<(String, usize)> =
                declared.iter().map(|(n, c)| (stem(n), *c)).collect();
            let mut want: Vec<(String, usize)> = want.iter().map(|(n, c)| (stem(n), *c)).collect();
            have.sort();
            have.dedup();
            want.sort();
            want.dedup();
            assert_eq!(have, want, "{}", source.module);
        }
    }
}
