//! Gradients accumulated in place into buffers that live as long as the
//! trainer: `buf += g`, and a weight's gradient `buf += dyᵀ·x` as one GEMM
//! with beta = 1 that reads the transposed operand through its strides (no
//! transposed copy, no product tensor). On the CPU in f32 the `gemm` crate
//! writes into the buffer, on a GPU cuBLAS does (`cublasGemmEx`, bf16 or
//! f32 operands into f32 or bf16 buffers); elsewhere (other dtypes, bf16
//! operands on the CPU) the sum is a new tensor that replaces the buffer.
//!
//! Allocating nothing that outlives a pass matters beyond the copies saved:
//! gradients created block by block during the backward pass, between its
//! transients, fragmented the heap (the CPU trainer's resident memory grew
//! ~75 MB a block under recomputation).

use super::matmul::matmul;
use candle_core::{
    bail, CpuStorage, DType, InplaceOp1, InplaceOp2, InplaceOp3, Layout, Result, Tensor,
};
use rayon::prelude::*;

/// buf [V, D] rows `ids` += rows of dy [N, D], in the order of `ids` (the
/// same sums every run): an embedding's gradient, without a V × D temporary
/// on the in-place path; elsewhere summed in f32 and rounded once
/// ([`super::embedding::backward`]).
pub fn add_rows(buf: &mut Tensor, ids: &Tensor, dy: &Tensor) -> Result<()> {
    if in_place(buf, &[dy]) && ids.device().is_cpu() && super::own_kernel(&[dy]) {
        return buf.inplace_op3(
            &ids.to_dtype(DType::U32)?.contiguous()?,
            &dy.contiguous()?,
            &AddRows,
        );
    }
    #[cfg(feature = "cuda")]
    if buf.device().is_cuda() && buf.is_contiguous() && super::own_kernel(&[buf, dy]) {
        return cuda_rows::add_rows(buf, ids, dy);
    }
    let g = super::embedding::backward(buf, ids, dy)?;
    add(buf, &g)
}

/// Whether the in-place CPU kernels apply to a buffer and its operands.
fn in_place(buf: &Tensor, operands: &[&Tensor]) -> bool {
    let f32_cpu = |t: &Tensor| t.device().is_cpu() && t.dtype() == DType::F32;
    f32_cpu(buf) && buf.is_contiguous() && operands.iter().all(|t| f32_cpu(t))
}

/// buf = 0.
pub fn zero(buf: &mut Tensor) -> Result<()> {
    if in_place(buf, &[]) {
        return buf.inplace_op1(&Zero);
    }
    *buf = buf.zeros_like()?;
    Ok(())
}

/// buf += g (same shape).
pub fn add(buf: &mut Tensor, g: &Tensor) -> Result<()> {
    if buf.shape() != g.shape() {
        bail!(
            "adding a {:?} gradient into a {:?} buffer",
            g.shape(),
            buf.shape()
        );
    }
    if in_place(buf, &[g]) {
        return buf.inplace_op2(&g.contiguous()?, &Add);
    }
    *buf = (&*buf + g.to_dtype(buf.dtype())?)?;
    Ok(())
}

/// buf [out, in] += dyᵀ · x, with dy [N, out] and x [N, in] (a linear
/// layer's weight gradient); `bf16`: the product with bf16 operands.
pub fn add_product(buf: &mut Tensor, dy: &Tensor, x: &Tensor, bf16: bool) -> Result<()> {
    let (n, out) = dy.dims2()?;
    let (n2, inp) = x.dims2()?;
    if n != n2 || buf.dims() != [out, inp] {
        bail!(
            "a {:?} gradient from dy {:?} and x {:?}",
            buf.dims(),
            dy.dims(),
            x.dims()
        );
    }
    if !bf16 && in_place(buf, &[dy, x]) && super::own_kernel(&[dy, x]) {
        return buf.inplace_op3(dy, x, &AddProduct);
    }
    #[cfg(feature = "cuda")]
    if buf.device().is_cuda() && buf.is_contiguous() && super::own_kernel(&[buf, dy, x]) {
        return cuda_product::add_product(buf, dy, x, bf16);
    }
    let product = matmul(&dy.t()?, x, bf16)?;
    add(buf, &product)
}

struct Zero;

