//! [`SparseStorage`] for [`Storage`]: CSR products, forwarded to the backend of the
//! operands' device.

use super::Storage;
use crate::backend::cpu::CpuStorage;
#[cfg(feature = "cuda")]
use crate::backend::cuda::CudaStorage;
use crate::backend::sparse::{CsrProduct, CsrRef, SparseStorage};
#[cfg(feature = "wgpu")]
use crate::backend::wgpu::WgpuStorage;
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::{Error, Result};

/// The arrays of `a` on one backend, or a device-mismatch error naming `op`.
fn csr_on<'a, S>(
    a: CsrRef<'a, Storage>,
    op: &'static str,
    pick: impl Fn(&'a Storage) -> Option<&'a S>,
) -> Result<CsrRef<'a, S>> {
    let get = |s: &'a Storage| {
        pick(s).ok_or(Error::DeviceMismatch {
            op,
            lhs: a.values.device(),
            rhs: s.device(),
        })
    };
    Ok(CsrRef {
        rows: a.rows,
        cols: a.cols,
        nnz: a.nnz,
        row_ptr: get(a.row_ptr)?,
        col_idx: get(a.col_idx)?,
        values: get(a.values)?,
        pieces: get(a.pieces)?,
        n_pieces: a.n_pieces,
        uniform_len: a.uniform_len,
        tuning: a.tuning,
    })
}

/// Runs `$body` with the CSR arrays `$a` and the operands `$x` (and, with `acc`, the
/// optional accumulator `(beta, Y, layout)`) on the backend of `$a`'s values (`$S` its
/// storage type), or returns a device mismatch.
macro_rules! on_csr_backend {
    ($op:expr, $a:ident, [$($x:ident),*], $variant:ident, $S:ty => $body:expr) => {{
        let $a = csr_on($a, $op, |s| match s {
            Storage::$variant(s) => Some(s),
            #[allow(unreachable_patterns)]
            _ => None,
        })?;
        $(
            let $x: &$S = match $x {
                Storage::$variant(s) => s,
                #[allow(unreachable_patterns)]
                other => {
                    return Err(Error::DeviceMismatch {
                        op: $op,
                        lhs: $a.values.device(),
                        rhs: other.device(),
                    })
                }
            };
        )*
        $body
    }};
    ($op:expr, $a:ident, [$($x:ident),*], acc $acc:ident, $variant:ident, $S:ty => $body:expr) => {
        on_csr_backend!($op, $a, [$($x),*], $variant, $S => {
            let $acc = match $acc {
                None => None,
                Some((beta, Storage::$variant(y), yl)) => Some((beta, y, yl)),
                #[allow(unreachable_patterns)]
                Some((_, other, _)) => {
                    return Err(Error::DeviceMismatch {
                        op: $op,
                        lhs: $a.values.device(),
                        rhs: other.device(),
                    })
                }
            };
            $body
        })
    };
}

impl SparseStorage for Storage {
    fn csr_matmul(
        a: CsrRef<'_, Self>,
        x: &Self,
        xl: &Layout,
        product: CsrProduct,
        acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>> {
        const OP: &str = "Csr::matmul";
        a.values.guard(OP)?;
        match a.values {
            Storage::Cpu(_) => on_csr_backend!(OP, a, [x], acc acc, Cpu, CpuStorage => {
                Ok(CpuStorage::csr_matmul(a, x, xl, product, acc)?.map(Storage::Cpu))
            }),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => on_csr_backend!(OP, a, [x], acc acc, Cuda, CudaStorage => {
                Ok(CudaStorage::csr_matmul(a, x, xl, product, acc)?.map(Storage::Cuda))
            }),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(_) => on_csr_backend!(OP, a, [x], acc acc, Wgpu, WgpuStorage => {
                Ok(WgpuStorage::csr_matmul(a, x, xl, product, acc)?.map(Storage::Wgpu))
            }),
        }
    }

    fn csr_sampled_dot(
        a: CsrRef<'_, Self>,
        lhs: &Self,
        ll: &Layout,
        rhs: &Self,
        rl: &Layout,
    ) -> Result<Self> {
        const OP: &str = "Csr::matmul backward";
        a.values.guard(OP)?;
        match a.values {
            Storage::Cpu(_) => on_csr_backend!(OP, a, [lhs, rhs], Cpu, CpuStorage => {
                CpuStorage::csr_sampled_dot(a, lhs, ll, rhs, rl).map(Storage::Cpu)
            }),
            #[cfg(feature = "cuda")]
            Storage::Cuda(_) => on_csr_backend!(OP, a, [lhs, rhs], Cuda, CudaStorage => {
                CudaStorage::csr_sampled_dot(a, lhs, ll, rhs, rl).map(Storage::Cuda)
            }),
            #[cfg(feature = "wgpu")]
            Storage::Wgpu(_) => on_csr_backend!(OP, a, [lhs, rhs], Wgpu, WgpuStorage => {
                WgpuStorage::csr_sampled_dot(a, lhs, ll, rhs, rl).map(Storage::Wgpu)
            }),
        }
    }
}
