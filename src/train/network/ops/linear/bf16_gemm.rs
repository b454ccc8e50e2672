//! A bf16 matrix product for the CPU, as PyTorch's CPU autocast does it:
//! operands rounded to bf16, products accumulated in f32. Three kernels
//! give the same arithmetic (a product of two bf16 values is exact in f32):
//! [`Bf16Kernel::Amx`] (Intel AMX's tiles, [`amx`]), [`Bf16Kernel::Avx512Bf16`]
//! (`vdpbf16ps` in a packed GEMM in the manner of Goto/BLIS: each operand
//! packed once as bf16 pairs along k, a 14 x 32 micro-kernel, row blocks of
//! C in parallel) and [`Bf16Kernel::Portable`] (operands rounded to bf16
//! values in f32, multiplied by the `gemm` crate). The fastest the CPU has
//! is picked once per process, unless `SWEEP_CPU_KERNELS` names one (the
//! tests force each where the CPU has it); docs/performance.md measures them.

use crate::config::runtime::CpuKernels;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;
use strum::VariantArray;

#[cfg(target_arch = "x86_64")]
mod amx;

const MR: usize = 14;
const NR: usize = 32;
/// k values per block (a multiple of 2: pairs).
const KC: usize = 256;
const MC: usize = MR * 9;
const NC: usize = 512;
/// k values per block of the portable kernel: bounds its rounded copies to
/// (m + n) · 512 values whatever k is.
const PORTABLE_KC: usize = 512;

/// Which implementation multiplies bf16 operands, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
pub enum Bf16Kernel {
    #[strum(serialize = "AMX")]
    Amx,
    #[strum(serialize = "AVX-512 BF16")]
    Avx512Bf16,
    #[strum(serialize = "portable")]
    Portable,
}

impl Bf16Kernel {
    /// Whether this CPU (and OS) can run it.
    pub fn available(self) -> bool {
        match self {
            Bf16Kernel::Amx => amx_available(),
            Bf16Kernel::Avx512Bf16 => avx512_bf16_available(),
            Bf16Kernel::Portable => true,
        }
    }

    /// Its name in words: "AMX", "AVX-512 BF16", "portable".
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Whether this CPU has the instructions of [`Bf16Kernel::Avx512Bf16`].
pub fn avx512_bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU has AMX-BF16 and Linux lets this process use it
/// ([`Bf16Kernel::Amx`]).
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The kernel this process uses, chosen once: the one `SWEEP_CPU_KERNELS`
/// names where the CPU has it, else the fastest the CPU has at or below it.
pub fn selected() -> Bf16Kernel {
    static CHOICE: OnceLock<Bf16Kernel> = OnceLock::new();
    *CHOICE.get_or_init(|| choose(crate::config::RuntimeOptions::current().cpu_kernels))
}

/// The fastest kernel this CPU has at or below what `asked` allows.
pub fn choose(asked: CpuKernels) -> Bf16Kernel {
    let ceiling = match asked {
        CpuKernels::Auto | CpuKernels::Amx => 0,
        CpuKernels::Avx512Bf16 => 1,
        CpuKernels::Portable => 2,
    };
    Bf16Kernel::VARIANTS[ceiling..]
        .iter()
        .copied()
        .find(|k| k.available())
        .unwrap_or(Bf16Kernel::Portable)
}

/// f32 -> bf16, round to nearest even (NaNs stay NaNs).
#[inline(always)]
fn bf16(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) | 0x40;
    }
    (b + 0x7fff + ((b >> 16) & 1)) >> 16
}

/// The value of a bf16 as f32 (for tests and references).
pub fn round_bf16(x: f32) -> f32 {
    f32::from_bits(bf16(x) << 16)
}

/// A strided read-only matrix view: element (r, c) at `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

#[cfg(test)]
impl View<'_> {
    fn at(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.rs + c * self.cs]
    }
}

/// C (m x n, row-major, contiguous) = A (m x k) · B (k x n), with the
/// process's [`selected`] kernel.
pub fn gemm(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [f32]) {
    gemm_with(selected(), m, n, k, a, b, c)
}

/// [`gemm()`] into memory that may hold anything (a new matrix's): C is
/// written once, by the product, never zeroed first. Zeroing the products
/// and the packed operands ([`Packed`]), which their writes cover anyway,
/// cost the CPU train step in bf16-mixed 3–7% (`sweep bench train`).
pub fn gemm_uninit(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [MaybeUninit<f32>]) {
    gemm_into(selected(), m, n, k, a, b, c)
}

