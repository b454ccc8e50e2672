//! Token embedding whose gradient is summed in f32: candle's `index_select` backward adds in the
//! table's dtype, and in bf16 a frequent token's row loses its updates once the sum is 256 times
//! one of them. The trainer adds into the table's buffer in place ([`add_rows`]): on the CPU in
//! the ids' order, on a GPU grouped by token without atomics; the same sums every run.

use super::accumulate;
use crate::train::network::kernels::{
    column_blocks, u32_of, LaunchPlan, Mem, Ty, Value, EMBEDDING,
};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, DType, InplaceOp2, Layout, Result, Shape, Tensor};

/// Rows `ids` (u32, `[N]`) of `table` (`[V, D]`): `[N, D]`.
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Embedding);
    if table.dtype() == DType::F32 || table.dtype() == DType::F64 {
        // Already exact enough: candle's own op.
        return table.index_select(ids, 0);
    }
    table.apply_op2(ids, Lookup)
}

/// The table's gradient from the looked-up rows', without autograd: added in f32 (f64 for f64)
/// in the order of `ids`, rounded once to the table's dtype.
pub fn backward(table: &Tensor, ids: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let work = super::work_dtype(table);
    let sum = Tensor::zeros(table.shape(), work, table.device())?.index_add(
        ids,
        &dy.to_dtype(work)?,
        0,
    )?;
    sum.to_dtype(table.dtype())
}

struct Lookup;

fn out_shape(table: &Layout, ids: &Layout) -> Result<Shape> {
    let (_, d) = table.shape().dims2()?;
    Ok(Shape::from((ids.shape().elem_count(), d)))
}

impl CustomOp2 for Lookup {
    fn name(&self) -> &'static str {
        "sweep-embedding"
    }

    fn cpu_fwd(
        &self,
        t: &CpuStorage,
        tl: &Layout,
        ids: &CpuStorage,
        il: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        Ok((t.index_select(ids, tl, il, 0)?, out_shape(tl, il)?))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        t: &candle_core::CudaStorage,
        tl: &Layout,
        ids: &candle_core::CudaStorage,
        il: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((t.index_select(ids, tl, il, 0)?, out_shape(tl, il)?))
    }
}

/// A micro-batch's ids as [`add_rows`] takes them: the host's, and their grouping for the GPU.
#[derive(Debug, Clone)]
pub struct Rows<'a> {
    pub ids: &'a [u32],
    /// The grouping's words on the device and its count of distinct ids.
    grouped: Option<(Tensor, usize)>,
}

impl<'a> Rows<'a> {
    /// The ids for a table on `device`: grouped and uploaded where its kernel runs.
    pub fn new(ids: &'a [u32], device: &candle_core::Device) -> Result<Rows<'a>> {
        let upload =
            super::gpu_path(device) && !ids.is_empty() && super::on_gpu(super::Kernel::Embedding);
        let grouped = match upload {
            true => {
                let g = Grouping::of(ids);
                Some((Tensor::from_vec(g.words, g.len, device)?, g.distinct))
            }
            false => None,
        };
        Ok(Rows { ids, grouped })
    }
}

impl<'a> From<&'a [u32]> for Rows<'a> {
    /// The host's ids alone (the kernel groups and uploads them itself).
    fn from(ids: &'a [u32]) -> Rows<'a> {
        Rows { ids, grouped: None }
    }
}

/// buf [V, D] rows `ids` += rows of dy [N, D] in the order of `ids`, in place where a kernel
/// takes it; elsewhere summed in f32 and rounded once ([`backward`]).
pub fn add_rows(buf: &mut Tensor, ids: &Rows, dy: &Tensor) -> Result<()> {
    let _part = crate::train::network::parts::op(crate::train::network::parts::Op::Embedding);
    let (grouped, ids) = (ids.grouped.as_ref(), ids.ids);
    let (rows, d) = buf.dims2()?;
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
    if super::in_place(buf, &[dy]) && super::own_kernel(super::Kernel::Embedding, &[dy]) {
        return buf.inplace_op2(&dy.contiguous()?, &AddRows { ids });
    }
    if super::gpu_path(buf.device())
        && buf.is_contiguous()
        && super::own_kernel(super::Kernel::Embedding, &[buf, dy])
    {
        return gpu_rows::add_rows(buf, ids, grouped, dy);
    }
    let ids = Tensor::from_slice(ids, ids.len(), buf.device())?;
    let g = backward(buf, &ids, dy)?;
    accumulate::add(buf, &g)
}

/// The CPU's row sum, ids checked by [`add_rows`].
struct AddRows<'a> {
    ids: &'a [u32],
}

impl InplaceOp2 for AddRows<'_> {
    fn name(&self) -> &'static str {
        "sweep-add-rows-into"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let dy = super::f32s(s2, l2)?;
        let (rows, d) = l1.shape().dims2()?;
        let CpuStorage::F32(buf) = s1 else {
            bail!("expected f32 data")
        };
        let buf = &mut buf[l1.start_offset()..l1.start_offset() + rows * d];
        for (&id, g) in self.ids.iter().zip(dy.chunks_exact(d)) {
            let row = &mut buf[id as usize * d..(id as usize + 1) * d];
            row.iter_mut().zip(g).for_each(|(b, g)| *b += g);
        }
        Ok(())
    }
}