impl InplaceOp1 for Zero {
    fn name(&self) -> &'static str {
        "sweep-zero"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let CpuStorage::F32(v) = s else {
            bail!("expected f32 data")
        };
        // A buffer may be a view into a larger storage (an all-reduced bucket).
        let (start, end) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("expected contiguous data".into()))?;
        v[start..end]
            .par_chunks_mut(1 << 16)
            .for_each(|c| c.fill(0.0));
        Ok(())
    }
}

struct Add;

impl InplaceOp2 for Add {
    fn name(&self) -> &'static str {
        "sweep-add-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let g = super::f32s(s2, l2)?;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let buf = &mut buf[l1.start_offset()..l1.start_offset() + g.len()];
        buf.par_chunks_mut(1 << 16)
            .zip(g.par_chunks(1 << 16))
            .for_each(|(b, g)| b.iter_mut().zip(g).for_each(|(b, g)| *b += g));
        Ok(())
    }
}

struct AddRows;

impl InplaceOp3 for AddRows {
    fn name(&self) -> &'static str {
        "sweep-add-rows-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let CpuStorage::U32(ids) = s2 else {
            bail!("expected u32 ids")
        };
        let ids = &ids[l2.start_offset()..l2.start_offset() + l2.shape().elem_count()];
        let dy = super::f32s(s3, l3)?;
        let (rows, d) = l1.shape().dims2()?;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let buf = &mut buf[l1.start_offset()..l1.start_offset() + rows * d];
        if dy.len() != ids.len() * d {
            bail!(
                "{} ids for {} rows of gradient",
                ids.len(),
                dy.len() / d.max(1)
            );
        }
        for (&id, g) in ids.iter().zip(dy.chunks_exact(d)) {
            let Some(row) = buf.get_mut(id as usize * d..(id as usize + 1) * d) else {
                bail!("token {id} is outside the {rows}-row table");
            };
            row.iter_mut().zip(g).for_each(|(b, g)| *b += g);
        }
        Ok(())
    }
}

/// [order: positions sorted by token, stably] [starts: distinct + 1]
/// [tokens: the distinct ids], as one vector of u32.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Plan {
    words: Vec<u32>,
    len: usize,
    distinct: usize,
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Plan {
    fn of(ids: &[u32]) -> Plan {
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&p| ids[p as usize]);
        let (mut starts, mut tokens) = (Vec::new(), Vec::new());
        for (k, &p) in order.iter().enumerate() {
            let id = ids[p as usize];
            if tokens.last() != Some(&id) {
                tokens.push(id);
                starts.push(k as u32);
            }
        }
        starts.push(order.len() as u32);
        let distinct = tokens.len();
        let mut words = order;
        words.extend(starts);
        words.extend(tokens);
        Plan {
            len: words.len(),
            words,
            distinct,
        }
    }
}

/// [`add_rows`] on CUDA without atomics (`kernels/embedding.cu`): the host
/// groups the positions by token, and one thread per (token, column) sums
/// that token's rows in position order and adds the sum into the buffer.
/// The same bits every run, which the bit-identical NCCL and resume tests
/// rely on (candle's `index_add` gives no such promise).
#[cfg(feature = "cuda")]
mod cuda_rows {
    use super::super::cuda::{self, by_dtype, Element};
    use super::Plan;
    use candle_core::cuda::cudarc::driver::PushKernelArg;
    use candle_core::{bail, CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Result, Tensor};

