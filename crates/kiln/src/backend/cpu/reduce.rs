//! Reductions over any set of dimensions, and softmax along one.
//!
//! The reduced dims form an inner layout and the kept dims an outer one. Two paths follow:
//! row-wise (one fold per output element over a strided run; a slice loop with eight
//! accumulators for a contiguous sum) and, when the input is contiguous and every reduced dim
//! precedes every kept dim, column-wise (whole rows folded into an accumulator row, the shape
//! of a bias gradient), which reads memory in order.

use super::chunked::{share_chunks, split_output};
use super::elem::{Elem, FloatElem};
use super::hot_helper::{join, share};
use super::simd::reduce as simd;
use super::strided::RowPlan;
use super::threads::{
    goes_parallel, install, num_threads, parallel_split, shares_with_helper, splits_in_two,
    wakes_helper, PARALLEL_THRESHOLD,
};
use super::CpuStorage;
use crate::layout::Layout;
use crate::op::ReduceOp;
use crate::shape::DimVec;
use crate::WithDType;
use num_traits::{Float, One, Zero};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Vector kernels for contiguous runs, where a type has them (f32); `None` means "fold
/// element by element".
pub(crate) trait RunKernels: Sized {
    /// Max (`max`) or min of a non-empty run, NaN propagating.
    fn extremum_run(_x: &[Self], _max: bool) -> Option<Self> {
        None
    }
    /// Position of the first max (`max`) or min of a non-empty run, first NaN winning.
    fn arg_run(_x: &[Self], _max: bool) -> Option<usize> {
        None
    }
    /// Whether `softmax_rows` has a kernel.
    const SOFTMAX_ROWS: bool = false;
    /// Softmax (or log-softmax) of the rows of length `n > 0` that make up `x`, into `out`
    /// (every element written). Only called where `SOFTMAX_ROWS`.
    fn softmax_rows(_x: &[Self], _n: usize, _out: &mut [MaybeUninit<Self>], _log: bool) {
        unreachable!("no softmax kernel for this type")
    }
    /// Whether `logsumexp_rows` has a kernel.
    const LOGSUMEXP_ROWS: bool = false;
    /// `ln Σ e^x` of each row of length `n > 0` that makes up `x`, into `out` (see
    /// `logsumexp`). Only called where `LOGSUMEXP_ROWS`.
    fn logsumexp_rows(_x: &[Self], _n: usize, _out: &mut [Self]) {
        unreachable!("no logsumexp kernel for this type")
    }
}
impl RunKernels for f32 {
    fn extremum_run(x: &[f32], max: bool) -> Option<f32> {
        Some(if max {
            simd::max_f32(x)
        } else {
            simd::min_f32(x)
        })
    }
    fn arg_run(x: &[f32], max: bool) -> Option<usize> {
        Some(simd::arg_extremum_f32(x, max))
    }
    const SOFTMAX_ROWS: bool = true;
    fn softmax_rows(x: &[f32], n: usize, out: &mut [MaybeUninit<f32>], log: bool) {
        simd::softmax_rows_f32(x, n, out, log)
    }
    const LOGSUMEXP_ROWS: bool = true;
    fn logsumexp_rows(x: &[f32], n: usize, out: &mut [f32]) {
        simd::logsumexp_rows_f32(x, n, out)
    }
}
impl RunKernels for half::f16 {}
impl RunKernels for half::bf16 {}
impl RunKernels for f64 {}
impl RunKernels for u8 {}
impl RunKernels for u32 {}
impl RunKernels for i64 {}

