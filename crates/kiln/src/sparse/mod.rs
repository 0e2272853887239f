//! Sparse matrices in CSR form ([`Csr`]) and their products with dense tensors, with
//! gradients; graph workloads on top of them ([`graph`]).
//!
//! A [`Csr`] is a sparsity *pattern* (row pointers, column indices; shared, immutable,
//! validated once) plus a dense 1-D tensor of *values*, which can require gradients. Every
//! array lives on the matrix's device; products run there (see
//! [`crate::backend::sparse::SparseStorage`]).
//!
//! ```
//! use kiln::sparse::Csr;
//! use kiln::{Device, Tensor};
//! // [[1, 0, 2],
//! //  [0, 0, 3]] from COO triplets in any order, duplicates summed.
//! let rows = Tensor::from_vec(vec![1i64, 0, 0, 0], 4, &Device::Cpu)?;
//! let cols = Tensor::from_vec(vec![2i64, 2, 0, 2], 4, &Device::Cpu)?;
//! let vals = Tensor::from_vec(vec![3f32, 1., 1., 1.], 4, &Device::Cpu)?;
//! let a = Csr::from_coo(2, 3, &rows, &cols, &vals)?;
//! assert_eq!(a.nnz(), 3);
//! let x = Tensor::from_vec(vec![1f32, 10., 100.], 3, &Device::Cpu)?;
//! assert_eq!(a.matmul(&x)?.to_vec::<f32>()?, [201., 300.]);
//! # Ok::<(), kiln::Error>(())
//! ```

mod build;
pub mod graph;
mod products;

use crate::backend::sparse::{CsrRef, Tuning, LONG_ROW, LONG_ROW_PIECE};
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Tensor};
use parking_lot::RwLockReadGuard;
use std::sync::{Arc, OnceLock};

/// The integer type of a CSR matrix's row pointers and column indices.
///
/// kiln has no `i32` dtype: 32-bit indices are stored as `u32` tensors whose entries are all
/// below 2³¹, so that their bits are valid `i32` (what PyTorch and cuSPARSE take).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IndexType {
    I32,
    I64,
}

impl IndexType {
    /// The dtype of the index tensors.
    pub fn dtype(self) -> DType {
        match self {
            IndexType::I32 => DType::U32,
            IndexType::I64 => DType::I64,
        }
    }

    /// The largest row count, column count or entry count the type can address.
    pub fn max(self) -> usize {
        match self {
            IndexType::I32 => i32::MAX as usize,
            IndexType::I64 => i64::MAX as usize,
        }
    }

    /// The narrowest type that addresses a matrix of this size.
    pub fn for_size(rows: usize, cols: usize, nnz: usize) -> IndexType {
        if rows.max(cols).max(nnz) <= IndexType::I32.max() {
            IndexType::I32
        } else {
            IndexType::I64
        }
    }
}

/// The index arrays of a CSR matrix, shared by every matrix with that sparsity pattern.
///
/// Invariants (established by [`Pattern::from_host`], relied on by every backend kernel):
/// `row_ptr` has `rows + 1` entries, starts at 0, never decreases and ends at `nnz`;
/// `col_idx` has `nnz` entries, each in `0..cols`; both are contiguous tensors of
/// `index.dtype()` on one device; `pieces` lists the long rows' pieces (see [`CsrRef`]).
pub(crate) struct Pattern {
    rows: usize,
    cols: usize,
    nnz: usize,
    index: IndexType,
    row_ptr: Tensor,
    col_idx: Tensor,
    pieces: Tensor,
    n_pieces: usize,
    /// Every row's entry count, when all rows hold the same one (see [`CsrRef::uniform_len`]).
    uniform_len: Option<usize>,
    /// Aᵀ's pattern and the positions of Aᵀ's values among A's, built on first use.
    transpose: OnceLock<(Arc<Pattern>, Tensor)>,
    /// What the backend measured for this pattern on its device.
    tuning: Tuning,
}