    pub fn add_rows(buf: &mut Tensor, ids: &Tensor, dy: &Tensor) -> Result<()> {
        let (rows, d) = buf.dims2()?;
        // The ids came from the host; reading them back waits for nothing
        // but their upload.
        let ids = ids.flatten_all()?.to_dtype(DType::U32)?.to_vec1::<u32>()?;
        if dy.elem_count() != ids.len() * d {
            bail!(
                "{} ids for {} rows of gradient",
                ids.len(),
                dy.elem_count() / d.max(1)
            );
        }
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= rows) {
            bail!("token {bad} is outside the {rows}-row table");
        }
        let plan = Plan::of(&ids);
        let op = AddRows {
            n: cuda::u32_of(ids.len(), "tokens")?,
            u: cuda::u32_of(plan.distinct, "distinct tokens")?,
            d: cuda::u32_of(d, "width")?,
        };
        let plan = Tensor::from_vec(plan.words, plan.len, buf.device())?;
        buf.inplace_op3(&dy.contiguous()?, &plan, &op)
    }

    struct AddRows {
        n: u32,
        u: u32,
        d: u32,
    }

    impl InplaceOp3 for AddRows {
        fn name(&self) -> &'static str {
            "sweep-add-rows-grouped"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<()> {
            bail!("the grouped row sum runs on CUDA tensors")
        }

        fn cuda_fwd(
            &self,
            buf: &mut CudaStorage,
            bl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
            plan: &CudaStorage,
            pl: &Layout,
        ) -> Result<()> {
            by_dtype!(cuda::dtype(buf), launch(self, buf, bl, dy, dyl, plan, pl))
        }
    }

    fn launch<T: Element>(
        op: &AddRows,
        buf: &mut CudaStorage,
        bl: &Layout,
        dy: &CudaStorage,
        dyl: &Layout,
        plan: &CudaStorage,
        pl: &Layout,
    ) -> Result<()> {
        let dev = cuda::device(buf);
        let dyv = cuda::view::<T>(dy, dyl)?;
        let plan = cuda::view::<u32>(plan, pl)?;
        let (n, u, d) = (op.n as usize, op.u as usize, op.d as usize);
        let mut b_view = cuda::view_mut::<T>(buf, bl)?;
        if plan.len() != n + 2 * u + 1 || dyv.len() != n * d || b_view.len() % d.max(1) != 0 {
            bail!("the grouped row sum's plan does not match its operands");
        }
        let f = cuda::function(&dev, &cuda::EMBEDDING, "add_rows", T::DTYPE)?;
        let mut b = f.builder();
        b.arg(&mut b_view).arg(&dyv).arg(&plan);
        b.arg(&op.n).arg(&op.u).arg(&op.d);
        let grid = cuda::blocks(op.u.max(1), cuda::column_blocks(d));
        // SAFETY: the kernel's signature; block (t, c) reads the plan's
        // entries of token t < u (the plan has n + 2u + 1 words, its
        // positions are below n and its tokens below the buffer's rows,
        // checked by the caller), dy's rows at those positions and columns
        // below d, and writes its token's row of the buffer.
        unsafe { cuda::launch(&mut b, grid, "add_rows") }
    }
}

struct AddProduct;

