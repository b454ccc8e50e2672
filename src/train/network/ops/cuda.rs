//! Compiling and launching the trainer's own CUDA kernels (`kernels/*.cu`): NVRTC compiles
//! each source to CUBIN once per process and architecture when first needed (no toolkit at
//! build time). Each launch is held to its signature in [`crate::train::network::kernels::KERNELS`];
//! `scripts/check-gpu-offline.sh` holds the same CUBINs to the same table without a GPU.
//! The kernels run on candle's stream, in order with candle's own.

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{
    CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    DriverError, LaunchArgs, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::cuda::{CudaDType, CudaDevice, CudaError};
use candle_core::{bail, CudaStorage, DType, Layout, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::store::{Span, Store};
use crate::train::network::kernels::{self, Arg, KernelSource, Ty};

/// A source's CUBIN for an architecture, compiled once per process. CUBIN, not PTX: a driver
/// refuses PTX newer than itself but loads a newer NVRTC's CUBIN of its major version.
fn cubin(source: &KernelSource, arch: (i32, i32)) -> Result<&'static [u8]> {
    type Cache =
        Mutex<HashMap<(&'static str, i32, i32), std::result::Result<&'static [u8], String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let compiled = cache
        .entry((source.module, arch.0, arch.1))
        .or_insert_with(|| {
            compile_cubin(&kernels::program(source), arch)
                // Leaked once per source, architecture and process: the device keeps the module.
                .map(|bin| &*Box::leak(bin.into_boxed_slice()))
                .map_err(|e| {
                    format!(
                        "compiling the `{}` kernels with NVRTC for sm_{}{}: {e}",
                        source.module, arch.0, arch.1
                    )
                })
        });
    compiled
        .clone()
        .map_err(|e| candle_core::Error::Msg(e.clone()))
}

/// NVRTC's CUBIN of `text` for compute capability `arch`, or its log.
fn compile_cubin(text: &str, (major, minor): (i32, i32)) -> std::result::Result<Vec<u8>, String> {
    use candle_core::cuda::cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(text).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("{e:?}"))?;
    let options = kernels::nvrtc_options((major, minor));
    // SAFETY: `prog` was created above and is destroyed once; the buffer holds NVRTC's size.
    let out = unsafe {
        match result::compile_program(prog, &options) {
            Err(e) => {
                let log = result::get_program_log(prog).unwrap_or_default();
                let log: Vec<u8> = log
                    .iter()
                    .map(|&c| c as u8)
                    .take_while(|&c| c != 0)
                    .collect();
                Err(format!("{e:?}\n{}", String::from_utf8_lossy(&log)))
            }
            Ok(()) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| format!("{e:?}"))
                    .and_then(|()| {
                        let mut bin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast())
                            .result()
                            .map(|()| bin)
                            .map_err(|e| format!("{e:?}"))
                    })
            }
        }
    };
    // SAFETY: created above, not destroyed before.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// A type a kernel's pointer parameter points to.
pub trait Stored {
    const TY: Ty;
}
impl Stored for f32 {
    const TY: Ty = Ty::F32;
}
impl Stored for half::bf16 {
    const TY: Ty = Ty::Bf16;
}
impl Stored for u32 {
    const TY: Ty = Ty::U32;
}

/// A kernel argument, held against its signature ([`kernels::KERNELS`]) before the launch.
pub trait Pushed {
    fn arg(&self) -> Arg;
}
impl Pushed for u32 {
    fn arg(&self) -> Arg {
        Arg::U32
    }
}
impl Pushed for u64 {
    fn arg(&self) -> Arg {
        Arg::U64
    }
}
impl Pushed for f32 {
    fn arg(&self) -> Arg {
        Arg::F32
    }
}
impl<T: Stored> Pushed for CudaSlice<T> {
    fn arg(&self) -> Arg {
        Arg::Ptr(T::TY)
    }
}
impl<T: Stored> Pushed for CudaView<'_, T> {
    fn arg(&self) -> Arg {
        Arg::Ptr(T::TY)
    }
}
impl<T: Stored> Pushed for CudaViewMut<'_, T> {
    fn arg(&self) -> Arg {
        Arg::Ptr(T::TY)
    }
}

