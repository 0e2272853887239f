//! Seeded initialisers (Kaiming for ReLU nets, Xavier/Glorot), uniform and normal.

use kiln::{DType, Device, Generator, Result, Shape, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// U(−b, b), b = √(6 / fan_in) (He et al., gain √2 for ReLU).
    KaimingUniform,
    /// N(0, 2 / fan_in).
    KaimingNormal,
    /// U(−b, b), b = √(6 / (fan_in + fan_out)).
    XavierUniform,
    /// N(0, 2 / (fan_in + fan_out)).
    XavierNormal,
    /// U(−b, b), b = 1/√fan_in: PyTorch's default for `nn.Linear`.
    TorchDefault,
    Zeros,
}

impl Init {
    pub fn tensor(
        self,
        shape: impl Into<Shape>,
        fan_in: usize,
        fan_out: usize,
        dtype: DType,
        device: &Device,
        rng: &mut Generator,
    ) -> Result<Tensor> {
        let (fi, fo) = (fan_in.max(1) as f64, fan_out.max(1) as f64);
        match self {
            Init::KaimingUniform => {
                let b = (6.0 / fi).sqrt();
                Tensor::rand(shape, -b, b, dtype, device, rng)
            }
            Init::KaimingNormal => Tensor::randn(shape, 0.0, (2.0 / fi).sqrt(), dtype, device, rng),
            Init::XavierUniform => {
                let b = (6.0 / (fi + fo)).sqrt();
                Tensor::rand(shape, -b, b, dtype, device, rng)
            }
            Init::XavierNormal => {
                Tensor::randn(shape, 0.0, (2.0 / (fi + fo)).sqrt(), dtype, device, rng)
            }
            Init::TorchDefault => {
                let b = 1.0 / fi.sqrt();
                Tensor::rand(shape, -b, b, dtype, device, rng)
            }
            Init::Zeros => Tensor::zeros(shape, dtype, device),
        }
    }
}