impl Pattern {
    /// Validates host arrays (any integer type, read as `i64`) and moves them to `device`.
    /// `op` names the caller in errors.
    pub(crate) fn from_host(
        op: &'static str,
        rows: usize,
        cols: usize,
        row_ptr: &[i64],
        col_idx: &[i64],
        index: Option<IndexType>,
        device: &Device,
    ) -> Result<Pattern> {
        let bad = |msg: String| Error::InvalidSparse { op, msg };
        if row_ptr.len() != rows + 1 {
            return Err(bad(format!(
                "row_ptr has {} entries; a matrix of {rows} rows needs {}",
                row_ptr.len(),
                rows + 1
            )));
        }
        if row_ptr[0] != 0 {
            return Err(bad(format!("row_ptr starts at {}, not 0", row_ptr[0])));
        }
        if let Some(r) = row_ptr.windows(2).position(|w| w[1] < w[0]) {
            return Err(bad(format!(
                "row_ptr decreases from {} to {} at row {r}",
                row_ptr[r],
                row_ptr[r + 1]
            )));
        }
        let nnz = col_idx.len();
        if row_ptr[rows] as u64 != nnz as u64 {
            return Err(bad(format!(
                "row_ptr ends at {}, but there are {nnz} column indices",
                row_ptr[rows]
            )));
        }
        if let Some(k) = col_idx
            .iter()
            .position(|&c| c < 0 || c as u64 >= cols as u64)
        {
            return Err(bad(format!(
                "column index {} (entry {k}) is outside 0..{cols}",
                col_idx[k]
            )));
        }
        let index = index.unwrap_or_else(|| IndexType::for_size(rows, cols, nnz));
        let largest = rows.max(cols).max(nnz);
        if largest > index.max() {
            return Err(bad(format!(
                "a {rows}x{cols} matrix with {nnz} entries does not fit {index:?} indices \
                 (at most {})",
                index.max()
            )));
        }
        let pieces = long_row_pieces(row_ptr);
        let n_pieces = pieces.len() / 3;
        let len = nnz / rows.max(1);
        let uniform = rows > 0
            && len <= LONG_ROW
            && row_ptr
                .iter()
                .enumerate()
                .all(|(i, &p)| p as usize == i * len);
        let to_tensor = |v: &[i64]| -> Result<Tensor> {
            let len = v.len();
            match index {
                IndexType::I32 => {
                    Tensor::from_vec(v.iter().map(|&i| i as u32).collect::<Vec<_>>(), len, device)
                }
                IndexType::I64 => Tensor::from_vec(v.to_vec(), len, device),
            }
        };
        Ok(Pattern {
            rows,
            cols,
            nnz,
            index,
            row_ptr: to_tensor(row_ptr)?,
            col_idx: to_tensor(col_idx)?,
            pieces: Tensor::from_vec(pieces, [n_pieces, 3], device)?,
            n_pieces,
            uniform_len: uniform.then_some(len),
            transpose: OnceLock::new(),
            tuning: Tuning::default(),
        })
    }

    /// The index arrays on the host, as `i64`.
    pub(crate) fn host_arrays(&self) -> Result<(Vec<i64>, Vec<i64>)> {
        let read = |t: &Tensor| -> Result<Vec<i64>> {
            match self.index {
                IndexType::I32 => Ok(t.to_vec::<u32>()?.into_iter().map(i64::from).collect()),
                IndexType::I64 => t.to_vec::<i64>(),
            }
        };
        Ok((read(&self.row_ptr)?, read(&self.col_idx)?))
    }

    fn device(&self) -> Device {
        self.row_ptr.device()
    }
}

/// `(row, start, end)` of every piece of every row longer than [`LONG_ROW`].
fn long_row_pieces(row_ptr: &[i64]) -> Vec<i64> {
    let mut pieces = Vec::new();
    for (r, w) in row_ptr.windows(2).enumerate() {
        if (w[1] - w[0]) as usize > LONG_ROW {
            let mut s = w[0];
            while s < w[1] {
                let e = (s + LONG_ROW_PIECE as i64).min(w[1]);
                pieces.extend_from_slice(&[r as i64, s, e]);
                s = e;
            }
        }
    }
    pieces
}

/// A sparse matrix in compressed-sparse-row form on one device.
///
/// Cloning is cheap (the pattern is shared, the values tensor is a handle). The values may
/// require gradients ([`Csr::with_values`]); products then record a gradient for them and
/// for the dense operand. See the [module documentation](self) for an example.
#[derive(Clone)]
pub struct Csr {
    pattern: Arc<Pattern>,
    values: Tensor,
}

impl std::fmt::Debug for Csr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Csr({}x{}, {} entries, {} values, {:?} indices, {})",
            self.rows(),
            self.cols(),
            self.nnz(),
            self.dtype(),
            self.index_type(),
            self.device()
        )
    }
}

impl Csr {
    /// A matrix from its CSR arrays: `row_ptr` (`rows + 1` entries) and `col_idx` (`nnz`),
    /// integer tensors of any dtype and layout, and `values` (`nnz`, float), which decides
    /// the device (the index arrays are copied there). Rows need not be sorted by column
    /// and may repeat a column (products then add both entries). Indices are stored as
    /// [`IndexType::for_size`] picks; see [`Csr::with_index_type`].
    ///
    /// # Errors
    /// [`Error::InvalidSparse`] for `row_ptr` not starting at 0, decreasing, or not ending at
    /// `nnz`; length mismatches; a column outside `0..cols`; sizes beyond `i64`.
    pub fn new(
        rows: usize,
        cols: usize,
        row_ptr: &Tensor,
        col_idx: &Tensor,
        values: &Tensor,
    ) -> Result<Csr> {
        const OP: &str = "Csr::new";
        check_values(OP, values, col_idx.elem_count())?;
        let (rp, ci) = (host_indices(OP, row_ptr)?, host_indices(OP, col_idx)?);
        let pattern = Pattern::from_host(OP, rows, cols, &rp, &ci, None, &values.device())?;
        Ok(Csr {
            pattern: Arc::new(pattern),
            values: values.flatten_all()?,
        })
    }

