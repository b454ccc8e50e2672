//! The products sweep hands cuBLAS itself, each with beta = 1 into a sum it keeps: a linear
//! layer's weight gradient, buf [out, in] += dyᵀ·x, and input gradient, acc [N, in] += dy·w
//! (`cublasGemmEx`); attention's backward, sum[.., :keys, :] += aᵀ·b (`...StridedBatchedEx`).
//! Each is first a [`Gemm`] in cuBLAS's column-major terms, where such a call goes wrong (a
//! leading dimension, a stride, a transpose): the tests run each on the host against the
//! product it stands for, every element it reaches inside its operand (checked on a GPU too).

use super::Gradient;
use crate::train::network::kernels::Ty;
use crate::train::network::ops::store::Store;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, DType, InplaceOp3, Layout, Result, Tensor};

/// One cuBLAS GEMM, column-major: per matrix of `batch`, C += op(A)·op(B), op(A) m × k, op(B)
/// k × n; A's (r, c) at `r + c·lda` (+ `stride_a` a matrix), and so on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Gemm {
    pub transa: bool,
    pub transb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    pub batch: usize,
}

impl Gemm {
    /// buf [out, in] += dyᵀ·x (row-major): as column-major bufᵀ [in, out] += xᵀ·dy, x read as
    /// [in, tokens] (ld in), dy as [out, tokens] transposed (ld out).
    pub fn weight_gradient(out: usize, inp: usize, tokens: usize) -> Gemm {
        Gemm {
            transa: false,
            transb: true,
            m: inp,
            n: out,
            k: tokens,
            lda: inp,
            ldb: out,
            ldc: inp,
            stride_a: tokens * inp,
            stride_b: tokens * out,
            stride_c: out * inp,
            batch: 1,
        }
    }

    /// acc [tokens, in] += dy·w (row-major): as column-major accᵀ [in, tokens] += wᵀ·dyᵀ, w read as
    /// [in, out] (ld in), dy as [out, tokens] (ld out).
    pub fn input_gradient(out: usize, inp: usize, tokens: usize) -> Gemm {
        Gemm {
            transa: false,
            transb: false,
            m: inp,
            n: tokens,
            k: out,
            lda: inp,
            ldb: out,
            ldc: inp,
            stride_a: out * inp,
            stride_b: tokens * out,
            stride_c: tokens * inp,
            batch: 1,
        }
    }

    /// `sum[i, :keys, :] += a[i]ᵀ·b[i]`, sum [batch, t, d], a [batch, rows, keys], b [batch, rows,
    /// d] (row-major): as column-major [d, keys] += bᵀ·a, b as [d, rows] (ld d), a as [keys, rows]
    /// transposed (ld keys).
    pub fn batched_sum(batch: usize, t: usize, d: usize, rows: usize, keys: usize) -> Gemm {
        Gemm {
            transa: false,
            transb: true,
            m: d,
            n: keys,
            k: rows,
            lda: d,
            ldb: keys,
            ldc: d,
            stride_a: rows * d,
            stride_b: rows * keys,
            stride_c: t * d,
            batch,
        }
    }

    /// The call as cuBLAS defines it, on the host in f64 (the tests' and emulation's reference);
    /// every element it reaches must lie inside its slice.
    pub fn on_host(&self, a: &[f64], b: &[f64], c: &mut [f64]) {
        let (reach_a, reach_b, reach_c) = self.reach();
        assert!(reach_a <= a.len() && reach_b <= b.len() && reach_c <= c.len());
        for i in 0..self.batch {
            let (a, b) = (&a[i * self.stride_a..], &b[i * self.stride_b..]);
            for col in 0..self.n {
                for row in 0..self.m {
                    let mut s = 0.0;
                    for p in 0..self.k {
                        let x = a[match self.transa {
                            true => p + row * self.lda,
                            false => row + p * self.lda,
                        }];
                        let y = b[match self.transb {
                            true => col + p * self.ldb,
                            false => p + col * self.ldb,
                        }];
                        s += x * y;
                    }
                    c[i * self.stride_c + row + col * self.ldc] += s;
                }
            }
        }
    }

