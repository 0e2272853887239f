//! CSR products on the CPU. Rows are split into tasks of equal work (entries plus rows, the
//! merge-path measure); rows longer than an eighth of a task ([`inline_row_len`], at least
//! [`LONG_ROW`]) are skipped there and computed as pieces in parallel, then summed per row:
//! a skewed matrix does not serialise on the thread that owns its longest row. Accumulation
//! is in the compute type (f32 for f16/bf16 and f32, f64 for f64); each output element is
//! rounded once.
//!
//! The transposed product has no direct kernel here (a scatter would need one private copy
//! of the output per thread): [`SparseStorage::csr_matmul`] answers `None` and the caller
//! multiplies by the materialised transpose.

use super::elem::{FloatElem, Real};
use super::threads::{install, num_threads, parallel_split};
use super::CpuStorage;
use crate::backend::sparse::{CsrProduct, CsrRef, SparseStorage, LONG_ROW};
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::{DType, Error, Result, WithDType};
use half::{bf16, f16};
use num_traits::{One, Zero};
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::ops::Range;

/// The integer types of CSR indices.
trait Index: WithDType {
    fn at(self) -> usize;
}
impl Index for u32 {
    #[inline(always)]
    fn at(self) -> usize {
        self as usize
    }
}
impl Index for i64 {
    #[inline(always)]
    fn at(self) -> usize {
        self as usize
    }
}

/// The typed arrays of a CSR matrix.
struct Arrays<'a, T, I> {
    /// Columns: every entry of `col_idx` is below this.
    cols: usize,
    row_ptr: &'a [I],
    col_idx: &'a [I],
    values: &'a [T],
    /// `(row, start, end)` triples of the long rows' pieces.
    pieces: &'a [i64],
    /// [`CsrRef::uniform_len`].
    uniform: Option<usize>,
}

/// The elements at `layout` as one contiguous run: borrowed when they already are one.
fn contiguous<'a, T: WithDType>(
    s: &'a CpuStorage,
    layout: &Layout,
    op: &'static str,
) -> Result<Cow<'a, [T]>> {
    match layout.contiguous_range() {
        Some(r) => Ok(Cow::Borrowed(&s.as_slice::<T>(op)?[r])),
        None => Ok(Cow::Owned(
            T::from_cpu_storage(s.copy_contiguous(layout)?).expect("copy keeps the dtype"),
        )),
    }
}

/// Row ranges of about equal work (`entries + rows`), `tasks` of them, as boundaries.
fn row_bounds<I: Index>(row_ptr: &[I], tasks: usize) -> Vec<usize> {
    let rows = row_ptr.len() - 1;
    let total = row_ptr[rows].at() + rows;
    let mut bounds = vec![0];
    for t in 1..tasks {
        let target = total * t / tasks;
        // The first row whose start (in merged entries + rows) reaches the target.
        let (mut lo, mut hi) = (*bounds.last().unwrap(), rows);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if row_ptr[mid].at() + mid < target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        bounds.push(lo);
    }
    bounds.push(rows);
    bounds
}

/// How many tasks a product of `work` copy-equivalent elements gets: one below the
/// threading grain, else a few per thread so that uneven rows even out.
fn task_count(work: usize) -> usize {
    match parallel_split(work, 1) {
        1 => 1,
        _ => 4 * num_threads(),
    }
}

/// Runs `f(rows, out_rows)` on each row range of `bounds`, in parallel when there are several.
fn for_row_ranges<T: Send>(
    out: &mut [T],
    n: usize,
    bounds: &[usize],
    f: impl Fn(Range<usize>, &mut [T]) + Sync,
) {
    if bounds.len() <= 2 {
        f(0..bounds[bounds.len() - 1], out);
        return;
    }
    let f = &f;
    install(|| {
        rayon::in_place_scope(|s| {
            let mut rest = out;
            for w in bounds.windows(2) {
                let (chunk, tail) = rest.split_at_mut((w[1] - w[0]) * n);
                rest = tail;
                let rows = w[0]..w[1];
                s.spawn(move |_| f(rows, chunk));
            }
        })
    });
}

