//! Row-wise iteration over up to three layouts of one shape, the engine of every elementwise
//! CPU kernel.
//!
//! Dimensions that are contiguous with respect to each other in every operand are merged,
//! extent-1 dimensions dropped, and the innermost remaining dimension becomes a "row" that a
//! kernel walks with fixed strides (a plain slice loop when all strides are 1, which the
//! compiler vectorises). Rows are split across threads above a size threshold.

use super::threads::{goes_parallel, install, PARALLEL_THRESHOLD};
use crate::layout::{merge_dims, Layout};
use crate::shape::DimVec;
use rayon::prelude::*;

/// The merged iteration space of `K` layouts that share one shape.
pub(crate) struct RowPlan<const K: usize> {
    /// Outer dimensions (all but the row), outermost first.
    outer_dims: DimVec,
    /// Per operand, the stride of each outer dimension.
    outer_strides: [DimVec; K],
    pub row_len: usize,
    /// Per operand, the stride along a row.
    pub row_strides: [usize; K],
    offsets: [usize; K],
}

impl<const K: usize> RowPlan<K> {
    pub fn new(layouts: [&Layout; K]) -> Self {
        let (mut md, mut ms) = merge_dims(layouts);
        let offsets = std::array::from_fn(|k| layouts[k].offset());
        if md.is_empty() {
            // A single element (or a shape of extent-1 dims).
            let n = layouts[0].elem_count();
            return RowPlan {
                outer_dims: DimVec::new(),
                outer_strides: ms,
                row_len: n,
                row_strides: [0; K],
                offsets,
            };
        }
        let row_len = md.pop().unwrap();
        let row_strides = std::array::from_fn(|k| ms[k].pop().unwrap());
        RowPlan {
            outer_dims: md,
            outer_strides: ms,
            row_len,
            row_strides,
            offsets,
        }
    }

    pub fn n_rows(&self) -> usize {
        self.outer_dims.iter().product()
    }

    /// Calls `f(row, offsets)` for rows `rows`, with each operand's storage offset of the
    /// row's first element.
    pub fn for_rows(&self, rows: std::ops::Range<usize>, mut f: impl FnMut(usize, [usize; K])) {
        if rows.is_empty() {
            return;
        }
        let nd = self.outer_dims.len();
        let mut index = DimVec::from_elem(0, nd);
        let mut rem = rows.start;
        for d in (0..nd).rev() {
            index[d] = rem % self.outer_dims[d];
            rem /= self.outer_dims[d];
        }
        let mut offs = self.offsets;
        for (off, strides) in offs.iter_mut().zip(&self.outer_strides) {
            *off += index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        }
        for r in rows {
            f(r, offs);
            // Odometer step.
            let mut d = nd;
            while d > 0 {
                d -= 1;
                index[d] += 1;
                for (off, strides) in offs.iter_mut().zip(&self.outer_strides) {
                    *off += strides[d];
                }
                if index[d] < self.outer_dims[d] {
                    break;
                }
                for (off, strides) in offs.iter_mut().zip(&self.outer_strides) {
                    *off -= index[d] * strides[d];
                }
                index[d] = 0;
            }
        }
    }
}

/// Splits a contiguous output of `plan`'s shape into chunks of whole rows and runs
/// `f(first_row, chunk)` on each, in parallel when the output is large.
pub(crate) fn for_output_chunks<O: Send, const K: usize>(
    plan: &RowPlan<K>,
    out: &mut [O],
    f: impl Fn(usize, &mut [O]) + Sync,
) {
    let n = out.len();
    let row_len = plan.row_len.max(1);
    if !goes_parallel(n) {
        f(0, out);
        return;
    }
    let rows_per_chunk = (PARALLEL_THRESHOLD / row_len).max(1);
    install(|| {
        out.par_chunks_mut(rows_per_chunk * row_len)
            .enumerate()
            .for_each(|(i, chunk)| f(i * rows_per_chunk, chunk));
    });
}

