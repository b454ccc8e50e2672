//! e^x and ln x for the CPU kernels: the same bits on every architecture.
//!
//! `f32::exp` is a call into the C library, whose `expf` rounds differently
//! on x86-64 and aarch64 (glibc's: over 20 million arguments the two builds'
//! results differ; so do `logf` and `tanhf`). [`exp`] uses only IEEE
//! additions, multiplications and bit operations, which every architecture
//! rounds alike (Rust contracts nothing into an FMA), and has no call and no
//! branch, so the compiler vectorizes a loop of it: 1.2 ns a value against
//! the library's 2.2 (SSE2; `sweep bench train` before and after:
//! docs/performance.md). A loop that also sums the values stays scalar, so
//! the kernels sum in a loop of their own. [`ln`] runs once per row (the
//! loss): the `libm` crate's portable `logf` serves it (its `expf` is
//! portable too, but twice as slow as the C library's).

/// e^x within 2 ulp; `exp(-inf) = 0`, `exp(inf) = inf`, NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Below this e^x is under f32's smallest normal, above it over its largest.
    const LOWEST: f32 = -87.336_55;
    const HIGHEST: f32 = 88.722_83;
    // x = n ln2 + r, |r| <= ln2 / 2, with ln2 in two parts (Cody and Waite):
    // n * LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer (to nearest, ties to even).
    const ROUND: f32 = 12_582_912.0;
    let c = x.clamp(LOWEST, HIGHEST);
    let shifted = c * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // ... and leaves that integer in its low bits: n as an integer without
    // a float-to-integer conversion (Rust's saturating one is not vectorized).
    let k = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = (c - n * LN2_HI) - n * LN2_LO;
    // e^r = 1 + r + r^2 p(r): Cephes' minimax polynomial on [-ln2/2, ln2/2],
    // by Horner's rule from the highest power.
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5, // Cephes' 5.0000001201e-1, which rounds to it in f32
    ];
    let p = P[1..].iter().fold(P[0], |p, &c| p * r + c);
    let er = 1.0 + r + r * r * p;
    // 2^n in two factors, each a normal float for n in [-126, 128].
    let half = k >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let y = er * pow2(half) * pow2(k - half);
    if x < LOWEST {
        0.0
    } else if x > HIGHEST {
        f32::INFINITY
    } else {
        y
    }
}

/// ln x, the `libm` crate's (a port of musl's): the same on every architecture.
#[inline]
pub fn ln(x: f32) -> f32 {
    libm::logf(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ulps between two finite f32 of one sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_exact_value_everywhere() {
        // Every 997th float of each sign's range, from e^x's smallest normal
        // result to its largest (~2 million values).
        let mut worst = (0, 0f32);
        for (from, to) in [(-87.3f32, -1e-30f32), (1e-30, 88.7)] {
            let (a, b) = (
                from.to_bits().min(to.to_bits()),
                from.to_bits().max(to.to_bits()),
            );
            for bits in (a..=b).step_by(997) {
                let x = f32::from_bits(bits);
                let u = ulps(exp(x), (x as f64).exp() as f32);
                if u > worst.0 {
                    worst = (u, x);
                }
            }
        }
        assert!(worst.0 <= 2, "{} ulp at x = {}", worst.0, worst.1);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(1e-30), 1.0);
    }

    #[test]
    fn exp_of_the_edges() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        // Near the ends of the range the result stays finite and close.
        for x in [-87.3f32, -80.0, 80.0, 88.7] {
            let exact = (x as f64).exp();
            assert!(
                ((exp(x) as f64 - exact) / exact).abs() < 3e-7,
                "{x}: {}",
                exp(x)
            );
        }
    }

    #[test]
    fn ln_is_the_portable_one() {
        assert_eq!(ln(1.0), 0.0);
        assert!((ln(std::f32::consts::E) - 1.0).abs() <= f32::EPSILON);
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
    }
}
