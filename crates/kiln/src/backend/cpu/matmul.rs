//! Matrix products through the `gemm` crate, which takes row and column strides for every
//! operand: transposed, narrowed and broadcast views go in without a copy.

use super::disjoint::DisjointPtr;
use super::hot_helper::join_waking;
use super::threads::{install, num_threads, splits_in_two};
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
    let a_batches = batch_offsets(la);
    let b_batches = batch_offsets(lb);
    let len = a_batches.len() * m * n;
    if m == 0 || n == 0 || k == 0 {
        return super::host_memory::filled_huge(T::ZERO, len);
    }
    // C is not cleared first: `gemm` with `read_dst = false` writes every element of it and
    // reads none (a 64 MiB memset was 6-8% of the 16384×1024×128 product).
    let mut out = super::host_memory::with_capacity_huge::<T>(len);
    let c = DisjointPtr(out.spare_capacity_mut().as_mut_ptr().cast::<T>());
    let operands = |oa: usize, ob: usize| Product {
        m,
        n,
        k,
        // SAFETY: the batch offsets lie inside the operands (layout invariant).
        a: unsafe { a.as_ptr().add(oa) },
        a_strides: [la.strides()[r - 2] as isize, la.strides()[r - 1] as isize],
        // SAFETY: as for `a`.
        b: unsafe { b.as_ptr().add(ob) },
        b_strides: [lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize],
    };
    let large = m * n * k >= 96 * 96 * 96;
    if large && splits_gemm_in_two() {
        for (i, (&oa, &ob)) in a_batches.iter().zip(&b_batches).enumerate() {
            // SAFETY: batch i's m*n outputs lie inside the capacity of `len` elements.
            let dst = unsafe { c.add(i * m * n) };
            let (first, second) = operands(oa, ob).halves();
            // SAFETY: the halves write disjoint parts of this batch's m*n outputs.
            join_waking(
                || unsafe { first.run(dst, Parallelism::None) },
                || unsafe { second.run(dst, Parallelism::None) },
            );
        }
        // SAFETY: the products wrote all `len` elements (`gemm` writes every element of C).
        unsafe { out.set_len(len) };
        return out;
    }
    let parallelism = if large && num_threads() > 1 {
        Parallelism::Rayon(num_threads())
    } else {
        Parallelism::None
    };
    install(|| {
        for (i, (&oa, &ob)) in a_batches.iter().zip(&b_batches).enumerate() {
            // SAFETY: batch i's m*n outputs lie inside the capacity of `len` elements.
            let dst = unsafe { c.add(i * m * n) };
            // SAFETY: `dst` holds this batch's m*n outputs.
            unsafe { operands(oa, ob).run(dst, parallelism) };
        }
    });
    // SAFETY: every batch's product wrote its m*n elements (all `len` of them).
    unsafe { out.set_len(len) };
    out
}

/// Whether a matrix product goes in two halves, one on the calling thread and one on the
/// hot helper (`hot_helper.rs`), instead of to the thread pool: with exactly two threads,
/// where handing a product to rayon's two workers blocks the caller and wakes both (55
/// context switches a training step of the MLP on the 2-core EPYC). Not from a pool thread
/// (its work is already spread over the cores). `KILN_CPU_HOT_HELPER=0` turns the helper off.
fn splits_gemm_in_two() -> bool {
    num_threads() == 2 && splits_in_two(usize::MAX, 1) && rayon::current_thread_index().is_none()
}

/// `C[m, n] = A[m, k] · B[k, n]` with A and B at any (row, column) strides, C row-major.
#[derive(Clone, Copy)]
struct Product<T> {
    m: usize,
    n: usize,
    k: usize,
    a: *const T,
    a_strides: [isize; 2],
    b: *const T,
    b_strides: [isize; 2],
}

// SAFETY: the operands are only read, and outlive the product's threads (`join_waking`
// returns after both halves).
unsafe impl<T> Send for Product<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Product<T> {}

/// A half of a product: its rows `rows` and columns `cols` of C.
#[derive(Clone, Copy)]
struct Half<T> {
    whole: Product<T>,
    rows: [usize; 2],
    cols: [usize; 2],
}

impl<T: WithDType> Product<T> {
    /// The product in two halves of C at a multiple of 16 (whole microkernel tiles): halves
    /// of its rows, or of its columns where it has fewer than 64 rows. Each half packs B
    /// whole, yet rows ran faster than columns on the 2-core EPYC in 12 of 16 shapes (x ·
    /// W1 of the MLP, 256×784×1024: 1.99 against 2.09–2.30 ms; through the pool 2.22).
    fn halves(self) -> (Half<T>, Half<T>) {
        let (m, n) = (self.m, self.n);
        let cut = |len: usize| (len / 2).div_ceil(16) * 16;
        let half = |rows, cols| Half {
            whole: self,
            rows,
            cols,
        };
        if m < 64 {
            let c = cut(n).min(n);
            (half([0, m], [0, c]), half([0, m], [c, n]))
        } else {
            let c = cut(m).min(m);
            (half([0, c], [0, n]), half([c, m], [0, n]))
        }
    }