impl InplaceOp3 for AddProduct {
    fn name(&self) -> &'static str {
        "sweep-add-product-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (dy, x) = (super::f32s_any(s2)?, super::f32s_any(s3)?);
        let (n, out) = l2.shape().dims2()?;
        let inp = l3.shape().dims2()?.1;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let (sd, sx) = (l2.stride(), l3.stride());
        // Every index below stays inside its slice: the layouts describe them.
        let (dy_end, x_end) = (
            l2.start_offset() + (n - 1) * sd[0] + (out - 1) * sd[1] + 1,
            l3.start_offset() + (n - 1) * sx[0] + (inp - 1) * sx[1] + 1,
        );
        let buf_end = l1.start_offset() + out * inp;
        if n == 0 || dy_end > dy.len() || x_end > x.len() || buf_end > buf.len() {
            bail!("a layout reaches outside its data");
        }
        // SAFETY: dst is the contiguous out × in buffer (row stride `inp`),
        // lhs = dyᵀ read through dy's strides (lhs(i, p) = dy[p, i]), rhs = x
        // through its own; all three lie inside their slices (checked above)
        // and dst does not alias the operands (a separate storage).
        unsafe {
            gemm::gemm(
                out,
                inp,
                n,
                buf.as_mut_ptr().add(l1.start_offset()),
                1,
                inp as isize,
                true,
                dy.as_ptr().add(l2.start_offset()),
                sd[0] as isize,
                sd[1] as isize,
                x.as_ptr().add(l3.start_offset()),
                sx[1] as isize,
                sx[0] as isize,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            )
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::ops::testing::{max_diff, rand};

    #[test]
    fn the_cuda_kernels_grouping_sums_the_rows_of_each_token() -> Result<()> {
        // The plan the CUDA kernel walks, walked here the way the kernel
        // does (per token and column, positions in order), against the CPU
        // kernel's sums.
        let ids: Vec<u32> = vec![4, 1, 4, 0, 6, 1, 4, 6, 2];
        let (n, d, rows) = (ids.len(), 5, 7);
        let plan = Plan::of(&ids);
        assert_eq!(plan.distinct, 5);
        assert_eq!(plan.len, n + 2 * plan.distinct + 1);
        let (order, rest) = plan.words.split_at(n);
        let (starts, tokens) = rest.split_at(plan.distinct + 1);
        assert_eq!(tokens, [0, 1, 2, 4, 6]);
        assert_eq!(starts, [0, 1, 3, 4, 7, 9]);
        // Stable: token 4's positions in the order they came.
        assert_eq!(&order[4..7], [0, 2, 6]);
        let dy = rand(&[n, d], 1);
        let g = dy.to_vec2::<f32>()?;
        let mut by_plan = rand(&[rows, d], 2).to_vec2::<f32>()?;
        let mut buf = Tensor::new(by_plan.clone(), &candle_core::Device::Cpu)?;
        for (t, &token) in tokens.iter().enumerate() {
            for col in 0..d {
                let sum: f32 = (starts[t]..starts[t + 1])
                    .map(|k| g[order[k as usize] as usize][col])
                    .sum();
                by_plan[token as usize][col] += sum;
            }
        }
        add_rows(
            &mut buf,
            &Tensor::new(ids.as_slice(), &candle_core::Device::Cpu)?,
            &dy,
        )?;
        let by_plan = Tensor::new(by_plan, &candle_core::Device::Cpu)?;
        assert!(max_diff(&buf, &by_plan)? < 1e-6);
        Ok(())
    }

    #[test]
    fn buffers_accumulate_in_place_like_their_sums() -> Result<()> {
        let (dy, x) = (rand(&[37, 9], 1), rand(&[37, 13], 2));
        let mut buf = rand(&[9, 13], 3);
        let want = (&buf + dy.t()?.matmul(&x)?)?;
        // A clone shares the storage: it sees the sum only if it is made in place.
        let alias = buf.clone();
        add_product(&mut buf, &dy, &x, false)?;
        assert!(max_diff(&buf, &want)? < 1e-5);
        assert!(max_diff(&alias, &want)? < 1e-5, "not in place");
        // A transposed operand is read through its strides.
        let dy_t = rand(&[9, 37], 4);
        let want = (&buf + dy_t.matmul(&x)?)?;
        add_product(&mut buf, &dy_t.t()?, &x, false)?;
        assert!(max_diff(&buf, &want)? < 1e-5);
        let g = rand(&[9, 13], 5);
        let want = (&buf + &g)?;
        add(&mut buf, &g)?;
        assert!(max_diff(&buf, &want)? < 1e-7);
        zero(&mut buf)?;
        assert_eq!(buf.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        // Rows of an embedding table, in the ids' order.
        let ids = Tensor::new(&[2u32, 0, 2], x.device())?;
        let rows = rand(&[3, 13], 6);
        add_rows(&mut buf, &ids, &rows)?;
        let want = Tensor::zeros((9, 13), DType::F32, x.device())?.index_add(&ids, &rows, 0)?;
        assert!(max_diff(&buf, &want)? < 1e-7);
        // Off the in-place path (f64, bf16 operands): the same sums.
        let mut b64 = Tensor::zeros((9, 13), DType::F64, x.device())?;
        let (dy64, x64) = (dy.to_dtype(DType::F64)?, x.to_dtype(DType::F64)?);
        add_product(&mut b64, &dy64, &x64, false)?;
        let d = (b64 - dy64.t()?.matmul(&x64)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(d < 1e-14);
        Ok(())
    }
}

/// buf [out, in] += dyᵀ·x on CUDA: one cuBLAS GEMM with beta = 1 written into
/// the buffer (no product tensor, no transposed copy). With `bf16`
/// (bf16-mixed: f32 buffers and activations) the operands go to cuBLAS in
/// bf16 and the sum stays in f32, as autocast's products do; f32 arithmetic
/// in every case (CUBLAS_COMPUTE_32F, no TF32).
#[cfg(feature = "cuda")]
mod cuda_product {
    use super::super::cuda;
    use candle_core::cuda::cudarc::cublas::{result::gemm_ex, sys};
    use candle_core::cuda::cudarc::driver::{DevicePtr, DevicePtrMut};
    use candle_core::{bail, CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Result, Tensor};

    pub fn add_product(buf: &mut Tensor, dy: &Tensor, x: &Tensor, bf16: bool) -> Result<()> {
        let operands = if bf16 { DType::BF16 } else { buf.dtype() };
        let dy = dy.to_dtype(operands)?.contiguous()?;
        let x = x.to_dtype(operands)?.contiguous()?;
        buf.inplace_op3(&dy, &x, &AddProduct)
    }

    struct AddProduct;

    fn cuda_type(dtype: DType) -> Result<sys::cudaDataType> {
        Ok(match dtype {
            DType::F32 => sys::cudaDataType::CUDA_R_32F,
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            dt => bail!("the in-place weight gradient takes f32 or bf16, not {dt:?}"),
        })
    }

    fn int(n: usize, what: &str) -> Result<i32> {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("{what} = {n} is too large for one cuBLAS GEMM"))
        })
    }

