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

    /// The elements converted to `f64`, whatever the dtype.
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        self.to_dtype(crate::DType::F64)?.to_vec::<f64>()
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
        if self
            .strides()
            .iter()
            .zip(self.dims())
            .any(|(&s, &d)| s == 0 && d > 1)
        {
            return Err(Error::Msg(format!(
                "assign: the target of shape {} is a broadcast view",
                self.shape()
            )));
        }
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
}