/// Accumulation type for sums: f32 for 16-bit floats, f64 for f32 and f64, wrapping
/// integers for integers.
pub(crate) trait SumAcc: Elem + RunKernels {
    type Acc: Copy + Send + Sync;
    const ACC_ZERO: Self::Acc;
    fn acc(a: Self::Acc, x: Self) -> Self::Acc;
    fn merge(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn finish(a: Self::Acc) -> Self;
    /// The sum of a contiguous run as an accumulator, where a kernel exists.
    fn sum_run(_x: &[Self]) -> Option<Self::Acc> {
        None
    }
    /// `accs[j] += x[r * stride + j]` for every row `r < n_rows`, where a kernel exists.
    fn column_sums(_x: &[Self], _n_rows: usize, _stride: usize, _accs: &mut [Self::Acc]) -> bool {
        false
    }
    /// `accs[j] +=` the sum of `x[(a·k + j)·run ..][..run]` for every `a < slabs`
    /// (`k = accs.len()`), where a kernel exists.
    fn plane_sums(_x: &[Self], _slabs: usize, _run: usize, _accs: &mut [Self::Acc]) -> bool {
        false
    }
}

macro_rules! sum_acc {
    ($ty:ty, $acc:ty, $zero:expr, $to:expr, $from:expr, $add:expr, f64) => {
        sum_acc!(@impl $ty, $acc, $zero, $to, $from, $add,
            fn sum_run(x: &[f32]) -> Option<f64> {
                Some(simd::sum_f32(x))
            }
            fn column_sums(x: &[f32], n_rows: usize, stride: usize, accs: &mut [f64]) -> bool {
                simd::column_sums_f32(x, n_rows, stride, accs);
                true
            }
            fn plane_sums(x: &[f32], slabs: usize, run: usize, accs: &mut [f64]) -> bool {
                simd::plane_sums_f32(x, slabs, run, accs);
                true
            });
    };
    ($ty:ty, $acc:ty, $zero:expr, $to:expr, $from:expr, $add:expr) => {
        sum_acc!(@impl $ty, $acc, $zero, $to, $from, $add,);
    };
    (@impl $ty:ty, $acc:ty, $zero:expr, $to:expr, $from:expr, $add:expr, $($extra:item)*) => {
        impl SumAcc for $ty {
            type Acc = $acc;
            const ACC_ZERO: $acc = $zero;
            #[inline(always)]
            fn acc(a: $acc, x: Self) -> $acc {
                $add(a, $to(x))
            }
            #[inline(always)]
            fn merge(a: $acc, b: $acc) -> $acc {
                $add(a, b)
            }
            #[inline(always)]
            fn finish(a: $acc) -> Self {
                $from(a)
            }
            $($extra)*
        }
    };
}
sum_acc!(
    half::f16,
    f32,
    0.0,
    half::f16::to_f32,
    half::f16::from_f32,
    |a, b| a + b
);
sum_acc!(
    half::bf16,
    f32,
    0.0,
    half::bf16::to_f32,
    half::bf16::from_f32,
    |a, b| a + b
);
sum_acc!(f32, f64, 0.0, |x| x as f64, |a| a as f32, |a, b| a + b, f64);
sum_acc!(f64, f64, 0.0, |x| x, |a| a, |a, b| a + b);
sum_acc!(u8, u8, 0, |x| x, |a| a, u8::wrapping_add);
sum_acc!(u32, u32, 0, |x| x, |a| a, u32::wrapping_add);
sum_acc!(i64, i64, 0, |x| x, |a| a, i64::wrapping_add);

/// A reduction as a fold over `(element, position in the reduced space)`.
trait Fold<T: Copy>: Sync {
    type Acc: Copy + Send + Sync;
    type Out: WithDType;
    /// Whether partial folds of consecutive pieces can be merged (in order) with `merge`.
    const SPLITTABLE: bool;
    fn init(&self) -> Self::Acc;
    fn step(&self, acc: Self::Acc, x: T, i: usize) -> Self::Acc;
    fn finish(&self, acc: Self::Acc) -> Self::Out;
    /// Combines the partial folds of two consecutive pieces, `a` the earlier.
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// Folds whole rows into accumulators: `accs[j]` takes `x[base + r * stride + j]` for
    /// `r < n_rows`. False where the fold has no kernel for it (the caller then steps).
    fn columns(
        &self,
        _x: &[T],
        _base: usize,
        _n_rows: usize,
        _stride: usize,
        _accs: &mut [Self::Acc],
    ) -> bool {
        false
    }
    /// Folds slabs `[slabs, accs.len(), run]` from `x[base..]` into `accs` (each run into
    /// its output). False where the fold has no kernel for it (the caller then runs).
    fn planes(
        &self,
        _x: &[T],
        _base: usize,
        _slabs: usize,
        _run: usize,
        _accs: &mut [Self::Acc],
    ) -> bool {
        false
    }
    /// Folds `len` elements at `x[start + k * stride]`, positions `pos0 + k`.
    #[inline]
    fn run(
        &self,
        mut acc: Self::Acc,
        x: &[T],
        start: usize,
        len: usize,
        stride: usize,
        pos0: usize,
    ) -> Self::Acc {
        for k in 0..len {
            acc = self.step(acc, x[start + k * stride], pos0 + k);
        }
        acc
    }
}

struct SumFold;
impl<T: SumAcc> Fold<T> for SumFold {
    type Acc = T::Acc;
    type Out = T;
    const SPLITTABLE: bool = true;
    fn init(&self) -> T::Acc {
        T::ACC_ZERO
    }
    #[inline(always)]
    fn step(&self, a: T::Acc, x: T, _: usize) -> T::Acc {
        T::acc(a, x)
    }
    fn finish(&self, a: T::Acc) -> T {
        T::finish(a)
    }
    fn merge(&self, a: T::Acc, b: T::Acc) -> T::Acc {
        T::merge(a, b)
    }
    fn columns(
        &self,
        x: &[T],
        base: usize,
        n_rows: usize,
        stride: usize,
        accs: &mut [T::Acc],
    ) -> bool {
        T::column_sums(&x[base..], n_rows, stride, accs)
    }
    fn planes(&self, x: &[T], base: usize, slabs: usize, run: usize, accs: &mut [T::Acc]) -> bool {
        T::plane_sums(&x[base..], slabs, run, accs)
    }
    /// Eight independent accumulators over a contiguous run, so the loop vectorises.
    #[inline]
    fn run(
        &self,
        acc: T::Acc,
        x: &[T],
        start: usize,
        len: usize,
        stride: usize,
        _: usize,
    ) -> T::Acc {
        if stride != 1 {
            return (0..len).fold(acc, |a, k| T::acc(a, x[start + k * stride]));
        }
        let run = &x[start..start + len];
        if let Some(s) = T::sum_run(run) {
            return T::merge(acc, s);
        }
        let mut lanes = [T::ACC_ZERO; 8];
        let chunks = run.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for i in 0..8 {
                lanes[i] = T::acc(lanes[i], c[i]);
            }
        }
        let mut s = acc;
        for &l in &lanes {
            s = T::merge(s, l);
        }
        rest.iter().fold(s, |a, &v| T::acc(a, v))
    }
}

