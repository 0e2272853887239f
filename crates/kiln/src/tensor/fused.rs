//! Fused training primitives: softmax cross-entropy per row and in-place optimizer updates.
//! Each is one backend call (one kernel on CUDA) where the composed ops would take several;
//! neither records an autograd graph (`kiln_nn::loss` wraps the first in a differentiable op).

use super::Tensor;
use crate::backend::{BackendStorage, UpdateSlot};
use crate::op::{CrossEntropyRows, UpdateRule};
use crate::storage::Storage;
use crate::{bail, Error, Result};

/// A training epoch's running per-row sums, updated in place by
/// [`Tensor::softmax_cross_entropy_accumulate`]: f32 tensors of `[N]` (the batch), read
/// once at the end of the epoch.
#[derive(Clone, Copy, Debug)]
pub struct EpochSums<'a> {
    /// Σ of each row's loss.
    pub loss: &'a Tensor,
    /// How many steps left `loss` finite (the first bad step is found from it).
    pub finite_steps: &'a Tensor,
    /// Σ of each row's 0/1 hit.
    pub hits: &'a Tensor,
}

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
        self.check_cross_entropy(targets, smoothing)?;
        let r = self.storage().cross_entropy(
            &self.layout,
            &targets.storage(),
            &targets.layout,
            smoothing,
            scale,
        )?;
        Ok(self.cross_entropy_rows(r))
    }

    /// [`Tensor::softmax_cross_entropy`] that also adds the rows to a training epoch's
    /// running sums, in place: `sums.loss += loss` (as f32), then `sums.finite_steps += 1`
    /// where `sums.loss` is finite, and `sums.hits += correct`. On CUDA this is the same one
    /// kernel when the three sums are contiguous f32 `[N]` tensors with their own storages
    /// (a training step's three small launches fewer); elsewhere, or for other sums, the
    /// three in-place ops run after it. Both give the same values.
    ///
    /// # Errors
    /// As [`Tensor::softmax_cross_entropy`], and the in-place ops' errors (a sum that is not
    /// f32 or does not broadcast from `[N]`, or lives on another device).
    ///
    /// ```
    /// # use kiln::{Device, DType, EpochSums, Tensor};
    /// let d = Device::Cpu;
    /// let x = Tensor::from_vec(vec![2f32, 0., 0., 0., 3., 0.], [2, 3], &d)?;
    /// let y = Tensor::from_vec(vec![0i64, 2], 2, &d)?;
    /// let (loss, finite, hits) = (Tensor::zeros(2, DType::F32, &d)?, Tensor::zeros(2, DType::F32, &d)?, Tensor::zeros(2, DType::F32, &d)?);
    /// let sums = EpochSums { loss: &loss, finite_steps: &finite, hits: &hits };
    /// for _ in 0..2 {
    ///     x.softmax_cross_entropy_accumulate(&y, 0.0, 0.5, sums)?;
    /// }
    /// let one = x.softmax_cross_entropy(&y, 0.0, 0.5)?.loss.to_vec::<f32>()?;
    /// assert_eq!(loss.to_vec::<f32>()?, [one[0] + one[0], one[1] + one[1]]);
    /// assert_eq!(finite.to_vec::<f32>()?, [2., 2.]);
    /// assert_eq!(hits.to_vec::<f32>()?, [2., 0.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn softmax_cross_entropy_accumulate(
        &self,
        targets: &Tensor,
        smoothing: f64,
        scale: f64,
        sums: EpochSums<'_>,
    ) -> Result<CrossEntropyRows<Tensor>> {
        self.check_cross_entropy(targets, smoothing)?;
        let parts = [sums.loss, sums.finite_steps, sums.hits];
        let own_storages = parts.iter().enumerate().all(|(i, s)| {
            !s.same_storage(self)
                && !s.same_storage(targets)
                && parts[..i].iter().all(|o| !o.same_storage(s))
        });
        if own_storages && parts.iter().all(|s| s.dims() == [self.dims()[0]]) {
            let fused = {
                let (x, t) = (self.storage(), targets.storage());
                let mut guards: Vec<_> = parts.iter().map(|s| s.storage.write()).collect();
                let [a, b, c] = &mut guards[..] else {
                    unreachable!("three sums")
                };
                x.cross_entropy_accumulate(
                    &self.layout,
                    &t,
                    &targets.layout,
                    smoothing,
                    scale,
                    [
                        (&mut **a, &sums.loss.layout),
                        (&mut **b, &sums.finite_steps.layout),
                        (&mut **c, &sums.hits.layout),
                    ],
                )?
            };
            if let Some(r) = fused {
                return Ok(self.cross_entropy_rows(r));
            }
        }
        let rows = self.softmax_cross_entropy(targets, smoothing, scale)?;
        sums.loss
            .add_assign(&rows.loss.to_dtype(crate::DType::F32)?)?;
        sums.finite_steps.count_finite_assign(sums.loss)?;
        sums.hits.add_assign(&rows.correct)?;
        Ok(rows)
    }

    /// The checks of [`Tensor::softmax_cross_entropy`].
    fn check_cross_entropy(&self, targets: &Tensor, smoothing: f64) -> Result<()> {
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
        Ok(())
    }

    /// The backend's rows as tensors of `[N]`, `[N, C]` and `[N]`.
    fn cross_entropy_rows(&self, r: CrossEntropyRows<Storage>) -> CrossEntropyRows<Tensor> {
        let n = self.dims()[0];
        CrossEntropyRows {
            loss: Tensor::from_storage(r.loss, [n]),
            grad: Tensor::from_storage(r.grad, self.shape().clone()),
            correct: Tensor::from_storage(r.correct, [n]),
        }
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
        Tensor::apply_update_group(
            &[ParamUpdate {
                param: self,
                grad,
                state,
            }],
            rule,
        )
    }

    /// [`Tensor::apply_update`] of several parameters by one rule: an optimizer step. On
    /// CUDA up to eight parameters share one kernel launch. Every parameter and state
    /// buffer must have its own storage.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, op::UpdateRule, ParamUpdate};
    /// let (p, q) = (Tensor::from_vec(vec![1f32, 2.], 2, &Device::Cpu)?, Tensor::from_vec(vec![3f32], 1, &Device::Cpu)?);
    /// let (gp, gq) = (Tensor::from_vec(vec![1f32, 1.], 2, &Device::Cpu)?, Tensor::from_vec(vec![2f32], 1, &Device::Cpu)?);
    /// let rule = UpdateRule::Sgd { lr: 0.5, momentum: 0.0, nesterov: false, weight_decay: 0.0 };
    /// Tensor::apply_update_group(
    ///     &[ParamUpdate { param: &p, grad: &gp, state: &[] }, ParamUpdate { param: &q, grad: &gq, state: &[] }],
    ///     rule,
    /// )?;
    /// assert_eq!((p.to_vec::<f32>()?, q.to_vec::<f32>()?), (vec![0.5, 1.5], vec![2.]));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn apply_update_group(updates: &[ParamUpdate<'_>], rule: UpdateRule) -> Result<()> {
        Tensor::update_group_impl(updates, rule, None)
    }

    /// [`Tensor::apply_update_group`] with the learning rate and Adam's step count read from
    /// `schedule`, a contiguous f64 tensor `[lr, step]` on the parameters' device, when the
    /// update runs (the rule's own `lr` and `step` are ignored). A step recorded into a CUDA
    /// graph then follows a schedule: write the new values into `schedule` between replays.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, op::UpdateRule, ParamUpdate};
    /// let p = Tensor::from_vec(vec![1f32, 2.], 2, &Device::Cpu)?;
    /// let g = Tensor::from_vec(vec![1f32, 1.], 2, &Device::Cpu)?;
    /// let schedule = Tensor::from_vec(vec![0.25f64, 1.0], 2, &Device::Cpu)?;
    /// let rule = UpdateRule::Sgd { lr: 99.0, momentum: 0.0, nesterov: false, weight_decay: 0.0 };
    /// Tensor::apply_update_group_scheduled(&[ParamUpdate { param: &p, grad: &g, state: &[] }], rule, &schedule)?;
    /// assert_eq!(p.to_vec::<f32>()?, [0.75, 1.75]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn apply_update_group_scheduled(
        updates: &[ParamUpdate<'_>],
        rule: UpdateRule,
        schedule: &Tensor,
    ) -> Result<()> {
        let op = rule.name();
        if schedule.dtype() != crate::DType::F64
            || schedule.dims() != [2]
            || !schedule.is_contiguous()
            || schedule.layout.offset() != 0
        {
            bail!(
                "{op}: the schedule must be a contiguous f64 tensor [lr, step] at offset 0, got {} of shape {} with strides {:?}",
                schedule.dtype(),
                schedule.shape(),
                schedule.strides()
            );
        }
        if let Some(u) = updates.first() {
            u.param.check_device(schedule, op)?;
        }
        Tensor::update_group_impl(updates, rule, Some(schedule))
    }

    fn update_group_impl(
        updates: &[ParamUpdate<'_>],
        rule: UpdateRule,
        schedule: Option<&Tensor>,
    ) -> Result<()> {
        let op = rule.name();
        let Some(first) = updates.first() else {
            return Ok(());
        };
        let mut written: Vec<&Tensor> = Vec::new();
        let mut grads = Vec::with_capacity(updates.len());
        for u in updates {
            first.param.check_same(u.param, op)?;
            if u.state.len() != rule.state_len() {
                bail!(
                    "{op}: expected {} state buffers, got {}",
                    rule.state_len(),
                    u.state.len()
                );
            }
            for other in std::iter::once(u.grad).chain(u.state.iter().copied()) {
                u.param.check_same(other, op)?;
                if other.shape() != u.param.shape() {
                    return Err(Error::ShapeMismatch {
                        op,
                        lhs: u.param.shape().clone(),
                        rhs: other.shape().clone(),
                    });
                }
            }
            for t in std::iter::once(u.param).chain(u.state.iter().copied()) {
                if !t.is_contiguous() {
                    bail!("{op}: the parameter and its state must be contiguous, got strides {:?} for shape {}", t.strides(), t.shape());
                }
                if written.iter().any(|w| w.same_storage(t)) {
                    bail!("{op}: parameters and state buffers must not share storage");
                }
                written.push(t);
            }
        }
        if schedule.is_some_and(|s| written.iter().any(|w| w.same_storage(s))) {
            bail!("{op}: the schedule must not share storage with a parameter or state buffer");
        }
        // One lock per storage: a gradient viewing a written buffer is copied first.
        for u in updates {
            let aliased = written.iter().any(|w| w.same_storage(u.grad));
            grads.push(if u.grad.is_contiguous() && !aliased {
                u.grad.clone()
            } else {
                u.grad.copy()?
            });
        }
        let grad_guards: Vec<_> = grads.iter().map(|g| g.storage()).collect();
        let mut param_guards: Vec<_> = updates.iter().map(|u| u.param.storage.write()).collect();
        let mut state_guards: Vec<Vec<_>> = updates
            .iter()
            .map(|u| u.state.iter().map(|t| t.storage.write()).collect())
            .collect();
        let mut slots: Vec<UpdateSlot<'_, Storage>> = Vec::with_capacity(updates.len());
        for ((((u, p), sg), g), gt) in updates
            .iter()
            .zip(param_guards.iter_mut())
            .zip(state_guards.iter_mut())
            .zip(&grad_guards)
            .zip(&grads)
        {
            slots.push(UpdateSlot {
                param: &mut **p,
                layout: &u.param.layout,
                grad: &**g,
                grad_layout: &gt.layout,
                state: sg
                    .iter_mut()
                    .zip(u.state)
                    .map(|(s, t)| (&mut **s, &t.layout))
                    .collect(),
            });
        }
        let schedule_guard = schedule.map(|s| s.storage());
        Storage::update_group(&mut slots, rule, schedule_guard.as_deref())
    }
}

/// One parameter of [`Tensor::apply_update_group`]: the parameter, its gradient and the
/// rule's state buffers (`rule.state_len()` of them).
pub struct ParamUpdate<'a> {
    pub param: &'a Tensor,
    pub grad: &'a Tensor,
    pub state: &'a [&'a Tensor],
}