/// A reference pushed as an argument (`&x` or `&mut x`).
pub trait Describe {
    fn describe(&self) -> Arg;
}
impl<T: Pushed + ?Sized> Describe for &T {
    fn describe(&self) -> Arg {
        (**self).arg()
    }
}
impl<T: Pushed + ?Sized> Describe for &mut T {
    fn describe(&self) -> Arg {
        (**self).arg()
    }
}

/// A kernel loaded on a device, launched on candle's stream.
pub struct Kernel {
    stream: Arc<CudaStream>,
    func: CudaFunction,
    entry: String,
    want: Vec<Arg>,
}

impl Kernel {
    /// A launch's arguments, to push in the order of the kernel's signature.
    pub fn builder(&self) -> Launch<'_> {
        Launch {
            args: self.stream.launch_builder(&self.func),
            entry: &self.entry,
            want: &self.want,
            got: Vec::with_capacity(self.want.len()),
        }
    }
}

/// A launch's arguments as they are pushed, each one's type recorded.
pub struct Launch<'a> {
    args: LaunchArgs<'a>,
    entry: &'a str,
    want: &'a [Arg],
    got: Vec<Arg>,
}

impl<'a> Launch<'a> {
    /// Pushes the next argument.
    pub fn arg<A: Describe>(&mut self, a: A) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<A>,
    {
        self.got.push(a.describe());
        self.args.arg(a);
        self
    }

    /// Whether what was pushed is the kernel's signature: count, order and types.
    fn check(&self) -> Result<()> {
        if self.got != self.want {
            bail!(
                "sweep's `{}` kernel takes ({}), but its launch pushed ({}): not launched",
                self.entry,
                describe(self.want),
                describe(&self.got)
            );
        }
        Ok(())
    }
}

fn describe(args: &[Arg]) -> String {
    args.iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every kernel compiled and loaded as the device opens, not in the first step's time.
pub fn load_all(dev: &CudaDevice) -> Result<()> {
    for k in kernels::KERNELS {
        for (_, ty) in k.entry_points() {
            let dtype = match ty {
                Ty::F32 => DType::F32,
                _ => DType::BF16,
            };
            function(dev, k.source, k.name, dtype)?;
        }
    }
    Ok(())
}

/// `name_f32` or `name_bf16` of a source, loaded (once per device), with its signature.
pub fn function(
    dev: &CudaDevice,
    source: &KernelSource,
    name: &str,
    dtype: DType,
) -> Result<Kernel> {
    let ty = match dtype {
        DType::F32 => Ty::F32,
        DType::BF16 => Ty::Bf16,
        dt => bail!("sweep's `{name}` kernel takes f32 or bf16, not {dt:?}"),
    };
    let Some(kernel) = kernels::kernel(source, name) else {
        bail!("sweep's `{name}` kernel is not in the kernels' table (src/train/network/kernels/mod.rs)");
    };
    let Some((entry, ty)) = kernel.entry_points().into_iter().find(|(_, t)| *t == ty) else {
        bail!("sweep's `{name}` kernel has no {dtype:?} entry point");
    };
    type Modules = Mutex<HashMap<(usize, &'static str), Arc<CudaModule>>>;
    type Functions = Mutex<HashMap<(usize, String), CudaFunction>>;
    static MODULES: OnceLock<Modules> = OnceLock::new();
    static FUNCTIONS: OnceLock<Functions> = OnceLock::new();
    let stream = dev.cuda_stream();
    let context = stream.context();
    // Each entry point looked up once per device, not at every launch.
    let key = (context.ordinal(), entry.clone());
    let known = FUNCTIONS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&key)
        .cloned();
    let func = match known {
        Some(f) => f,
        None => {
            let module = {
                let mut modules = MODULES
                    .get_or_init(Default::default)
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                match modules.entry((context.ordinal(), source.module)) {
                    std::collections::hash_map::Entry::Occupied(m) => m.get().clone(),
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        let arch = context
                            .compute_capability()
                            .map_err(|e| driver_error(e, source.module))?;
                        let module = context
                            .load_module(Ptx::from_binary(cubin(source, arch)?.to_vec()))
                            .map_err(|e| driver_error(e, source.module))?;
                        slot.insert(module).clone()
                    }
                }
            };
            let f = module
                .load_function(&entry)
                .map_err(|e| driver_error(e, name))?;
            FUNCTIONS
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, f.clone());
            f
        }
    };
    Ok(Kernel {
        stream,
        func,
        want: kernel.args(ty),
        entry,
    })
}