    /// The whole product into `c` (row-major, `n` a row).
    ///
    /// # Safety
    /// `c` holds `m·n` writable elements no other thread touches; the operands hold every
    /// element their strides reach for `m`, `n`, `k`.
    unsafe fn run(self, c: DisjointPtr<T>, parallelism: Parallelism) {
        let all = Half {
            whole: self,
            rows: [0, self.m],
            cols: [0, self.n],
        };
        // SAFETY: forwarded to the caller.
        unsafe { all.run(c, parallelism) }
    }
}

impl<T: WithDType> Half<T> {
    /// This half of the product into `c` (the whole C, row-major).
    ///
    /// # Safety
    /// As [`Product::run`], with only this half's elements of `c` kept from other threads.
    unsafe fn run(self, c: DisjointPtr<T>, parallelism: Parallelism) {
        let p = self.whole;
        let (rows, cols) = (self.rows[1] - self.rows[0], self.cols[1] - self.cols[0]);
        if rows == 0 || cols == 0 {
            return;
        }
        let [a_rs, a_cs] = p.a_strides;
        let [b_rs, b_cs] = p.b_strides;
        // SAFETY: A's rows of the half are inside A (the caller's guarantee).
        let a = unsafe { p.a.offset(self.rows[0] as isize * a_rs) };
        let padded = (a_rs == 1 && strides_alias::<T>(a_cs) && p.k >= 8 && cols >= 64)
            // SAFETY: A's `rows` rows from `a` at these strides are inside A (as above).
            .then(|| unsafe { copy_columns_padded(a, a_cs, rows, p.k) });
        let (a, a_cs) = match &padded {
            Some((copy, ld)) => (copy.as_ptr(), *ld as isize),
            None => (a, a_cs),
        };
        // SAFETY: C's element (i, j) is at i·n + j, inside its m·n elements for the half's
        // rows and columns; A's rows (or their copy) and B's columns of the half are inside
        // the operands (the caller's guarantee for the whole product). alpha multiplies the
        // old C, which is not read (read_dst = false).
        unsafe {
            gemm::gemm(
                rows,
                cols,
                p.k,
                c.0.add(self.rows[0] * p.n + self.cols[0]),
                1,
                p.n as isize,
                false,
                a,
                a_cs,
                a_rs,
                p.b.offset(self.cols[0] as isize * b_cs),
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
}

/// Whether a stride of `stride` elements is a multiple of 4 KiB, where the lines that a
/// stride apart map to one set of the L1 and L2 caches. `gemm` packs a column-major A (a
/// transposed view) by reading its columns, a stride apart: the 16384×1024×128 product with
/// a 64 KiB stride ran at 82 GFLOP/s against 179 at m = 16000 (2-core Xeon, session 50).
fn strides_alias<T>(stride: isize) -> bool {
    let bytes = stride.unsigned_abs() * std::mem::size_of::<T>();
    bytes >= 4096 && bytes.is_multiple_of(4096)
}

/// The `rows`×`k` column-major matrix at `a` (column stride `a_cs`) copied to columns one
/// cache line longer than a whole number of lines, so that they no longer alias; with that
/// column stride (`ld`, in elements).
///
/// # Safety
/// `a.offset(i + j·a_cs)` is readable for every `i < rows`, `j < k`.
unsafe fn copy_columns_padded<T: WithDType>(
    a: *const T,
    a_cs: isize,
    rows: usize,
    k: usize,
) -> (Vec<T>, usize) {
    let line = 64 / std::mem::size_of::<T>();
    let ld = rows.div_ceil(line) * line + line;
    let mut copy = super::host_memory::with_capacity_huge::<T>(ld * k);
    let dst = copy.spare_capacity_mut().as_mut_ptr().cast::<T>();
    for j in 0..k {
        // SAFETY: column j of A is readable (the caller's guarantee); column j of the copy
        // is elements j·ld..(j + 1)·ld of its capacity, which does not overlap A (a fresh
        // buffer). The padding is never read (gemm reads rows < `rows`), but a `Vec`'s
        // elements must be initialised, so it is written too.
        unsafe {
            let column = dst.add(j * ld);
            std::ptr::copy_nonoverlapping(a.offset(j as isize * a_cs), column, rows);
            (rows..ld).for_each(|i| column.add(i).write(T::ZERO));
        }
    }
    // SAFETY: all `ld * k` elements were written above.
    unsafe { copy.set_len(ld * k) };
    (copy, ld)
}
