//! Image layers: `Conv2d`, `MaxPool2d`, `AvgPool2d`, `BatchNorm2d`, and the shape layers
//! `Flatten` and `Unflatten`, with PyTorch's parameter and buffer names.

use crate::init::Init;
use crate::layers::{Activation, Dropout, Linear, Module, Sequential};
use kiln::op::EpilogueActivation;
use kiln::{Conv2dOptions, DType, Device, Generator, Result, RunningStats, Tensor};

/// A 2-D convolution over NCHW input: weight `[c_out, c_in / groups, kh, kw]`, optional
/// bias `[c_out]` (PyTorch's `nn.Conv2d` layout and names).
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: Conv2dOptions,
}

impl Conv2d {
    /// A layer with weights drawn by `init` (fan-in `c_in / groups · kh · kw`) and a bias
    /// drawn as PyTorch does, U(−1/√fan_in, 1/√fan_in).
    ///
    /// ```
    /// use kiln::{Conv2dOptions, Device, DType, Generator, Tensor};
    /// use kiln_nn::{init::Init, Conv2d, Module};
    /// let conv = Conv2d::new(1, 8, [3, 3], Conv2dOptions::default().padding(1), true,
    ///     Init::KaimingUniform, DType::F32, &Device::Cpu, &mut Generator::new(0))?;
    /// let y = conv.forward(&Tensor::ones([2, 1, 28, 28], DType::F32, &Device::Cpu)?)?;
    /// assert_eq!(y.dims(), &[2, 8, 28, 28]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: Conv2dOptions,
        bias: bool,
        init: Init,
        dtype: DType,
        device: &Device,
        rng: &mut Generator,
    ) -> Result<Conv2d> {
        let groups = options.groups.max(1);
        let fan_in = in_channels / groups * kernel[0] * kernel[1];
        let fan_out = out_channels / groups * kernel[0] * kernel[1];
        let weight = init
            .tensor(
                [out_channels, in_channels / groups, kernel[0], kernel[1]],
                fan_in,
                fan_out,
                dtype,
                device,
                rng,
            )?
            .var()?;
        let bias = if bias {
            let b = 1.0 / (fan_in.max(1) as f64).sqrt();
            Some(Tensor::rand(out_channels, -b, b, dtype, device, rng)?.var()?)
        } else {
            None
        };
        Ok(Conv2d {
            weight,
            bias,
            options,
        })
    }

    /// `act(conv(x))`, the activation fused into the convolution's GEMM epilogue where kiln
    /// has one (ReLU and tanh-GELU with a bias).
    pub fn forward_activated(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        let fused = match act {
            Activation::Relu => Some(EpilogueActivation::Relu),
            Activation::GeluTanh => Some(EpilogueActivation::GeluTanh),
            _ => None,
        };
        match fused {
            Some(f) if self.bias.is_some() => {
                x.conv2d_act(&self.weight, self.bias.as_ref(), self.options, Some(f))
            }
            _ => act.forward(&self.forward(x)?),
        }
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }

    fn as_conv2d(&self) -> Option<&Conv2d> {
        Some(self)
    }
}