/// `alpha·A·X + beta·Y` into a new `[rows, n]` vector (`xs` is `[cols, n]` row-major).
fn matmul_typed<T: FloatElem, I: Index>(
    a: &Arrays<'_, T, I>,
    xs: &[T],
    n: usize,
    alpha: T::C,
    acc: Option<(T::C, &[T])>,
) -> Vec<T> {
    let rows = a.row_ptr.len() - 1;
    // The unchecked reads below rely on it: every column indexes a row of x.
    assert_eq!(
        xs.len(),
        a.cols * n,
        "spmm: x does not have the matrix's column count of rows"
    );
    if n == 0 || rows == 0 {
        return vec![T::ZERO; rows * n];
    }
    // Every element is written exactly once below (short rows by their task, long rows from
    // their pieces, which cover them: `CsrRef`'s invariant), so the output starts
    // uninitialised rather than zero-filled: a pass over it less.
    let mut result: Vec<T> = super::host_memory::with_capacity_huge(rows * n);
    let out = &mut result.spare_capacity_mut()[..rows * n];
    let finish = |sum: T::C, r: usize, j: usize| -> T {
        match acc {
            Some((beta, y)) => T::from_c(alpha * sum + beta * y[r * n + j].to_c()),
            None => T::from_c(alpha * sum),
        }
    };
    let nnz = a.values.len();
    let bounds = row_bounds(a.row_ptr, task_count(nnz.saturating_mul(n) * 2 + rows));
    let inline = inline_row_len(nnz + rows, bounds.len() - 1);
    for_row_ranges(out, n, &bounds, |range, out| {
        let first = range.start;
        if n == 1 {
            // One column: a tight loop over the range's row pointers, monomorphised for
            // the accumulate-or-not choice so that the loop holds no branch on it.
            let rp = &a.row_ptr[range.start..=range.end];
            match acc {
                None => spmv_range(a, rp, xs, out, inline, |sum, _| T::from_c(alpha * sum)),
                Some((beta, y)) => spmv_range(a, rp, xs, out, inline, |sum, i| {
                    T::from_c(alpha * sum + beta * y[first + i].to_c())
                }),
            }
            return;
        }
        let mut sums = vec![T::C::zero(); n];
        for r in range {
            let (s, e) = (a.row_ptr[r].at(), a.row_ptr[r + 1].at());
            if e - s > inline {
                continue;
            }
            let o = &mut out[(r - first) * n..][..n];
            sums.fill(T::C::zero());
            // SAFETY: as above, x is [cols, n] row-major.
            unsafe { axpy_rows(&a.col_idx[s..], e - s, &a.values[s..e], xs, n, &mut sums) };
            for (j, (o, &sum)) in o.iter_mut().zip(&sums).enumerate() {
                o.write(finish(sum, r, j));
            }
        }
    });
    // Rows longer than `inline`: pieces in parallel into per-piece partial sums, then one
    // sum per row.
    let piece = |p: usize| {
        let (s, e) = (a.pieces[3 * p + 1] as usize, a.pieces[3 * p + 2] as usize);
        (a.pieces[3 * p] as usize, s, e)
    };
    let row_len = |r: usize| a.row_ptr[r + 1].at() - a.row_ptr[r].at();
    let todo: Vec<usize> = (0..a.pieces.len() / 3)
        .filter(|&p| row_len(piece(p).0) > inline)
        .collect();
    let n_pieces = todo.len();
    if n_pieces > 0 {
        let piece = |i: usize| piece(todo[i]);
        let mut partials = vec![T::C::zero(); n_pieces * n];
        install(|| {
            partials
                .par_chunks_mut(n)
                .enumerate()
                .with_min_len(8)
                .for_each(|(p, part)| {
                    let (_, s, e) = piece(p);
                    let (cols, vals) = (&a.col_idx[s..e], &a.values[s..e]);
                    // SAFETY: as for the rows above.
                    if n == 1 {
                        part[0] = unsafe { dot_row(cols, vals, xs) };
                    } else {
                        unsafe { axpy_rows(&a.col_idx[s..], e - s, vals, xs, n, part) };
                    }
                })
        });
        let mut p = 0;
        while p < n_pieces {
            let row = piece(p).0;
            let mut q = p + 1;
            while q < n_pieces && piece(q).0 == row {
                q += 1;
            }
            for j in 0..n {
                let total = (p..q).fold(T::C::zero(), |t, i| t + partials[i * n + j]);
                out[row * n + j].write(finish(total, row, j));
            }
            p = q;
        }
    }
    // SAFETY: every element of the first rows * n has been written (see the allocation).
    unsafe { result.set_len(rows * n) };
    result
}

/// The longest row a task computes itself when `work` (entries plus rows) is split into
/// `tasks`; longer rows are split into the pattern's pieces (rows above [`LONG_ROW`]) and
/// shared among threads. A row of an eighth of a task's work does not unbalance it, and
/// computing rows whole saves the pieces' second pass: the power-law SpMV on one thread of
/// the 2-core EPYC took 35 ms with every row above [`LONG_ROW`] in pieces against 25 ms with
/// whole rows (a prototype of the loop).
fn inline_row_len(work: usize, tasks: usize) -> usize {
    if tasks <= 1 {
        usize::MAX
    } else {
        (work / tasks / 8).max(LONG_ROW)
    }
}