fn driver_error(e: DriverError, what: &str) -> candle_core::Error {
    typed(e, format!("loading sweep's `{what}` kernels"))
}

/// A driver or cuBLAS error as candle's typed error (out-of-memory stays recognisable).
pub fn typed(e: impl Into<CudaError>, doing: String) -> candle_core::Error {
    candle_core::Error::from(e.into()).context(doing)
}

/// `[start, end)` of a contiguous layout.
fn span(l: &Layout) -> Result<std::ops::Range<usize>> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(start..end),
        None => bail!("sweep's CUDA kernels take contiguous tensors"),
    }
}

/// The contiguous elements of a storage under a layout.
pub fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    Ok(s.as_cuda_slice::<T>()?.slice(span(l)?))
}

/// The same, to write into.
pub fn view_mut<'a, T: CudaDType>(
    s: &'a mut CudaStorage,
    l: &Layout,
) -> Result<CudaViewMut<'a, T>> {
    Ok(s.as_cuda_slice_mut::<T>()?.slice_mut(span(l)?))
}

/// The CUDA storage of a tensor an op holds (beside the operands candle hands it).
pub fn on_gpu<'a>(s: &'a candle_core::Storage, what: &str) -> Result<&'a CudaStorage> {
    match s {
        candle_core::Storage::Cuda(s) => Ok(s),
        _ => bail!("{what} is not on the GPU"),
    }
}

/// Uninitialised device memory for `n` values (every writer writes all); one value for none,
/// as the driver refuses 0 bytes.
fn alloc<T: DeviceRepr + ValidAsZeroBits>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: the callers' kernels write all n values before anything reads them.
    unsafe { dev.alloc::<T>(n.max(1)) }
}

/// The device of a storage.
pub fn device(s: &CudaStorage) -> CudaDevice {
    BackendStorage::device(s).clone()
}

/// The dtype of a storage.
pub fn dtype(s: &CudaStorage) -> DType {
    s.dtype()
}

/// The kernels' storage type of a storage (f32 or bf16).
pub fn ty(s: &CudaStorage) -> Result<Ty> {
    match s.dtype() {
        DType::F32 => Ok(Ty::F32),
        DType::BF16 => Ok(Ty::Bf16),
        dt => bail!("sweep's CUDA kernels take f32 or bf16, not {dt:?}"),
    }
}