/// Max (or min, with `MAX = false`), propagating NaN.
struct ExtremumFold<const MAX: bool>;
impl<T: Elem + RunKernels, const MAX: bool> Fold<T> for ExtremumFold<MAX> {
    type Acc = Option<T>;
    type Out = T;
    const SPLITTABLE: bool = true;
    fn init(&self) -> Option<T> {
        None
    }
    #[inline(always)]
    fn step(&self, a: Option<T>, x: T, _: usize) -> Option<T> {
        Some(match a {
            None => x,
            Some(a) if MAX => a.maximum(x),
            Some(a) => a.minimum(x),
        })
    }
    fn finish(&self, a: Option<T>) -> T {
        a.unwrap_or(T::ZERO)
    }
    fn merge(&self, a: Option<T>, b: Option<T>) -> Option<T> {
        match b {
            Some(b) => self.step(a, b, 0),
            None => a,
        }
    }
    #[inline]
    fn run(
        &self,
        acc: Option<T>,
        x: &[T],
        start: usize,
        len: usize,
        stride: usize,
        _: usize,
    ) -> Option<T> {
        if stride == 1 && len > 0 {
            if let Some(m) = T::extremum_run(&x[start..start + len], MAX) {
                return self.merge(acc, Some(m));
            }
        }
        (0..len).fold(acc, |a, k| self.step(a, x[start + k * stride], 0))
    }
}

