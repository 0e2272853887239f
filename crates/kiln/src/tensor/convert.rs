//! Reading tensors back to the host and moving them between devices.

use super::Tensor;
use crate::{Device, Error, Result, WithDType};

impl Tensor {
    /// The elements in row-major order. `T` must be this tensor's element type.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let x = Tensor::arange(0., 4., 1., DType::I64, &Device::Cpu)?;
    /// assert_eq!(x.to_vec::<i64>()?, vec![0, 1, 2, 3]);
    /// assert!(x.to_vec::<f32>().is_err()); // wrong element type: an error, not a panic
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "to_vec",
                lhs: self.dtype,
                rhs: T::DTYPE,
            });
        }
        let cpu = self.storage().to_cpu(&self.layout)?;
        T::from_cpu_storage(cpu).ok_or(Error::DTypeMismatch {
            op: "to_vec",
            lhs: self.dtype,
            rhs: T::DTYPE,
        })
    }

    /// The elements converted to `f64`, whatever the dtype and device (converted on the
    /// host, so devices without f64 work too).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        self.to_device(&crate::Device::Cpu)?
            .to_dtype(crate::DType::F64)?
            .to_vec::<f64>()
    }

    /// Rows of a 2-D tensor.
    pub fn to_vec2<T: WithDType>(&self) -> Result<Vec<Vec<T>>> {
        if self.rank() != 2 {
            return Err(Error::Msg(format!(
                "to_vec2: needs a 2-D tensor, got shape {}",
                self.shape()
            )));
        }
        let cols = self.dims()[1];
        Ok(self
            .to_vec::<T>()?
            .chunks(cols.max(1))
            .map(<[T]>::to_vec)
            .collect())
    }

    /// The single element of a one-element tensor (any rank).
    pub fn to_scalar<T: WithDType>(&self) -> Result<T> {
        if self.elem_count() != 1 {
            return Err(Error::Msg(format!(
                "to_scalar: tensor of shape {} has {} elements",
                self.shape(),
                self.elem_count()
            )));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// A copy on `device` (`self` when it is already there). The copy is contiguous.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if *device == self.device {
            return Ok(self.clone());
        }
        let s = self.storage().to_device(&self.layout, *device)?;
        Ok(Tensor::from_storage(s, self.shape().clone()))
    }
}

