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

    /// `self·rhs + bias` for a 2-D `self` `[m, k]`, 2-D `rhs` `[k, n]` and 1-D `bias` `[n]`
    /// added to every row: a linear layer's forward as one op. On CUDA the bias is added in
    /// the GEMM's epilogue (cuBLASLt), and the backward computes the weight gradient and the
    /// bias gradient in one GEMM call.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
    /// let w = Tensor::from_vec(vec![1f32, 0., 0., 1.], [2, 2], &Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![10f32, 20.], 2, &Device::Cpu)?;
    /// assert_eq!(x.matmul_bias(&w, &b)?.to_vec::<f32>()?, [11., 22., 13., 24.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn matmul_bias(&self, rhs: &Tensor, bias: &Tensor) -> Result<Tensor> {
        self.check_same(rhs, "matmul_bias")?;
        self.check_same(bias, "matmul_bias")?;
        self.check_float("matmul_bias")?;
        let (m, k, n) = match (self.dims(), rhs.dims(), bias.dims()) {
            (&[m, k], &[k2, n], &[nb]) if k == k2 && n == nb => (m, k, n),
            _ => {
                return Err(Error::MatmulShape {
                    lhs: self.shape().clone(),
                    rhs: rhs.shape().clone(),
                    msg: format!(
                        "matmul_bias needs [m, k] x [k, n] + [n], got bias {}",
                        bias.shape()
                    ),
                })
            }
        };
        let _ = k;
        let s = self.storage().matmul_bias(
            &self.layout,
            &rhs.storage(),
            &rhs.layout,
            &bias.storage(),
            &bias.layout,
        )?;
        Ok(
            Tensor::from_storage(s, [m, n]).tracked(&[self, rhs, bias], || Op::MatmulBias {
                a: self.clone(),
                b: rhs.clone(),
                bias: bias.clone(),
            }),
        )
    }

    /// `act(self·rhs + bias)` for 2-D `self` `[m, k]`, `rhs` `[k, n]` and a `[n]` bias: a
    /// linear layer and its activation as one GEMM on CUDA (cuBLASLt's RELU_BIAS or
    /// GELU_AUX_BIAS epilogue; the GELU form keeps the pre-activation for the gradient),
    /// with gradients for all three operands.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, op::EpilogueActivation};
    /// let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
    /// let w = Tensor::from_vec(vec![1f32, 0., 0., -1.], [2, 2], &Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![0f32, 1.], 2, &Device::Cpu)?;
    /// let y = x.matmul_bias_act(&w, &b, EpilogueActivation::Relu)?;
    /// assert_eq!(y.to_vec::<f32>()?, [1., 0., 3., 0.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn matmul_bias_act(
        &self,
        rhs: &Tensor,
        bias: &Tensor,
        act: crate::op::EpilogueActivation,
    ) -> Result<Tensor> {
        self.check_same(rhs, "matmul_bias_act")?;
        self.check_same(bias, "matmul_bias_act")?;
        self.check_float("matmul_bias_act")?;
        let (m, n) = match (self.dims(), rhs.dims(), bias.dims()) {
            (&[m, k], &[k2, n], &[nb]) if k == k2 && n == nb => (m, n),
            _ => {
                return Err(Error::MatmulShape {
                    lhs: self.shape().clone(),
                    rhs: rhs.shape().clone(),
                    msg: format!(
                        "matmul_bias_act needs [m, k] x [k, n] + [n], got bias {}",
                        bias.shape()
                    ),
                })
            }
        };
        let (s, pre) = self.storage().matmul_bias_act(
            &self.layout,
            &rhs.storage(),
            &rhs.layout,
            &bias.storage(),
            &bias.layout,
            act,
        )?;
        let pre = pre.map(|p| Tensor::from_storage(p, [m, n]));
        Ok(
            Tensor::from_storage(s, [m, n]).tracked_out(&[self, rhs, bias], |out| {
                Op::MatmulBiasAct {
                    a: self.clone(),
                    b: rhs.clone(),
                    bias: bias.clone(),
                    act,
                    out,
                    pre,
                }
            }),
        )
    }

    /// `(self·rhs, Σ_k self[.., k])` for 2-D `self` `[m, k]` and `rhs` `[k, n]`: the product
    /// and the `[m]` row sums of `self`, from one GEMM call on CUDA (cuBLASLt's bias-gradient
    /// epilogue). With `self = gᵀ` and `rhs = x` this is a linear layer's weight and bias
    /// gradients. Records no graph.
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let a = Tensor::from_vec(vec![1f32, 2., 3., 4.], [2, 2], &Device::Cpu)?;
    /// let (p, sums) = a.matmul_row_sums(&a)?;
    /// assert_eq!(p.to_vec::<f32>()?, [7., 10., 15., 22.]);
    /// assert_eq!(sums.to_vec::<f32>()?, [3., 7.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn matmul_row_sums(&self, rhs: &Tensor) -> Result<(Tensor, Tensor)> {
        self.check_same(rhs, "matmul_row_sums")?;
        self.check_float("matmul_row_sums")?;
        let (m, n) = match (self.dims(), rhs.dims()) {
            (&[m, k], &[k2, n]) if k == k2 => (m, n),
            _ => {
                return Err(Error::MatmulShape {
                    lhs: self.shape().clone(),
                    rhs: rhs.shape().clone(),
                    msg: "matmul_row_sums needs [m, k] x [k, n]".into(),
                })
            }
        };
        let (p, s) = self
            .storage()
            .matmul_row_sums(&self.layout, &rhs.storage(), &rhs.layout)?;
        Ok((
            Tensor::from_storage(p, [m, n]),
            Tensor::from_storage(s, [m]),
        ))
    }
}