/// [`gemm()`] with a given kernel (AMX and AVX-512 BF16 need a CPU that has them).
pub fn gemm_with(
    kernel: Bf16Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: View,
    b: View,
    c: &mut [f32],
) {
    // SAFETY: `MaybeUninit<f32>` has f32's layout, and `gemm_into` only
    // writes values (and reads those it wrote).
    let c = unsafe { &mut *(c as *mut [f32] as *mut [MaybeUninit<f32>]) };
    gemm_into(kernel, m, n, k, a, b, c)
}

/// C = A · B into memory that may hold anything: every element of C is
/// written, and read (to add to it) only after it was.
fn gemm_into(
    kernel: Bf16Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: View,
    b: View,
    c: &mut [MaybeUninit<f32>],
) {
    assert_eq!(c.len(), m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(MaybeUninit::new(0.0));
        return;
    }
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Bf16Kernel::Amx => amx::gemm(m, n, k, a, b, c),
        #[cfg(not(target_arch = "x86_64"))]
        Bf16Kernel::Amx => unreachable!("AMX is x86-64's ({m} {n} {k})"),
        Bf16Kernel::Avx512Bf16 => {
            assert!(
                avx512_bf16_available(),
                "the bf16 kernel needs AVX-512 BF16"
            );
            gemm_avx512(m, n, k, a, b, c)
        }
        Bf16Kernel::Portable => {
            // The `gemm` crate is not promised to leave an overwritten C
            // unread: give it zeros.
            c.fill(MaybeUninit::new(0.0));
            // SAFETY: every element was just written.
            let c = unsafe { &mut *(c as *mut [MaybeUninit<f32>] as *mut [f32]) };
            gemm_portable(m, n, k, a, b, c)
        }
    }
}

/// The portable kernel: for every block of k, both operands' blocks rounded
/// to bf16 (held as f32, row-major), then C (+)= A block · B block by the
/// `gemm` crate's f32 kernels. Every product of two bf16 values is exact in
/// f32, so this is bf16 multiplication with f32 accumulation.
fn gemm_portable(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [f32]) {
    let kc_max = PORTABLE_KC.min(k);
    let mut ab = vec![0f32; m * kc_max];
    let mut bb = vec![0f32; kc_max * n];
    for k0 in (0..k).step_by(PORTABLE_KC) {
        let kc = PORTABLE_KC.min(k - k0);
        let (ab, bb) = (&mut ab[..m * kc], &mut bb[..kc * n]);
        ab.par_chunks_mut(kc).enumerate().for_each(|(i, row)| {
            let base = i * a.rs + k0 * a.cs;
            row.iter_mut()
                .enumerate()
                .for_each(|(p, x)| *x = round_bf16(a.data[base + p * a.cs]));
        });
        bb.par_chunks_mut(n).enumerate().for_each(|(p, row)| {
            let base = (k0 + p) * b.rs;
            row.iter_mut()
                .enumerate()
                .for_each(|(j, x)| *x = round_bf16(b.data[base + j * b.cs]));
        });
        // SAFETY: C is m x n row-major (asserted by the caller), the blocks
        // are m x kc and kc x n row-major, all alive and not aliased.
        unsafe {
            super::gemm_f32(
                (m, n, kc),
                c.as_mut_ptr(),
                k0 > 0,
                (ab.as_ptr(), 1, kc),
                (bb.as_ptr(), 1, n),
            )
        };
    }
}

fn gemm_avx512(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [MaybeUninit<f32>]) {
    // Each operand is converted and packed exactly once; every block of C
    // then reads the panels it needs.
    let ap = Packed::new(a, k, m, MR, true);
    let bp = Packed::new(b, k, n, NR, false);
    c.par_chunks_mut(MC * n)
        .enumerate()
        .for_each(|(blk, c_rows)| {
            let ic = blk * MC;
            let mc = MC.min(m - ic);
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for kb in 0..k.div_ceil(KC) {
                    let kp = ap.pairs(kb);
                    for j0 in (jc..jc + nc).step_by(NR) {
                        let bpanel = bp.panel(kb, j0 / NR);
                        for i0 in (0..mc).step_by(MR) {
                            let apanel = ap.panel(kb, (ic + i0) / MR);
                            let (mr, nr) = (MR.min(mc - i0), NR.min(n - j0));
                            let out = &mut c_rows[i0 * n + j0..];
                            tile(apanel, bpanel, kp, out, n, mr, nr, kb == 0);
                        }
                    }
                }
            }
        });
}

/// An operand as bf16 pairs along k: for every block of KC k values, panels
/// of `width` lanes (MR rows of A, NR columns of B), zeros beyond the edges.
/// Its memory is written once, by the packing, never zeroed first (see
/// [`gemm_uninit`]).
struct Packed {
    data: Vec<u32>,
    k: usize,
    panels: usize,
    width: usize,
}

