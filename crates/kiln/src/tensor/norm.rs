//! Batch normalisation, written with tensor ops (gradients come from theirs).

use super::Tensor;
use crate::{Error, Result};

/// The running statistics of [`Tensor::batch_norm`], updated in place while training.
#[derive(Clone, Copy, Debug)]
pub struct RunningStats<'a> {
    pub mean: &'a Tensor,
    pub var: &'a Tensor,
    /// Weight of the new batch in the update `running = (1 − momentum)·running + momentum·batch`.
    pub momentum: f64,
}

impl Tensor {
    /// Batch normalisation of `self` `[n, c, ...]` over every dim but the channels (dim 1),
    /// as `torch.nn.functional.batch_norm`: `(x − mean) / √(var + eps) · weight + bias`.
    ///
    /// Training (`training = true`) normalises by the batch's statistics (biased variance)
    /// and, with `running`, updates them in place with the unbiased variance; evaluation
    /// normalises by `running`, which it then needs. `weight` and `bias` (`[c]`) are
    /// optional. Gradients flow to `self`, `weight` and `bias`.
    ///
    /// # Errors
    /// An input of rank < 2, statistics or affine parameters not `[c]`, evaluation without
    /// running statistics, or training on one value per channel.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, RunningStats};
    /// let x = Tensor::from_vec(vec![1f32, 3., 5., 7.], [2, 2], &Device::Cpu)?;
    /// let (m, v) = (Tensor::zeros(2, kiln::DType::F32, &Device::Cpu)?, Tensor::ones(2, kiln::DType::F32, &Device::Cpu)?);
    /// let y = x.batch_norm(Some(RunningStats { mean: &m, var: &v, momentum: 0.5 }), None, None, true, 0.0)?;
    /// assert_eq!(y.to_vec::<f32>()?, [-1., -1., 1., 1.]);
    /// assert_eq!(m.to_vec::<f32>()?, [1.5, 2.5]); // 0.5·0 + 0.5·mean
    /// assert_eq!(v.to_vec::<f32>()?, [4.5, 4.5]); // 0.5·1 + 0.5·8 (unbiased)
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn batch_norm(
        &self,
        running: Option<RunningStats<'_>>,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        eps: f64,
    ) -> Result<Tensor> {
        const OP: &str = "batch_norm";
        self.check_float(OP)?;
        if self.rank() < 2 {
            return Err(Error::Msg(format!(
                "{OP}: the input {} needs at least 2 dims [n, c, ...]",
                self.shape()
            )));
        }
        let c = self.dims()[1];
        let per_channel = self.elem_count() / c.max(1);
        let stats: [Option<&Tensor>; 2] =
            running.map_or([None, None], |r| [Some(r.mean), Some(r.var)]);
        for (name, t) in ["running_mean", "running_var", "weight", "bias"]
            .into_iter()
            .zip(stats.into_iter().chain([weight, bias]))
        {
            if let Some(t) = t {
                self.check_same(t, OP)?;
                if t.dims() != [c] {
                    return Err(Error::Msg(format!(
                        "{OP}: {name} {} must be [{c}] for the input {}",
                        t.shape(),
                        self.shape()
                    )));
                }
            }
        }
        // [1, c, 1, ...]: broadcasts against the input.
        let mut channel_shape = vec![1; self.rank()];
        channel_shape[1] = c;
        let per_channel_view = |t: &Tensor| t.reshape(channel_shape.clone());
        let (scale, shift, centred) = if training {
            if per_channel < 2 {
                return Err(Error::Msg(format!(
                    "{OP}: training needs more than one value per channel, got input {}",
                    self.shape()
                )));
            }
            let dims: Vec<usize> = (0..self.rank()).filter(|&d| d != 1).collect();
            let mean = self.mean(dims.clone(), true)?;
            let centred = self.sub(&mean)?;
            let var = centred.sqr()?.mean(dims, true)?;
            if let Some(r) = running {
                crate::no_grad(|| -> Result<()> {
                    let unbiased = per_channel as f64 / (per_channel - 1) as f64;
                    let m = mean.reshape(c)?.sub(r.mean)?.mul_scalar(r.momentum)?;
                    r.mean.add_assign(&m)?;
                    let v = var
                        .reshape(c)?
                        .mul_scalar(unbiased)?
                        .sub(r.var)?
                        .mul_scalar(r.momentum)?;
                    r.var.add_assign(&v)
                })?;
            }
            let inv_std = var.add_scalar(eps)?.sqrt()?.recip()?;
            let scale = match weight {
                Some(w) => inv_std.mul(&per_channel_view(w)?)?,
                None => inv_std,
            };
            let shift = match bias {
                Some(b) => per_channel_view(b)?,
                None => scale.zeros_like()?,
            };
            (scale, shift, centred)
        } else {
            let Some(r) = running else {
                return Err(Error::Msg(format!(
                    "{OP}: evaluation (training = false) needs running statistics"
                )));
            };
            let inv_std = r.var.add_scalar(eps)?.sqrt()?.recip()?;
            let scale = match weight {
                Some(w) => inv_std.mul(w)?,
                None => inv_std,
            };
            let shift = r.mean.mul(&scale)?.neg()?;
            let shift = match bias {
                Some(b) => shift.add(b)?,
                None => shift,
            };
            (
                per_channel_view(&scale)?,
                per_channel_view(&shift)?,
                self.clone(),
            )
        };
        centred.affine(&scale, &shift)
    }
}
