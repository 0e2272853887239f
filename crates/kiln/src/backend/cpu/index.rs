//! index_select, gather and scatter-add. Indices arrive already checked against the
//! dimension's extent and flattened in row-major order.

use super::elem::Elem;
use crate::layout::Layout;
use crate::shape::Shape;

/// A layout over `shape` that walks `l`'s storage with dimension `dim` pinned (stride 0);
/// adding `index * stride(dim)` then selects along `dim`.
fn pinned(l: &Layout, shape: &[usize], dim: usize) -> (Layout, usize) {
    let mut strides = l.strides().to_vec();
    let stride = std::mem::replace(&mut strides[dim], 0);
    let v = Layout::new(shape.into(), strides, l.offset(), usize::MAX)
        .expect("a pinned view of a valid layout");
    (v, stride)
}

pub(super) fn index_select<T: Copy>(x: &[T], l: &Layout, ids: &[usize], dim: usize) -> Vec<T> {
    let mut shape = l.dims().to_vec();
    shape[dim] = ids.len();
    let inner: usize = shape[dim + 1..].iter().product();
    if l.is_contiguous() {
        // Whole runs of `inner` elements (rows of a dataset, say) copied at memcpy speed.
        let dims = l.dims();
        let outer: usize = dims[..dim].iter().product();
        let size = dims[dim];
        let mut out = super::host_memory::with_capacity_huge(outer * ids.len() * inner);
        for o in 0..outer {
            for &i in ids {
                let start = l.offset() + (o * size + i) * inner;
                out.extend_from_slice(&x[start..start + inner]);
            }
        }
        return out;
    }
    let (v, stride) = pinned(l, &shape, dim);
    let n = ids.len().max(1);
    v.offsets()
        .enumerate()
        .map(|(i, o)| x[o + ids[(i / inner.max(1)) % n] * stride])
        .collect()
}

pub(super) fn gather<T: Copy>(
    x: &[T],
    l: &Layout,
    ids: &[usize],
    ids_shape: &Shape,
    dim: usize,
) -> Vec<T> {
    let (v, stride) = pinned(l, ids_shape.dims(), dim);
    v.offsets()
        .zip(ids)
        .map(|(o, &i)| x[o + i * stride])
        .collect()
}

/// Adds `src` into the contiguous `out` at the positions `ids` name along `dim`.
pub(super) fn scatter_add<T: Elem>(
    out: &mut [T],
    out_layout: &Layout,
    ids: &[usize],
    src: &[T],
    sl: &Layout,
    dim: usize,
) {
    let (v, stride) = pinned(out_layout, sl.dims(), dim);
    for ((o, so), &i) in v.offsets().zip(sl.offsets()).zip(ids) {
        let p = o + i * stride;
        out[p] = out[p].add(src[so]);
    }
}
