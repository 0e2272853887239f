//! Optimizers (SGD with momentum, Nesterov and weight decay; Adam and AdamW) updating
//! parameters in place on their device, and learning-rate schedules.

use kiln::op::UpdateRule;
use kiln::{Error, Grads, ParamUpdate, Result, Tensor};
use std::collections::HashMap;

/// Updates parameters from their gradients.
pub trait Optimizer {
    fn step(&mut self, grads: &Grads) -> Result<()>;
    fn lr(&self) -> f64;
    fn set_lr(&mut self, lr: f64);
    /// Named state tensors, for checkpoints (`<param>.momentum_buffer`, `<param>.exp_avg`, ...).
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores what [`Optimizer::state`] returned.
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
}

/// Applies `rule` to each (parameter, gradient, state) in as few grouped updates as there
/// are (device, dtype) pairs among the parameters.
fn apply_grouped(updates: Vec<(&Tensor, &Tensor, Vec<&Tensor>)>, rule: UpdateRule) -> Result<()> {
    let mut remaining: Vec<_> = updates.iter().collect();
    while let Some(&(first, ..)) = remaining.first() {
        let key = (first.device(), first.dtype());
        let (same, rest): (Vec<_>, Vec<_>) = remaining
            .into_iter()
            .partition(|(p, ..)| (p.device(), p.dtype()) == key);
        let group: Vec<ParamUpdate> = same
            .iter()
            .map(|(param, grad, state)| ParamUpdate { param, grad, state })
            .collect();
        Tensor::apply_update_group(&group, rule)?;
        remaining = rest;
    }
    Ok(())
}

/// Stochastic gradient descent, as `torch.optim.SGD`:
/// `g += wd·p; v = μ·v + g; p -= lr·(nesterov ? g + μ·v : v)`.
pub struct Sgd {
    params: Vec<(String, Tensor)>,
    pub lr: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    velocity: Vec<Option<Tensor>>,
}

impl Sgd {
    pub fn new(
        params: Vec<(String, Tensor)>,
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    ) -> Result<Sgd> {
        if nesterov && momentum <= 0.0 {
            return Err(Error::Msg(
                "SGD: Nesterov momentum needs momentum > 0".into(),
            ));
        }
        let n = params.len();
        Ok(Sgd {
            params,
            lr,
            momentum,
            nesterov,
            weight_decay,
            velocity: vec![None; n],
        })
    }
}

impl Optimizer for Sgd {
    /// One fused update per parameter (see [`kiln::op::UpdateRule::Sgd`]); the momentum
    /// buffer starts at zero, so the first step sets it to the gradient, as in PyTorch.
    fn step(&mut self, grads: &Grads) -> Result<()> {
        let rule = UpdateRule::Sgd {
            lr: self.lr,
            momentum: self.momentum,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
        };
        for ((_, p), v) in self.params.iter().zip(self.velocity.iter_mut()) {
            if self.momentum != 0.0 && v.is_none() && grads.get(p).is_some() {
                *v = Some(p.detach().zeros_like()?);
            }
        }
        let updates = self
            .params
            .iter()
            .zip(&self.velocity)
            // A parameter the loss does not use gets no update (as in PyTorch).
            .filter_map(|((_, p), v)| Some((p, grads.get(p)?, v.iter().collect())))
            .collect();
        apply_grouped(updates, rule)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(&self.velocity)
            .filter_map(|((n, _), v)| {
                v.as_ref()
                    .map(|v| (format!("{n}.momentum_buffer"), v.clone()))
            })
            .collect()
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for ((n, p), v) in self.params.iter().zip(self.velocity.iter_mut()) {
            *v = state
                .get(&format!("{n}.momentum_buffer"))
                .map(|t| t.to_device(&p.device()))
                .transpose()?;
        }
        Ok(())
    }
}

/// Adam (`decoupled = false`, weight decay added to the gradient) and AdamW
/// (`decoupled = true`, weight decay applied to the parameter), as in PyTorch.
pub struct Adam {
    params: Vec<(String, Tensor)>,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
    m: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
    t: u64,
}

impl Adam {
    pub fn new(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64, decoupled: bool) -> Adam {
        let n = params.len();
        Adam {
            params,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            decoupled,
            m: vec![None; n],
            v: vec![None; n],
            t: 0,
        }
    }
}

impl Optimizer for Adam {
    /// One fused update per parameter (see [`kiln::op::UpdateRule::Adam`]); the moments
    /// start at zero.
    fn step(&mut self, grads: &Grads) -> Result<()> {
        self.t += 1;
        let rule = UpdateRule::Adam {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled: self.decoupled,
            step: self.t,
        };
        for (i, (_, p)) in self.params.iter().enumerate() {
            if grads.get(p).is_none() {
                continue;
            }
            for slot in [&mut self.m[i], &mut self.v[i]] {
                if slot.is_none() {
                    *slot = Some(p.detach().zeros_like()?);
                }
            }
        }
        let updates = self
            .params
            .iter()
            .zip(self.m.iter().zip(&self.v))
            // A parameter the loss does not use gets no update (as in PyTorch).
            .filter_map(|((_, p), (m, v))| {
                Some((p, grads.get(p)?, m.iter().chain(v.iter()).collect()))
            })
            .collect();
        apply_grouped(updates, rule)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, (n, _)) in self.params.iter().enumerate() {
            if let (Some(m), Some(v)) = (&self.m[i], &self.v[i]) {
                out.push((format!("{n}.exp_avg"), m.clone()));
                out.push((format!("{n}.exp_avg_sq"), v.clone()));
            }
        }
        if let Some((_, p)) = self.params.first() {
            if let Ok(t) = Tensor::scalar(self.t as f64, kiln::DType::I64, &p.device()) {
                out.push(("step".into(), t));
            }
        }
        out
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for (i, (n, p)) in self.params.iter().enumerate() {
            let dev = p.device();
            self.m[i] = state
                .get(&format!("{n}.exp_avg"))
                .map(|t| t.to_device(&dev))
                .transpose()?;
            self.v[i] = state
                .get(&format!("{n}.exp_avg_sq"))
                .map(|t| t.to_device(&dev))
                .transpose()?;
        }
        if let Some(t) = state.get("step") {
            self.t = t.to_device(&kiln::Device::Cpu)?.to_scalar::<i64>()? as u64;
        }
        Ok(())
    }
}

/// Learning rate as a function of the epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    Constant,
    /// Multiply by `gamma` every `every` epochs.
    Step {
        every: usize,
        gamma: f64,
    },
    /// Cosine annealing from the base rate to `min_lr` over `total` epochs.
    Cosine {
        total: usize,
        min_lr: f64,
    },
}

impl Schedule {
    /// The rate for (0-based) `epoch`.
    ///
    /// ```
    /// use kiln_nn::optim::Schedule;
    /// assert_eq!(Schedule::Step { every: 2, gamma: 0.1 }.lr(1.0, 3), 0.1);
    /// assert!((Schedule::Cosine { total: 10, min_lr: 0.0 }.lr(1.0, 5) - 0.5).abs() < 1e-12);
    /// ```
    pub fn lr(&self, base: f64, epoch: usize) -> f64 {
        match *self {
            Schedule::Constant => base,
            Schedule::Step { every, gamma } => base * gamma.powi((epoch / every.max(1)) as i32),
            Schedule::Cosine { total, min_lr } => {
                let t = (epoch as f64 / total.max(1) as f64).min(1.0);
                min_lr + (base - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }
}
