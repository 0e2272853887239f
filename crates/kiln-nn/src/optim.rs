//! Optimizers (SGD with momentum, Nesterov and weight decay; Adam and AdamW) updating
//! parameters in place on their device, and learning-rate schedules.

use kiln::op::UpdateRule;
use kiln::{DType, Device, Error, Grads, ParamUpdate, Result, Tensor};
use std::collections::HashMap;

/// Updates parameters from their gradients.
///
/// The learning rate (and Adam's step count) live in device memory next to the parameters
/// and every update reads them there, so a step recorded into a CUDA graph follows
/// [`Optimizer::set_lr`] without being recorded again. State buffers are made when the
/// optimizer is made, never inside a step.
pub trait Optimizer {
    fn step(&mut self, grads: &Grads) -> Result<()>;
    fn lr(&self) -> f64;
    /// Sets the learning rate of the following steps (writes it to each parameter device).
    fn set_lr(&mut self, lr: f64) -> Result<()>;
    /// Named state tensors, for checkpoints (`<param>.momentum_buffer`, `<param>.exp_avg`, ...).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restores what [`Optimizer::state`] returned, in place (buffers keep their storage, so
    /// a recorded step keeps working).
    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()>;
}

/// The `[lr, step]` f64 schedule buffer of each device that holds parameters (see
/// [`Tensor::apply_update_group_scheduled`]); on devices without f64 tensors (wgpu) the
/// two numbers stay on the host and each update takes them as arguments.
struct Schedules {
    per_device: Vec<(Device, LrStep)>,
}

// One per device: the size difference of the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum LrStep {
    /// The buffer, and `1.0` on the same device (added to the step count).
    OnDevice {
        buffer: Tensor,
        one: Tensor,
    },
    OnHost(std::cell::Cell<[f64; 2]>),
}

impl Schedules {
    fn new(params: &[(String, Tensor)], lr: f64) -> Result<Schedules> {
        let mut per_device: Vec<(Device, LrStep)> = Vec::new();
        for (_, p) in params {
            let dev = p.device();
            if !per_device.iter().any(|(d, _)| *d == dev) {
                let schedule = if dev.supports(DType::F64) {
                    LrStep::OnDevice {
                        buffer: Tensor::from_vec(vec![lr, 0.0], 2, &dev)?,
                        one: Tensor::ones(1, DType::F64, &dev)?,
                    }
                } else {
                    LrStep::OnHost(std::cell::Cell::new([lr, 0.0]))
                };
                per_device.push((dev, schedule));
            }
        }
        Ok(Schedules { per_device })
    }

    fn get(&self, dev: Device) -> &LrStep {
        &self
            .per_device
            .iter()
            .find(|(d, _)| *d == dev)
            .expect("a schedule per parameter device")
            .1
    }

    /// Writes `[lr, step]` to every device.
    fn write(&self, lr: f64, step: f64) -> Result<()> {
        for (dev, s) in &self.per_device {
            match s {
                LrStep::OnDevice { buffer, .. } => {
                    buffer.assign(&Tensor::from_vec(vec![lr, step], 2, dev)?)?
                }
                LrStep::OnHost(v) => v.set([lr, step]),
            }
        }
        Ok(())
    }

    /// Adds one to the step count on every device, on the device.
    fn advance(&self) -> Result<()> {
        for (_, s) in &self.per_device {
            match s {
                LrStep::OnDevice { buffer, one } => buffer.narrow(0, 1, 1)?.add_assign(one)?,
                LrStep::OnHost(v) => {
                    let [lr, step] = v.get();
                    v.set([lr, step + 1.0]);
                }
            }
        }
        Ok(())
    }

    /// The step count, read from the first device.
    fn step(&self) -> Result<f64> {
        match self.per_device.first() {
            Some((_, LrStep::OnDevice { buffer, .. })) => {
                Ok(buffer.to_device(&Device::Cpu)?.to_vec::<f64>()?[1])
            }
            Some((_, LrStep::OnHost(v))) => Ok(v.get()[1]),
            None => Ok(0.0),
        }
    }
}

/// Checks that `value` is finite and in `range`, naming the optimizer argument.
fn check_arg(op: &str, name: &str, value: f64, ok: bool, range: &str) -> Result<()> {
    if value.is_finite() && ok {
        Ok(())
    } else {
        Err(Error::Msg(format!(
            "{op}: {name} = {value} is out of range: {range}"
        )))
    }
}