/// Position of the first max (or min); the first NaN wins, as in PyTorch.
struct ArgFold<const MAX: bool>;
impl<T: Elem + RunKernels, const MAX: bool> Fold<T> for ArgFold<MAX> {
    type Acc = Option<(T, usize)>;
    type Out = i64;
    const SPLITTABLE: bool = true;
    fn init(&self) -> Self::Acc {
        None
    }
    #[inline(always)]
    fn step(&self, a: Self::Acc, x: T, i: usize) -> Self::Acc {
        match a {
            None => Some((x, i)),
            Some((b, _)) if b.is_nan() => a,
            Some(_) if x.is_nan() => Some((x, i)),
            Some((b, _)) if (MAX && x > b) || (!MAX && x < b) => Some((x, i)),
            a => a,
        }
    }
    fn finish(&self, a: Self::Acc) -> i64 {
        a.map_or(0, |(_, i)| i as i64)
    }
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc {
        match b {
            Some((v, i)) => self.step(a, v, i),
            None => a,
        }
    }
    #[inline]
    fn run(
        &self,
        acc: Self::Acc,
        x: &[T],
        start: usize,
        len: usize,
        stride: usize,
        pos0: usize,
    ) -> Self::Acc {
        if stride == 1 && len > 0 {
            if let Some(p) = T::arg_run(&x[start..start + len], MAX) {
                // Earlier positions are in `acc`: it wins ties.
                return self.step(acc, x[start + p], pos0 + p);
            }
        }
        (0..len).fold(acc, |a, k| self.step(a, x[start + k * stride], pos0 + k))
    }
}

pub(super) fn reduce<T: SumAcc>(x: &[T], l: &Layout, dims: &[usize], op: ReduceOp) -> CpuStorage {
    let permuted = if l.is_contiguous() {
        None
    } else {
        as_permuted_contiguous(l, dims)
    };
    let (l, dims) = match &permuted {
        Some((pl, pd)) => (pl, &pd[..]),
        None => (l, dims),
    };
    match op {
        ReduceOp::Sum => reduce_with(x, l, dims, &SumFold),
        ReduceOp::Max => reduce_with(x, l, dims, &ExtremumFold::<true>),
        ReduceOp::Min => reduce_with(x, l, dims, &ExtremumFold::<false>),
        ReduceOp::ArgMax => reduce_with(x, l, dims, &ArgFold::<true>),
        ReduceOp::ArgMin => reduce_with(x, l, dims, &ArgFold::<false>),
    }
}

/// A permuted view of contiguous memory (a transposed matrix) as the contiguous layout it
/// permutes, with the reduced `dims` renumbered; `None` unless the permutation keeps the
/// kept dims in their order, and the reduced ones in theirs (so the outputs' order and the
/// arg-reductions' indices stay as they are). Its reduction then reads memory in order
/// through the column- or channel-wise paths: the bias gradient of a linear layer (row sums
/// of the transposed output gradient, `[1024, 256]` viewing `[256, 1024]`) had gone to the
/// pool as 1024 strided runs.
fn as_permuted_contiguous(l: &Layout, dims: &[usize]) -> Option<(Layout, DimVec)> {
    let mut order: DimVec = (0..l.rank()).collect();
    // Stable: equal strides (size-1 dims) keep their order.
    order.sort_by_key(|&d| std::cmp::Reverse(l.strides()[d]));
    let reduced = |d: &&usize| dims.contains(d);
    if !order.iter().filter(reduced).is_sorted()
        || !order.iter().filter(|d| !reduced(d)).is_sorted()
    {
        return None;
    }
    let permuted = sub_layout(l, &order, l.offset());
    if !permuted.is_contiguous() {
        return None;
    }
    let new_dims = (0..order.len())
        .filter(|&p| dims.contains(&order[p]))
        .collect();
    Some((permuted, new_dims))
}

