//! A precomputed gradient hung on the graph: [`attach`] returns a scalar zero
//! whose gradient with respect to `x` is `grad` (times whatever arrives from
//! above). Tests only (built with them): the oracle's loss hangs its gradient
//! on candle's autograd with it, and the oracle starts a block's backward
//! pass from the gradient of its output.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use std::sync::Arc;

/// A scalar zero of `dtype` (f32 or f64) with d/dx = `grad` (shaped like `x`).
pub fn attach(x: &Tensor, grad: Tensor, dtype: DType) -> Result<Tensor> {
    if grad.shape() != x.shape() {
        candle_core::bail!("a {:?} gradient for a {:?} tensor", grad.shape(), x.shape());
    }
    x.apply_op1_arc(Arc::new(Box::new(Attach { grad, dtype })))
}

/// Zero in the forward pass, `grad` times the incoming gradient backwards:
/// attaches a precomputed gradient to the graph without keeping what it was
/// computed from.
struct Attach {
    grad: Tensor,
    /// Of the zero it returns: the loss's.
    dtype: DType,
}

impl CustomOp1 for Attach {
    fn name(&self) -> &'static str {
        "sweep-attach-gradient"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let zero = match self.dtype {
            DType::F64 => CpuStorage::F64(vec![0.0]),
            _ => CpuStorage::F32(vec![0.0]),
        };
        Ok((zero, Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::CudaStorage;
        let dev = s.device.clone();
        let zero = match self.dtype {
            DType::F64 => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f64>(1)?, dev),
            _ => CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f32>(1)?, dev),
        };
        Ok((zero, Shape::from(())))
    }

    fn bwd(&self, _: &Tensor, _: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        // The incoming gradient is a scalar; multiplying on the device keeps
        // the step free of host round-trips.
        Ok(Some(
            self.grad.broadcast_mul(&g.to_dtype(self.grad.dtype())?)?,
        ))
    }
}