/// x × y blocks of [`kernels::THREADS`] threads.
fn blocks(x: u32, y: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (kernels::THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches a kernel once its arguments match its signature; an empty grid launches nothing.
///
/// # Safety
/// Every index the kernel reaches under `cfg` is inside the memory passed to it.
pub unsafe fn launch(args: &mut Launch<'_>, cfg: LaunchConfig, what: &str) -> Result<()> {
    args.check()?;
    let (x, y, z) = cfg.grid_dim;
    if x == 0 || y == 0 || z == 0 {
        return Ok(());
    }
    unsafe { args.args.launch(cfg) }
        .map(|_| ())
        .map_err(|e| typed(e, format!("launching sweep's `{what}` kernel")))
}

/// An operand of a plan: the contiguous elements of a storage, typed.
pub enum Operand<'a> {
    F32(CudaView<'a, f32>),
    Bf16(CudaView<'a, half::bf16>),
    U32(CudaView<'a, u32>),
}

impl<'a> Operand<'a> {
    /// The contiguous elements of a storage under a layout, of its dtype.
    pub fn of(s: &'a CudaStorage, l: &Layout) -> Result<Operand<'a>> {
        Ok(match s.dtype() {
            DType::F32 => Operand::F32(view(s, l)?),
            DType::BF16 => Operand::Bf16(view(s, l)?),
            DType::U32 => Operand::U32(view(s, l)?),
            dt => bail!("sweep's CUDA kernels take f32, bf16 or u32, not {dt:?}"),
        })
    }
}

impl Span for Operand<'_> {
    fn len(&self) -> usize {
        match self {
            Operand::F32(v) => v.len(),
            Operand::Bf16(v) => v.len(),
            Operand::U32(v) => v.len(),
        }
    }

    fn ty(&self) -> Ty {
        match self {
            Operand::F32(_) => Ty::F32,
            Operand::Bf16(_) => Ty::Bf16,
            Operand::U32(_) => Ty::U32,
        }
    }
}

impl Store for CudaStorage {
    type Device = CudaDevice;
    type Operand<'a> = Operand<'a>;

    fn device(&self) -> CudaDevice {
        device(self)
    }

    fn ty(&self) -> Result<Ty> {
        ty(self)
    }

    fn operand<'a>(&'a self, l: &Layout) -> Result<Operand<'a>> {
        Operand::of(self, l)
    }

    fn operand_mut<'a>(&'a mut self, l: &Layout) -> Result<Operand<'a>> {
        Operand::of(self, l)
    }

    fn held<'a>(s: &'a candle_core::Storage, what: &str) -> Result<&'a CudaStorage> {
        on_gpu(s, what)
    }

    fn with_mut<R>(
        t: &candle_core::Tensor,
        f: impl FnOnce(&mut Self, &Layout) -> Result<R>,
    ) -> Result<R> {
        super::store::with_mut(t, f)
    }

    fn execute(
        dev: &CudaDevice,
        plan: &kernels::LaunchPlan,
        operands: &[Operand<'_>],
    ) -> Result<Vec<Self>> {
        Ok(execute(dev, plan, operands)?
            .into_iter()
            .map(|o| o.into_storage(dev.clone()))
            .collect())
    }

    fn gemm(
        g: &super::linear::Gemm,
        c: (&mut Self, &Layout),
        a: (&Self, &Layout),
        b: (&Self, &Layout),
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        super::linear::cublas::on_gpu::gemm(g, c, a, b, what)
    }
}

impl candle_core::InplaceOp1 for super::store::WithMut<'_, CudaStorage> {
    fn name(&self) -> &'static str {
        "sweep-with-mut"
    }

    fn cpu_fwd(&self, _: &mut candle_core::CpuStorage, _: &Layout) -> Result<()> {
        bail!("a GPU op's tensor is on the CPU")
    }

    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> Result<()> {
        (self.0.borrow_mut())(s, l)
    }
}

/// An output or scratch buffer a plan allocates.
pub enum Owned {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<half::bf16>),
    U32(CudaSlice<u32>),
}

impl Owned {
    fn alloc(dev: &CudaDevice, ty: Ty, n: usize) -> Result<Owned> {
        Ok(match ty {
            Ty::F32 => Owned::F32(alloc(dev, n)?),
            Ty::Bf16 => Owned::Bf16(alloc(dev, n)?),
            Ty::U32 => Owned::U32(alloc(dev, n)?),
        })
    }

    /// A storage of it, for a tensor.
    pub fn into_storage(self, dev: CudaDevice) -> CudaStorage {
        match self {
            Owned::F32(s) => CudaStorage::wrap_cuda_slice(s, dev),
            Owned::Bf16(s) => CudaStorage::wrap_cuda_slice(s, dev),
            Owned::U32(s) => CudaStorage::wrap_cuda_slice(s, dev),
        }
    }
}