/// `out[i] = f(a[i])` over a layout, into a new contiguous vector.
pub(crate) fn map1<A: Copy + Sync, O: Copy + Send + Sync>(
    a: &[A],
    la: &Layout,
    zero: O,
    f: impl Fn(A) -> O + Sync + Send,
) -> Vec<O> {
    if let Some(r) = la.contiguous_range() {
        let src = &a[r];
        if !goes_parallel(src.len()) {
            return src.iter().map(|&x| f(x)).collect();
        }
        let mut out = Vec::with_capacity(src.len());
        install(|| {
            src.par_iter()
                .with_min_len(4096)
                .map(|&x| f(x))
                .collect_into_vec(&mut out)
        });
        return out;
    }
    let plan = RowPlan::new([la]);
    let mut out = vec![zero; la.elem_count()];
    let (len, [sa]) = (plan.row_len, plan.row_strides);
    for_output_chunks(&plan, &mut out, |first, chunk| {
        let rows = first..first + chunk.len() / len.max(1);
        plan.for_rows(rows, |r, [oa]| {
            let dst = &mut chunk[(r - first) * len..][..len];
            if sa == 1 {
                for (d, &x) in dst.iter_mut().zip(&a[oa..oa + len]) {
                    *d = f(x);
                }
            } else {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = f(a[oa + i * sa]);
                }
            }
        });
    });
    out
}

/// `out[i] = f(a[i], b[i])` over two layouts of one shape, into a new contiguous vector.
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, O: Copy + Send + Sync>(
    a: &[A],
    la: &Layout,
    b: &[B],
    lb: &Layout,
    zero: O,
    f: impl Fn(A, B) -> O + Sync + Send,
) -> Vec<O> {
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        if !goes_parallel(a.len()) {
            return a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
        }
        let mut out = Vec::with_capacity(a.len());
        install(|| {
            a.par_iter()
                .zip(b.par_iter())
                .with_min_len(4096)
                .map(|(&x, &y)| f(x, y))
                .collect_into_vec(&mut out)
        });
        return out;
    }
    let plan = RowPlan::new([la, lb]);
    let mut out = vec![zero; la.elem_count()];
    let (len, [sa, sb]) = (plan.row_len, plan.row_strides);
    for_output_chunks(&plan, &mut out, |first, chunk| {
        let rows = first..first + chunk.len() / len.max(1);
        plan.for_rows(rows, |r, [oa, ob]| {
            let dst = &mut chunk[(r - first) * len..][..len];
            match (sa, sb) {
                (1, 1) => {
                    for ((d, &x), &y) in dst.iter_mut().zip(&a[oa..oa + len]).zip(&b[ob..ob + len])
                    {
                        *d = f(x, y);
                    }
                }
                (1, 0) => {
                    let y = b[ob];
                    for (d, &x) in dst.iter_mut().zip(&a[oa..oa + len]) {
                        *d = f(x, y);
                    }
                }
                (0, 1) => {
                    let x = a[oa];
                    for (d, &y) in dst.iter_mut().zip(&b[ob..ob + len]) {
                        *d = f(x, y);
                    }
                }
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = f(a[oa + i * sa], b[ob + i * sb]);
                    }
                }
            }
        });
    });
    out
}

/// `out[i] = f(a[i], b[i], c[i])` over three layouts of one shape.
pub(crate) fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, O: Copy + Send + Sync>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    zero: O,
    f: impl Fn(A, B, C) -> O + Sync + Send,
) -> Vec<O> {
    let plan = RowPlan::new([la, lb, lc]);
    let mut out = vec![zero; la.elem_count()];
    let (len, [sa, sb, sc]) = (plan.row_len, plan.row_strides);
    for_output_chunks(&plan, &mut out, |first, chunk| {
        let rows = first..first + chunk.len() / len.max(1);
        plan.for_rows(rows, |r, [oa, ob, oc]| {
            let dst = &mut chunk[(r - first) * len..][..len];
            for (i, d) in dst.iter_mut().enumerate() {
                *d = f(a[oa + i * sa], b[ob + i * sb], c[oc + i * sc]);
            }
        });
    });
    out
}

/// Copies `src` (layout `ls`) into `dst` at layout `ld` (same shape), element by element.
pub(crate) fn copy_into<T: Copy>(src: &[T], ls: &Layout, dst: &mut [T], ld: &Layout) {
    let plan = RowPlan::new([ld, ls]);
    let (len, [sd, ss]) = (plan.row_len, plan.row_strides);
    plan.for_rows(0..plan.n_rows(), |_, [od, os]| {
        if sd == 1 && ss == 1 {
            dst[od..od + len].copy_from_slice(&src[os..os + len]);
        } else {
            for i in 0..len {
                dst[od + i * sd] = src[os + i * ss];
            }
        }
    });
}
