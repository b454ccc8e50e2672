//! The bf16 product on Intel AMX: `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one
//! into 16 x 16 f32 sums, eight times `vdpbf16ps`'s work. A is packed as rows of bf16 pairs
//! along k, B as panels of 32 columns of pairs (AMX's right-operand layout); a 32 x 32 block of
//! C keeps its four tiles over all of k. Measured in docs/performance.md ("bf16 on AMX").

use super::{pack_panel, View};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Rows and columns of C one block computes: 2 x 2 tiles of 16 x 16.
const BLOCK: usize = 32;
/// Pairs of k one tile step takes: a tile row of 64 bytes.
const STEP: usize = 16;
/// Rows of C one parallel task computes.
const MC: usize = 128;

/// Whether the CPU has AMX-BF16 and the OS lets this process use its tiles (asked once).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| super::avx512_bf16_available() && tiles::enable())
}

/// C (m x n, row-major) = A · B, bf16 operands, f32 sums, each written once. Needs [`available`].
pub fn gemm(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [MaybeUninit<f32>]) {
    assert!(available(), "the AMX kernel needs AMX-BF16");
    let kpp = k.div_ceil(2).next_multiple_of(STEP);
    let ap = pack_rows(a, m, k, kpp);
    let bp = pack_columns(b, k, n, kpp);
    c.par_chunks_mut(MC * n)
        .enumerate()
        .for_each(|(blk, c_rows)| {
            let (ic, mc) = (blk * MC, MC.min(m - blk * MC));
            // SAFETY: `available` said the CPU and the OS allow the tiles.
            let _tiles = unsafe { tiles::Configured::new() };
            let mut edge = [0f32; BLOCK * BLOCK];
            for j0 in (0..n).step_by(BLOCK) {
                let bpanel = &bp[j0 / BLOCK * kpp * BLOCK..][..kpp * BLOCK];
                for i0 in (0..mc).step_by(BLOCK) {
                    let apanel = &ap[(ic + i0) * kpp..][..BLOCK * kpp];
                    let (mr, nr) = (BLOCK.min(mc - i0), BLOCK.min(n - j0));
                    let out = &mut c_rows[i0 * n + j0..];
                    if mr == BLOCK && nr == BLOCK {
                        assert!(out.len() >= (BLOCK - 1) * n + BLOCK);
                        // SAFETY: the panels hold 32 rows and columns of kpp pairs (a multiple of STEP); C holds 32
                        // rows of 32 at stride n (asserted); tiles configured above.
                        unsafe { tiles::block(apanel, bpanel, kpp, out.as_mut_ptr().cast(), n) };
                    } else {
                        // SAFETY: as above, into a 32 x 32 buffer.
                        unsafe { tiles::block(apanel, bpanel, kpp, edge.as_mut_ptr(), BLOCK) };
                        for i in 0..mr {
                            let row = &mut out[i * n..i * n + nr];
                            for (d, s) in row.iter_mut().zip(&edge[i * BLOCK..]) {
                                *d = MaybeUninit::new(*s);
                            }
                        }
                    }
                }
            }
        });
}

/// A as rows of bf16 pairs along k, rows padded to a multiple of 32, pairs past k zero.
fn pack_rows(a: View, m: usize, k: usize, kpp: usize) -> Vec<u32> {
    let len = m.next_multiple_of(BLOCK) * kpp;
    let mut data: Vec<u32> = Vec::with_capacity(len);
    pack_rows_into(a, m, k, kpp, &mut data.spare_capacity_mut()[..len]);
    // SAFETY: `pack_rows_into` wrote every element.
    unsafe { data.set_len(len) };
    data
}

