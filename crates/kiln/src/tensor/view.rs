//! Views: O(1) ops that change only the layout. Each shares storage with its input.

use super::Tensor;
use crate::autograd::Op;
use crate::backend::BackendStorage;
use crate::shape::Shape;
use crate::{Dim, Error, Result};

impl Tensor {
    /// Swaps dimensions `d0` and `d1`.
    ///
    /// ```
    /// # use kiln::{Device, Tensor, DType};
    /// let a = Tensor::arange(0., 6., 1., DType::F32, &Device::Cpu)?.reshape([2, 3])?;
    /// let t = a.transpose(0, 1)?;
    /// assert_eq!(t.dims(), &[3, 2]);
    /// assert!(t.same_storage(&a));
    /// assert_eq!(t.to_vec::<f32>()?, vec![0., 3., 1., 4., 2., 5.]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn transpose(&self, d0: impl Dim, d1: impl Dim) -> Result<Tensor> {
        let d0 = d0.to_index(self.rank(), "transpose")?;
        let d1 = d1.to_index(self.rank(), "transpose")?;
        let mut out = self.view_of_self();
        out.layout.swap_dims(d0, d1);
        Ok(out.tracked(&[self], || Op::Transpose {
            x: self.clone(),
            d0,
            d1,
        }))
    }

    /// Transposes the last two dimensions (rank ≥ 2).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::Msg(format!(
                "t: needs at least 2 dimensions, got shape {}",
                self.shape()
            )));
        }
        self.transpose(self.rank() - 2, self.rank() - 1)
    }

    /// Reorders dimensions: new dimension `i` is old dimension `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let out = self.with_layout(self.layout.permute(perm)?);
        Ok(out.tracked(&[self], || Op::Permute {
            x: self.clone(),
            perm: perm.to_vec(),
        }))
    }

    /// Elements `start .. start + len` of `dim`.
    pub fn narrow(&self, dim: impl Dim, start: usize, len: usize) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "narrow")?;
        let mut out = self.view_of_self();
        out.layout
            .slice_in_place(dim, start, start.saturating_add(len), 1)
            .map_err(|e| e.with_op("narrow"))?;
        Ok(out.tracked(&[self], || Op::Slice {
            x: self.clone(),
            dim,
            start,
            end: start + len,
            step: 1,
        }))
    }

    /// Every `step`-th element of `range` along `dim` (`x[.., start:end:step, ..]`).
    pub fn slice(
        &self,
        dim: impl Dim,
        range: std::ops::Range<usize>,
        step: usize,
    ) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "slice")?;
        let mut out = self.view_of_self();
        out.layout
            .slice_in_place(dim, range.start, range.end, step)?;
        Ok(out.tracked(&[self], || Op::Slice {
            x: self.clone(),
            dim,
            start: range.start,
            end: range.end,
            step,
        }))
    }

    /// Element `index` of `dim`, removing that dimension.
    pub fn select(&self, dim: impl Dim, index: usize) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "select")?;
        if index >= self.dims()[dim] {
            return Err(Error::IndexOutOfRange {
                op: "select",
                index: index as i64,
                dim,
                size: self.dims()[dim],
            });
        }
        self.narrow(dim, index, 1)?.squeeze(dim)
    }

    /// Numpy-style broadcast to `shape` (stride 0 on repeated dimensions).
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let out = self.with_layout(self.layout.broadcast_as(shape)?);
        Ok(out.tracked(&[self], || Op::Broadcast { x: self.clone() }))
    }

    /// Alias of [`Tensor::broadcast_as`], PyTorch's name.
    pub fn expand(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.broadcast_as(shape)
    }

    /// Inserts a dimension of extent 1 at `dim` (`0..=rank`; negative counts from the end).
    pub fn unsqueeze(&self, dim: impl Dim) -> Result<Tensor> {
        let dim = dim.to_index(self.rank() + 1, "unsqueeze")?;
        let mut out = self.view_of_self();
        out.layout.unsqueeze_in_place(dim)?;
        Ok(out.tracked(&[self], || Op::Reshape { x: self.clone() }))
    }

    /// Removes `dim` if its extent is 1 (otherwise a no-op, as in PyTorch).
    pub fn squeeze(&self, dim: impl Dim) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "squeeze")?;
        let mut out = self.view_of_self();
        out.layout.squeeze_in_place(dim)?;
        Ok(out.tracked(&[self], || Op::Reshape { x: self.clone() }))
    }

    /// The same elements in row-major order with a new shape. A view when the strides allow
    /// it (always for contiguous tensors), otherwise a contiguous copy.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = self.check_count(shape.into(), "reshape")?;
        match self.layout.reshape_view(&shape) {
            Some(l) => Ok(self.reshaped(l)),
            None => self.contiguous()?.reshape(shape),
        }
    }

    /// Like [`Tensor::reshape`] but never copies: an error when the strides do not allow a view.
    pub fn view(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = self.check_count(shape.into(), "view")?;
        match self.layout.reshape_view(&shape) {
            Some(l) => Ok(self.reshaped(l)),
            None => Err(Error::InvalidLayout {
                op: "view",
                shape: self.shape().clone(),
                strides: self.strides().to_vec(),
                msg: format!("cannot be viewed as {shape} without a copy; use reshape"),
            }),
        }
    }

    /// Merges dimensions `start..=end` into one (a view when possible, like reshape).
    pub fn flatten(&self, start: impl Dim, end: impl Dim) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(1);
        }
        let (s, e) = (
            start.to_index(self.rank(), "flatten")?,
            end.to_index(self.rank(), "flatten")?,
        );
        if s > e {
            return Err(Error::Msg(format!(
                "flatten: start dim {s} is after end dim {e}"
            )));
        }
        let d = self.dims();
        let mut shape = d[..s].to_vec();
        shape.push(d[s..=e].iter().product());
        shape.extend_from_slice(&d[e + 1..]);
        self.reshape(shape)
    }

    /// All dimensions into one.
    pub fn flatten_all(&self) -> Result<Tensor> {
        self.reshape(self.elem_count())
    }

    /// A contiguous tensor with the same elements: `self` itself (no copy) when already
    /// contiguous, otherwise a copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy()
    }

    /// A contiguous copy with its own storage, whatever the layout (unlike
    /// [`Tensor::contiguous`], which returns `self` when it can).
    pub fn copy(&self) -> Result<Tensor> {
        let s = self.storage().copy_contiguous(&self.layout)?;
        let out = Tensor::from_storage(s, self.shape().clone());
        Ok(out.tracked(&[self], || Op::Copy { x: self.clone() }))
    }

    /// A view of all of `self` (not tracked) whose layout the caller then edits in place:
    /// views are built where they are returned, without passing layouts through `Result`s
    /// (transpose 29 → 23.5 ns on the 2-core CPU against `with_layout(layout.transpose()?)`).
    #[inline]
    fn view_of_self(&self) -> Tensor {
        self.with_layout(self.layout.clone())
    }

    /// A view with the same elements in row-major order (`layout` came from `self`'s).
    fn reshaped(&self, layout: crate::Layout) -> Tensor {
        let out = self.with_layout(layout);
        out.tracked(&[self], || Op::Reshape { x: self.clone() })
    }

    fn check_count(&self, shape: Shape, op: &'static str) -> Result<Shape> {
        if shape.elem_count() != self.elem_count() {
            return Err(Error::ElementCountMismatch {
                op,
                from: self.shape().clone(),
                from_count: self.elem_count(),
                to_count: shape.elem_count(),
                to: shape,
            });
        }
        Ok(shape)
    }
}