/// A step's positions grouped by token, as the kernel walks them: [positions sorted stably by
/// token] [starts: distinct + 1] [the distinct ids], one u32 vector.
struct Grouping {
    words: Vec<u32>,
    len: usize,
    distinct: usize,
}

impl Grouping {
    fn of(ids: &[u32]) -> Grouping {
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
        Grouping {
            len: words.len(),
            words,
            distinct,
        }
    }
}

/// [`add_rows`] on a GPU without atomics: a thread per (token, column) sums in position order,
/// the same bits every run (candle's `index_add` does not promise it).
mod gpu_rows {
    use super::super::store::{Span, Store};
    use super::Grouping;
    use crate::train::network::kernels::u32_of;
    #[cfg(feature = "cuda")]
    use candle_core::CudaStorage;
    use candle_core::{bail, CpuStorage, InplaceOp3, Layout, Result, Tensor};

    /// Ids and shapes checked by [`super::add_rows`]; their grouping as uploaded, else made here.
    pub fn add_rows(
        buf: &mut Tensor,
        ids: &[u32],
        grouped: Option<&(Tensor, usize)>,
        dy: &Tensor,
    ) -> Result<()> {
        let (_, d) = buf.dims2()?;
        if ids.is_empty() || d == 0 {
            return Ok(());
        }
        let (plan, distinct) = match grouped {
            Some((words, distinct)) if words.device().same_device(buf.device()) => {
                (words.clone(), *distinct)
            }
            _ => {
                let g = Grouping::of(ids);
                (Tensor::from_vec(g.words, g.len, buf.device())?, g.distinct)
            }
        };
        let op = AddRows {
            n: u32_of(ids.len(), "tokens").map_err(candle_core::Error::Msg)?,
            u: u32_of(distinct, "distinct tokens").map_err(candle_core::Error::Msg)?,
            d: u32_of(d, "width").map_err(candle_core::Error::Msg)?,
        };
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
            buf: &mut CpuStorage,
            bl: &Layout,
            dy: &CpuStorage,
            dyl: &Layout,
            plan: &CpuStorage,
            pl: &Layout,
        ) -> Result<()> {
            if !super::super::emulating() {
                bail!("the grouped row sum runs on CUDA tensors");
            }
            launch(self, buf, bl, dy, dyl, plan, pl)
        }

        #[cfg(feature = "cuda")]
        fn cuda_fwd(
            &self,
            buf: &mut CudaStorage,
            bl: &Layout,
            dy: &CudaStorage,
            dyl: &Layout,
            plan: &CudaStorage,
            pl: &Layout,
        ) -> Result<()> {
            launch(self, buf, bl, dy, dyl, plan, pl)
        }
    }

    fn launch<S: Store>(
        op: &AddRows,
        buf: &mut S,
        bl: &Layout,
        dy: &S,
        dyl: &Layout,
        grouping: &S,
        gl: &Layout,
    ) -> Result<()> {
        let (n, u, d) = (op.n as usize, op.u as usize, op.d as usize);
        let plan = super::plan(n, u, d, buf.ty()?).map_err(candle_core::Error::Msg)?;
        let dev = buf.device();
        let operands = [
            buf.operand_mut(bl)?,
            dy.operand(dyl)?,
            grouping.operand(gl)?,
        ];
        if operands[2].len() != n + 2 * u + 1
            || operands[1].len() != n * d
            || operands[0].len() % d.max(1) != 0
        {
            bail!("the grouped row sum's plan does not match its operands");
        }
        S::execute(&dev, &plan, &operands)?;
        Ok(())
    }
}