impl Packed {
    /// `x`: the operand's other dimension (m for A, n for B).
    fn new(v: View, k: usize, x: usize, width: usize, k_is_col: bool) -> Packed {
        let len = Packed::len(k, x, width);
        let mut data = Vec::with_capacity(len);
        Packed::write(
            v,
            k,
            x,
            width,
            k_is_col,
            &mut data.spare_capacity_mut()[..len],
        );
        // SAFETY: `write` wrote every element.
        unsafe { data.set_len(len) };
        Packed {
            data,
            k,
            panels: x.div_ceil(width),
            width,
        }
    }

    fn len(k: usize, x: usize, width: usize) -> usize {
        k.div_ceil(2) * x.div_ceil(width) * width
    }

    /// The packed operand into `out` ([`Packed::len`] of it), every
    /// element written: its blocks and panels tile it, and `pack_panel`
    /// writes every lane of its panel.
    fn write(
        v: View,
        k: usize,
        x: usize,
        width: usize,
        k_is_col: bool,
        out: &mut [MaybeUninit<u32>],
    ) {
        let panels = x.div_ceil(width);
        assert_eq!(out.len(), Packed::len(k, x, width));
        out.par_chunks_mut(KC / 2 * panels * width)
            .enumerate()
            .for_each(|(kb, block)| {
                let (k0, kc) = (kb * KC, KC.min(k - kb * KC));
                block
                    .par_chunks_mut(kc.div_ceil(2) * width)
                    .enumerate()
                    .for_each(|(p, out)| {
                        let valid = width.min(x - p * width);
                        pack_panel(v, k0, kc, p * width, valid, width, out, k_is_col);
                    });
            });
    }

    /// Pairs in k block `kb`.
    fn pairs(&self, kb: usize) -> usize {
        KC.min(self.k - kb * KC).div_ceil(2)
    }

    fn panel(&self, kb: usize, p: usize) -> &[u32] {
        let len = self.pairs(kb) * self.width;
        let start = kb * (KC / 2) * self.panels * self.width + p * len;
        &self.data[start..start + len]
    }
}

/// One panel: `width` lanes per pair (x = the non-k dimension, `valid` of them
/// real), pairs along k, every lane of `out` written (zeros beyond `valid`
/// and past an odd k). `k_is_col`: the view is A (k runs along its
/// columns), else B (k runs along its rows).
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_panel(
    v: View,
    k0: usize,
    kc: usize,
    x0: usize,
    valid: usize,
    width: usize,
    out: &mut [MaybeUninit<u32>],
    k_is_col: bool,
) {
    assert!(out.len() >= kc.div_ceil(2) * width);
    let kp = kc.div_ceil(2);
    let (k_stride, x_stride) = if k_is_col { (v.cs, v.rs) } else { (v.rs, v.cs) };
    let base = if k_is_col {
        x0 * v.rs + k0 * v.cs
    } else {
        k0 * v.rs + x0 * v.cs
    };
    #[cfg(target_arch = "x86_64")]
    {
        if x_stride == 1 && kc.is_multiple_of(2) {
            // SAFETY: AVX-512 BF16 checked by `gemm_with`; masked reads stay inside the view.
            unsafe { simd::pairs_from_rows(&v.data[base..], k_stride, kp, valid, width, out) };
            return;
        }
        if k_stride == 1 && kc.is_multiple_of(16) {
            // SAFETY: as above.
            unsafe { simd::pairs_along_rows(&v.data[base..], x_stride, valid, kp, width, out) };
            out[..kp * width]
                .chunks_exact_mut(width)
                .for_each(|lane| lane[valid..].fill(MaybeUninit::new(0)));
            return;
        }
    }
    for p in 0..kp {
        for x in 0..width {
            out[p * width + x] = MaybeUninit::new(if x >= valid {
                0
            } else {
                let at = |k: usize| v.data[base + k * k_stride + x * x_stride];
                let lo = at(2 * p);
                let hi = if 2 * p + 1 < kc { at(2 * p + 1) } else { 0.0 };
                bf16(lo) | (bf16(hi) << 16)
            });
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Pairs of two consecutive k rows, x contiguous: for every 16 x, convert
    /// both rows and interleave them into (row 2p, row 2p+1) lanes. The first
    /// `valid` of `width` lanes are read; the rest are zero.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn pairs_from_rows(
        src: &[f32],
        k_stride: usize,
        kp: usize,
        valid: usize,
        width: usize,
        out: &mut [MaybeUninit<u32>],
    ) {
        // Lane i of the result takes element i of the low row then element i of the high row.
        let idx = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        for p in 0..kp {
            let lo = src.as_ptr().add(2 * p * k_stride);
            let hi = src.as_ptr().add((2 * p + 1) * k_stride);
            for x in (0..width).step_by(16) {
                let load: __mmask16 = if x >= valid {
                    0
                } else {
                    (((1u32 << (valid - x).min(16)) - 1) & 0xffff) as u16
                };
                let store: __mmask16 = (((1u32 << (width - x).min(16)) - 1) & 0xffff) as u16;
                let l = _mm512_maskz_loadu_ps(load, lo.add(x));
                let h = _mm512_maskz_loadu_ps(load, hi.add(x));
                let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(h, l));
                let lanes = _mm512_permutexvar_epi16(idx, both);
                _mm512_mask_storeu_epi32(
                    out.as_mut_ptr().add(p * width + x) as *mut _,
                    store,
                    lanes,
                );
            }
        }
    }

    /// Pairs along contiguous k: 16 floats of one x give 8 pairs at once.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn pairs_along_rows(
        src: &[f32],
        x_stride: usize,
        valid: usize,
        kp: usize,
        width: usize,
        out: &mut [MaybeUninit<u32>],
    ) {
        let mut tmp = [0u32; 8];
        for x in 0..valid {
            let row = src.as_ptr().add(x * x_stride);
            for p in (0..kp).step_by(8) {
                let v: __m256i =
                    std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(row.add(2 * p))));
                _mm256_storeu_si256(tmp.as_mut_ptr() as *mut _, v);
                for (q, t) in tmp.iter().enumerate() {
                    out.get_unchecked_mut((p + q) * width + x).write(*t);
                }
            }
        }
    }
}