    pub(crate) fn from_pattern(pattern: Arc<Pattern>, values: Tensor) -> Csr {
        Csr { pattern, values }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.pattern.rows
    }
    /// Columns.
    pub fn cols(&self) -> usize {
        self.pattern.cols
    }
    /// `[rows, cols]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.rows(), self.cols()]
    }
    /// Stored entries.
    pub fn nnz(&self) -> usize {
        self.pattern.nnz
    }
    /// The values' dtype.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }
    pub fn device(&self) -> Device {
        self.values.device()
    }
    pub fn index_type(&self) -> IndexType {
        self.pattern.index
    }
    /// The row pointers (`rows + 1` entries, dtype [`IndexType::dtype`]).
    pub fn row_ptr(&self) -> &Tensor {
        &self.pattern.row_ptr
    }
    /// The column index of each stored entry.
    pub fn col_idx(&self) -> &Tensor {
        &self.pattern.col_idx
    }
    /// The stored values (1-D, `nnz`), in row order.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// The same pattern with other values (`nnz` elements, float, on this device): for
    /// example `a.with_values(&a.values().var()?)` to learn the entries.
    pub fn with_values(&self, values: &Tensor) -> Result<Csr> {
        check_values("Csr::with_values", values, self.nnz())?;
        if values.device() != self.device() {
            return Err(Error::DeviceMismatch {
                op: "Csr::with_values",
                lhs: self.device(),
                rhs: values.device(),
            });
        }
        Ok(Csr {
            pattern: self.pattern.clone(),
            values: values.flatten_all()?,
        })
    }

    /// The matrix with values converted to `dtype` (differentiable).
    pub fn to_dtype(&self, dtype: DType) -> Result<Csr> {
        self.with_values(&self.values.to_dtype(dtype)?)
    }

    /// The matrix on `device` (values and index arrays copied).
    pub fn to_device(&self, device: &Device) -> Result<Csr> {
        if *device == self.device() {
            return Ok(self.clone());
        }
        let p = &self.pattern;
        let pattern = Pattern {
            rows: p.rows,
            cols: p.cols,
            nnz: p.nnz,
            index: p.index,
            row_ptr: p.row_ptr.to_device(device)?,
            col_idx: p.col_idx.to_device(device)?,
            pieces: p.pieces.to_device(device)?,
            n_pieces: p.n_pieces,
            uniform_len: p.uniform_len,
            transpose: OnceLock::new(),
            tuning: Tuning::default(),
        };
        Ok(Csr {
            pattern: Arc::new(pattern),
            values: self.values.to_device(device)?,
        })
    }

    /// The same matrix with indices of `index` type (an error if the matrix is too large
    /// for it).
    pub fn with_index_type(&self, index: IndexType) -> Result<Csr> {
        if index == self.index_type() {
            return Ok(self.clone());
        }
        let (rp, ci) = self.pattern.host_arrays()?;
        let p = Pattern::from_host(
            "Csr::with_index_type",
            self.rows(),
            self.cols(),
            &rp,
            &ci,
            Some(index),
            &self.device(),
        )?;
        Ok(Csr::from_pattern(Arc::new(p), self.values.clone()))
    }

    /// Runs `f` with the matrix's arrays as a backend sees them (read-locked).
    pub(crate) fn with_ref<R>(&self, f: impl FnOnce(CsrRef<'_, Storage>) -> R) -> R {
        let p = &self.pattern;
        let guards: [RwLockReadGuard<'_, Storage>; 4] = [
            p.row_ptr.storage(),
            p.col_idx.storage(),
            self.values.storage(),
            p.pieces.storage(),
        ];
        f(CsrRef {
            rows: p.rows,
            cols: p.cols,
            nnz: p.nnz,
            row_ptr: &guards[0],
            col_idx: &guards[1],
            values: &guards[2],
            pieces: &guards[3],
            n_pieces: p.n_pieces,
            uniform_len: p.uniform_len,
            tuning: &p.tuning,
        })
    }
}

/// Reads an integer tensor of indices to the host as `i64` (u64 beyond `i64::MAX` cannot
/// occur: kiln's widest unsigned dtype is `u32`).
fn host_indices(op: &'static str, t: &Tensor) -> Result<Vec<i64>> {
    if t.rank() != 1 {
        return Err(Error::InvalidSparse {
            op,
            msg: format!("index arrays must be 1-D, got shape {}", t.shape()),
        });
    }
    match t.dtype() {
        DType::I64 => t.to_vec::<i64>(),
        DType::U32 => Ok(t.to_vec::<u32>()?.into_iter().map(i64::from).collect()),
        DType::U8 => Ok(t.to_vec::<u8>()?.into_iter().map(i64::from).collect()),
        dtype => Err(Error::UnsupportedDType { op, dtype }),
    }
}

/// Checks that `values` is a 1-D float tensor of `nnz` elements.
fn check_values(op: &'static str, values: &Tensor, nnz: usize) -> Result<()> {
    values.check_float(op)?;
    if values.rank() != 1 || values.elem_count() != nnz {
        return Err(Error::InvalidSparse {
            op,
            msg: format!(
                "values have shape {}; the matrix needs a 1-D tensor of {nnz} entries",
                values.shape()
            ),
        });
    }
    Ok(())
}
