//! SpMV and SpMM through cuSPARSE's generic API (loaded at run time; without it, or with
//! `KILN_CUSPARSE=0`, only kiln's own kernels run). `sparse.rs` times it against kiln's
//! kernels once per pattern and sends a product here only where it measured faster.

use super::{CudaDevice, CudaStorage};
use crate::backend::sparse::CsrRef;
use crate::{DType, Error, Result};
use cudarc::cusparse::sys as cs;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// Why cuSPARSE is not used, or `None` when it is.
pub(crate) fn unavailable_reason() -> Option<&'static str> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            if std::env::var("KILN_CUSPARSE").is_ok_and(|v| v == "0") {
                return Some("disabled by KILN_CUSPARSE=0".into());
            }
            // SAFETY: probes for the shared library without calling into it.
            if !unsafe { cs::is_culib_present() } {
                return Some(
                    "libcusparse is not on the library path (it ships with the CUDA toolkit, \
                     e.g. /usr/local/cuda/lib64, and in pip's nvidia-cusparse)"
                        .into(),
                );
            }
            None
        })
        .as_deref()
}

/// A device's cuSPARSE handle, bound to its stream.
pub(crate) struct Handle(cs::cusparseHandle_t);

// SAFETY: the handle is only used under the device's `cusparse` mutex.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `Handle::new`, destroyed once.
        unsafe {
            cs::cusparseDestroy(self.0);
        }
    }
}

fn check(status: cs::cusparseStatus_t, what: &str) -> Result<()> {
    if status == cs::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("cuSPARSE {what}: {status:?}")))
    }
}

impl Handle {
    fn new(dev: &CudaDevice) -> Result<Handle> {
        dev.bind()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the stream outlives the handle (both belong
        // to the device, which lives for the process).
        unsafe {
            check(cs::cusparseCreate(&mut h), "cusparseCreate")?;
            check(
                cs::cusparseSetStream(h, dev.stream.cu_stream() as _),
                "cusparseSetStream",
            )?;
        }
        Ok(Handle(h))
    }
}

/// Whether cuSPARSE can compute `A·X` for these dtypes here (f32 and f64 values).
pub(crate) fn supports(values: DType) -> bool {
    matches!(values, DType::F32 | DType::F64) && unavailable_reason().is_none()
}

/// Destroys the descriptors it holds when dropped.
struct Descriptors {
    mat: cs::cusparseSpMatDescr_t,
    vecs: Vec<cs::cusparseDnVecDescr_t>,
    mats: Vec<cs::cusparseDnMatDescr_t>,
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created below and is destroyed once.
        unsafe {
            if !self.mat.is_null() {
                cs::cusparseDestroySpMat(self.mat);
            }
            for &v in &self.vecs {
                cs::cusparseDestroyDnVec(v);
            }
            for &m in &self.mats {
                cs::cusparseDestroyDnMat(m);
            }
        }
    }
}

