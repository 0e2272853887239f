//! Constructors: constants, ranges, identity, random, and from host data.

use super::Tensor;
use crate::backend::cpu::CpuStorage;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Device, Error, Generator, Result, WithDType};

impl Tensor {
    /// Every element equal to `value` (cast to `dtype`).
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let t = Tensor::full(2.5, [2, 2], DType::F64, &Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f64>()?, vec![2.5; 4]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn full(
        value: f64,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let s = Storage::full(value, shape.elem_count(), dtype, *device)?;
        Ok(Tensor::from_storage(s, shape))
    }

    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, dtype, device)
    }

    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, dtype, device)
    }

    /// A rank-0 tensor holding `value`.
    pub fn scalar(value: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(value, (), dtype, device)
    }

    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape().clone(), self.dtype, &self.device)
    }

    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape().clone(), self.dtype, &self.device)
    }

    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Tensor::full(value, self.shape().clone(), self.dtype, &self.device)
    }

    /// `start, start + step, ..` below `end` (above it for a negative step), as a 1-D tensor.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let t = Tensor::arange(0.0, 1.0, 0.25, DType::F32, &Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f32>()?, vec![0.0, 0.25, 0.5, 0.75]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(Error::Msg(format!(
                "arange: bad range {start}..{end} with step {step}"
            )));
        }
        let n = ((end - start) / step).ceil().max(0.0) as usize;
        let s = CpuStorage::from_f64s((0..n).map(|i| start + i as f64 * step), dtype);
        Ok(Tensor::from_storage(Storage::from_cpu(s, *device)?, n))
    }

    /// The `n × n` identity matrix.
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
        let s = CpuStorage::from_f64s(
            (0..n * n).map(|i| if i % (n + 1) == 0 { 1.0 } else { 0.0 }),
            dtype,
        );
        Ok(Tensor::from_storage(Storage::from_cpu(s, *device)?, [n, n]))
    }

    /// Takes ownership of `data` (row-major) as a tensor of `shape`; no copy on the CPU.
    pub fn from_vec<T: WithDType>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.elem_count() {
            return Err(Error::ElementCountMismatch {
                op: "from_vec",
                from: Shape::from(data.len()),
                from_count: data.len(),
                to_count: shape.elem_count(),
                to: shape,
            });
        }
        Ok(Tensor::from_storage(
            Storage::from_cpu(T::into_cpu_storage(data), *device)?,
            shape,
        ))
    }

    /// Copies `data` (row-major) into a tensor of `shape`.
    pub fn from_slice<T: WithDType>(
        data: &[T],
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape, device)
    }

    /// Uniform samples in `[lo, hi)` drawn from `rng`.
    pub fn rand(
        shape: impl Into<Shape>,
        lo: f64,
        hi: f64,
        dtype: DType,
        device: &Device,
        rng: &mut Generator,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let s = CpuStorage::from_f64s((0..shape.elem_count()).map(|_| rng.uniform(lo, hi)), dtype);
        Ok(Tensor::from_storage(Storage::from_cpu(s, *device)?, shape))
    }

    /// Normal samples with `mean` and `std` drawn from `rng`.
    pub fn randn(
        shape: impl Into<Shape>,
        mean: f64,
        std: f64,
        dtype: DType,
        device: &Device,
        rng: &mut Generator,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let s = CpuStorage::from_f64s(
            (0..shape.elem_count()).map(|_| rng.normal(mean, std)),
            dtype,
        );
        Ok(Tensor::from_storage(Storage::from_cpu(s, *device)?, shape))
    }
}
