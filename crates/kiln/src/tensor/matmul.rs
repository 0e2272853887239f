//! Matrix products with broadcast batch dimensions.

use super::Tensor;
use crate::autograd::Op;
use crate::backend::BackendStorage;
use crate::shape::Shape;
use crate::{Error, Result};

impl Tensor {
    /// Matrix product `[.., m, k] × [.., k, n] → [.., m, n]`, batch dims broadcast
    /// numpy-style. A 1-D operand is a vector (as in `torch.matmul`). Transposed, narrowed
    /// and broadcast views go to the GEMM routine as strides, without a copy.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let a = Tensor::ones([4, 2, 3], DType::F32, &Device::Cpu)?;
    /// let b = Tensor::ones([3, 5], DType::F32, &Device::Cpu)?;
    /// let c = a.matmul(&b)?;
    /// assert_eq!(c.dims(), &[4, 2, 5]);
    /// assert_eq!(c.to_vec::<f32>()?[0], 3.0);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.check_same(rhs, "matmul")?;
        let err = |msg: &str| Error::MatmulShape {
            lhs: self.shape().clone(),
            rhs: rhs.shape().clone(),
            msg: msg.into(),
        };
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(err("both operands need at least one dimension"));
        }
        let lhs = if self.rank() == 1 {
            self.unsqueeze(0)?
        } else {
            self.clone()
        };
        let rhs_m = if rhs.rank() == 1 {
            rhs.unsqueeze(1)?
        } else {
            rhs.clone()
        };
        let (lr, rr) = (lhs.rank(), rhs_m.rank());
        let (m, k) = (lhs.dims()[lr - 2], lhs.dims()[lr - 1]);
        let (k2, n) = (rhs_m.dims()[rr - 2], rhs_m.dims()[rr - 1]);
        if k != k2 {
            return Err(err(&format!("inner dimensions differ ({k} vs {k2})")));
        }
        let lb = Shape::from(&lhs.dims()[..lr - 2]);
        let rb = Shape::from(&rhs_m.dims()[..rr - 2]);
        let batch = lb
            .broadcast_with(&rb, "matmul")
            .map_err(|_| err("batch dimensions do not broadcast"))?;
        let with = |b: &Shape, x, y| {
            let mut d = b.dims().to_vec();
            d.extend([x, y]);
            Shape::from(d)
        };
        let ll = lhs.layout.broadcast_as(with(&batch, m, k))?;
        let rl = rhs_m.layout.broadcast_as(with(&batch, k, n))?;
        let s = lhs.storage().matmul(&ll, &rhs_m.storage(), &rl)?;
        let out =
            Tensor::from_storage(s, with(&batch, m, n)).tracked(&[&lhs, &rhs_m], || Op::Matmul {
                a: lhs.clone(),
                b: rhs_m.clone(),
            });
        match (self.rank(), rhs.rank()) {
            (1, 1) => out.reshape(()),
            (1, _) => out.squeeze(-2),
            (_, 1) => out.squeeze(-1),
            _ => Ok(out),
        }
    }
}