/// `out[i] = finish(Σ_k A[i, k]·x[k], i)` for the rows whose pointers are `rp` (`out.len() + 1`
/// of them), rows longer than `inline` (at least [`LONG_ROW`]) skipped (left unwritten).
#[inline(always)]
fn spmv_range<T: FloatElem, I: Index>(
    a: &Arrays<'_, T, I>,
    rp: &[I],
    xs: &[T],
    out: &mut [MaybeUninit<T>],
    inline: usize,
    finish: impl Fn(T::C, usize) -> T,
) {
    assert_eq!(
        rp.len(),
        out.len() + 1,
        "spmv: row pointers for the output rows"
    );
    if let Some(len) = a.uniform {
        // Row i starts at first + i·len: no row pointers to load, no lengths to branch on.
        let first = rp[0].at();
        // One entry a row without `dot_row`'s length test: 0.41-0.43 against 0.52 ms for
        // the 1M-node cycle on one thread.
        if len == 1 {
            for (i, o) in out.iter_mut().enumerate() {
                // SAFETY: entry first + i is row first/len + i's one entry (< nnz); its
                // column indexes inside x (CsrRef's invariant, x's length asserted above).
                let sum = unsafe {
                    let k = first + i;
                    a.values.get_unchecked(k).to_c()
                        * xs.get_unchecked(a.col_idx.get_unchecked(k).at()).to_c()
                };
                o.write(finish(sum, i));
            }
        } else {
            for (i, o) in out.iter_mut().enumerate() {
                let s = first + i * len;
                prefetch_stream(a, s);
                prefetch_gathers(a, xs, s + GATHER_AHEAD, len.min(GATHER_PREFETCH_MAX));
                // SAFETY: as for the general rows below, with the row's bounds s..s + len.
                let sum = unsafe {
                    dot_row(
                        a.col_idx.get_unchecked(s..s + len),
                        a.values.get_unchecked(s..s + len),
                        xs,
                    )
                };
                o.write(finish(sum, i));
            }
        }
        return;
    }
    // Each row's start is the previous row's end: one row-pointer load per row.
    let mut s = rp[0].at();
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: i + 1 < rp.len() (asserted above).
        let e = unsafe { rp.get_unchecked(i + 1) }.at();
        prefetch_stream(a, s);
        if e - s <= inline {
            // SAFETY: s <= e <= nnz (row pointers never decrease and end at nnz, which
            // col_idx and values hold); columns are below the matrix's column count, which
            // is x's length (asserted by the caller).
            let sum = unsafe {
                dot_row(
                    a.col_idx.get_unchecked(s..e),
                    a.values.get_unchecked(s..e),
                    xs,
                )
            };
            o.write(finish(sum, i));
        }
        s = e;
    }
}

/// How many entries ahead of the current row [`spmv_range`] asks for the matrix's columns
/// and values. The random gathers of `x` hold most of the core's outstanding misses, and the
/// hardware prefetcher alone let the two sequential streams stall behind them: on the 2-core
/// EPYC a prototype of the row loop took 25–26 ms instead of 33.6 for the power-law SpMV on
/// one thread, and 15.9 instead of 21.0 on two (medians of 7 alternated rounds). 128 to 1024
/// entries measured alike within that host's noise.
const STREAM_AHEAD: usize = 256;

/// Prefetches the cache lines of `col_idx` and `values` [`STREAM_AHEAD`] entries after `k`.
#[inline(always)]
fn prefetch_stream<T, I>(a: &Arrays<'_, T, I>, k: usize) {
    prefetch(a.col_idx, k + STREAM_AHEAD, 1);
    prefetch(a.values, k + STREAM_AHEAD, 1);
}

/// How many entries ahead of the current row [`spmv_range`] prefetches the elements of `x`
/// the entries gather, for rows of one length. Out-of-order execution alone kept too few of
/// those misses in flight: on the 2-core EPYC the 1M-row SpMV with 16 random columns a row
/// took 10.6–12.2 ms without and 9.1–10.7 with 32 entries ahead (medians of 8 alternated
/// runs 10.9 → 9.6; 16–128 ahead measured alike, 256 no better than none). On the power-law
/// matrix's rows of many lengths the same prefetch per row made it slower (medians of 6,
/// 11.1 → 12.3 ms): its short rows pay the second pass over their columns.
const GATHER_AHEAD: usize = 32;