impl Tensor {
    /// Overwrites the elements of `self` (any view, not a broadcast one) with those of `src`
    /// (same shape, dtype and device), in place: every tensor sharing the storage sees the
    /// change. Not recorded by autograd; optimizers update parameters this way.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        self.check_same(src, "assign")?;
        if self.shape() != src.shape() {
            return Err(Error::ShapeMismatch {
                op: "assign",
                lhs: self.shape().clone(),
                rhs: src.shape().clone(),
            });
        }
        self.check_writable("assign")?;
        // Reading and writing one storage would need two locks on it: copy the source first.
        let src = if src.same_storage(self) {
            src.copy()?
        } else {
            src.clone()
        };
        let from = src.storage();
        let mut to = self.storage.write();
        crate::backend::BackendStorage::copy_into(&*from, &src.layout, &mut *to, &self.layout)
    }

    /// `self = self op rhs` in place, with `rhs` broadcast to `self`'s shape (one kernel on
    /// CUDA). `self` must not be a broadcast view. Not recorded by autograd: running totals
    /// and accumulators are updated this way (inside a CUDA graph too).
    ///
    /// ```
    /// # use kiln::{Device, Tensor, op::BinaryOp};
    /// let total = Tensor::from_vec(vec![1f32, 2.], 2, &Device::Cpu)?;
    /// total.binary_assign(&Tensor::from_vec(vec![10f32], 1, &Device::Cpu)?, BinaryOp::Add)?;
    /// assert_eq!(total.to_vec::<f32>()?, [11., 12.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn binary_assign(&self, rhs: &Tensor, op: crate::op::BinaryOp) -> Result<()> {
        self.check_same(rhs, op.name())?;
        self.check_writable(op.name())?;
        // Reading and writing one storage would need two locks on it: copy the source first.
        let rhs = if rhs.same_storage(self) {
            rhs.copy()?
        } else {
            rhs.clone()
        };
        let rl = rhs.layout.broadcast_as(self.shape().clone()).map_err(|_| {
            Error::BroadcastIncompatible {
                op: op.name(),
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
            }
        })?;
        let rhs = rhs.with_layout(rl);
        let from = rhs.storage();
        let mut to = self.storage.write();
        crate::backend::BackendStorage::binary_assign(
            &mut *to,
            &self.layout,
            &from,
            &rhs.layout,
            op,
        )
    }

    /// Refuses an in-place write through a broadcast view (it would write one element
    /// several times).
    fn check_writable(&self, op: &str) -> Result<()> {
        if self
            .strides()
            .iter()
            .zip(self.dims())
            .any(|(&s, &d)| s == 0 && d > 1)
        {
            return Err(Error::Msg(format!(
                "{op}: the in-place target of shape {} is a broadcast view",
                self.shape()
            )));
        }
        Ok(())
    }

    /// `self += rhs` in place; see [`Tensor::binary_assign`].
    pub fn add_assign(&self, rhs: &Tensor) -> Result<()> {
        self.binary_assign(rhs, crate::op::BinaryOp::Add)
    }

    /// `self += 1` where `watched` is finite (element-wise, broadcast), in place and on the
    /// device. With `watched` a running sum of losses, whose first NaN or infinity stays
    /// non-finite, `self` ends up counting the steps before the run diverged: divergence is
    /// located without reading anything back per step (and inside a CUDA graph).
    ///
    /// ```
    /// # use kiln::{Device, Tensor};
    /// let finite_steps = Tensor::zeros(2, kiln::DType::F32, &Device::Cpu)?;
    /// for sum in [[1f32, 2.], [3., f32::NAN], [4., f32::NAN]] {
    ///     finite_steps.count_finite_assign(&Tensor::from_vec(sum.to_vec(), 2, &Device::Cpu)?)?;
    /// }
    /// assert_eq!(finite_steps.to_vec::<f32>()?, [3., 1.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn count_finite_assign(&self, watched: &Tensor) -> Result<()> {
        self.binary_assign(watched, crate::op::BinaryOp::CountFinite)
    }
}

impl Tensor {
    /// The elements in row-major order as native-endian bytes (little-endian on every
    /// supported platform), read through the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        fn bytes<T: WithDType>(t: &Tensor) -> Result<Vec<u8>> {
            Ok(bytemuck::cast_slice(&t.to_vec::<T>()?).to_vec())
        }
        match self.dtype {
            crate::DType::F16 => bytes::<half::f16>(self),
            crate::DType::BF16 => bytes::<half::bf16>(self),
            crate::DType::F32 => bytes::<f32>(self),
            crate::DType::F64 => bytes::<f64>(self),
            crate::DType::U8 => bytes::<u8>(self),
            crate::DType::U32 => bytes::<u32>(self),
            crate::DType::I64 => bytes::<i64>(self),
        }
    }

    /// A tensor of `dtype` and `shape` on `device` from row-major native-endian bytes.
    pub fn from_bytes(
        bytes: &[u8],
        dtype: crate::DType,
        shape: impl Into<crate::Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let want = shape.elem_count() * dtype.size_in_bytes();
        if bytes.len() != want {
            return Err(Error::Msg(format!(
                "from_bytes: {} bytes for {dtype} {shape} (needs {want})",
                bytes.len()
            )));
        }
        fn make<T: WithDType>(b: &[u8], shape: crate::Shape, device: &Device) -> Result<Tensor> {
            // Copy through an aligned vector: the bytes may not be aligned for T.
            let mut v = vec![T::ZERO; b.len() / std::mem::size_of::<T>()];
            bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
            Tensor::from_vec(v, shape, device)
        }
        match dtype {
            crate::DType::F16 => make::<half::f16>(bytes, shape, device),
            crate::DType::BF16 => make::<half::bf16>(bytes, shape, device),
            crate::DType::F32 => make::<f32>(bytes, shape, device),
            crate::DType::F64 => make::<f64>(bytes, shape, device),
            crate::DType::U8 => make::<u8>(bytes, shape, device),
            crate::DType::U32 => make::<u32>(bytes, shape, device),
            crate::DType::I64 => make::<i64>(bytes, shape, device),
        }
    }
}
