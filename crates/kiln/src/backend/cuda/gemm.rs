//! Matrix products through cuBLAS (`cublasGemmStridedBatchedEx`).
//!
//! kiln is row-major and cuBLAS column-major, so `C = A·B` is computed as `Cᵀ = Bᵀ·Aᵀ`. A
//! matrix view whose rows or columns are contiguous maps to an op flag and a leading
//! dimension with no copy (a transposed view is just the other flag); batch dims become one
//! batch stride (0 when broadcast). Only layouts no flag or single stride can express (e.g. a
//! broadcast matrix dim, or batch dims mixing broadcast and real strides) are copied first.

use super::CudaStorage;
use crate::layout::Layout;
use crate::{DType, Error, Result};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};

/// How a `[r, c]` matrix view sits in memory, in cuBLAS terms.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// Rows contiguous: column-major memory holds the transpose, leading dimension `ld`.
    RowMajor(usize),
    /// Columns contiguous: column-major memory holds the matrix itself.
    ColMajor(usize),
}

fn classify(r: usize, c: usize, rs: usize, cs: usize) -> Option<Order> {
    if (cs == 1 || c == 1) && (r == 1 || rs >= c.max(1)) {
        return Some(Order::RowMajor(if r == 1 { c.max(1) } else { rs }));
    }
    if (rs == 1 || r == 1) && (c == 1 || cs >= r.max(1)) {
        return Some(Order::ColMajor(if c == 1 { r.max(1) } else { cs }));
    }
    None
}

/// One stride that walks the batch dims in row-major order, if there is one.
fn batch_stride(l: &Layout) -> Option<usize> {
    let r = l.rank();
    let dims: Vec<(usize, usize)> = l.dims()[..r - 2]
        .iter()
        .zip(&l.strides()[..r - 2])
        .filter(|(d, _)| **d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let Some(&(_, base)) = dims.last() else {
        return Some(0);
    };
    let mut expected = base;
    for &(d, s) in dims.iter().rev() {
        if s != expected {
            return None;
        }
        expected *= d;
    }
    Some(base)
}

/// The operand as (pointer, order, batch stride), copying it contiguous when needed.
fn operand(x: &CudaStorage, l: &Layout) -> Result<(Option<CudaStorage>, u64, Order, usize)> {
    let r = l.rank();
    let (rows, cols) = (l.dims()[r - 2], l.dims()[r - 1]);
    if let (Some(order), Some(bs)) = (
        classify(rows, cols, l.strides()[r - 2], l.strides()[r - 1]),
        batch_stride(l),
    ) {
        return Ok((None, x.ptr_at(l.offset()), order, bs));
    }
    let c = super::elementwise::cast(x, l, x.dtype)?;
    let ptr = c.buf.ptr;
    let bs = if l.elem_count() == rows * cols {
        0
    } else {
        rows * cols
    };
    Ok((Some(c), ptr, Order::RowMajor(cols.max(1)), bs))
}

pub(super) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            lhs: a.dtype,
            rhs: b.dtype,
        });
    }
    let (data_type, compute) = match a.dtype {
        DType::F32 if super::tf32_enabled() => (
            cudaDataType::CUDA_R_32F,
            cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        DType::F32 => (
            cudaDataType::CUDA_R_32F,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::F64 => (
            cudaDataType::CUDA_R_64F,
            cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        DType::F16 => (
            cudaDataType::CUDA_R_16F,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::BF16 => (
            cudaDataType::CUDA_R_16BF,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        dtype => {
            return Err(Error::UnsupportedDType {
                op: "matmul",
                dtype,
            })
        }
    };
    let r = la.rank();
    let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
    let batch: usize = la.dims()[..r - 2].iter().product();
    let out = CudaStorage::alloc(a.dev(), batch * m * n, a.dtype)?;
    if out.len == 0 {
        return Ok(out);
    }
    if k == 0 {
        super::elementwise::fill(&out, 0.0)?;
        return Ok(out);
    }
    for (what, v) in [("m", m), ("n", n), ("k", k), ("batch", batch)] {
        if v > i32::MAX as usize {
            return Err(Error::Msg(format!(
                "matmul on CUDA: {what} = {v} exceeds cuBLAS's 32-bit limit"
            )));
        }
    }
    let (_keep_a, a_ptr, a_order, a_bs) = operand(a, la)?;
    let (_keep_b, b_ptr, b_order, b_bs) = operand(b, lb)?;
    // Cᵀ (n×m) = Bᵀ (n×k) · Aᵀ (k×m): cuBLAS's first operand is B.
    let (op_b, ld_b) = match b_order {
        Order::RowMajor(ld) => (cublasOperation_t::CUBLAS_OP_N, ld),
        Order::ColMajor(ld) => (cublasOperation_t::CUBLAS_OP_T, ld),
    };
    let (op_a, ld_a) = match a_order {
        Order::RowMajor(ld) => (cublasOperation_t::CUBLAS_OP_N, ld),
        Order::ColMajor(ld) => (cublasOperation_t::CUBLAS_OP_T, ld),
    };
    let dev = a.dev();
    let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
    let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) = if a.dtype == DType::F64
    {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    dev.with_blas(|handle| {
        // SAFETY: pointers address the operands' batches (batch strides and leading
        // dimensions checked by `classify`/`batch_stride` against the layouts, which stay
        // inside their buffers); `out` holds batch*m*n elements; alpha/beta are host scalars
        // of the compute type and outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                handle,
                op_b,
                op_a,
                n as i32,
                m as i32,
                k as i32,
                alpha,
                b_ptr as *const _,
                data_type,
                ld_b as i32,
                b_bs as i64,
                a_ptr as *const _,
                data_type,
                ld_a as i32,
                a_bs as i64,
                beta,
                out.buf.ptr as *mut _,
                data_type,
                n as i32,
                (m * n) as i64,
                batch as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| {
            Error::Cuda(format!(
                "cublasGemmStridedBatchedEx ({m}x{k}x{n}, batch {batch}, {}): {e:?}",
                a.dtype
            ))
        })
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_row_and_column_major_views() {
        assert!(matches!(classify(3, 4, 4, 1), Some(Order::RowMajor(4))));
        assert!(matches!(classify(4, 3, 1, 4), Some(Order::ColMajor(4))));
        assert!(
            matches!(classify(3, 4, 8, 1), Some(Order::RowMajor(8))),
            "narrowed columns keep ld"
        );
        assert!(classify(3, 4, 0, 1).is_none(), "broadcast rows need a copy");
        assert!(
            classify(3, 4, 8, 2).is_none(),
            "stepped columns need a copy"
        );
        assert!(
            matches!(classify(1, 4, 0, 1), Some(Order::RowMajor(4))),
            "a single row's stride is irrelevant"
        );
    }

    #[test]
    fn batch_strides() {
        let l = Layout::contiguous([2, 3, 4, 5]);
        assert_eq!(batch_stride(&l), Some(20));
        let b = Layout::contiguous([4, 5])
            .broadcast_as([2, 3, 4, 5])
            .unwrap();
        assert_eq!(batch_stride(&b), Some(0));
        let mixed = Layout::contiguous([2, 1, 4, 5])
            .broadcast_as([2, 3, 4, 5])
            .unwrap();
        assert_eq!(batch_stride(&mixed), None);
        let perm = Layout::contiguous([3, 2, 4, 5]).transpose(0, 1).unwrap();
        assert_eq!(batch_stride(&perm), None);
    }
}