/// The most gathers one row prefetches: a long row's later entries are left to the
/// hardware (its own loop keeps enough misses in flight).
const GATHER_PREFETCH_MAX: usize = 64;

/// Prefetches the elements of `x` that entries `k..k + n` gather (those that exist).
#[inline(always)]
fn prefetch_gathers<T, I: Index>(a: &Arrays<'_, T, I>, x: &[T], k: usize, n: usize) {
    let end = (k + n).min(a.col_idx.len());
    for kk in k.min(end)..end {
        // SAFETY: kk < col_idx.len().
        let c = unsafe { a.col_idx.get_unchecked(kk) }.at();
        prefetch(x, c, 1);
    }
}

/// `Σ v[k]·x[col[k]]` over one row (or piece), four sums in flight.
///
/// # Safety
/// Every column in `cols` indexes inside `x` ([`CsrRef`]'s invariants with `x` of `cols`
/// rows), and `vals` is at least as long as `cols`.
#[inline]
unsafe fn dot_row<T: FloatElem, I: Index>(cols: &[I], vals: &[T], x: &[T]) -> T::C {
    let len = cols.len();
    debug_assert!(vals.len() >= len);
    // SAFETY: k < len <= vals.len(); columns index inside x (the caller's contract).
    let term = |k: usize| unsafe {
        vals.get_unchecked(k).to_c() * x.get_unchecked(cols.get_unchecked(k).at()).to_c()
    };
    if len < 4 {
        // Short rows (most rows of sparse graphs): no accumulators to set up and combine.
        let mut sum = T::C::zero();
        for k in 0..len {
            sum = sum + term(k);
        }
        return sum;
    }
    let mut s = [T::C::zero(); 4];
    let mut k = 0;
    while k + 4 <= len {
        s[0] = s[0] + term(k);
        s[1] = s[1] + term(k + 1);
        s[2] = s[2] + term(k + 2);
        s[3] = s[3] + term(k + 3);
        k += 4;
    }
    while k < len {
        s[0] = s[0] + term(k);
        k += 1;
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// How many entries ahead [`axpy_rows`] prefetches the dense row it will need: rows of `x`
/// are gathered at random, and the prefetch keeps several misses in flight.
const PREFETCH_AHEAD: usize = 8;

/// `sums[j] += Σ v[k]·x[col[k], j]` over the first `len` entries of `cols`/`vals`, for a
/// row-major `x` of `n` columns. `cols` may run past the row (to the end of the matrix):
/// the entries after it are only prefetched.
///
/// # Safety
/// Every column in `cols` indexes a row inside `x` (`x.len() >= (col + 1)·n`), `vals` holds
/// at least `len` values and `sums` `n`.
#[inline]
unsafe fn axpy_rows<T: FloatElem, I: Index>(
    cols: &[I],
    len: usize,
    vals: &[T],
    x: &[T],
    n: usize,
    sums: &mut [T::C],
) {
    debug_assert!(sums.len() == n && vals.len() >= len && cols.len() >= len);
    for k in 0..len {
        if let Some(c) = cols.get(k + PREFETCH_AHEAD) {
            prefetch(x, c.at() * n, n);
        }
        // SAFETY: k < len (the caller's contract for both slices).
        let (c, w) = unsafe { (cols.get_unchecked(k).at(), vals.get_unchecked(k).to_c()) };
        // SAFETY: the row `c` of x lies inside x (the caller's contract).
        let xr = unsafe { x.get_unchecked(c * n..c * n + n) };
        for (s, xv) in sums.iter_mut().zip(xr) {
            *s = *s + w * xv.to_c();
        }
    }
}

/// Asks the CPU to fetch `x[start..start + n]` (its first 512 bytes) into cache.
#[inline(always)]
fn prefetch<T>(x: &[T], start: usize, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = (n * std::mem::size_of::<T>()).min(512);
        let p = x.as_ptr().wrapping_add(start) as *const i8;
        for off in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, start, n);
}

/// `out[k] = Σ_j lhs[row(k), j]·rhs[col(k), j]`, split into tasks of equal entry counts.
fn sampled_dot_typed<T: FloatElem, I: Index>(
    a: &Arrays<'_, T, I>,
    lhs: &[T],
    rhs: &[T],
    n: usize,
) -> Vec<T> {
    let nnz = a.values.len();
    let mut out = vec![T::ZERO; nnz];
    let tasks = task_count(nnz.saturating_mul(n) * 2).min(nnz.max(1));
    let per = nnz.div_ceil(tasks.max(1)).max(1);
    let run = |start: usize, chunk: &mut [T]| {
        // The row of entry `start`: the last row whose start is at most `start`, skipping
        // empty rows.
        let mut r = a.row_ptr.partition_point(|p| p.at() <= start) - 1;
        for (i, o) in chunk.iter_mut().enumerate() {
            let k = start + i;
            while a.row_ptr[r + 1].at() <= k {
                r += 1;
            }
            let c = a.col_idx[k].at();
            let (lr, rr) = (&lhs[r * n..][..n], &rhs[c * n..][..n]);
            let dot = lr
                .iter()
                .zip(rr)
                .fold(T::C::zero(), |s, (l, x)| s + l.to_c() * x.to_c());
            *o = T::from_c(dot);
        }
    };
    if tasks <= 1 {
        run(0, &mut out);
    } else {
        install(|| {
            out.par_chunks_mut(per)
                .enumerate()
                .for_each(|(t, chunk)| run(t * per, chunk))
        });
    }
    out
}

/// Runs `$body` with `$T` the value type and `$I` the index type of `$a`.
macro_rules! typed_csr {
    ($a:expr, $op:expr, |$arrays:ident : $T:ident, $I:ident| $body:expr) => {{
        macro_rules! with_index {
            ($t:ty) => {{
                match $a.row_ptr.dtype() {
                    DType::U32 => {
                        type $T = $t;
                        type $I = u32;
                        let $arrays = arrays::<$T, $I>(&$a, $op)?;
                        $body
                    }
                    DType::I64 => {
                        type $T = $t;
                        type $I = i64;
                        let $arrays = arrays::<$T, $I>(&$a, $op)?;
                        $body
                    }
                    dtype => return Err(Error::UnsupportedDType { op: $op, dtype }),
                }
            }};
        }
        match $a.values.dtype() {
            DType::F16 => with_index!(f16),
            DType::BF16 => with_index!(bf16),
            DType::F32 => with_index!(f32),
            DType::F64 => with_index!(f64),
            dtype => return Err(Error::UnsupportedDType { op: $op, dtype }),
        }
    }};
}

fn arrays<'a, T: WithDType, I: WithDType>(
    a: &CsrRef<'a, CpuStorage>,
    op: &'static str,
) -> Result<Arrays<'a, T, I>> {
    Ok(Arrays {
        cols: a.cols,
        row_ptr: &a.row_ptr.as_slice::<I>(op)?[..a.rows + 1],
        col_idx: &a.col_idx.as_slice::<I>(op)?[..a.nnz],
        values: &a.values.as_slice::<T>(op)?[..a.nnz],
        pieces: &a.pieces.as_slice::<i64>(op)?[..3 * a.n_pieces],
        uniform: a.uniform_len,
    })
}