    impl InplaceOp3 for AddProduct {
        fn name(&self) -> &'static str {
            "sweep-add-product-cublas"
        }

        fn cpu_fwd(
            &self,
            _: &mut CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
            _: &CpuStorage,
            _: &Layout,
        ) -> Result<()> {
            bail!("the cuBLAS weight gradient runs on CUDA tensors")
        }

        fn cuda_fwd(
            &self,
            buf: &mut CudaStorage,
            bl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
            x: &CudaStorage,
            xl: &Layout,
        ) -> Result<()> {
            let (out, inp) = bl.shape().dims2()?;
            let (n, dy_out) = dyl.shape().dims2()?;
            let (xn, x_inp) = xl.shape().dims2()?;
            if (dy_out, x_inp, xn) != (out, inp, n) {
                bail!("a [{out}, {inp}] gradient from dy [{n}, {dy_out}] and x [{xn}, {x_inp}]");
            }
            let (c_type, ab_type) = (cuda_type(cuda::dtype(buf))?, cuda_type(cuda::dtype(dy))?);
            if cuda::dtype(x) != cuda::dtype(dy) {
                bail!("the weight gradient's operands differ in dtype");
            }
            let dev = cuda::device(buf);
            let stream = dev.cuda_stream();
            let blas = dev.cublas_handle();
            let (m, nn, k) = (int(inp, "in")?, int(out, "out")?, int(n, "tokens")?);
            let (one, also_one) = (1.0f32, 1.0f32);
            // Row-major buf [out, in] is column-major bufᵀ [in, out]:
            // bufᵀ += xᵀ·dy, with x read as column-major [in, N] (no
            // transpose, ld in) and dy as column-major [out, N] transposed
            // (ld out). One macro per storage type pair keeps the typed
            // views alive while cuBLAS runs on candle's stream.
            macro_rules! gemm {
                ($c:ty, $ab:ty) => {{
                    let a = cuda::view::<$ab>(x, xl)?;
                    let b = cuda::view::<$ab>(dy, dyl)?;
                    let mut c = cuda::view_mut::<$c>(buf, bl)?;
                    let (a_ptr, _a) = a.device_ptr(&stream);
                    let (b_ptr, _b) = b.device_ptr(&stream);
                    let (c_ptr, _c) = c.device_ptr_mut(&stream);
                    // SAFETY: a holds in·N values, b out·N and c in·out (the
                    // shapes checked above), each contiguous, with the types
                    // and leading dimensions passed; alpha and beta are f32
                    // host values as CUBLAS_COMPUTE_32F takes them.
                    unsafe {
                        gemm_ex(
                            *blas.handle(),
                            sys::cublasOperation_t::CUBLAS_OP_N,
                            sys::cublasOperation_t::CUBLAS_OP_T,
                            m,
                            nn,
                            k,
                            (&one as *const f32).cast(),
                            a_ptr as *const _,
                            ab_type,
                            m,
                            b_ptr as *const _,
                            ab_type,
                            nn,
                            (&also_one as *const f32).cast(),
                            c_ptr as *mut _,
                            c_type,
                            m,
                            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                        )
                    }
                    .map_err(|e| candle_core::Error::Msg(format!("cuBLAS weight gradient: {e:?}")))
                }};
            }
            match (cuda::dtype(buf), cuda::dtype(dy)) {
                (DType::F32, DType::F32) => gemm!(f32, f32),
                (DType::F32, DType::BF16) => gemm!(f32, half::bf16),
                (DType::BF16, DType::BF16) => gemm!(half::bf16, half::bf16),
                (c, ab) => bail!("a {c:?} gradient from {ab:?} operands"),
            }
        }
    }
}