/// The sub-layout of `l` made of `dims` (in order), at `offset`.
fn sub_layout(l: &Layout, dims: &[usize], offset: usize) -> Layout {
    let shape: Vec<usize> = dims.iter().map(|&d| l.dims()[d]).collect();
    let strides = dims.iter().map(|&d| l.strides()[d]).collect();
    Layout::new(shape.into(), strides, offset, usize::MAX).expect("a sub-layout of a valid layout")
}

fn reduce_with<T: Copy + Sync, F: Fold<T>>(
    x: &[T],
    l: &Layout,
    dims: &[usize],
    fold: &F,
) -> CpuStorage {
    let kept: DimVec = (0..l.rank()).filter(|d| !dims.contains(d)).collect();
    let outer = sub_layout(l, &kept, l.offset());
    let inner = sub_layout(l, dims, 0);
    let (n_out, n_red) = (outer.elem_count(), inner.elem_count());
    let mut out = vec![<F::Out as WithDType>::ZERO; n_out];
    let large = goes_parallel(n_out * n_red);

    // Column-wise: a contiguous input whose reduced dims form one block [i, j) of dims,
    // viewed as [A, R, B] (A, B the kept sizes before and after): each of the A slabs adds
    // whole rows of B into a row of accumulators, reading memory in order.
    let block = dims.windows(2).all(|w| w[1] == w[0] + 1);
    let (before, after): (usize, usize) = match (dims.first(), dims.last()) {
        (Some(&i), Some(&j)) => (
            l.dims()[..i].iter().product(),
            l.dims()[j + 1..].iter().product(),
        ),
        _ => (1, 1),
    };
    if F::SPLITTABLE && l.is_contiguous() && block && after >= 8 && n_red > 0 {
        let off = l.offset();
        let mut accs = vec![fold.init(); n_out];
        // Columns [c0, c0 + accs.len()) of slab `a`.
        let work = |a: usize, c0: usize, accs: &mut [F::Acc]| {
            let base = off + a * n_red * after + c0;
            if fold.columns(x, base, n_red, after, accs) {
                return;
            }
            for r in 0..n_red {
                let row = &x[base + r * after..][..accs.len()];
                for (acc, &v) in accs.iter_mut().zip(row) {
                    *acc = fold.step(*acc, v, r);
                }
            }
        };
        let tasks = parallel_split(n_out * n_red, 1);
        if tasks > 1 {
            // Pieces of whole slabs, or of columns within a slab when slabs are few.
            let per = if before >= tasks {
                after
            } else {
                after.div_ceil(tasks.div_ceil(before)).max(64).min(after)
            };
            install(|| {
                accs.par_chunks_mut(after)
                    .enumerate()
                    .for_each(|(a, slab)| {
                        slab.par_chunks_mut(per)
                            .enumerate()
                            .for_each(|(c, ch)| work(a, c * per, ch))
                    })
            });
        } else {
            for (a, slab) in accs.chunks_mut(after).enumerate() {
                work(a, 0, slab);
            }
        }
        for (o, a) in out.iter_mut().zip(accs) {
            *o = fold.finish(a);
        }
        return CpuStorage::from_vec(out);
    }

    // Channel-wise: a contiguous input whose kept dims form one block between reduced ones,
    // viewed as [A, K, R] (a bias or batch-norm gradient: [n, c, h, w] over (0, 2, 3)).
    // Memory is read in order, each thread folding a run of the A slabs into its own K
    // accumulators (merged in order), where one output at a time walked A runs of R at a
    // stride of K·R: 35-78 GB/s for [256, 64, 14, 14] on the 2-core EPYC.
    let kept_block = kept.windows(2).all(|w| w[1] == w[0] + 1);
    if let (true, Some(&k0), Some(&k1)) = (F::SPLITTABLE && kept_block, kept.first(), kept.last()) {
        let slabs: usize = l.dims()[..k0].iter().product();
        let run: usize = l.dims()[k1 + 1..].iter().product();
        if l.is_contiguous() && slabs > 1 && run >= 8 && n_out > 0 {
            let off = l.offset();
            let fold_slabs = |slab_range: std::ops::Range<usize>| {
                let mut accs = vec![fold.init(); n_out];
                let base = off + slab_range.start * n_out * run;
                if fold.planes(x, base, slab_range.len(), run, &mut accs) {
                    return accs;
                }
                for a in slab_range {
                    for (k, acc) in accs.iter_mut().enumerate() {
                        *acc = fold.run(*acc, x, off + (a * n_out + k) * run, run, 1, a * run);
                    }
                }
                accs
            };
            let tasks = parallel_split(n_out * n_red, 1).min(slabs);
            let accs = if tasks > 1 {
                let per = slabs.div_ceil(tasks);
                let parts: Vec<Vec<F::Acc>> = install(|| {
                    (0..slabs.div_ceil(per))
                        .into_par_iter()
                        .map(|t| fold_slabs(t * per..((t + 1) * per).min(slabs)))
                        .collect()
                });
                let mut parts = parts.into_iter();
                let first = parts.next().expect("at least one slab");
                parts.fold(first, |mut accs, part| {
                    for (a, b) in accs.iter_mut().zip(part) {
                        *a = fold.merge(*a, b);
                    }
                    accs
                })
            } else {
                fold_slabs(0..slabs)
            };
            for (o, a) in out.iter_mut().zip(accs) {
                *o = fold.finish(a);
            }
            return CpuStorage::from_vec(out);
        }
    }

    let plan = RowPlan::new([&inner]);
    let (run_len, [run_stride]) = (plan.row_len, plan.row_strides);
    let single_run = plan.n_rows() == 1;

    // Few outputs, long runs (a whole-tensor sum): split each run across threads, the
    // pieces merged in order (so the result does not depend on which thread ran which).
    // Two pieces of up to 4M elements go through the hot helper as halves: a 1M-element sum
    // took 61-64 us through the pool on the 2-core CI-sized machine, 38-40 on one thread.
    // Longer runs the pool would split in two are shared with the helper in chunks
    // (`hot_helper::share`), which does not leave one of two pool workers asleep.
    let tasks = parallel_split(run_len, 1);
    let piece = |base: usize, first: usize, len: usize| {
        fold.run(
            fold.init(),
            x,
            base + first * run_stride,
            len,
            run_stride,
            first,
        )
    };
    if F::SPLITTABLE && single_run && n_out == 1 && tasks == 2 && splits_in_two(run_len, 1) {
        if run_len <= 1 << 22 {
            let half = run_len.div_ceil(2);
            for (o, base) in out.iter_mut().zip(outer.offsets()) {
                let (head, tail) = join(
                    || piece(base, 0, half),
                    || piece(base, half, run_len - half),
                );
                *o = fold.finish(fold.merge(head, tail));
            }
            return CpuStorage::from_vec(out);
        }
        if shares_with_helper(run_len, 1) {
            let per = run_len.div_ceil(share_chunks(run_len));
            let n_chunks = run_len.div_ceil(per);
            for (o, base) in out.iter_mut().zip(outer.offsets()) {
                let parts: Vec<Mutex<Option<F::Acc>>> =
                    (0..n_chunks).map(|_| Mutex::new(None)).collect();
                let one = |c: usize| {
                    let acc = piece(base, c * per, per.min(run_len - c * per));
                    *parts[c].lock().unwrap_or_else(|e| e.into_inner()) = Some(acc);
                };
                share(n_chunks, &one, wakes_helper(run_len, 1));
                let acc = parts.into_iter().fold(fold.init(), |a, p| {
                    let p = p.into_inner().unwrap_or_else(|e| e.into_inner());
                    fold.merge(a, p.expect("every chunk ran"))
                });
                *o = fold.finish(acc);
            }
            return CpuStorage::from_vec(out);
        }
    }
    if F::SPLITTABLE && single_run && n_out < num_threads() && tasks > 1 {
        let chunk = run_len.div_ceil(tasks);
        for (o, base) in out.iter_mut().zip(outer.offsets()) {
            let acc = install(|| {
                (0..run_len.div_ceil(chunk))
                    .into_par_iter()
                    .map(|c| {
                        let len = chunk.min(run_len - c * chunk);
                        fold.run(
                            fold.init(),
                            x,
                            base + c * chunk * run_stride,
                            len,
                            run_stride,
                            c * chunk,
                        )
                    })
                    .reduce(|| fold.init(), |a, b| fold.merge(a, b))
            });
            *o = fold.finish(acc);
        }
        return CpuStorage::from_vec(out);
    }
    let work = |first: usize, chunk: &mut [F::Out]| {
        for (o, base) in chunk.iter_mut().zip(outer.offsets_from(first)) {
            let acc = if n_red == 0 {
                fold.init()
            } else if single_run {
                fold.run(fold.init(), x, base, run_len, run_stride, 0)
            } else {
                let mut acc = fold.init();
                plan.for_rows(0..plan.n_rows(), |r, [o]| {
                    acc = fold.run(acc, x, base + o, run_len, run_stride, r * run_len);
                });
                acc
            };
            *o = fold.finish(acc);
        }
    };
    if large && n_out > 1 {
        let per = (PARALLEL_THRESHOLD / n_red.max(1))
            .clamp(1, n_out.div_ceil(2 * rayon::current_num_threads()));
        install(|| {
            out.par_chunks_mut(per)
                .enumerate()
                .for_each(|(c, ch)| work(c * per, ch))
        });
    } else {
        work(0, &mut out);
    }
    CpuStorage::from_vec(out)
}