impl SparseStorage for CpuStorage {
    fn csr_matmul(
        a: CsrRef<'_, Self>,
        x: &Self,
        xl: &Layout,
        product: CsrProduct,
        acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>> {
        const OP: &str = "spmm";
        if product.transpose {
            return Ok(None);
        }
        let n = xl.dims()[1];
        typed_csr!(a, OP, |arrays: T, I| {
            let xs = contiguous::<T>(x, xl, OP)?;
            let beta_y = match acc {
                Some((beta, y, yl)) if beta != 0.0 => Some((
                    <T as FloatElem>::C::from_f64c(beta),
                    contiguous::<T>(y, yl, OP)?,
                )),
                _ => None,
            };
            let alpha = <T as FloatElem>::C::from_f64c(product.alpha);
            let alpha = if product.alpha == 1.0 {
                One::one()
            } else {
                alpha
            };
            let out = matmul_typed::<T, I>(
                &arrays,
                &xs,
                n,
                alpha,
                beta_y.as_ref().map(|(b, y)| (*b, &y[..])),
            );
            Ok(Some(CpuStorage::from_vec(out)))
        })
    }

    fn csr_sampled_dot(
        a: CsrRef<'_, Self>,
        lhs: &Self,
        ll: &Layout,
        rhs: &Self,
        rl: &Layout,
    ) -> Result<Self> {
        const OP: &str = "spmm backward";
        let n = ll.dims()[1];
        typed_csr!(a, OP, |arrays: T, I| {
            let l = contiguous::<T>(lhs, ll, OP)?;
            let r = contiguous::<T>(rhs, rl, OP)?;
            Ok(CpuStorage::from_vec(sampled_dot_typed::<T, I>(
                &arrays, &l, &r, n,
            )))
        })
    }
}