    /// How many elements of A, B and C the call reaches (0 for an empty product).
    pub fn reach(&self) -> (usize, usize, usize) {
        let end = |rows: usize, cols: usize, ld: usize, stride: usize| {
            if rows == 0 || cols == 0 || self.batch == 0 {
                return 0;
            }
            (self.batch - 1) * stride + (cols - 1) * ld + rows
        };
        // A is stored m × k (k × m transposed), B k × n (n × k transposed).
        let (a_rows, a_cols) = if self.transa {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (b_rows, b_cols) = if self.transb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (
            end(a_rows, a_cols, self.lda, self.stride_a),
            end(b_rows, b_cols, self.ldb, self.stride_b),
            end(self.m, self.n, self.ldc, self.stride_c),
        )
    }
}

/// [`super::add_gradient`] on a GPU, in place; `bf16`: bf16 operands, f32 sum (as autocast).
pub(super) fn add_gradient(
    which: Gradient,
    buf: &mut Tensor,
    dy: &Tensor,
    other: &Tensor,
    bf16: bool,
) -> Result<()> {
    let operands = if bf16 { DType::BF16 } else { buf.dtype() };
    let dy = dy.to_dtype(operands)?.contiguous()?;
    let other = other.to_dtype(operands)?.contiguous()?;
    buf.inplace_op3(&dy, &other, &AddGradient(which))
}

struct AddGradient(Gradient);

impl AddGradient {
    fn gpu<S: Store>(
        &self,
        buf: (&mut S, &Layout),
        dy: (&S, &Layout),
        other: (&S, &Layout),
    ) -> Result<()> {
        let (bl, dyl, ol) = (buf.1, dy.1, other.1);
        let rows = self.0.rows(bl.dims(), dyl.dims(), ol.dims())?;
        let ((n, out), inp) = (dyl.shape().dims2()?, ol.shape().dims2()?.1);
        // A is x or w, B is dy (see the descriptions).
        let (g, what) = match self.0 {
            Gradient::Weight => (Gemm::weight_gradient(out, inp, n), "weight"),
            Gradient::Input => (Gemm::input_gradient(out, inp, n), "input"),
        };
        let what = || format!("cuBLAS {what} gradient [{rows}, {inp}] over {n} tokens");
        S::gemm(&g, buf, other, dy, &what)
    }
}

impl InplaceOp3 for AddGradient {
    fn name(&self) -> &'static str {
        "sweep-add-gradient-cublas"
    }

    fn cpu_fwd(
        &self,
        buf: &mut CpuStorage,
        bl: &Layout,
        dy: &CpuStorage,
        dyl: &Layout,
        other: &CpuStorage,
        ol: &Layout,
    ) -> Result<()> {
        if !crate::train::network::ops::emulating() {
            bail!("the cuBLAS gradients run on CUDA tensors");
        }
        self.gpu((buf, bl), (dy, dyl), (other, ol))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        buf: &mut CudaStorage,
        bl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
        other: &CudaStorage,
        ol: &Layout,
    ) -> Result<()> {
        self.gpu((buf, bl), (dy, dyl), (other, ol))
    }
}

/// [`super::add_batched_product`]: sum [.., T, d] (f32), a [.., M, keys], b [.., M, d].
pub struct AddBatchedProduct;

/// The leading dimensions' count and the last two of a layout.
fn batched(l: &Layout, what: &str) -> Result<(usize, usize, usize)> {
    let dims = l.shape().dims();
    if dims.len() < 2 || !l.is_contiguous() {
        bail!("{what} of a batched product: {dims:?}, contiguous, at least 2 dimensions");
    }
    let r = dims.len();
    Ok((dims[..r - 2].iter().product(), dims[r - 2], dims[r - 1]))
}

impl AddBatchedProduct {
    fn gpu<S: Store>(
        &self,
        sum: (&mut S, &Layout),
        a: (&S, &Layout),
        b: (&S, &Layout),
    ) -> Result<()> {
        let (sl, al, bl) = (sum.1, a.1, b.1);
        let (batch, t, d) = batched(sl, "the sum")?;
        let (a_batch, rows, keys) = batched(al, "aᵀ")?;
        let (b_batch, b_rows, b_d) = batched(bl, "b")?;
        if (a_batch, b_batch, b_rows, b_d) != (batch, batch, rows, d) || keys > t {
            bail!(
                "sum {:?}[.., :keys, :] += aᵀ·b with a {:?} and b {:?}",
                sl.shape().dims(),
                al.shape().dims(),
                bl.shape().dims()
            );
        }
        if sum.0.ty()? != Ty::F32 {
            bail!("the batched product sums into f32");
        }
        let g = Gemm::batched_sum(batch, t, d, rows, keys);
        let what = || format!("cuBLAS batched product: {batch} × [{keys}, {d}] over {rows} rows");
        S::gemm(&g, sum, b, a, &what)
    }
}

impl InplaceOp3 for AddBatchedProduct {
    fn name(&self) -> &'static str {
        "sweep-add-batched-product-cublas"
    }

    fn cpu_fwd(
        &self,
        sum: &mut CpuStorage,
        sl: &Layout,
        a: &CpuStorage,
        al: &Layout,
        b: &CpuStorage,
        bl: &Layout,
    ) -> Result<()> {
        if !crate::train::network::ops::emulating() {
            bail!("the cuBLAS batched product runs on CUDA tensors");
        }
        self.gpu((sum, sl), (a, al), (b, bl))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sum: &mut CudaStorage,
        sl: &Layout,
        a: &CudaStorage,
        al: &Layout,
        b: &CudaStorage,
        bl: &Layout,
    ) -> Result<()> {
        self.gpu((sum, sl), (a, al), (b, bl))
    }
}

