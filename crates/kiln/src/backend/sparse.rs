//! The sparse-matrix primitives of a backend (each backend's `sparse.rs`): products of a CSR
//! matrix with dense operands. Building, validating, converting and transposing CSR
//! matrices happen above, in [`crate::sparse`]; a backend sees only validated arrays.

use super::BackendStorage;
use crate::layout::Layout;
use crate::Result;

/// Rows with more entries than this are not computed by the per-row kernels: they are cut
/// into pieces of at most [`LONG_ROW_PIECE`] entries (listed in [`CsrRef::pieces`]) that run
/// in parallel and are summed, so that one very long row never serialises a product.
pub const LONG_ROW: usize = 64;
/// The most entries of one piece of a long row.
pub const LONG_ROW_PIECE: usize = 256;

/// A validated CSR matrix as a backend sees it. Invariants (checked by
/// [`crate::sparse::Csr`] before any backend call):
/// - `row_ptr` holds `rows + 1` entries, `col_idx` and `values` `nnz = row_ptr[rows]`; all
///   three are contiguous from offset 0 and on one device;
/// - `row_ptr` and `col_idx` share a dtype, `U32` (entries below 2³¹, i.e. valid `i32`) or
///   `I64`; `row_ptr` starts at 0 and never decreases; every column is in `0..cols`;
/// - `pieces` is `[n_pieces, 3]` `I64`, contiguous: `(row, start, end)` for every piece of
///   every row longer than [`LONG_ROW`], in row order, each piece at most
///   [`LONG_ROW_PIECE`] entries, together covering those rows exactly.
pub struct CsrRef<'a, S> {
    pub rows: usize,
    pub cols: usize,
    pub nnz: usize,
    pub row_ptr: &'a S,
    pub col_idx: &'a S,
    pub values: &'a S,
    pub pieces: &'a S,
    pub n_pieces: usize,
    /// `Some(len)` when every row holds `len` entries (`row_ptr[i] = i·len`, `len` at most
    /// [`LONG_ROW`]): a cycle, a permutation, a k-regular graph. Found while the row pointers
    /// are validated.
    pub uniform_len: Option<usize>,
    /// The backend's measured choices for this pattern (see [`Tuning`]).
    pub tuning: &'a Tuning,
}

/// Choices a backend measured for one sparsity pattern (for example CUDA's threads per
/// row), kept with the pattern so that each is measured once. Keys and values are the
/// backend's own.
#[derive(Debug, Default)]
pub struct Tuning {
    choices: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Tuning {
    /// The value stored under `key`, if any.
    pub fn get(&self, key: u64) -> Option<u64> {
        let c = self.choices.lock().unwrap_or_else(|e| e.into_inner());
        c.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
    }

    /// Counts one more use of `key` and returns the count (a backend measures only what is
    /// used repeatedly: a one-off product should not pay for timing its candidates).
    pub fn count_use(&self, key: u64) -> u64 {
        let count_key = key | 1 << 63;
        let n = self.get(count_key).unwrap_or(0) + 1;
        self.set(count_key, n);
        n
    }

    /// Stores `value` under `key` (replacing an earlier value).
    pub fn set(&self, key: u64, value: u64) {
        let mut c = self.choices.lock().unwrap_or_else(|e| e.into_inner());
        c.retain(|(k, _)| *k != key);
        c.push((key, value));
    }
}

// Manual impls: a derive would require `S: Clone`, but only references are copied.
impl<S> Clone for CsrRef<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S> Copy for CsrRef<'_, S> {}

/// Which product [`SparseStorage::csr_matmul`] computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CsrProduct {
    /// Scales the product.
    pub alpha: f64,
    /// With `true`, `Aᵀ·X` (`X` is `[rows, n]`, the result `[cols, n]`); else `A·X`.
    pub transpose: bool,
}

/// Products of a CSR matrix with dense operands.
pub trait SparseStorage: BackendStorage {
    /// `alpha·A·X + beta·Y` (or with `Aᵀ`, see [`CsrProduct`]) as a new contiguous
    /// `[m, n]` storage of `A`'s value dtype. `x` is `[k, n]` with any strides; `acc` is
    /// `(beta, Y, Y's layout)` with `Y` of the result's shape, any strides (when `beta` is 0,
    /// `Y` is not read, so NaNs in it do not propagate). Returns `Ok(None)` when the backend
    /// has no direct kernel for the transposed product: the caller then multiplies by the
    /// materialised transpose.
    fn csr_matmul(
        a: CsrRef<'_, Self>,
        x: &Self,
        x_layout: &Layout,
        product: CsrProduct,
        acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>>;

    /// The sampled dense product `out[k] = Σ_j lhs[row(k), j] · rhs[col(k), j]` for every
    /// stored entry `k` of `A` (the gradient of `A·X` with respect to `A`'s values is this
    /// with `lhs` the output gradient and `rhs = X`). `lhs` is `[rows, n]`, `rhs`
    /// `[cols, n]`, any strides; the result is `[nnz]` of `A`'s value dtype.
    fn csr_sampled_dot(
        a: CsrRef<'_, Self>,
        lhs: &Self,
        lhs_layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
    ) -> Result<Self>;
}
