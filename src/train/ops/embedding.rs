//! Token embedding whose gradient is summed in f32. candle's `index_select`
//! backward adds each token's gradient into the table with `index_add` in the
//! table's dtype: in bf16 a frequent token's row loses most of its updates
//! once the sum is 256 times larger than one of them. This op looks rows up
//! like `index_select` and, backwards, adds into an f32 table and rounds once.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Rows `ids` (u32, [N]) of `table` ([V, D]): [N, D].
pub fn embedding(table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if table.dtype() == DType::F32 || table.dtype() == DType::F64 {
        // Already exact enough: candle's own op.
        return table.index_select(ids, 0);
    }
    table.apply_op2(ids, Lookup)
}

/// The gradient of the table from the gradient of the looked-up rows,
/// without autograd: rows added into a table in f32 (f64 for f64), in the
/// order of `ids` (the same sum every run), rounded once to the table's dtype.
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

    // Autograd runs only in the tests (the oracle, [`crate::train::oracle`]).
    #[cfg(test)]
    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        _: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(backward(table, ids, grad)?), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

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
        let g = out.sum_all()?.backward()?;
        let d = g
            .get(&table)
            .unwrap()
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
