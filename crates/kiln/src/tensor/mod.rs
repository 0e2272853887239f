//! [`Tensor`]: shared storage seen through a [`Layout`].

mod conv;
mod convert;
mod create;
mod display;
mod dropout;
mod elementwise;
mod fused;
mod index;
mod matmul;
mod norm;
mod reduce;
mod view;

pub use conv::Conv2dOptions;
pub(crate) use conv::{conv2d_input_grad_gemm, conv2d_weight_grad_gemm};
pub use dropout::DropoutStream;
pub use fused::{EpochSums, ParamUpdate};
pub use norm::RunningStats;

use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Device, Error, Result};
use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::Arc;

/// An n-dimensional array on a device.
///
/// A tensor is a reference-counted [`Storage`] plus a [`Layout`] (shape, strides, offset).
/// Cloning it or taking a view (transpose, narrow, broadcast, ...) copies only the layout,
/// which lives inline for up to four dimensions (NCHW): no heap allocation, no data copy. Ops accept
/// any view and return a new contiguous tensor.
///
/// ```
/// use kiln::{Device, DType, Tensor};
/// let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], [2, 3], &Device::Cpu)?;
/// let b = a.t()?; // a [3, 2] view of the same storage
/// let c = a.matmul(&b)?; // [2, 2]
/// assert_eq!(c.to_vec::<f32>()?, vec![14., 32., 32., 77.]);
/// assert_eq!(c.sum(kiln::AllDims, false)?.to_scalar::<f32>()?, 155.);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<RwLock<Storage>>,
    layout: Layout,
    dtype: DType,
    device: Device,
    /// How this tensor was made, when it requires gradients (see [`crate::autograd`]).
    pub(crate) node: Option<Arc<crate::autograd::Node>>,
}

impl Tensor {
    /// A tensor owning `storage`, laid out contiguously as `shape`.
    pub(crate) fn from_storage(storage: Storage, shape: impl Into<Shape>) -> Tensor {
        let (dtype, device) = (storage.dtype(), storage.device());
        Tensor {
            storage: Arc::new(RwLock::new(storage)),
            layout: Layout::contiguous(shape),
            dtype,
            device,
            node: None,
        }
    }

    /// The same storage seen through another layout (the layout must index inside it).
    #[inline]
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
            dtype: self.dtype,
            device: self.device,
            node: None,
        }
    }

    /// Read access to the storage. Recursive reads are allowed (`x + x` reads twice).
    pub(crate) fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        self.storage.read_recursive()
    }

    #[inline]
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    #[inline]
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.layout.elem_count()
    }
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    #[inline]
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// Extent of dimension `dim` (negative counts from the end).
    pub fn dim(&self, dim: impl crate::Dim) -> Result<usize> {
        Ok(self.dims()[dim.to_index(self.rank(), "dim")?])
    }

    /// Whether two tensors share storage (views of one another).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether no other tensor or view shares this tensor's storage, so that writing to it
    /// in place cannot change what another tensor reads.
    pub fn owns_storage_alone(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
    }

    pub(crate) fn check_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.device != other.device {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device,
                rhs: other.device,
            });
        }
        Ok(())
    }

    pub(crate) fn check_same(&self, other: &Tensor, op: &'static str) -> Result<()> {
        self.check_device(other, op)?;
        if self.dtype != other.dtype {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype,
                rhs: other.dtype,
            });
        }
        Ok(())
    }

    pub(crate) fn check_float(&self, op: &'static str) -> Result<()> {
        if !self.dtype.is_float() {
            return Err(Error::UnsupportedDType {
                op,
                dtype: self.dtype,
            });
        }
        Ok(())
    }
}
