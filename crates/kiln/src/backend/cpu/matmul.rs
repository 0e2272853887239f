//! Matrix products through the `gemm` crate, which takes row and column strides for every
//! operand: transposed, narrowed and broadcast views go in without a copy.

use super::threads::{install, num_threads};
use super::CpuStorage;
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::{DType, Error, Result, WithDType};
use gemm::Parallelism;

pub(super) fn matmul(
    lhs: &CpuStorage,
    ll: &Layout,
    rhs: &CpuStorage,
    rl: &Layout,
) -> Result<CpuStorage> {
    use CpuStorage as S;
    Ok(match (lhs, rhs) {
        (S::F32(a), S::F32(b)) => S::F32(gemm_batched(a, ll, b, rl)),
        (S::F64(a), S::F64(b)) => S::F64(gemm_batched(a, ll, b, rl)),
        (S::F16(a), S::F16(b)) => S::F16(gemm_batched(a, ll, b, rl)),
        (S::BF16(_), S::BF16(_)) => {
            // `gemm` has no bf16 kernel: multiply in f32 (exact products of bf16 inputs, f32
            // accumulation, as bf16 GEMMs on GPUs do) and round once.
            let a = lhs.cast(ll, DType::F32)?;
            let b = rhs.cast(rl, DType::F32)?;
            let out = matmul(
                &a,
                &Layout::contiguous(ll.shape().clone()),
                &b,
                &Layout::contiguous(rl.shape().clone()),
            )?;
            let n = out.len();
            out.cast(&Layout::contiguous(n), DType::BF16)?
        }
        (a, b) if a.dtype() != b.dtype() => {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: a.dtype(),
                rhs: b.dtype(),
            });
        }
        (a, _) => {
            return Err(Error::UnsupportedDType {
                op: "matmul",
                dtype: a.dtype(),
            })
        }
    })
}

fn batch_offsets(l: &Layout) -> Vec<usize> {
    let r = l.rank();
    let shape: Vec<usize> = l.dims()[..r - 2].to_vec();
    let strides = l.strides()[..r - 2].to_vec();
    Layout::new(shape.into(), strides, l.offset(), usize::MAX)
        .expect("batch sub-layout")
        .offsets()
        .collect()
}

fn gemm_batched<T: WithDType>(a: &[T], la: &Layout, b: &[T], lb: &Layout) -> Vec<T> {
    let r = la.rank();
    let (m, k, n) = (la.dims()[r - 2], la.dims()[r - 1], lb.dims()[r - 1]);
    let (a_rs, a_cs) = (la.strides()[r - 2] as isize, la.strides()[r - 1] as isize);
    let (b_rs, b_cs) = (lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize);
    let a_batches = batch_offsets(la);
    let b_batches = batch_offsets(lb);
    let mut out = super::host_memory::filled_huge(T::ZERO, a_batches.len() * m * n);
    if m == 0 || n == 0 || k == 0 {
        return out;
    }
    let parallelism = if m * n * k >= 96 * 96 * 96 && num_threads() > 1 {
        Parallelism::Rayon(num_threads())
    } else {
        Parallelism::None
    };
    install(|| {
        for (i, (&oa, &ob)) in a_batches.iter().zip(&b_batches).enumerate() {
            let dst = &mut out[i * m * n..(i + 1) * m * n];
            // SAFETY: `dst` holds m*n elements written with row stride n and column stride 1.
            // Every lhs element read is `oa + i*a_rs + p*a_cs` for i < m, p < k, which the
            // layout invariant keeps inside `a` (likewise for rhs), and gemm reads nothing
            // else. alpha multiplies the old dst, which is not read (read_dst = false).
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    dst.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr().add(oa),
                    a_cs,
                    a_rs,
                    b.as_ptr().add(ob),
                    b_cs,
                    b_rs,
                    T::ZERO,
                    T::ONE,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
        }
    });
    out
}