/// [`pack_rows`] into `out`, every element written.
fn pack_rows_into(a: View, m: usize, k: usize, kpp: usize, out: &mut [MaybeUninit<u32>]) {
    out.par_chunks_mut(BLOCK * kpp)
        .enumerate()
        .for_each(|(panel, out)| {
            let (r0, valid) = (panel * BLOCK, BLOCK.min(m - panel * BLOCK));
            if a.cs == 1 {
                for (r, row) in out.chunks_exact_mut(kpp).enumerate() {
                    match r < valid {
                        // SAFETY: AVX-512 BF16 checked by `available`.
                        true => unsafe { simd::row_pairs(&a.data[(r0 + r) * a.rs..][..k], row) },
                        false => row.fill(MaybeUninit::new(0)),
                    }
                }
                return;
            }
            // k strided: 16 pairs of the panel's 32 rows at a time, as the other kernel packs them, turned.
            let mut pairs = [MaybeUninit::new(0u32); STEP * BLOCK];
            for s in 0..kpp / STEP {
                let k0 = s * 2 * STEP;
                let kc = (2 * STEP).min(k.saturating_sub(k0));
                if kc > 0 {
                    pack_panel(a, k0, kc, r0, valid, BLOCK, &mut pairs, true);
                }
                for r in 0..BLOCK {
                    for p in 0..STEP {
                        out[r * kpp + s * STEP + p] = match p < kc.div_ceil(2) {
                            true => pairs[p * BLOCK + r],
                            false => MaybeUninit::new(0),
                        };
                    }
                }
            }
        });
}

/// B as panels of 32 columns: kpp pairs of 32 lanes each (zeros past k and n).
fn pack_columns(b: View, k: usize, n: usize, kpp: usize) -> Vec<u32> {
    let len = n.div_ceil(BLOCK) * kpp * BLOCK;
    let mut data: Vec<u32> = Vec::with_capacity(len);
    pack_columns_into(b, k, n, kpp, &mut data.spare_capacity_mut()[..len]);
    // SAFETY: `pack_columns_into` wrote every element.
    unsafe { data.set_len(len) };
    data
}

/// [`pack_columns`] into `out`, every element written.
fn pack_columns_into(b: View, k: usize, n: usize, kpp: usize, out: &mut [MaybeUninit<u32>]) {
    let kp = k.div_ceil(2);
    out.par_chunks_mut(kpp * BLOCK)
        .enumerate()
        .for_each(|(p, out)| {
            let valid = BLOCK.min(n - p * BLOCK);
            pack_panel(
                b,
                0,
                k,
                p * BLOCK,
                valid,
                BLOCK,
                &mut out[..kp * BLOCK],
                false,
            );
            out[kp * BLOCK..].fill(MaybeUninit::new(0));
        });
}

mod simd {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// A row of k contiguous values as bf16 pairs into `out` (zeros past k).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn row_pairs(src: &[f32], out: &mut [MaybeUninit<u32>]) {
        let mask = |n: usize| ((1u32 << n.min(16)) - 1) as u16;
        let k = src.len();
        let mut p = 0;
        while 2 * p < k && p < out.len() {
            let left = k - 2 * p;
            let lo = _mm512_maskz_loadu_ps(mask(left), src.as_ptr().add(2 * p));
            // Masked off, a lane reads nothing: the pointer may pass the end.
            let hi_at = src.as_ptr().wrapping_add(2 * p + 16);
            let hi = _mm512_maskz_loadu_ps(mask(left.saturating_sub(16)), hi_at);
            let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_mask_storeu_epi32(out.as_mut_ptr().add(p).cast(), mask(out.len() - p), pairs);
            p += 16;
        }
        let written = p.min(out.len());
        out[written..].fill(MaybeUninit::new(0));
    }
}

mod tiles {
    use std::arch::asm;