/// Applies `rule` to each (parameter, gradient, state) in as few grouped updates as there
/// are (device, dtype) pairs among the parameters, reading each device's schedule.
fn apply_grouped(
    updates: Vec<(&Tensor, &Tensor, Vec<&Tensor>)>,
    rule: UpdateRule,
    schedules: &Schedules,
) -> Result<()> {
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
        match schedules.get(key.0) {
            LrStep::OnDevice { buffer, .. } => {
                Tensor::apply_update_group_scheduled(&group, rule, buffer)?
            }
            LrStep::OnHost(v) => {
                let [lr, step] = v.get();
                Tensor::apply_update_group(&group, rule.with_schedule(lr, step))?
            }
        }
        remaining = rest;
    }
    Ok(())
}

/// Stochastic gradient descent, as `torch.optim.SGD`:
/// `g += wd·p; v = μ·v + g; p -= lr·(nesterov ? g + μ·v : v)`.
pub struct Sgd {
    params: Vec<(String, Tensor)>,
    lr: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    velocity: Vec<Option<Tensor>>,
    schedules: Schedules,
}

impl Sgd {
    /// # Errors
    /// A learning rate that is not finite and > 0, a momentum outside `[0, 1)`, a negative
    /// or non-finite weight decay, or Nesterov without momentum.
    pub fn new(
        params: Vec<(String, Tensor)>,
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    ) -> Result<Sgd> {
        check_arg("SGD", "lr", lr, lr > 0.0, "finite and > 0")?;
        check_arg(
            "SGD",
            "momentum",
            momentum,
            (0.0..1.0).contains(&momentum),
            "[0, 1)",
        )?;
        check_arg(
            "SGD",
            "weight_decay",
            weight_decay,
            weight_decay >= 0.0,
            "finite and >= 0",
        )?;
        if nesterov && momentum <= 0.0 {
            return Err(Error::Msg(
                "SGD: Nesterov momentum needs momentum > 0".into(),
            ));
        }
        // The momentum buffer starts at zero, so the first step sets it to the gradient, as
        // in PyTorch.
        let velocity = params
            .iter()
            .map(|(_, p)| {
                (momentum != 0.0)
                    .then(|| p.detach().zeros_like())
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let schedules = Schedules::new(&params, lr)?;
        Ok(Sgd {
            params,
            lr,
            momentum,
            nesterov,
            weight_decay,
            velocity,
            schedules,
        })
    }
}

impl Optimizer for Sgd {
    /// One fused update per group of parameters (see [`kiln::op::UpdateRule::Sgd`]).
    fn step(&mut self, grads: &Grads) -> Result<()> {
        let rule = UpdateRule::Sgd {
            lr: self.lr,
            momentum: self.momentum,
            nesterov: self.nesterov,
            weight_decay: self.weight_decay,
        };
        let updates = self
            .params
            .iter()
            .zip(&self.velocity)
            // A parameter the loss does not use gets no update (as in PyTorch).
            .filter_map(|((_, p), v)| Some((p, grads.get(p)?, v.iter().collect())))
            .collect();
        apply_grouped(updates, rule, &self.schedules)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_arg("SGD", "lr", lr, lr >= 0.0, "finite and >= 0")?;
        self.lr = lr;
        self.schedules.write(lr, 0.0)
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self
            .params
            .iter()
            .zip(&self.velocity)
            .filter_map(|((n, _), v)| {
                v.as_ref()
                    .map(|v| (format!("{n}.momentum_buffer"), v.clone()))
            })
            .collect())
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for ((n, p), v) in self.params.iter().zip(self.velocity.iter_mut()) {
            if let (Some(v), Some(saved)) = (v.as_ref(), state.get(&format!("{n}.momentum_buffer")))
            {
                v.assign(&saved.to_device(&p.device())?.to_dtype(v.dtype())?)?;
            }
        }
        Ok(())
    }
}

/// Adam (`decoupled = false`, weight decay added to the gradient) and AdamW
/// (`decoupled = true`, weight decay applied to the parameter), as in PyTorch.
pub struct Adam {
    params: Vec<(String, Tensor)>,
    lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// The step count lives in `schedules` (device memory), advanced by each step.
    schedules: Schedules,
}

impl Adam {
    /// Adam with PyTorch's defaults (β = (0.9, 0.999), ε = 1e-8).
    ///
    /// # Errors
    /// A learning rate that is not finite and > 0, or a negative or non-finite weight decay.
    pub fn new(
        params: Vec<(String, Tensor)>,
        lr: f64,
        weight_decay: f64,
        decoupled: bool,
    ) -> Result<Adam> {
        Adam::with_betas(params, lr, (0.9, 0.999), 1e-8, weight_decay, decoupled)
    }