/// Max-pooling over `kernel` windows moved by `stride` (PyTorch's default: the kernel).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl MaxPool2d {
    /// Square `k × k` windows with stride `k`, no padding (`nn.MaxPool2d(k)`).
    pub fn new(k: usize) -> MaxPool2d {
        MaxPool2d {
            kernel: [k, k],
            stride: [k, k],
            padding: [0, 0],
        }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Average pooling, padding counted as zeros (`nn.AvgPool2d`'s default).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl AvgPool2d {
    /// Square `k × k` windows with stride `k`, no padding (`nn.AvgPool2d(k)`).
    pub fn new(k: usize) -> AvgPool2d {
        AvgPool2d {
            kernel: [k, k],
            stride: [k, k],
            padding: [0, 0],
        }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Batch normalisation over the channels of NCHW input (`nn.BatchNorm2d`): batch
/// statistics while training (updating the running ones in place), running statistics in
/// evaluation. Parameters `weight`, `bias`; buffers `running_mean`, `running_var`,
/// `num_batches_tracked`.
pub struct BatchNorm2d {
    pub weight: Tensor,
    pub bias: Tensor,
    pub running_mean: Tensor,
    pub running_var: Tensor,
    pub num_batches_tracked: Tensor,
    pub momentum: f64,
    pub eps: f64,
    training: bool,
    one: Tensor,
}

impl BatchNorm2d {
    /// `channels` channels, weight 1, bias 0, momentum 0.1, eps 1e-5 (PyTorch's defaults).
    ///
    /// ```
    /// use kiln::{Device, DType, Tensor};
    /// use kiln_nn::{BatchNorm2d, Module};
    /// let bn = BatchNorm2d::new(3, DType::F32, &Device::Cpu)?;
    /// let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, &Device::Cpu)?.reshape([2, 3, 2, 2])?;
    /// let y = bn.forward(&x)?;
    /// assert!(y.mean(kiln::AllDims, false)?.to_scalar::<f32>()?.abs() < 1e-6);
    /// assert_eq!(bn.num_batches_tracked.to_scalar::<i64>()?, 1);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn new(channels: usize, dtype: DType, device: &Device) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            weight: Tensor::ones(channels, dtype, device)?.var()?,
            bias: Tensor::zeros(channels, dtype, device)?.var()?,
            running_mean: Tensor::zeros(channels, dtype, device)?,
            running_var: Tensor::ones(channels, dtype, device)?,
            num_batches_tracked: Tensor::zeros((), DType::I64, device)?,
            momentum: 0.1,
            eps: 1e-5,
            training: true,
            one: Tensor::ones((), DType::I64, device)?,
        })
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 {
            return Err(kiln::Error::Msg(format!(
                "BatchNorm2d: expected NCHW input, got {}",
                x.shape()
            )));
        }
        let running = RunningStats {
            mean: &self.running_mean,
            var: &self.running_var,
            momentum: self.momentum,
        };
        let y = x.batch_norm(
            Some(running),
            Some(&self.weight),
            Some(&self.bias),
            self.training,
            self.eps,
        )?;
        if self.training {
            self.num_batches_tracked.add_assign(&self.one)?;
        }
        Ok(y)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.weight.clone()),
            ("bias".into(), self.bias.clone()),
        ]
    }

    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
            (
                "num_batches_tracked".into(),
                self.num_batches_tracked.clone(),
            ),
        ]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Merges every dim from 1 on: `[n, ...] → [n, prod]` (`nn.Flatten()`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() <= 2 {
            return Ok(x.clone());
        }
        x.flatten(1, x.rank() - 1)
    }
}

/// Splits dim `dim` into `sizes` (`nn.Unflatten(dim, sizes)`): `[n, 784] → [n, 1, 28, 28]`.
#[derive(Clone, Debug)]
pub struct Unflatten {
    pub dim: usize,
    pub sizes: Vec<usize>,
}

impl Module for Unflatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.dims();
        if self.dim >= d.len() {
            return Err(kiln::Error::Msg(format!(
                "Unflatten: dim {} is out of range for input {}",
                self.dim,
                x.shape()
            )));
        }
        let mut shape = d[..self.dim].to_vec();
        shape.extend(&self.sizes);
        shape.extend(&d[self.dim + 1..]);
        x.reshape(shape)
    }
}

/// The network of `kiln train --model cnn` for 28×28 images given as `[n, 784]` rows:
/// Unflatten, conv 1→32 5×5 pad 2, ReLU, max-pool 2, conv 32→64 5×5 pad 2, ReLU, max-pool 2,
/// Flatten, linear 3136→`hidden`, ReLU, (dropout,) linear `hidden`→`classes`; PyTorch's
/// default initialisation and layer indices, so its checkpoint loads into the same
/// `torch.nn.Sequential`.
///
/// ```
/// use kiln::{DType, Device, Generator, Tensor};
/// use kiln_nn::{conv::mnist_cnn, Module};
/// let net = mnist_cnn(128, 10, None, &Device::Cpu, &mut Generator::new(0))?;
/// let y = net.forward(&Tensor::zeros([2, 784], DType::F32, &Device::Cpu)?)?;
/// assert_eq!(y.dims(), &[2, 10]);
/// assert_eq!(net.named_parameters()[0].0, "1.weight");
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn mnist_cnn(
    hidden: usize,
    classes: usize,
    dropout: Option<(f64, u64)>,
    device: &Device,
    rng: &mut Generator,
) -> Result<Sequential> {
    let (f32, init) = (DType::F32, Init::TorchDefault);
    let pad2 = Conv2dOptions::default().padding(2);
    let mut m = Sequential::new()
        .push(Unflatten {
            dim: 1,
            sizes: vec![1, 28, 28],
        })
        .push(Conv2d::new(
            1,
            32,
            [5, 5],
            pad2,
            true,
            init,
            f32,
            device,
            rng,
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(
            32,
            64,
            [5, 5],
            pad2,
            true,
            init,
            f32,
            device,
            rng,
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Flatten)
        .push(Linear::new(
            64 * 7 * 7,
            hidden,
            true,
            init,
            f32,
            device,
            rng,
        )?)
        .push(Activation::Relu);
    if let Some((p, seed)) = dropout {
        m = m.push(Dropout::new(p, seed)?);
    }
    Ok(m.push(Linear::new(hidden, classes, true, init, f32, device, rng)?))
}
