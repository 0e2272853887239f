//! Row-wise iteration over up to three layouts of one shape, the engine of every elementwise
//! CPU kernel.
//!
//! Dimensions that are contiguous with respect to each other in every operand are merged,
//! extent-1 dimensions dropped, and the innermost remaining dimension becomes a "row" that a
//! kernel walks with fixed strides (a plain slice loop when all strides are 1, which the
//! compiler vectorises). Rows are split across threads above a size threshold.

use super::host_memory::filled_huge;
use super::threads::{goes_parallel, install, parallel_split, PARALLEL_THRESHOLD};
use crate::layout::{merge_dims, Layout};
use crate::shape::DimVec;
use bytemuck::Pod;
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
    for_output_chunks_of(plan, out, 1, None, f)
}

/// [`for_output_chunks`] with chunks of a multiple of `rows` rows (but the last), in
/// parallel from the grain of an op of relative cost `cost` (`threads::parallel_split`;
/// `None`: from [`PARALLEL_THRESHOLD`] elements).
fn for_output_chunks_of<O: Send, const K: usize>(
    plan: &RowPlan<K>,
    out: &mut [O],
    rows: usize,
    cost: Option<usize>,
    f: impl Fn(usize, &mut [O]) + Sync,
) {
    let n = out.len();
    let row_len = plan.row_len.max(1);
    let parallel = match cost {
        Some(cost) => parallel_split(n, cost) > 1,
        None => goes_parallel(n),
    };
    if !parallel {
        f(0, out);
        return;
    }
    let rows_per_chunk = (PARALLEL_THRESHOLD / row_len).max(1).next_multiple_of(rows);
    install(|| {
        out.par_chunks_mut(rows_per_chunk * row_len)
            .enumerate()
            .for_each(|(i, chunk)| f(i * rows_per_chunk, chunk));
    });
}