/// The max of a row, NaN if any value is NaN.
fn row_max<C: Float>(values: impl Iterator<Item = C>) -> C {
    values.fold(
        C::neg_infinity(),
        |m, v| if v > m || v.is_nan() { v } else { m },
    )
}

/// Softmax (or log-softmax) along `dim` into a contiguous output, computed in the dtype's
/// compute type with the max subtracted first.
pub(super) fn softmax<T: FloatElem + RunKernels>(
    x: &[T],
    l: &Layout,
    dim: usize,
    log: bool,
) -> Vec<T> {
    let n = l.dims()[dim];
    let stride = l.strides()[dim];
    let others: DimVec = (0..l.rank()).filter(|&d| d != dim).collect();
    let outer_in = sub_layout(l, &others, l.offset());
    let out_layout = Layout::contiguous(l.shape().clone());
    let outer_out = sub_layout(&out_layout, &others, 0);
    let out_stride = out_layout.strides()[dim];
    let rows = outer_in.elem_count();
    if n == 0 {
        return vec![T::ZERO; l.elem_count()];
    }
    let mut out: Vec<T> = super::host_memory::with_capacity_huge(l.elem_count());
    let row = |src: usize, dst: usize, out: &mut [MaybeUninit<T>], buf: &mut Vec<T::C>| {
        if T::SOFTMAX_ROWS && stride == 1 && out_stride == 1 {
            return T::softmax_rows(&x[src..src + n], n, &mut out[dst..dst + n], log);
        }
        buf.clear();
        buf.extend((0..n).map(|k| x[src + k * stride].to_c()));
        // A row whose max is not finite is NaN throughout, as in PyTorch (`x - max` is NaN
        // somewhere in it: NaN, inf - inf, or -inf - -inf).
        let m = row_max(buf.iter().copied());
        if !m.is_finite() {
            for k in 0..n {
                out[dst + k * out_stride].write(T::from_c(T::C::nan()));
            }
            return;
        }
        let mut sum = T::C::zero();
        for v in buf.iter_mut() {
            *v = *v - m;
            sum = sum + v.exp();
        }
        if log {
            let ls = sum.ln();
            for (k, &v) in buf.iter().enumerate() {
                out[dst + k * out_stride].write(T::from_c(v - ls));
            }
        } else {
            let inv = T::C::one() / sum;
            for (k, &v) in buf.iter().enumerate() {
                out[dst + k * out_stride].write(T::from_c(v.exp() * inv));
            }
        }
    };
    // Rows are independent, but with `dim` not last their outputs interleave; split the
    // output by whole outer blocks only when `dim` is the last dim (stride 1 rows).
    let total = l.elem_count();
    let dst = &mut out.spare_capacity_mut()[..total];
    if let (true, Some(r)) = (T::SOFTMAX_ROWS && stride == 1, l.contiguous_range()) {
        // Whole rows back to back: one kernel call per chunk of rows.
        let src = &x[r];
        split_output(dst, 4, n, true, |start, d| {
            T::softmax_rows(&src[start..start + d.len()], n, d, log)
        });
    } else if out_stride == 1 && goes_parallel(rows * n) {
        let srcs: Vec<usize> = outer_in.offsets().collect();
        install(|| {
            dst.par_chunks_mut(n)
                .zip(srcs.par_iter())
                .for_each_init(Vec::new, |buf, (o, &s)| row(s, 0, o, buf))
        });
    } else {
        let mut buf = Vec::with_capacity(n);
        for (s, d) in outer_in.offsets().zip(outer_out.offsets()) {
            row(s, d, dst, &mut buf);
        }
    }
    // SAFETY: every row writes its n outputs, and the rows' outputs (dst + k * out_stride
    // for the outer positions of the contiguous output layout) cover all `total` elements.
    unsafe { out.set_len(total) };
    out
}