    /// CPUID's AMX-BF16 and AMX-TILE, and Linux's leave to use tile data (else the first faults).
    pub fn enable() -> bool {
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let cpu = leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0;
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a request for a permission, which changes nothing else.
        cpu && unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        } == 0
    }

    /// `ldtilecfg`'s 64 bytes: palette 1, every tile 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    /// This thread's tiles configured until dropped (`tilerelease`: no tile state saved after).
    pub struct Configured(());

    impl Configured {
        /// # Safety
        /// [`super::available`] must be true.
        pub unsafe fn new() -> Configured {
            let mut c = [0u8; 64];
            c[0] = 1;
            for t in 0..8 {
                c[16 + 2 * t] = 64; // bytes per row
                c[48 + t] = 16; // rows
            }
            let config = Config(c);
            asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
            Configured(())
        }
    }

    impl Drop for Configured {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by `new`.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }

    /// C (32 x 32, row stride `ldc` floats) = A panel (32 rows of `kpp`
    /// pairs) · B panel (`kpp` pairs of 32 columns): tiles 0-3 sum C's four
    /// quarters, 4-5 hold A's two halves, 6-7 B's.
    ///
    /// # Safety
    /// Tiles configured ([`Configured`]); `kpp` a multiple of 16; the
    /// panels hold 32 · kpp pairs each; C 32 rows of 32 at stride `ldc`.
    pub unsafe fn block(a: &[u32], b: &[u32], kpp: usize, c: *mut f32, ldc: usize) {
        debug_assert!(kpp.is_multiple_of(16) && a.len() >= 32 * kpp && b.len() >= 32 * kpp);
        let (a, b) = (a.as_ptr(), b.as_ptr());
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let (row_a, row_b): (usize, usize) = (kpp * 4, 32 * 4);
        for p in (0..kpp).step_by(16) {
            asm!(
                "tileloadd tmm4, [{a0} + {row_a}*1]",
                "tileloadd tmm6, [{b0} + {row_b}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {row_b}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {row_a}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(p),
                a1 = in(reg) a.add(16 * kpp + p),
                b0 = in(reg) b.add(p * 32),
                b1 = in(reg) b.add(p * 32 + 16),
                row_a = in(reg) row_a,
                row_b = in(reg) row_b,
                options(nostack, readonly)
            );
        }
        let row_c = ldc * 4;
        asm!(
            "tilestored [{c0} + {row_c}*1], tmm0",
            "tilestored [{c1} + {row_c}*1], tmm1",
            "tilestored [{c2} + {row_c}*1], tmm2",
            "tilestored [{c3} + {row_c}*1], tmm3",
            c0 = in(reg) c,
            c1 = in(reg) c.add(16),
            c2 = in(reg) c.add(16 * ldc),
            c3 = in(reg) c.add(16 * ldc + 16),
            row_c = in(reg) row_c,
            options(nostack)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing writes every element of its buffer (never zeroed first):
    /// packed over a sentinel, it equals packed over zeros, for rows along
    /// k or across it, odd k and edge panels.
    #[test]
    fn packing_writes_every_element() {
        if !available() {
            eprintln!("skipped: this CPU (or OS) lacks AMX");
            return;
        }
        let data: Vec<f32> = (0..2 * 70 * 75).map(|i| (i % 13) as f32 - 6.0).collect();
        for (x, k) in [(33usize, 75usize), (70, 32), (1, 1)] {
            let kpp = k.div_ceil(2).next_multiple_of(STEP);
            for (rs, cs) in [(k, 1), (1, x), (2 * k, 2)] {
                let v = View {
                    data: &data,
                    rs,
                    cs,
                };
                let rows = |fill: u32| {
                    let mut out = vec![MaybeUninit::new(fill); x.next_multiple_of(BLOCK) * kpp];
                    pack_rows_into(v, x, k, kpp, &mut out);
                    // SAFETY: filled before packing.
                    out.iter()
                        .map(|e| unsafe { e.assume_init() })
                        .collect::<Vec<u32>>()
                };
                assert_eq!(
                    rows(u32::MAX),
                    rows(0),
                    "rows: x {x} k {k} strides {rs},{cs}"
                );
                let v = View {
                    data: &data,
                    rs: cs,
                    cs: rs,
                };
                let columns = |fill: u32| {
                    let mut out = vec![MaybeUninit::new(fill); x.div_ceil(BLOCK) * kpp * BLOCK];
                    pack_columns_into(v, k, x, kpp, &mut out);
                    // SAFETY: filled before packing.
                    out.iter()
                        .map(|e| unsafe { e.assume_init() })
                        .collect::<Vec<u32>>()
                };
                assert_eq!(columns(u32::MAX), columns(0), "columns: x {x} k {k}");
            }
        }
    }
}