/// The grouped row sum: buffer [rows, d] (operand 0, added into), dy [n, d] (1) and the grouping
/// of n positions into u tokens (2, `Grouping`'s words): block (t, c) sums token t's rows of dy
/// in position order for its columns (bounds checked by [`add_rows`]).
pub fn plan(n: usize, u: usize, d: usize, own: Ty) -> std::result::Result<LaunchPlan, String> {
    let mut plan = LaunchPlan::default();
    let (n32, u32v, d32) = (
        u32_of(n, "tokens")?,
        u32_of(u, "distinct tokens")?,
        u32_of(d, "width")?,
    );
    plan.launch(
        &EMBEDDING,
        "add_rows",
        own,
        (u32v, column_blocks(d)),
        vec![
            Value::Ptr(Mem::Operand(0), 0),
            Value::Ptr(Mem::Operand(1), 0),
            Value::Ptr(Mem::Operand(2), 0),
            Value::U32(n32),
            Value::U32(u32v),
            Value::U32(d32),
        ],
    )?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::network::ops::testing::{max_diff, rand};
    use candle_core::{Device, Var};

    #[test]
    fn rows_are_added_in_place_like_index_add() -> Result<()> {
        let mut buf = Tensor::zeros((9, 13), DType::F32, &Device::Cpu)?;
        let alias = buf.clone();
        let ids = [2u32, 0, 2];
        let rows = rand(&[3, 13], 6);
        add_rows(&mut buf, &ids[..].into(), &rows)?;
        let want = Tensor::zeros((9, 13), DType::F32, &Device::Cpu)?.index_add(
            &Tensor::new(&ids, &Device::Cpu)?,
            &rows,
            0,
        )?;
        assert!(max_diff(&buf, &want)? < 1e-7);
        assert!(max_diff(&alias, &want)? < 1e-7, "not in place");
        // Checked before any path: the composed one too.
        for composed in [false, true] {
            let mut f64_buf = buf.to_dtype(DType::F64)?;
            let (b, dy) = match composed {
                false => (&mut buf, rand(&[1, 13], 7)),
                true => (&mut f64_buf, rand(&[1, 13], 7).to_dtype(DType::F64)?),
            };
            let err = add_rows(b, &Rows::from(&[9u32][..]), &dy).unwrap_err();
            assert!(err.to_string().contains("outside the 9-row table"), "{err}");
            let err = add_rows(b, &Rows::from(&[1u32, 2][..]), &dy).unwrap_err();
            assert!(err.to_string().contains("2 ids for 1 rows"), "{err}");
        }
        Ok(())
    }

    #[test]
    fn the_cuda_kernels_grouping_sums_the_rows_of_each_token() -> Result<()> {
        // The plan the CUDA kernel walks, walked here the way the kernel
        // does (per token and column, positions in order), against the CPU
        // kernel's sums.
        let ids: Vec<u32> = vec![4, 1, 4, 0, 6, 1, 4, 6, 2];
        let (n, d, rows) = (ids.len(), 5, 7);
        let plan = Grouping::of(&ids);
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
        add_rows(&mut buf, &ids[..].into(), &dy)?;
        let by_plan = Tensor::new(by_plan, &candle_core::Device::Cpu)?;
        assert!(max_diff(&buf, &by_plan)? < 1e-6);
        Ok(())
    }

    /// The GPU plan under the host emulation of CUDA equals the CPU kernel:
    /// a token repeated many times and across blocks, widths that fill no
    /// whole block of columns, one token; f32 and bf16 buffers.
    #[test]
    fn the_gpu_plan_equals_the_cpu_kernel_under_emulation() -> Result<()> {
        use crate::train::network::kernels::emulator::Buffer;
        use crate::train::network::ops::testing::{assert_rounded, buffer, emulate, tensor};
        for (ids, d, rows) in [
            (
                (0..40)
                    .map(|i| [3, 9, 3, 3, 0][i % 5])
                    .collect::<Vec<u32>>(),
                300,
                10,
            ),
            (vec![2], 5, 4),
        ] {
            let n = ids.len();
            let grouping = Grouping::of(&ids);
            let dy = rand(&[n, d], 3);
            let start = rand(&[rows, d], 4);
            for (own, tol) in [(Ty::F32, 1e-5), (Ty::Bf16, 5e-2)] {
                let seen = |t: &Tensor| tensor(&buffer(t, own), t.dims());
                let mut want = seen(&start);
                add_rows(&mut want, &ids[..].into(), &seen(&dy))?;
                let operands = [
                    buffer(&start, own),
                    buffer(&dy, own),
                    Buffer::u32(&grouping.words),
                ];
                let Some((_, after)) = emulate(
                    &plan(n, grouping.distinct, d, own).unwrap(),
                    &operands,
                    own == Ty::F32 && n == 40,
                ) else {
                    return Ok(());
                };
                let got = tensor(&after[0], &[rows, d]);
                assert!(max_diff(&got, &want)? < tol, "{n} ids, width {d}, {own:?}");
                // Sums of a row's gradients (another order) that may cancel.
                assert_rounded(&after[0], &want, 1e-5, 1e-6);
            }
        }
        Ok(())
    }

    #[test]
    fn bf16_gradients_are_summed_in_f32() -> Result<()> {
        let dev = Device::Cpu;
        // 3072 uses of token 1 (a frequent token; 3072 is exact in bf16) and one of token 0.
        let mut ids = vec![1u32; 3072];
        ids.push(0);
        let ids = Tensor::from_vec(ids, 3073, &dev)?;
        let table = Var::from_tensor(&Tensor::ones((4, 2), DType::BF16, &dev)?)?;
        let out = embedding(&table, &ids)?;
        assert_eq!(out.dims(), &[3073, 2]);
        assert_eq!(
            out.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?,
            6146.0
        );
        // The gradient of out's sum.
        let d = backward(&table, &ids, &out.ones_like()?)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        // Exact counts; bf16 accumulation stops near 256.
        assert_eq!(
            d,
            vec![
                vec![1.0, 1.0],
                vec![3072.0, 3072.0],
                vec![0.0, 0.0],
                vec![0.0, 0.0]
            ]
        );
        let candle = table
            .as_tensor()
            .index_select(&ids, 0)?
            .sum_all()?
            .backward()?;
        let c = candle
            .get(&table)
            .unwrap()
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        assert!(
            c[1][0] < 1000.0,
            "candle's bf16 index_add drifts: {}",
            c[1][0]
        );
        Ok(())
    }
}
