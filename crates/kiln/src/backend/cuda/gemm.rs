//! Matrix products: kiln's row-major views mapped onto cuBLAS's column-major GEMM, run by
//! cuBLASLt (`gemm_lt.rs`, cached plans and fused epilogues) or, where it has no algorithm,
//! by `cublasGemmStridedBatchedEx`.
//!
//! kiln is row-major and cuBLAS column-major, so `C = A·B` is computed as `Cᵀ = Bᵀ·Aᵀ`. A
//! matrix view whose rows or columns are contiguous maps to an op flag and a leading
//! dimension with no copy (a transposed view is just the other flag); batch dims become one
//! batch stride (0 when broadcast). Only layouts no flag or single stride can express (e.g. a
//! broadcast matrix dim, or batch dims mixing broadcast and real strides) are copied first.

use super::{gemm_lt, CudaStorage};
use crate::backend::BackendStorage;
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

/// kiln's `C = A·B` (row-major, `[batch.., m, k] × [batch.., k, n]`) as cuBLAS's
/// `Cᵀ = Bᵀ·Aᵀ`, with the copies some layouts need kept alive alongside.
struct Mapped {
    problem: gemm_lt::Problem,
    _copies: (Option<CudaStorage>, Option<CudaStorage>),
}

fn gemm_dtype_check(a: &CudaStorage, b: &CudaStorage, op: &'static str) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype,
            rhs: b.dtype,
        });
    }
    if !a.dtype.is_float() {
        return Err(Error::UnsupportedDType { op, dtype: a.dtype });
    }
    Ok(())
}

fn map(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    out: &CudaStorage,
) -> Result<Mapped> {
    let r = la.rank();
    let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
    let batch: usize = la.dims()[..r - 2].iter().product();
    for (what, v) in [("m", m), ("n", n), ("k", k), ("batch", batch)] {
        if v > i32::MAX as usize {
            return Err(Error::Msg(format!(
                "matmul on CUDA: {what} = {v} exceeds cuBLAS's 32-bit limit"
            )));
        }
    }
    let (keep_a, a_ptr, a_order, a_bs) = operand(a, la)?;
    let (keep_b, b_ptr, b_order, b_bs) = operand(b, lb)?;
    let lt_operand = |ptr, order, batch_stride| {
        let (ld, transposed) = match order {
            Order::RowMajor(ld) => (ld, false),
            Order::ColMajor(ld) => (ld, true),
        };
        gemm_lt::Operand {
            ptr,
            ld,
            batch_stride,
            transposed,
        }
    };
    Ok(Mapped {
        problem: gemm_lt::Problem {
            dtype: a.dtype,
            tf32: a.dtype == DType::F32 && super::tf32_enabled(),
            m: n,
            n: m,
            k,
            batch,
            // cuBLAS's first operand is kiln's B.
            a: lt_operand(b_ptr, b_order, b_bs),
            b: lt_operand(a_ptr, a_order, a_bs),
            d: out.buf.ptr,
        },
        _copies: (keep_a, keep_b),
    })
}

pub(super) fn matmul(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<CudaStorage> {
    gemm_dtype_check(a, b, "matmul")?;
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
    let mapped = map(a, la, b, lb, &out)?;
    // SAFETY: `map` checked the views' strides against their buffers; `out` holds batch·m·n.
    if !unsafe { gemm_lt::matmul(a.dev(), &mapped.problem, gemm_lt::Epilogue::None) }? {
        cublas_gemm(a.dev(), &mapped.problem)?;
    }
    Ok(out)
}

/// `a·b + bias` for 2-D `a`, `b` and a `[n]` bias, the bias added in the GEMM's epilogue
/// when cuBLASLt can (else a second kernel).
pub(super) fn matmul_bias(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    bias: &CudaStorage,
    lbias: &Layout,
) -> Result<CudaStorage> {
    gemm_dtype_check(a, b, "matmul_bias")?;
    gemm_dtype_check(a, bias, "matmul_bias")?;
    let (m, k, n) = (la.dims()[0], la.dims()[1], lb.dims()[1]);
    let bias_ptr = bias.ptr_at(lbias.offset());
    let fusable = la.rank() == 2
        && k > 0
        && m * n > 0
        && lbias.is_contiguous()
        && bias_ptr.is_multiple_of(16);
    if fusable {
        let out = CudaStorage::alloc(a.dev(), m * n, a.dtype)?;
        let mapped = map(a, la, b, lb, &out)?;
        // SAFETY: as in `matmul`; the bias holds n contiguous elements (D's rows in cuBLAS's
        // terms), of the operands' dtype (checked above).
        if unsafe { gemm_lt::matmul(a.dev(), &mapped.problem, gemm_lt::Epilogue::Bias(bias_ptr)) }?
        {
            return Ok(out);
        }
    }
    let product = matmul(a, la, b, lb)?;
    let ol = Layout::contiguous(crate::shape::Shape::from(&[m, n][..]));
    product.binary(
        &ol,
        bias,
        &lbias.broadcast_as(ol.shape().clone())?,
        crate::op::BinaryOp::Add,
    )
}

/// `act(a·b + bias)` for 2-D `a`, `b` and a `[n]` bias with the activation in the GEMM's
/// epilogue when cuBLASLt can (GELU also writes the pre-activation), else the generic path.
pub(super) fn matmul_bias_act(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
    bias: &CudaStorage,
    lbias: &Layout,
    act: crate::op::EpilogueActivation,
) -> Result<(CudaStorage, Option<CudaStorage>)> {
    use crate::op::EpilogueActivation as Act;
    gemm_dtype_check(a, b, "matmul_bias_act")?;
    gemm_dtype_check(a, bias, "matmul_bias_act")?;
    let (m, k, n) = (la.dims()[0], la.dims()[1], lb.dims()[1]);
    let bias_ptr = bias.ptr_at(lbias.offset());
    let fusable = la.rank() == 2
        && k > 0
        && m * n > 0
        && lbias.is_contiguous()
        && bias_ptr.is_multiple_of(16)
        // cuBLASLt's GELU epilogue wants the auxiliary output's leading dimension (n in
        // its terms) a multiple of 8.
        && (act == Act::Relu || n.is_multiple_of(8))
        && fuse_activation();
    if fusable {
        let out = CudaStorage::alloc(a.dev(), m * n, a.dtype)?;
        let pre = match act {
            Act::Relu => None,
            Act::GeluTanh => Some(CudaStorage::alloc(a.dev(), m * n, a.dtype)?),
        };
        let mapped = map(a, la, b, lb, &out)?;
        let epilogue = match &pre {
            None => gemm_lt::Epilogue::BiasRelu(bias_ptr),
            Some(z) => gemm_lt::Epilogue::BiasGeluAux {
                bias: bias_ptr,
                aux: z.buf.ptr,
            },
        };
        // SAFETY: as in `matmul_bias`; the auxiliary buffer holds m·n elements laid out as D.
        if unsafe { gemm_lt::matmul(a.dev(), &mapped.problem, epilogue) }? {
            return Ok((out, pre));
        }
    }
    let z = matmul_bias(a, la, b, lb, bias, lbias)?;
    let zl = Layout::contiguous(crate::shape::Shape::from(&[m, n][..]));
    let out = z.unary(&zl, act.unary())?;
    Ok((out, (act == Act::GeluTanh).then_some(z)))
}

/// Fewest row sums for which `matmul_row_sums` uses the bias-gradient epilogue.
const MIN_FUSED_ROW_SUMS: usize = 32;

/// Whether `matmul_bias_act` puts the activation in the GEMM's epilogue
/// (`KILN_GEMM_EPILOGUE_ACT=0` computes it with a second kernel instead, for comparison).
fn fuse_activation() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_GEMM_EPILOGUE_ACT").map_or(true, |v| v != "0"))
}

