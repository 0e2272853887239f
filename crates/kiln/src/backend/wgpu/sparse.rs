//! CSR products on wgpu devices: not written yet; every call is a clear error.

use super::WgpuStorage;
use crate::backend::sparse::{CsrProduct, CsrRef, SparseStorage};
use crate::layout::Layout;
use crate::{Error, Result};

fn not_yet(op: &str) -> Error {
    Error::Msg(format!(
        "{op}: sparse products are not implemented on wgpu devices yet; move the matrix to \
         the CPU or a CUDA device"
    ))
}

impl SparseStorage for WgpuStorage {
    fn csr_matmul(
        _a: CsrRef<'_, Self>,
        _x: &Self,
        _xl: &Layout,
        _product: CsrProduct,
        _acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>> {
        Err(not_yet("Csr::matmul"))
    }

    fn csr_sampled_dot(
        _a: CsrRef<'_, Self>,
        _lhs: &Self,
        _ll: &Layout,
        _rhs: &Self,
        _rl: &Layout,
    ) -> Result<Self> {
        Err(not_yet("Csr::matmul backward"))
    }
}