#[cfg(feature = "cuda")]
pub(crate) mod on_gpu {
    use super::Gemm;
    use crate::train::network::ops::cuda;
    use candle_core::cuda::cudarc::cublas::result::{gemm_ex, gemm_strided_batched_ex};
    use candle_core::cuda::cudarc::cublas::sys;
    use candle_core::cuda::cudarc::driver::{DevicePtr, DevicePtrMut};
    use candle_core::cuda::CudaDType;
    use candle_core::{bail, CudaStorage, DType, Layout, Result};

    /// C += op(A)·op(B) by cuBLAS: an f32 or bf16 sum of f32 or bf16 operands.
    pub fn gemm(
        g: &Gemm,
        c: (&mut CudaStorage, &Layout),
        a: (&CudaStorage, &Layout),
        b: (&CudaStorage, &Layout),
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        match (cuda::dtype(c.0), cuda::dtype(a.0)) {
            (DType::F32, DType::F32) => run::<f32, f32>(g, c, a, b, what),
            (DType::F32, DType::BF16) => run::<f32, half::bf16>(g, c, a, b, what),
            (DType::BF16, DType::BF16) => run::<half::bf16, half::bf16>(g, c, a, b, what),
            (c, ab) => bail!("{}: a {c:?} sum of {ab:?} operands", what()),
        }
    }

    fn cuda_type(dtype: DType) -> Result<sys::cudaDataType> {
        Ok(match dtype {
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            dt => bail!("sweep's cuBLAS products take f32 or bf16, not {dt:?}"),
        })
    }

