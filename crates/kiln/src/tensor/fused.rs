//! Fused training primitives: softmax cross-entropy per row and in-place optimizer updates.
//! Each is one backend call (one kernel on CUDA) where the composed ops would take several;
//! neither records an autograd graph (`kiln_nn::loss` wraps the first in a differentiable op).

use super::Tensor;
use crate::backend::BackendStorage;
use crate::op::{CrossEntropyRows, UpdateRule};
use crate::{bail, Error, Result};

impl Tensor {
    /// Softmax cross-entropy of logits `self` (`[N, C]`, float, any view) against class ids
    /// `targets` (`[N]`, integer), with label smoothing `smoothing` in `[0, 1)`, in one
    /// pass: per-row losses times `scale`, the gradient of their sum, `scale · (softmax − q)`,
    /// and per-row hits (see [`CrossEntropyRows`]). With `scale = 1/N` the losses sum to the
    /// mean. Records no graph.
    ///
    /// # Errors
    /// Shapes other than `[N, C]` and `[N]`, integer logits, float targets, a smoothing
    /// outside `[0, 1)`, operands on two devices, or a label outside `[0, C)` (on CUDA
    /// reported at the next read).
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![2f32, 0., 0., 0., 3., 0.], [2, 3], &Device::Cpu)?;
    /// let y = Tensor::from_vec(vec![0i64, 2], 2, &Device::Cpu)?;
    /// let r = x.softmax_cross_entropy(&y, 0.0, 0.5)?;
    /// let want = x.log_softmax(1)?.to_vec::<f32>()?;
    /// let loss = r.loss.to_vec::<f32>()?;
    /// assert!((loss[0] + 0.5 * want[0]).abs() < 1e-6 && (loss[1] + 0.5 * want[5]).abs() < 1e-6);
    /// assert_eq!(r.correct.to_vec::<f32>()?, [1., 0.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn softmax_cross_entropy(
        &self,
        targets: &Tensor,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Tensor>> {
        if self.rank() != 2 || targets.rank() != 1 || targets.dims()[0] != self.dims()[0] {
            bail!(
                "cross_entropy: expected logits [N, C] and targets [N], got {} and {}",
                self.shape(),
                targets.shape()
            );
        }
        if !(0.0..1.0).contains(&smoothing) {
            bail!("cross_entropy: label smoothing {smoothing} is not in [0, 1)");
        }
        self.check_float("cross_entropy")?;
        if !targets.dtype().is_int() {
            return Err(Error::UnsupportedDType {
                op: "cross_entropy (targets)",
                dtype: targets.dtype(),
            });
        }
        self.check_device(targets, "cross_entropy")?;
        let r = self.storage().cross_entropy(
            &self.layout,
            &targets.storage(),
            &targets.layout,
            smoothing,
            scale,
        )?;
        let n = self.dims()[0];
        Ok(CrossEntropyRows {
            loss: Tensor::from_storage(r.loss, [n]),
            grad: Tensor::from_storage(r.grad, self.shape().clone()),
            correct: Tensor::from_storage(r.correct, [n]),
        })
    }

    /// Updates this parameter in place by `rule` from `grad` and the rule's state buffers
    /// (`rule.state_len()` of them, read and written in place), in one fused step. The
    /// parameter and the state must be contiguous tensors of one shape, dtype and device
    /// with their own storages; `grad` may be any view. Records no graph.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, op::UpdateRule};
    /// let p = Tensor::from_vec(vec![1f32, 2.], 2, &Device::Cpu)?;
    /// let v = p.zeros_like()?;
    /// let g = Tensor::from_vec(vec![0.5f32, -1.], 2, &Device::Cpu)?;
    /// let rule = UpdateRule::Sgd { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    /// p.apply_update(&g, &[&v], rule)?;
    /// assert_eq!(p.to_vec::<f32>()?, [0.95, 2.1]);
    /// assert_eq!(v.to_vec::<f32>()?, [0.5, -1.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn apply_update(&self, grad: &Tensor, state: &[&Tensor], rule: UpdateRule) -> Result<()> {
        let op = rule.name();
        if state.len() != rule.state_len() {
            bail!(
                "{op}: expected {} state buffers, got {}",
                rule.state_len(),
                state.len()
            );
        }
        for other in std::iter::once(grad).chain(state.iter().copied()) {
            self.check_same(other, op)?;
            if other.shape() != self.shape() {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape().clone(),
                    rhs: other.shape().clone(),
                });
            }
        }
        for (i, t) in std::iter::once(self)
            .chain(state.iter().copied())
            .enumerate()
        {
            if !t.is_contiguous() {
                bail!("{op}: the parameter and its state must be contiguous, got strides {:?} for shape {}", t.strides(), t.shape());
            }
            if std::iter::once(self)
                .chain(state.iter().copied())
                .take(i)
                .any(|u| u.same_storage(t))
            {
                bail!("{op}: the parameter and its state buffers must not share storage");
            }
        }
        // One lock per storage: a gradient viewing the parameter or a state is copied first.
        let grad = if grad.is_contiguous()
            && !std::iter::once(self)
                .chain(state.iter().copied())
                .any(|t| t.same_storage(grad))
        {
            grad.clone()
        } else {
            grad.copy()?
        };
        let g = grad.storage();
        let mut guards: Vec<_> = state.iter().map(|t| t.storage.write()).collect();
        let mut bufs: Vec<_> = guards
            .iter_mut()
            .zip(state)
            .map(|(s, t)| (&mut **s, &t.layout))
            .collect();
        let mut p = self.storage.write();
        p.update(&self.layout, &g, &grad.layout, &mut bufs, rule)
    }
}