    /// Adam with explicit betas and epsilon.
    ///
    /// # Errors
    /// As [`Adam::new`], and betas outside `[0, 1)` or an epsilon that is not finite and > 0.
    pub fn with_betas(
        params: Vec<(String, Tensor)>,
        lr: f64,
        (beta1, beta2): (f64, f64),
        eps: f64,
        weight_decay: f64,
        decoupled: bool,
    ) -> Result<Adam> {
        let op = if decoupled { "AdamW" } else { "Adam" };
        check_arg(op, "lr", lr, lr > 0.0, "finite and > 0")?;
        check_arg(op, "beta1", beta1, (0.0..1.0).contains(&beta1), "[0, 1)")?;
        check_arg(op, "beta2", beta2, (0.0..1.0).contains(&beta2), "[0, 1)")?;
        check_arg(op, "eps", eps, eps > 0.0, "finite and > 0")?;
        check_arg(
            op,
            "weight_decay",
            weight_decay,
            weight_decay >= 0.0,
            "finite and >= 0",
        )?;
        let zeros = |params: &[(String, Tensor)]| -> Result<Vec<Tensor>> {
            params
                .iter()
                .map(|(_, p)| p.detach().zeros_like())
                .collect()
        };
        let (m, v) = (zeros(&params)?, zeros(&params)?);
        let schedules = Schedules::new(&params, lr)?;
        Ok(Adam {
            params,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            m,
            v,
            schedules,
        })
    }
}

impl Optimizer for Adam {
    /// Advances the step count (on the device), then one fused update per group of
    /// parameters (see [`kiln::op::UpdateRule::Adam`]); the moments start at zero.
    fn step(&mut self, grads: &Grads) -> Result<()> {
        let rule = UpdateRule::Adam {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            decoupled: self.decoupled,
            step: 0,
        };
        self.schedules.advance()?;
        let updates = self
            .params
            .iter()
            .zip(self.m.iter().zip(&self.v))
            // A parameter the loss does not use gets no update (as in PyTorch).
            .filter_map(|((_, p), (m, v))| Some((p, grads.get(p)?, vec![m, v])))
            .collect();
        apply_grouped(updates, rule, &self.schedules)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_arg("Adam", "lr", lr, lr >= 0.0, "finite and >= 0")?;
        self.lr = lr;
        let step = self.schedules.step()?;
        self.schedules.write(lr, step)
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for (i, (n, _)) in self.params.iter().enumerate() {
            out.push((format!("{n}.exp_avg"), self.m[i].clone()));
            out.push((format!("{n}.exp_avg_sq"), self.v[i].clone()));
        }
        if let Some((_, p)) = self.params.first() {
            let step = self.schedules.step()?;
            out.push((
                "step".into(),
                Tensor::scalar(step, DType::I64, &p.device())?,
            ));
        }
        Ok(out)
    }

    fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for (i, (n, p)) in self.params.iter().enumerate() {
            let dev = p.device();
            for (buf, key) in [(&self.m[i], "exp_avg"), (&self.v[i], "exp_avg_sq")] {
                if let Some(saved) = state.get(&format!("{n}.{key}")) {
                    buf.assign(&saved.to_device(&dev)?.to_dtype(buf.dtype())?)?;
                }
            }
        }
        if let Some(t) = state.get("step") {
            let step = t
                .to_device(&Device::Cpu)?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
            self.schedules.write(self.lr, step)?;
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
    /// Checks the schedule's numbers: `every` and `total` at least 1, `gamma` finite and
    /// > 0, `min_lr` finite and ≥ 0; an error names the field, its value and the range.
    ///
    /// ```
    /// use kiln_nn::optim::Schedule;
    /// assert!(Schedule::Step { every: 0, gamma: 0.1 }.validate().is_err());
    /// assert!(Schedule::Cosine { total: 10, min_lr: 0.0 }.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Msg(format!("schedule: {what}")));
        match *self {
            Schedule::Constant => Ok(()),
            Schedule::Step { every: 0, .. } => bad("every = 0 epochs: must be at least 1".into()),
            Schedule::Step { gamma, .. } if !(gamma.is_finite() && gamma > 0.0) => {
                bad(format!("gamma = {gamma}: must be finite and > 0"))
            }
            Schedule::Cosine { total: 0, .. } => bad("total = 0 epochs: must be at least 1".into()),
            Schedule::Cosine { min_lr, .. } if !(min_lr.is_finite() && min_lr >= 0.0) => {
                bad(format!("min_lr = {min_lr}: must be finite and >= 0"))
            }
            _ => Ok(()),
        }
    }

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