    fn int(n: usize, what: &str) -> Result<i32> {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("{what} = {n} is too large for one cuBLAS GEMM"))
        })
    }

    /// Runs `g` on candle's stream, alpha = beta = 1, f32 arithmetic, after checking each operand
    /// holds every element `g` reaches.
    fn run<C: CudaDType, AB: CudaDType>(
        g: &Gemm,
        c: (&mut CudaStorage, &Layout),
        a: (&CudaStorage, &Layout),
        b: (&CudaStorage, &Layout),
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        let (c_type, ab_type) = (cuda_type(cuda::dtype(c.0))?, cuda_type(cuda::dtype(a.0))?);
        if cuda::dtype(b.0) != cuda::dtype(a.0) {
            bail!("{}: the operands differ in dtype", what());
        }
        let dev = cuda::device(c.0);
        let stream = dev.cuda_stream();
        let blas = dev.cublas_handle();
        let av = cuda::view::<AB>(a.0, a.1)?;
        let bv = cuda::view::<AB>(b.0, b.1)?;
        let mut cv = cuda::view_mut::<C>(c.0, c.1)?;
        let (reach_a, reach_b, reach_c) = g.reach();
        if reach_a > av.len() || reach_b > bv.len() || reach_c > cv.len() {
            bail!("{}: {g:?} reaches past its operands", what());
        }
        let op = |t: bool| match t {
            true => sys::cublasOperation_t::CUBLAS_OP_T,
            false => sys::cublasOperation_t::CUBLAS_OP_N,
        };
        let (m, n, k) = (int(g.m, "m")?, int(g.n, "n")?, int(g.k, "k")?);
        let (lda, ldb, ldc) = (int(g.lda, "lda")?, int(g.ldb, "ldb")?, int(g.ldc, "ldc")?);
        let stride =
            |s: usize| i64::try_from(s).map_err(|_| candle_core::Error::Msg("stride".into()));
        let (a_ptr, _a) = av.device_ptr(&stream);
        let (b_ptr, _b) = bv.device_ptr(&stream);
        let (c_ptr, _c) = cv.device_ptr_mut(&stream);
        let one = 1.0f32;
        let one = (&one as *const f32).cast();
        // SAFETY: each operand holds every element reached (checked above) with the types passed, the
        // views outlive the call on their stream; alpha and beta are f32 host values (COMPUTE_32F).
        unsafe {
            if g.batch == 1 {
                gemm_ex(
                    *blas.handle(),
                    op(g.transa),
                    op(g.transb),
                    m,
                    n,
                    k,
                    one,
                    a_ptr as *const _,
                    ab_type,
                    lda,
                    b_ptr as *const _,
                    ab_type,
                    ldb,
                    one,
                    c_ptr as *mut _,
                    c_type,
                    ldc,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            } else {
                gemm_strided_batched_ex(
                    *blas.handle(),
                    op(g.transa),
                    op(g.transb),
                    m,
                    n,
                    k,
                    one,
                    a_ptr as *const _,
                    ab_type,
                    lda,
                    stride(g.stride_a)?,
                    b_ptr as *const _,
                    ab_type,
                    ldb,
                    stride(g.stride_b)?,
                    one,
                    c_ptr as *mut _,
                    c_type,
                    ldc,
                    stride(g.stride_c)?,
                    int(g.batch, "batch")?,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
        }
        .map_err(|e| cuda::typed(e, what()))
    }
}

#[cfg(test)]
mod tests {
    use super::Gemm;

    fn run_host(g: &Gemm, a: &[f64], b: &[f64], c: &mut [f64]) {
        g.on_host(a, b, c)
    }

    /// Values that tell every element from every other.
    fn values(n: usize, seed: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 + seed * 13) % 23) as f64 - 11.0)
            .collect()
    }

    #[test]
    fn the_weight_gradient_call_adds_dy_transposed_times_x_and_reaches_its_buffers_exactly() {
        for (out, inp, tokens) in [(9, 13, 37), (1, 5, 3), (64, 16, 1)] {
            let (dy, x) = (values(tokens * out, 1), values(tokens * inp, 2));
            let mut buf = values(out * inp, 3);
            let mut want = buf.clone();
            for o in 0..out {
                for j in 0..inp {
                    want[o * inp + j] += (0..tokens)
                        .map(|t| dy[t * out + o] * x[t * inp + j])
                        .sum::<f64>();
                }
            }
            let g = Gemm::weight_gradient(out, inp, tokens);
            assert_eq!(g.reach(), (x.len(), dy.len(), buf.len()));
            run_host(&g, &x, &dy, &mut buf);
            assert_eq!(buf, want, "[{out}, {inp}] over {tokens} tokens");
        }
    }

    #[test]
    fn the_input_gradient_call_adds_dy_times_w_and_reaches_its_buffers_exactly() {
        for (out, inp, tokens) in [(9, 13, 37), (1, 5, 3), (64, 16, 1)] {
            let (dy, w) = (values(tokens * out, 7), values(out * inp, 8));
            let mut acc = values(tokens * inp, 9);
            let mut want = acc.clone();
            for t in 0..tokens {
                for j in 0..inp {
                    want[t * inp + j] += (0..out)
                        .map(|o| dy[t * out + o] * w[o * inp + j])
                        .sum::<f64>();
                }
            }
            let g = Gemm::input_gradient(out, inp, tokens);
            assert_eq!(g.reach(), (w.len(), dy.len(), acc.len()));
            run_host(&g, &w, &dy, &mut acc);
            assert_eq!(acc, want, "[{tokens}, {inp}] from {out} outputs");
        }
    }

    #[test]
    fn the_batched_sum_adds_a_transposed_times_b_into_the_first_keys_rows_only() {
        for (batch, t, d, rows, keys) in [(3, 11, 4, 6, 7), (2, 5, 8, 3, 5), (1, 9, 2, 4, 1)] {
            let (a, b) = (values(batch * rows * keys, 4), values(batch * rows * d, 5));
            let mut sum = values(batch * t * d, 6);
            let mut want = sum.clone();
            for i in 0..batch {
                for key in 0..keys {
                    for j in 0..d {
                        want[(i * t + key) * d + j] += (0..rows)
                            .map(|r| a[(i * rows + r) * keys + key] * b[(i * rows + r) * d + j])
                            .sum::<f64>();
                    }
                }
            }
            let g = Gemm::batched_sum(batch, t, d, rows, keys);
            let (reach_a, reach_b, reach_c) = g.reach();
            assert_eq!((reach_a, reach_b), (b.len(), a.len()));
            assert_eq!(reach_c, ((batch - 1) * t + keys) * d);
            run_host(&g, &b, &a, &mut sum);
            assert_eq!(sum, want, "{batch} × [{keys} of {t}, {d}] over {rows} rows");
        }
    }

    #[test]
    fn the_reach_counts_transposed_operands_and_empty_products() {
        let g = Gemm {
            transa: true,
            transb: false,
            m: 3,
            n: 2,
            k: 4,
            lda: 5,
            ldb: 4,
            ldc: 3,
            stride_a: 100,
            stride_b: 8,
            stride_c: 6,
            batch: 2,
        };
        // A stored k × m = 4 × 3 with ld 5: its last element at 4 - 1 + 2·5,
        // one matrix on.
        assert_eq!(g.reach(), (100 + 2 * 5 + 4, 8 + 4 + 4, 6 + 3 + 3));
        assert_eq!(Gemm { k: 0, ..g }.reach(), (0, 0, 6 + 3 + 3));
        assert_eq!(Gemm { batch: 0, ..g }.reach(), (0, 0, 0));
    }
}