/// `(a·b, Σ_k a[i, k])` for 2-D `a`, `b`: the row sums come from the GEMM's epilogue when
/// cuBLASLt can (else a reduction kernel). With `a = gᵀ` this is a weight gradient and its
/// bias gradient in one call.
pub(super) fn matmul_row_sums(
    a: &CudaStorage,
    la: &Layout,
    b: &CudaStorage,
    lb: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    gemm_dtype_check(a, b, "matmul_row_sums")?;
    let (m, k, n) = (la.dims()[0], la.dims()[1], lb.dims()[1]);
    // With few sums (a narrow layer's weight gradient) every BGRADB algorithm cuBLASLt
    // offered was a deep split-K: 48 µs for the 10×128 (k = 256) gradient of the default MLP
    // on the H100 (ncu), where a plain GEMM and a column sum take a few µs each.
    if la.rank() == 2 && k > 0 && m * n > 0 && m >= MIN_FUSED_ROW_SUMS {
        let out = CudaStorage::alloc(a.dev(), m * n, a.dtype)?;
        let sums = CudaStorage::alloc(a.dev(), m, a.dtype)?;
        let mapped = map(a, la, b, lb, &out)?;
        // SAFETY: as in `matmul`; `sums` holds m elements (D's columns in cuBLAS's terms).
        let epilogue = gemm_lt::Epilogue::BiasGradB(sums.buf.ptr);
        if unsafe { gemm_lt::matmul(a.dev(), &mapped.problem, epilogue) }? {
            return Ok((out, sums));
        }
    }
    let product = matmul(a, la, b, lb)?;
    let sums = super::reduce::reduce(a, la, &[la.rank() - 1], crate::op::ReduceOp::Sum)?;
    Ok((product, sums))
}

/// The fallback: `cublasGemmStridedBatchedEx` (which picks its kernel on every call).
fn cublas_gemm(dev: &super::CudaDevice, p: &gemm_lt::Problem) -> Result<()> {
    dev.check_capture("matmul")?;
    if !dev.capturing() {
        super::note_launches(1);
    }
    let data_type = match p.dtype {
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F64 => cudaDataType::CUDA_R_64F,
        DType::F16 => cudaDataType::CUDA_R_16F,
        _ => cudaDataType::CUDA_R_16BF,
    };
    let compute = match p.dtype {
        DType::F32 if p.tf32 => cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        DType::F64 => cublasComputeType_t::CUBLAS_COMPUTE_64F,
        _ => cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (one32, zero32, one64, zero64) = (1f32, 0f32, 1f64, 0f64);
    let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) = if p.dtype == DType::F64
    {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    dev.with_blas(|handle| {
        // SAFETY: pointers address the operands' batches (batch strides and leading
        // dimensions checked by `classify`/`batch_stride` against the layouts, which stay
        // inside their buffers); D holds batch·m·n elements; alpha/beta are host scalars
        // of the compute type and outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                handle,
                op(p.a.transposed),
                op(p.b.transposed),
                p.m as i32,
                p.n as i32,
                p.k as i32,
                alpha,
                p.a.ptr as *const _,
                data_type,
                p.a.ld as i32,
                p.a.batch_stride as i64,
                p.b.ptr as *const _,
                data_type,
                p.b.ld as i32,
                p.b.batch_stride as i64,
                beta,
                p.d as *mut _,
                data_type,
                p.m as i32,
                (p.m * p.n) as i64,
                p.batch as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| {
            Error::Cuda(format!(
                "cublasGemmStridedBatchedEx ({}x{}x{}, batch {}, {}): {e:?}",
                p.n, p.k, p.m, p.batch, p.dtype
            ))
        })
    })
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
