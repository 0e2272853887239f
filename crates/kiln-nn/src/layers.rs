//! Modules: `Linear`, activations, `Dropout`, and the `Sequential` container.

use crate::conv::Conv2d;
use crate::init::Init;
use kiln::{DType, Device, DropoutStream, Generator, Result, Tensor};
use std::sync::Mutex;

/// A layer or model: a forward function and named parameters (PyTorch names: `weight`,
/// `bias`, `0.weight` in a sequence, ...).
pub trait Module: Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Parameters with their names; each is a leaf made by [`Tensor::var`].
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// State that is saved with the parameters but not trained, with its names (PyTorch's
    /// buffers: `running_mean`, `running_var`, `num_batches_tracked` of a batch norm).
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }

    /// Switches training behaviour (dropout, batch statistics) on or off.
    fn set_training(&mut self, _training: bool) {}

    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }

    /// This module as a [`Linear`] layer, if it is one ([`Sequential`] fuses a linear layer
    /// and the activation after it into one op).
    fn as_linear(&self) -> Option<&Linear> {
        None
    }

    /// This module as a [`Conv2d`] layer, if it is one ([`Sequential`] fuses it with the
    /// activation after it).
    fn as_conv2d(&self) -> Option<&Conv2d> {
        None
    }

    /// This module as an [`Activation`], if it is one.
    fn as_activation(&self) -> Option<Activation> {
        None
    }
}

/// `y = x Wᵀ + b` with `W` of shape `[out, in]` (PyTorch's layout).
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with weights drawn by `init` and a zero bias.
    ///
    /// ```
    /// use kiln::{Device, DType, Generator, Tensor};
    /// use kiln_nn::{init::Init, Linear, Module};
    /// let l = Linear::new(4, 3, true, Init::KaimingUniform, DType::F32, &Device::Cpu, &mut Generator::new(0))?;
    /// let y = l.forward(&Tensor::ones([2, 4], DType::F32, &Device::Cpu)?)?;
    /// assert_eq!(y.dims(), &[2, 3]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn new(
        inputs: usize,
        outputs: usize,
        bias: bool,
        init: Init,
        dtype: DType,
        device: &Device,
        rng: &mut Generator,
    ) -> Result<Linear> {
        if inputs == 0 || outputs == 0 {
            return Err(kiln::Error::Msg(format!(
                "Linear: inputs = {inputs} and outputs = {outputs} must both be at least 1"
            )));
        }
        let weight = init
            .tensor([outputs, inputs], inputs, outputs, dtype, device, rng)?
            .var()?;
        let bias = if bias {
            Some(Tensor::zeros(outputs, dtype, device)?.var()?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

impl Linear {
    /// `act(x Wᵀ + b)`: the layer and the activation after it as one op where kiln has one
    /// (ReLU and tanh-GELU on a 2-D input with a bias: the activation runs in the GEMM's
    /// epilogue on CUDA); otherwise the layer, then the activation.
    pub fn forward_activated(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let fused = match act {
            Activation::Relu => Some(kiln::op::EpilogueActivation::Relu),
            Activation::GeluTanh => Some(kiln::op::EpilogueActivation::GeluTanh),
            _ => None,
        };
        match (&self.bias, fused) {
            (Some(b), Some(f)) if x.rank() == 2 => x.matmul_bias_act(&self.weight.t()?, b, f),
            _ => act.forward(&self.forward(x)?),
        }
    }
}

impl Module for Linear {
    fn as_linear(&self) -> Option<&Linear> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The transposed weight is a view: the GEMM reads it with a transpose flag.
        let wt = self.weight.t()?;
        match &self.bias {
            // One op: the bias is added in the GEMM's epilogue on CUDA.
            Some(b) if x.rank() == 2 => x.matmul_bias(&wt, b),
            Some(b) => x.matmul(&wt)?.add(b),
            None => x.matmul(&wt),
        }
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }
}

/// Element-wise activations as modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Tanh,
    Sigmoid,
}

impl Module for Activation {
    fn as_activation(&self) -> Option<Activation> {
        Some(*self)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }
}

/// Zeroes each element with probability `p` while training and scales the rest by
/// `1/(1-p)`; the identity in evaluation. Masks come from a [`kiln::DropoutStream`] on the
/// input's device, drawn there: a training step recorded in a CUDA graph draws new masks on
/// every replay.
pub struct Dropout {
    pub p: f64,
    training: bool,
    seed: u64,
    stream: Mutex<Option<DropoutStream>>,
}

impl Dropout {
    /// # Errors
    /// A probability `p` outside `[0, 1)` (1 would zero every element).
    ///
    /// ```
    /// use kiln_nn::Dropout;
    /// assert!(Dropout::new(0.5, 0).is_ok());
    /// let err = Dropout::new(1.5, 0).err().expect("p = 1.5 is refused");
    /// assert!(err.to_string().contains("1.5"));
    /// ```
    pub fn new(p: f64, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(kiln::Error::Msg(format!(
                "Dropout: p = {p} is out of range: [0, 1)"
            )));
        }
        Ok(Dropout {
            p,
            training: true,
            seed,
            stream: Mutex::new(None),
        })
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let mut slot = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let device = x.device();
        // The stream lives on the input's device; moving continues it at the same step.
        let step = match &*slot {
            Some(s) if s.device() == device => None,
            Some(s) => Some(s.step()?),
            None => Some(0),
        };
        if let Some(step) = step {
            *slot = Some(DropoutStream::at_step(self.seed, step, &device)?);
        }
        x.dropout(self.p, slot.as_ref().expect("set above"))
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Modules applied in order; parameters are named `<index>.<name>` as in PyTorch.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Sequential {
        Sequential::default()
    }

    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    /// The layers in order; a [`Linear`] or [`Conv2d`] followed by an [`Activation`] runs as
    /// one fused op ([`Linear::forward_activated`], [`Conv2d::forward_activated`]), with the
    /// same result and parameter names.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let next = self.layers.get(i + 1).and_then(|l| l.as_activation());
            let layer = &self.layers[i];
            match (layer.as_linear(), layer.as_conv2d(), next) {
                (Some(linear), _, Some(act)) => {
                    y = linear.forward_activated(&y, act)?;
                    i += 2;
                }
                (_, Some(conv), Some(act)) => {
                    y = conv.forward_activated(&y, act)?;
                    i += 2;
                }
                _ => {
                    y = self.layers[i].forward(&y)?;
                    i += 1;
                }
            }
        }
        Ok(y)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.named_parameters()
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.named_buffers()
                    .into_iter()
                    .map(move |(n, t)| (format!("{i}.{n}"), t))
            })
            .collect()
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}
