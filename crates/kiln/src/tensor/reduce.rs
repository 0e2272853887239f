//! Reductions over sets of dimensions, logsumexp, softmax.

use super::Tensor;
use crate::autograd::Op;
use crate::backend::BackendStorage;
use crate::op::ReduceOp;
use crate::shape::{DimVec, Shape};
use crate::{DType, Dim, Dims, Error, Result};

impl Tensor {
    /// Applies a primitive reduction over `dims`. With `keepdim` the reduced dims stay with
    /// extent 1; without, they are removed. An empty set of dims returns `self` unchanged
    /// (numpy's `axis=()`).
    pub fn reduce(&self, dims: impl Dims, keepdim: bool, op: ReduceOp) -> Result<Tensor> {
        let dims = dims.to_indexes(self.rank(), op.name())?;
        if dims.is_empty() {
            return Ok(self.clone());
        }
        for &d in &dims {
            if self.dims()[d] == 0
                && matches!(
                    op,
                    ReduceOp::Max | ReduceOp::Min | ReduceOp::ArgMax | ReduceOp::ArgMin
                )
            {
                return Err(Error::Msg(format!(
                    "{}: dimension {d} of shape {} is empty, which has no {}",
                    op.name(),
                    self.shape(),
                    op.name()
                )));
            }
        }
        let s = self.storage().reduce(&self.layout, &dims, op)?;
        let kept: DimVec = self
            .dims()
            .iter()
            .enumerate()
            .map(|(i, &d)| if dims.contains(&i) { 1 } else { d })
            .collect();
        let out = Tensor::from_storage(s, Shape(kept));
        let out = match op {
            ReduceOp::Sum => out.tracked(&[self], || Op::Sum { x: self.clone() }),
            ReduceOp::Max | ReduceOp::Min => out.tracked_out(&[self], |out| Op::Extremum {
                x: self.clone(),
                out,
            }),
            ReduceOp::ArgMax | ReduceOp::ArgMin => out,
        };
        self.drop_reduced(out, &dims, keepdim)
    }

    /// `out` (keepdim shape of a reduction of `self` over `dims`) without the reduced dims
    /// unless `keepdim`.
    fn drop_reduced(&self, out: Tensor, dims: &[usize], keepdim: bool) -> Result<Tensor> {
        if keepdim {
            return Ok(out);
        }
        let kept: Vec<usize> = self
            .dims()
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, &d)| d)
            .collect();
        out.reshape(kept)
    }

    /// Sum over `dims`.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let x = Tensor::arange(0., 6., 1., DType::F32, &Device::Cpu)?.reshape([2, 3])?;
    /// assert_eq!(x.sum(0, false)?.to_vec::<f32>()?, vec![3., 5., 7.]);
    /// assert_eq!(x.sum(-1, true)?.dims(), &[2, 1]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn sum(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, ReduceOp::Sum)
    }

    /// Mean over `dims` (float dtypes).
    pub fn mean(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        self.check_float("mean")?;
        let idx = dims.to_indexes(self.rank(), "mean")?;
        let n: usize = idx.iter().map(|&d| self.dims()[d]).product();
        self.sum(idx.to_vec(), keepdim)?.mul_scalar(1.0 / n as f64)
    }

    /// Maximum over `dims` (NaN propagates).
    pub fn max(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, ReduceOp::Max)
    }

    /// Minimum over `dims` (NaN propagates).
    pub fn min(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        self.reduce(dims, keepdim, ReduceOp::Min)
    }

    /// Index (`i64`) of the first maximum along `dim`.
    pub fn argmax(&self, dim: impl Dim, keepdim: bool) -> Result<Tensor> {
        self.reduce(dim, keepdim, ReduceOp::ArgMax)
    }

    /// Index (`i64`) of the first minimum along `dim`.
    pub fn argmin(&self, dim: impl Dim, keepdim: bool) -> Result<Tensor> {
        self.reduce(dim, keepdim, ReduceOp::ArgMin)
    }

    /// `log(Σ exp(x))` over `dims`, computed stably (the max is subtracted first). A slice
    /// holding +inf gives +inf, one of -inf (or an empty one) -inf, and NaN gives NaN, as in
    /// PyTorch. Over one dim on the CPU and CUDA this is one fused kernel (per row: the max,
    /// then the sum of exponentials); elsewhere it is composed of max, exp, sum and log.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![0f32, 0., 1000., 1000.], [2, 2], &Device::Cpu)?;
    /// let lse = x.logsumexp(1, false)?.to_vec::<f32>()?;
    /// assert!((lse[0] - 2f32.ln()).abs() < 1e-6 && (lse[1] - (1000. + 2f32.ln())).abs() < 1e-3);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn logsumexp(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        self.check_float("logsumexp")?;
        let idx = dims.to_indexes(self.rank(), "logsumexp")?.to_vec();
        // The result's shape with the reduced dims kept.
        let mut kept = self.dims().to_vec();
        for &d in &idx {
            kept[d] = 1;
        }
        if idx.iter().any(|&d| self.dims()[d] == 0) {
            // The log of an empty sum, on every device (the max below would refuse it).
            let out = Tensor::full(f64::NEG_INFINITY, kept, self.dtype(), &self.device())?;
            return self.drop_reduced(out, &idx, keepdim);
        }
        if let [dim] = idx[..] {
            if let Some(s) = self.storage().logsumexp(&self.layout, dim) {
                let out = Tensor::from_storage(s?, kept);
                let out = out.tracked_out(&[self], |out| Op::LogSumExp {
                    x: self.clone(),
                    out,
                });
                return self.drop_reduced(out, &idx, keepdim);
            }
        }
        if matches!(self.dtype(), DType::F16 | DType::BF16) {
            // Composite steps would each round to 16 bits; compute in f32, round once. (The
            // fused kernels above already compute 16-bit rows in f32.)
            return self
                .to_dtype(DType::F32)?
                .logsumexp(idx, keepdim)?
                .to_dtype(self.dtype());
        }
        // The shift is a constant for differentiation (its terms cancel).
        let m = self.detach().max(idx.clone(), true)?;
        // An all -inf (or +inf) slice would give inf - inf = NaN: shift by 0 there instead.
        let finite = m.abs()?.lt_scalar(f64::INFINITY)?;
        let m = finite.where_cond(&m, &m.zeros_like()?)?;
        let lse = self
            .sub(&m)?
            .exp()?
            .sum(idx.clone(), true)?
            .log()?
            .add(&m)?;
        self.drop_reduced(lse, &idx, keepdim)
    }

    /// Softmax along `dim`, float dtypes.
    pub fn softmax(&self, dim: impl Dim) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// Log-softmax along `dim`, float dtypes.
    pub fn log_softmax(&self, dim: impl Dim) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: impl Dim, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        let dim = dim.to_index(self.rank(), op)?;
        let s = self.storage().softmax(&self.layout, dim, log)?;
        let out = Tensor::from_storage(s, self.shape().clone());
        Ok(out.tracked_out(&[self], |out| Op::Softmax {
            x: self.clone(),
            out,
            dim,
            log,
        }))
    }
}