/// `out[i] = f(a[i])` over a layout, into a new contiguous vector.
pub(crate) fn map1<A: Copy + Sync, O: Pod + Send + Sync>(
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
    let mut out = filled_huge(zero, la.elem_count());
    let (len, [sa]) = (plan.row_len, plan.row_strides);
    if plan.transposed_operand().is_some() {
        let no_block = |_: usize, _: &mut [O]| false;
        // Chunks of whole groups: a chunk of 8 rows (the parallel grain, for rows of 4096)
        // never made a whole tile.
        for_output_chunks_of(&plan, &mut out, GROUP, None, |first, chunk| {
            map1_by_tiles(a, &plan, first, chunk, &f, &no_block)
        });
        return out;
    }
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

/// Side of the square tiles of [`map1_by_tiles`]: a tile's source rows and output rows stay
/// in L1 while it is walked, and a tile of 4-byte elements is one register transpose.
const TILE: usize = 16;
/// Rows walked together by [`map1_by_tiles`]: each source run it reads is then 256 bytes of
/// f32 (four whole lines) rather than one line.
const GROUP: usize = 64;

impl<const K: usize> RowPlan<K> {
    /// An operand read with a stride above 1 along each row but with stride 1 across
    /// neighbouring rows (a transposed view, or a batch of them), where rows hold more than
    /// one element: walked in tiles ([`map1_by_tiles`]) or copied out first.
    pub(crate) fn transposed_operand(&self) -> Option<usize> {
        if self.row_len <= 1 {
            return None;
        }
        (0..K).find(|&k| self.row_strides[k] > 1 && self.outer_strides[k].last() == Some(&1))
    }
}

/// The elements of `a` at layout `la`, in a new contiguous vector: [`map1`]'s identity,
/// with whole 16×16 tiles of 4-byte elements of a transposed source moved by register
/// transposes on AVX-512 and AVX2 CPUs.
pub(crate) fn copied<T: Pod + Send + Sync>(a: &[T], la: &Layout, zero: T) -> Vec<T> {
    #[cfg(target_arch = "x86_64")]
    let plan = RowPlan::new([la]);
    #[cfg(target_arch = "x86_64")]
    let level = super::simd::simd_level();
    #[cfg(target_arch = "x86_64")]
    if plan.transposed_operand().is_some()
        && size_of::<T>() == 4
        && matches!(
            level,
            super::simd::SimdLevel::Avx512 | super::simd::SimdLevel::Avx2
        )
    {
        let mut out = filled_huge(zero, la.elem_count());
        let sa = plan.row_strides[0];
        // Source offset `o` (16 consecutive elements at `o + c·sa` for each of 16 columns c)
        // into `dst` (16 rows of the output, `plan.row_len` apart).
        let block = |o: usize, dst: &mut [T]| {
            let len = plan.row_len;
            assert!(o + 15 * sa + 16 <= a.len() && 15 * len + 16 <= dst.len());
            let (src, out) = (a[o..].as_ptr().cast(), dst.as_mut_ptr().cast());
            // SAFETY: the level (AVX-512 or AVX2) is the routine's; T is 4 bytes and `Copy`,
            // so its values move as 32-bit lanes unchanged; the 16 loads and 16 stores lie
            // inside `a` and `dst` (asserted above).
            unsafe {
                if level == super::simd::SimdLevel::Avx512 {
                    super::simd::transpose::transpose_tile(src, sa, out, len)
                } else {
                    super::simd::transpose::transpose_tile_avx2(src, sa, out, len)
                }
            };
            true
        };
        // Chunks of whole groups (see `map1`). A copy's grain (cost 1) is ~512K elements:
        // 256² split in two read 9–26 GB/s.
        for_output_chunks_of(&plan, &mut out, GROUP, Some(1), |first, chunk| {
            map1_by_tiles(a, &plan, first, chunk, &|x| x, &block)
        });
        return out;
    }
    map1(a, la, zero, |x| x)
}

/// [`map1`]'s rows `first..` (the output `chunk`) where [`RowPlan::transposed_operand`]: row by row,
/// every element read would touch its own cache line, and a line's other elements would be
/// gone before the next rows came back for them (a 1024² transposed copy took 2.3 ms, 1.8
/// GB/s, on the 2-core EPYC). Here up to [`GROUP`] rows whose sources are consecutive are
/// walked together, in tiles of [`TILE`] × [`TILE`]. `block(o, dst)` may move a whole tile itself
/// (source offset `o`, `dst` the output from the tile's first element) and return true.
fn map1_by_tiles<A: Copy, O: Copy>(
    a: &[A],
    plan: &RowPlan<1>,
    first: usize,
    chunk: &mut [O],
    f: &impl Fn(A) -> O,
    block: &impl Fn(usize, &mut [O]) -> bool,
) {
    let (len, [sa]) = (plan.row_len, plan.row_strides);
    let rows = chunk.len() / len.max(1);
    // A group of rows: (first row, its source offset, how many), the rows' sources being
    // consecutive elements.
    let mut group: Option<(usize, usize, usize)> = None;
    let mut flush = |(r0, o0, g): (usize, usize, usize)| {
        let dst = &mut chunk[(r0 - first) * len..][..g * len];
        // Bounds: the group's source elements `o0 + c·sa + rr` (c < len, rr < g) are elements
        // of the layout, which lie inside `a`.
        let last = o0 + (len - 1) * sa + g - 1;
        assert!(
            last < a.len(),
            "map1_by_tiles: source element {last} of {}",
            a.len()
        );
        for c0 in (0..len).step_by(TILE) {
            let c1 = (c0 + TILE).min(len);
            for r0 in (0..g).step_by(TILE) {
                let r1 = (r0 + TILE).min(g);
                let tile = &mut dst[r0 * len..r1 * len];
                if r1 - r0 == TILE && c1 - c0 == TILE && block(o0 + c0 * sa + r0, &mut tile[c0..]) {
                    continue;
                }
                for (rr, d) in (r0..r1).zip(tile.chunks_exact_mut(len)) {
                    for (c, d) in d[c0..c1].iter_mut().enumerate() {
                        // SAFETY: `o0 + (c0 + c)·sa + rr <= last < a.len()` (asserted above).
                        *d = f(unsafe { *a.get_unchecked(o0 + (c0 + c) * sa + rr) });
                    }
                }
            }
        }
    };
    plan.for_rows(first..first + rows, |r, [o]| {
        group = match group {
            Some((r0, o0, g)) if g < GROUP && o == o0 + g => Some((r0, o0, g + 1)),
            Some(done) => {
                flush(done);
                Some((r, o, 1))
            }
            None => Some((r, o, 1)),
        };
    });
    if let Some(done) = group {
        flush(done);
    }
}

/// `out[i] = f(a[i], b[i])` over two layouts of one shape, into a new contiguous vector.
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, O: Pod + Send + Sync>(
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
    let mut out = filled_huge(zero, la.elem_count());
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
pub(crate) fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, O: Pod + Send + Sync>(
    (a, la): (&[A], &Layout),
    (b, lb): (&[B], &Layout),
    (c, lc): (&[C], &Layout),
    zero: O,
    f: impl Fn(A, B, C) -> O + Sync + Send,
) -> Vec<O> {
    let plan = RowPlan::new([la, lb, lc]);
    let mut out = filled_huge(zero, la.elem_count());
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