/// `ln Σ e^x` along `dim`: one value per row, laid out as `l`'s shape with `dim` of size 1
/// (contiguous), computed in the dtype's compute type with the row's max subtracted first.
/// An infinite max shifts by 0 instead, so a row of -inf gives -inf, a row holding +inf gives
/// +inf, and NaN gives NaN (as PyTorch); an empty row gives -inf (the log of an empty sum).
pub(super) fn logsumexp<T: FloatElem + RunKernels>(x: &[T], l: &Layout, dim: usize) -> Vec<T> {
    let n = l.dims()[dim];
    let stride = l.strides()[dim];
    let others: DimVec = (0..l.rank()).filter(|&d| d != dim).collect();
    let outer = sub_layout(l, &others, l.offset());
    let rows = outer.elem_count();
    if n == 0 {
        return vec![T::from_c(T::C::neg_infinity()); rows];
    }
    if let (true, Some(r)) = (T::LOGSUMEXP_ROWS && stride == 1, l.contiguous_range()) {
        // Whole rows back to back: one kernel call per chunk of rows.
        let src = &x[r];
        let mut out = vec![T::ZERO; rows];
        split_output(&mut out, 4 * n, 1, true, |first, o| {
            T::logsumexp_rows(&src[first * n..(first + o.len()) * n], n, o)
        });
        return out;
    }
    let row = |src: usize| -> T {
        if T::LOGSUMEXP_ROWS && stride == 1 {
            let mut v = [T::ZERO];
            T::logsumexp_rows(&x[src..src + n], n, &mut v);
            return v[0];
        }
        let values = (0..n).map(|k| x[src + k * stride].to_c());
        // An infinite max shifts by 0: a shift by ±inf would give inf - inf = NaN.
        let shift = row_max(values.clone());
        let shift = if shift.is_infinite() {
            T::C::zero()
        } else {
            shift
        };
        let sum = values.fold(T::C::zero(), |s, v| s + (v - shift).exp());
        T::from_c(sum.ln() + shift)
    };
    if goes_parallel(rows * n) && rows > 1 {
        let starts: Vec<usize> = outer.offsets().collect();
        install(|| starts.par_iter().map(|&s| row(s)).collect())
    } else {
        outer.offsets().map(row).collect()
    }
}