/// A pointer argument: a view from an element offset of an operand or a buffer.
enum Pointer<'a> {
    F32(CudaView<'a, f32>),
    Bf16(CudaView<'a, half::bf16>),
    U32(CudaView<'a, u32>),
}

impl<'a> Pointer<'a> {
    fn of_operand(o: &'a Operand<'_>, at: usize) -> Result<Pointer<'a>> {
        if at > o.len() {
            bail!("a planned launch points past an operand");
        }
        Ok(match o {
            Operand::F32(v) => Pointer::F32(v.slice(at..)),
            Operand::Bf16(v) => Pointer::Bf16(v.slice(at..)),
            Operand::U32(v) => Pointer::U32(v.slice(at..)),
        })
    }

    fn of_owned(o: &'a Owned, at: usize) -> Result<Pointer<'a>> {
        let n = match o {
            Owned::F32(s) => s.len(),
            Owned::Bf16(s) => s.len(),
            Owned::U32(s) => s.len(),
        };
        if at > n {
            bail!("a planned launch points past a buffer it allocates");
        }
        Ok(match o {
            Owned::F32(s) => Pointer::F32(s.slice(at..)),
            Owned::Bf16(s) => Pointer::Bf16(s.slice(at..)),
            Owned::U32(s) => Pointer::U32(s.slice(at..)),
        })
    }
}

/// The thread that opened the CUDA device: all GPU work is queued on candle's stream by it.
static GPU_THREAD: std::sync::OnceLock<std::thread::ThreadId> = std::sync::OnceLock::new();

/// Makes this thread, which opened the device, the one that queues GPU work.
pub fn claim_gpu_thread() {
    let _ = GPU_THREAD.set(std::thread::current().id());
}

/// Whether this thread may queue GPU work (any, before a device was opened: the tests').
fn gpu_thread() -> bool {
    GPU_THREAD
        .get()
        .is_none_or(|t| *t == std::thread::current().id())
}

/// Runs a plan ([`kernels::LaunchPlan`]) on candle's stream; returns its outputs.
pub fn execute(
    dev: &CudaDevice,
    plan: &kernels::LaunchPlan,
    operands: &[Operand],
) -> Result<Vec<Owned>> {
    use kernels::{Mem, Value};
    if !gpu_thread() {
        bail!("sweep's kernels are queued by the thread that opened the device (one stream, in that thread's order)");
    }
    let outputs = plan
        .outputs
        .iter()
        .map(|&(ty, n)| Owned::alloc(dev, ty, n))
        .collect::<Result<Vec<_>>>()?;
    let scratch = plan
        .scratch
        .iter()
        .map(|&(ty, n)| Owned::alloc(dev, ty, n))
        .collect::<Result<Vec<_>>>()?;
    for l in &plan.launches {
        let dtype = match l.own {
            Ty::F32 => DType::F32,
            Ty::Bf16 => DType::BF16,
            Ty::U32 => DType::U32,
        };
        let kernel = function(dev, l.kernel.source, l.kernel.name, dtype)?;
        // The views first: the builder keeps pointers to them.
        let pointers = l
            .args
            .iter()
            .filter_map(|a| match *a {
                Value::Ptr(m, at) => Some(match m {
                    Mem::Operand(i) => match operands.get(i) {
                        Some(o) => Pointer::of_operand(o, at),
                        None => Err(candle_core::Error::Msg(
                            "a plan names a missing operand".into(),
                        )),
                    },
                    Mem::Output(i) => Pointer::of_owned(&outputs[i], at),
                    Mem::Scratch(i) => Pointer::of_owned(&scratch[i], at),
                }),
                _ => None,
            })
            .collect::<Result<Vec<_>>>()?;
        let mut b = kernel.builder();
        let mut next = pointers.iter();
        for a in &l.args {
            match a {
                Value::Ptr(..) => match next.next().expect("a view per pointer") {
                    Pointer::F32(v) => b.arg(v),
                    Pointer::Bf16(v) => b.arg(v),
                    Pointer::U32(v) => b.arg(v),
                },
                Value::U32(v) => b.arg(v),
                Value::U64(v) => b.arg(v),
                Value::F32(v) => b.arg(v),
            };
        }
        let entry = l.entry();
        // SAFETY: `launch` checks the arguments against the signature, and each plan bounds what its
        // kernels touch by the sizes it passes (every plan runs under AddressSanitizer in the tests).
        unsafe { launch(&mut b, blocks(l.grid.0, l.grid.1), &entry) }?;
    }
    Ok(outputs)
}