/// C[0..mr, 0..nr] (row stride `ldc`) = A panel · B panel when `first`
/// (the first k block), else += it.
#[allow(clippy::too_many_arguments)]
fn tile(
    ap: &[u32],
    bp: &[u32],
    kp: usize,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    mr: usize,
    nr: usize,
    first: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if mr == MR && nr == NR {
            assert!(c.len() >= (MR - 1) * ldc + NR);
            // SAFETY: `gemm_with` asserted AVX-512 F and BF16; the panels hold kp·MR
            // and kp·NR lanes; C holds MR rows of NR at stride ldc (asserted).
            // C is read (to add to) only after the first k block wrote it.
            unsafe {
                kernel(
                    ap.as_ptr(),
                    bp.as_ptr(),
                    kp,
                    c.as_mut_ptr().cast(),
                    ldc,
                    first,
                )
            };
            return;
        }
        // An edge tile: through a full-size buffer.
        let mut acc = [0f32; MR * NR];
        // SAFETY: as above, with the buffer as C.
        unsafe { kernel(ap.as_ptr(), bp.as_ptr(), kp, acc.as_mut_ptr(), NR, true) };
        for i in 0..mr {
            let (row, sum) = (&mut c[i * ldc..i * ldc + nr], &acc[i * NR..i * NR + nr]);
            for (d, s) in row.iter_mut().zip(sum) {
                match first {
                    true => *d = MaybeUninit::new(*s),
                    // SAFETY: the first k block wrote it.
                    false => *d = MaybeUninit::new(unsafe { d.assume_init() } + s),
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "`gemm` asserts `avx512_bf16_available()`, false off x86-64 ({} {} {} {} {} {} {} {first})",
        ap.len(),
        bp.len(),
        kp,
        c.len(),
        ldc,
        mr,
        nr
    );
}

/// The 14 x 32 micro-kernel: C = A panel · B panel over kp pairs when
/// `store`, else C += it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel(ap: *const u32, bp: *const u32, kp: usize, c: *mut f32, ldc: usize, store: bool) {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); MR * 2];
    for p in 0..kp {
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR) as *const _));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR + 16) as *const _));
        let a = ap.add(p * MR);
        for i in 0..MR {
            let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i) as i32));
            acc[2 * i] = _mm512_dpbf16_ps(acc[2 * i], ai, b0);
            acc[2 * i + 1] = _mm512_dpbf16_ps(acc[2 * i + 1], ai, b1);
        }
    }
    for i in 0..MR {
        let row = c.add(i * ldc);
        let (mut lo, mut hi) = (acc[2 * i], acc[2 * i + 1]);
        if !store {
            lo = _mm512_add_ps(lo, _mm512_loadu_ps(row));
            hi = _mm512_add_ps(hi, _mm512_loadu_ps(row.add(16)));
        }
        _mm512_storeu_ps(row, lo);
        _mm512_storeu_ps(row.add(16), hi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The exact product of the bf16-rounded operands, in f64.
    fn reference(m: usize, n: usize, k: usize, a: View, b: View) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| round_bf16(a.at(i, p)) as f64 * round_bf16(b.at(p, j)) as f64)
                    .sum();
            }
        }
        c
    }

    /// The kernels this CPU can run (the portable one everywhere); those it
    /// cannot are said.
    fn kernels() -> Vec<Bf16Kernel> {
        let (can, cannot): (Vec<Bf16Kernel>, Vec<Bf16Kernel>) =
            Bf16Kernel::VARIANTS.iter().partition(|k| k.available());
        for k in cannot {
            eprintln!(
                "the {} kernel is not tested: this CPU (or OS) lacks it",
                k.name()
            );
        }
        can
    }

    #[test]
    fn a_kernel_asked_for_is_used_where_the_cpu_has_it() {
        let best = *Bf16Kernel::VARIANTS.iter().find(|k| k.available()).unwrap();
        assert_eq!(choose(CpuKernels::Auto), best);
        assert_eq!(choose(CpuKernels::Portable), Bf16Kernel::Portable);
        let avx = choose(CpuKernels::Avx512Bf16);
        assert_eq!(
            avx == Bf16Kernel::Avx512Bf16,
            avx512_bf16_available(),
            "{avx:?}"
        );
        assert_ne!(avx, Bf16Kernel::Amx, "never above what was asked");
    }

    #[test]
    fn matches_the_exact_product_of_bf16_operands() {
        for kernel in kernels() {
            exact_product(kernel);
        }
    }

    fn exact_product(kernel: Bf16Kernel) {
        // Edges in every dimension (not multiples of MR, NR, KC, MC, NC,
        // PORTABLE_KC), odd k, and transposed views of both operands.
        for (m, n, k) in [
            (1, 1, 1),
            (15, 33, 7),
            (130, 70, 300),
            (40, 600, 513),
            (9, 20, 1100),
            (64, 96, 64),
            (129, 33, 31),
        ] {
            let a = data(m * k, 1);
            let b = data(k * n, 2);
            for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
                let av = if a_t {
                    View {
                        data: &a,
                        rs: 1,
                        cs: m,
                    }
                } else {
                    View {
                        data: &a,
                        rs: k,
                        cs: 1,
                    }
                };
                let bv = if b_t {
                    View {
                        data: &b,
                        rs: 1,
                        cs: k,
                    }
                } else {
                    View {
                        data: &b,
                        rs: n,
                        cs: 1,
                    }
                };
                // NaN where the product must write: C is never read first.
                let mut c = vec![f32::NAN; m * n];
                gemm_with(kernel, m, n, k, av, bv, &mut c);
                let want = reference(m, n, k, av, bv);
                for (x, y) in c.iter().zip(&want) {
                    assert!(
                        (*x as f64 - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "{kernel:?} {m}x{n}x{k} t={a_t},{b_t}: {x} vs {y}"
                    );
                }
            }
        }
    }

    /// Packing writes every element of its buffer (its memory is never
    /// zeroed): packed over a sentinel, it equals packed over zeros, on
    /// each path — rows or columns contiguous, neither, odd k, edge panels.
    #[test]
    fn packing_writes_every_element() {
        if !avx512_bf16_available() {
            eprintln!("skipped: packing is the AVX-512 BF16 kernel's, and this CPU lacks it");
            return;
        }
        let data = data(2 * 601 * 600, 3);
        for (k, x, width) in [(513, 33, NR), (256, 15, MR), (7, 1, MR), (600, 40, NR)] {
            for (rs, cs) in [(k, 1), (1, x), (2 * k, 2)] {
                for k_is_col in [true, false] {
                    let v = View {
                        data: &data,
                        rs,
                        cs,
                    };
                    let packed = |fill: u32| {
                        let mut out = vec![MaybeUninit::new(fill); Packed::len(k, x, width)];
                        Packed::write(v, k, x, width, k_is_col, &mut out);
                        // SAFETY: filled before `write`.
                        out.iter()
                            .map(|e| unsafe { e.assume_init() })
                            .collect::<Vec<u32>>()
                    };
                    let (over_sentinel, over_zeros) = (packed(u32::MAX), packed(0));
                    let unwritten = over_sentinel
                        .iter()
                        .zip(&over_zeros)
                        .position(|(a, b)| a != b);
                    assert_eq!(
                        unwritten, None,
                        "an element left unwritten: k {k} x {x} width {width} strides {rs},{cs} k_is_col {k_is_col}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0); // halfway: to even
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert!(round_bf16(f32::NAN).is_nan());
    }
}
