//! Joining tensors (cat, stack) and indexing by tensors (index_select, gather, scatter_add).

use super::Tensor;
use crate::autograd::Op;
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::shape::Shape;
use crate::storage::Storage;
use crate::{DType, Dim, Error, Result};

impl Tensor {
    /// Concatenates along `dim`; all other extents must match.
    ///
    /// ```
    /// # use kiln::{Device, DType, Tensor};
    /// let a = Tensor::zeros([2, 3], DType::F32, &Device::Cpu)?;
    /// let b = Tensor::ones([1, 3], DType::F32, &Device::Cpu)?;
    /// assert_eq!(Tensor::cat(&[&a, &b], 0)?.dims(), &[3, 3]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn cat(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
        let first = *tensors
            .first()
            .ok_or_else(|| Error::msg("cat: needs at least one tensor"))?;
        let dim = dim.to_index(first.rank(), "cat")?;
        let mut total = 0;
        for t in tensors {
            first.check_same(t, "cat")?;
            let same_rest = t.rank() == first.rank()
                && t.dims()
                    .iter()
                    .zip(first.dims())
                    .enumerate()
                    .all(|(i, (a, b))| i == dim || a == b);
            if !same_rest {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().clone(),
                    rhs: t.shape().clone(),
                });
            }
            total += t.dims()[dim];
        }
        let mut dims = first.dims().to_vec();
        dims[dim] = total;
        let shape = Shape::from(dims);
        let out_layout = Layout::contiguous(shape.clone());
        let mut out = Storage::full(0.0, shape.elem_count(), first.dtype(), first.device())?;
        let mut start = 0;
        for t in tensors {
            let len = t.dims()[dim];
            t.storage()
                .copy_into(&t.layout, &mut out, &out_layout.narrow(dim, start, len)?)?;
            start += len;
        }
        let out = Tensor::from_storage(out, shape);
        Ok(out.tracked(tensors, || Op::Cat {
            xs: tensors.iter().map(|t| (*t).clone()).collect(),
            dim,
        }))
    }

    /// Stacks equal-shape tensors along a new dimension `dim`.
    pub fn stack(tensors: &[&Tensor], dim: impl Dim) -> Result<Tensor> {
        let first = *tensors
            .first()
            .ok_or_else(|| Error::msg("stack: needs at least one tensor"))?;
        let dim = dim.to_index(first.rank() + 1, "stack")?;
        let mut views = Vec::with_capacity(tensors.len());
        for t in tensors {
            if t.shape() != first.shape() {
                return Err(Error::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().clone(),
                    rhs: t.shape().clone(),
                });
            }
            views.push(t.unsqueeze(dim)?);
        }
        Tensor::cat(&views.iter().collect::<Vec<_>>(), dim)
    }

    /// Entries `ids` (a 1-D integer tensor) along `dim`: an embedding lookup is
    /// `table.index_select(&ids, 0)`.
    pub fn index_select(&self, ids: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "index_select")?;
        self.check_device(ids, "index_select")?;
        check_index_dtype(ids, "index_select")?;
        if ids.rank() != 1 {
            return Err(Error::Msg(format!(
                "index_select: ids must be 1-D, got shape {}",
                ids.shape()
            )));
        }
        let s = self
            .storage()
            .index_select(&self.layout, &ids.storage(), &ids.layout, dim)?;
        let mut dims = self.dims().to_vec();
        dims[dim] = ids.elem_count();
        let out = Tensor::from_storage(s, dims);
        Ok(out.tracked(&[self], || Op::IndexSelect {
            x: self.clone(),
            ids: ids.detach(),
            dim,
        }))
    }

    /// `out[i][j] = self[i][ids[i][j]]` for `dim = 1` (likewise for other dims). `ids` has the
    /// rank of `self` and no larger extent in any other dim; the result has `ids`' shape.
    pub fn gather(&self, ids: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "gather")?;
        self.check_device(ids, "gather")?;
        check_index_dtype(ids, "gather")?;
        check_index_shape(self, ids, dim, "gather")?;
        let s = self
            .storage()
            .gather(&self.layout, &ids.storage(), &ids.layout, dim)?;
        let out = Tensor::from_storage(s, ids.shape().clone());
        Ok(out.tracked(&[self], || Op::Gather {
            x: self.clone(),
            ids: ids.detach(),
            dim,
        }))
    }

    /// A copy of `self` with `src[i][j]` added at `[i][ids[i][j]]` for `dim = 1` (likewise
    /// for other dims); repeated indices accumulate. `ids` and `src` share a shape.
    pub fn scatter_add(&self, ids: &Tensor, src: &Tensor, dim: impl Dim) -> Result<Tensor> {
        let dim = dim.to_index(self.rank(), "scatter_add")?;
        self.check_device(ids, "scatter_add")?;
        self.check_same(src, "scatter_add")?;
        check_index_dtype(ids, "scatter_add")?;
        if ids.shape() != src.shape() {
            return Err(Error::ShapeMismatch {
                op: "scatter_add",
                lhs: ids.shape().clone(),
                rhs: src.shape().clone(),
            });
        }
        check_index_shape(self, ids, dim, "scatter_add")?;
        let s = self.storage().scatter_add(
            &self.layout,
            &ids.storage(),
            &ids.layout,
            &src.storage(),
            &src.layout,
            dim,
        )?;
        let out = Tensor::from_storage(s, self.shape().clone());
        Ok(out.tracked(&[self, src], || Op::ScatterAdd {
            x: self.clone(),
            ids: ids.detach(),
            src: src.clone(),
            dim,
        }))
    }
}

fn check_index_dtype(ids: &Tensor, op: &'static str) -> Result<()> {
    match ids.dtype() {
        DType::U8 | DType::U32 | DType::I64 => Ok(()),
        dtype => Err(Error::UnsupportedDType { op, dtype }),
    }
}

fn check_index_shape(x: &Tensor, ids: &Tensor, dim: usize, op: &'static str) -> Result<()> {
    let fits = ids.rank() == x.rank()
        && ids
            .dims()
            .iter()
            .zip(x.dims())
            .enumerate()
            .all(|(i, (a, b))| i == dim || a <= b);
    if !fits {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().clone(),
            rhs: ids.shape().clone(),
        });
    }
    Ok(())
}