/// `Y = alpha·A·X` into `y_ptr` (`[rows, n]` contiguous), `X` row-major `[cols, n]` with
/// leading dimension `ldx` (1 when `n == 1`).
///
/// # Safety
/// `a`'s arrays satisfy [`CsrRef`]'s invariants and have dtype f32/f64 values; `x_ptr` and
/// `y_ptr` address live device buffers of the stated shapes.
pub(crate) unsafe fn csr_mm(
    dev: &Arc<CudaDevice>,
    a: &CsrRef<'_, CudaStorage>,
    x_ptr: u64,
    ldx: u64,
    n: u64,
    y_ptr: u64,
    alpha: f64,
) -> Result<()> {
    let (value_type, alpha_bytes, zero) = match a.values.dtype {
        DType::F32 => (
            cs::cudaDataType::CUDA_R_32F,
            (alpha as f32).to_ne_bytes().to_vec(),
            0f32.to_ne_bytes().to_vec(),
        ),
        DType::F64 => (
            cs::cudaDataType::CUDA_R_64F,
            alpha.to_ne_bytes().to_vec(),
            0f64.to_ne_bytes().to_vec(),
        ),
        dtype => {
            return Err(Error::UnsupportedDType {
                op: "cuSPARSE SpMM",
                dtype,
            })
        }
    };
    let index_type = match a.row_ptr.dtype {
        DType::U32 => cs::cusparseIndexType_t::CUSPARSE_INDEX_32I,
        _ => cs::cusparseIndexType_t::CUSPARSE_INDEX_64I,
    };
    let mut guard = dev.cusparse.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        *guard = Some(Handle::new(dev)?);
    }
    let handle = guard.as_ref().expect("created above").0;
    dev.bind()?;
    let mut d = Descriptors {
        mat: std::ptr::null_mut(),
        vecs: Vec::new(),
        mats: Vec::new(),
    };
    let (rows, cols) = (a.rows as i64, a.cols as i64);
    // SAFETY: the caller's contract; every pointer handed to cuSPARSE stays alive for the
    // call (the arrays are borrowed, the workspace lives until the end of this function and
    // the caching allocator reuses it only for work queued after this on the same stream).
    unsafe {
        check(
            cs::cusparseCreateCsr(
                &mut d.mat,
                rows,
                cols,
                a.nnz as i64,
                a.row_ptr.buf.ptr as *mut c_void,
                a.col_idx.buf.ptr as *mut c_void,
                a.values.buf.ptr as *mut c_void,
                index_type,
                index_type,
                cs::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO,
                value_type,
            ),
            "cusparseCreateCsr",
        )?;
        let op = cs::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE;
        let (al, be) = (
            alpha_bytes.as_ptr() as *const c_void,
            zero.as_ptr() as *const c_void,
        );
        let mut size = 0usize;
        if n == 1 {
            let (mut vx, mut vy) = (std::ptr::null_mut(), std::ptr::null_mut());
            check(
                cs::cusparseCreateDnVec(&mut vx, cols, x_ptr as *mut c_void, value_type),
                "cusparseCreateDnVec",
            )?;
            d.vecs.push(vx);
            check(
                cs::cusparseCreateDnVec(&mut vy, rows, y_ptr as *mut c_void, value_type),
                "cusparseCreateDnVec",
            )?;
            d.vecs.push(vy);
            let alg = cs::cusparseSpMVAlg_t::CUSPARSE_SPMV_ALG_DEFAULT;
            check(
                cs::cusparseSpMV_bufferSize(
                    handle, op, al, d.mat, vx, be, vy, value_type, alg, &mut size,
                ),
                "cusparseSpMV_bufferSize",
            )?;
            let ws = CudaStorage::alloc(dev, size.max(1), DType::U8)?;
            check(
                cs::cusparseSpMV(
                    handle,
                    op,
                    al,
                    d.mat,
                    vx,
                    be,
                    vy,
                    value_type,
                    alg,
                    ws.buf.ptr as *mut c_void,
                ),
                "cusparseSpMV",
            )?;
        } else {
            let (mut mx, mut my) = (std::ptr::null_mut(), std::ptr::null_mut());
            let order = cs::cusparseOrder_t::CUSPARSE_ORDER_ROW;
            check(
                cs::cusparseCreateDnMat(
                    &mut mx,
                    cols,
                    n as i64,
                    ldx as i64,
                    x_ptr as *mut c_void,
                    value_type,
                    order,
                ),
                "cusparseCreateDnMat",
            )?;
            d.mats.push(mx);
            check(
                cs::cusparseCreateDnMat(
                    &mut my,
                    rows,
                    n as i64,
                    n as i64,
                    y_ptr as *mut c_void,
                    value_type,
                    order,
                ),
                "cusparseCreateDnMat",
            )?;
            d.mats.push(my);
            let alg = cs::cusparseSpMMAlg_t::CUSPARSE_SPMM_ALG_DEFAULT;
            check(
                cs::cusparseSpMM_bufferSize(
                    handle, op, op, al, d.mat, mx, be, my, value_type, alg, &mut size,
                ),
                "cusparseSpMM_bufferSize",
            )?;
            let ws = CudaStorage::alloc(dev, size.max(1), DType::U8)?;
            check(
                cs::cusparseSpMM(
                    handle,
                    op,
                    op,
                    al,
                    d.mat,
                    mx,
                    be,
                    my,
                    value_type,
                    alg,
                    ws.buf.ptr as *mut c_void,
                ),
                "cusparseSpMM",
            )?;
        }
    }
    dev.note_bound();
    Ok(())
}
