//! index_select, gather and scatter-add on CUDA. Indices are converted to contiguous i64 and
//! the data made contiguous first; an out-of-range index sets the device's error flag, which
//! the next synchronisation or read reports (the kernel itself skips the element).

use super::compile::KernelSource;
use super::launch::{grid_1d, kernel_names, name_for, StridedArgs};
use super::CudaStorage;
use crate::layout::Layout;
use crate::{DType, Error, Result};

const SELECT: [&str; 7] = kernel_names!("index_select");
const GATHER: [&str; 7] = kernel_names!("gather");
const SCATTER: [&str; 7] = kernel_names!("scatter_add");

/// Contiguous i64 indices: the input itself when it already is (no copy, no launch), else a
/// converted copy. Returns the copy (if any), the indices' address and their count.
fn ids_i64(
    ids: &CudaStorage,
    il: &Layout,
    op: &'static str,
) -> Result<(Option<CudaStorage>, u64, usize)> {
    match ids.dtype {
        DType::I64 if il.is_contiguous() => Ok((None, ids.ptr_at(il.offset()), il.elem_count())),
        DType::U8 | DType::U32 | DType::I64 => {
            let c = super::elementwise::cast(ids, il, DType::I64)?;
            let (ptr, len) = (c.buf.ptr, c.len);
            Ok((Some(c), ptr, len))
        }
        dtype => Err(Error::UnsupportedDType { op, dtype }),
    }
}

fn contiguous(x: &CudaStorage, l: &Layout) -> Result<(Option<CudaStorage>, usize)> {
    if l.is_contiguous() {
        Ok((None, l.offset()))
    } else {
        Ok((Some(super::elementwise::cast(x, l, x.dtype)?), 0))
    }
}

/// Strides of `x`'s contiguous layout walked over `shape`, with `dim` pinned (stride 0).
fn pinned_args(x_shape: &[usize], shape: &[usize], dim: usize) -> Result<(StridedArgs<1>, u64)> {
    if shape.len() > 8 {
        return Err(Error::Msg(format!(
            "index ops on CUDA support at most 8 dims, got shape {shape:?}"
        )));
    }
    let strides = crate::Shape::from(x_shape).contiguous_strides();
    let mut dims = [0u64; 8];
    let mut st = [0u64; 8];
    for (d, &e) in shape.iter().enumerate() {
        dims[d] = e as u64;
        st[d] = if d == dim {
            0
        } else {
            strides.as_slice()[d] as u64
        };
    }
    Ok((
        StridedArgs::new(shape.len() as u32, dims, [st]),
        strides.as_slice()[dim] as u64,
    ))
}

pub(super) fn index_select(
    x: &CudaStorage,
    l: &Layout,
    ids: &CudaStorage,
    il: &Layout,
    dim: usize,
) -> Result<CudaStorage> {
    let (_ids_copy, ids_ptr, ids_len) = ids_i64(ids, il, "index_select")?;
    let (xc, off) = contiguous(x, l)?;
    let xs = xc.as_ref().unwrap_or(x);
    let dims = l.dims();
    let outer: usize = dims[..dim].iter().product();
    let inner: usize = dims[dim + 1..].iter().product();
    let n_ids = ids_len;
    let out = CudaStorage::alloc(x.dev(), outer * n_ids * inner, x.dtype)?;
    if out.len == 0 {
        return Ok(out);
    }
    let dev = x.dev();
    let name = name_for(&SELECT, x.dtype);
    let (x_ptr, o, n, ds, i) = (
        xs.ptr_at(off),
        outer as u64,
        n_ids as u64,
        dims[dim] as u64,
        inner as u64,
    );
    // SAFETY: x is contiguous [outer, dim, inner]; ids holds n_ids i64; out holds
    // outer*n_ids*inner; matches `index_select_<T>`.
    unsafe {
        dev.call(
            KernelSource::Index,
            name,
            grid_1d(dev, out.len as u64),
            &mut [
                &mut { x_ptr },
                &mut { ids_ptr },
                &mut { out.buf.ptr },
                &mut { o },
                &mut { n },
                &mut { ds },
                &mut { i },
                &mut { dev.error_flag },
            ],
        )
    }?;
    // Armed after the launch is queued: a check that sees it reads the flag after the kernel.
    dev.arm_flag();
    Ok(out)
}

pub(super) fn gather(
    x: &CudaStorage,
    l: &Layout,
    ids: &CudaStorage,
    il: &Layout,
    dim: usize,
) -> Result<CudaStorage> {
    let (_ids_copy, ids_ptr, ids_len) = ids_i64(ids, il, "gather")?;
    let (xc, off) = contiguous(x, l)?;
    let xs = xc.as_ref().unwrap_or(x);
    let out = CudaStorage::alloc(x.dev(), ids_len, x.dtype)?;
    if out.len == 0 {
        return Ok(out);
    }
    let (args, dim_stride) = pinned_args(l.dims(), il.dims(), dim)?;
    let dev = x.dev();
    let name = name_for(&GATHER, x.dtype);
    let (x_ptr, n, ds) = (xs.ptr_at(off), out.len as u64, l.dims()[dim] as u64);
    // SAFETY: every offset the kernel forms stays inside contiguous x (ids' extents are at
    // most x's outside `dim`, checked by the tensor layer; ids are bounds-checked on device).
    unsafe {
        dev.call(
            KernelSource::Index,
            name,
            grid_1d(dev, n),
            &mut [
                &mut { x_ptr },
                &mut { ids_ptr },
                &mut { out.buf.ptr },
                &mut { n },
                &mut { args },
                &mut { dim_stride },
                &mut { ds },
                &mut { dev.error_flag },
            ],
        )
    }?;
    // Armed after the launch is queued: a check that sees it reads the flag after the kernel.
    dev.arm_flag();
    Ok(out)
}

pub(super) fn scatter_add(
    x: &CudaStorage,
    l: &Layout,
    ids: &CudaStorage,
    il: &Layout,
    src: &CudaStorage,
    sl: &Layout,
    dim: usize,
) -> Result<CudaStorage> {
    if src.dtype != x.dtype {
        return Err(Error::DTypeMismatch {
            op: "scatter_add",
            lhs: x.dtype,
            rhs: src.dtype,
        });
    }
    let (_ids_copy, ids_ptr, ids_len) = ids_i64(ids, il, "scatter_add")?;
    let out = super::elementwise::cast(x, l, x.dtype)?;
    let (sc, soff) = contiguous(src, sl)?;
    let ss = sc.as_ref().unwrap_or(src);
    if ids_len == 0 {
        return Ok(out);
    }
    let (args, dim_stride) = pinned_args(l.dims(), il.dims(), dim)?;
    let dev = x.dev();
    let name = name_for(&SCATTER, x.dtype);
    let (s_ptr, n, ds) = (ss.ptr_at(soff), ids_len as u64, l.dims()[dim] as u64);
    // SAFETY: as in `gather`, with the contiguous copy `out` as the target.
    unsafe {
        dev.call(
            KernelSource::Index,
            name,
            grid_1d(dev, n),
            &mut [
                &mut { out.buf.ptr },
                &mut { ids_ptr },
                &mut { s_ptr },
                &mut { n },
                &mut { args },
                &mut { dim_stride },
                &mut { ds },
                &mut { dev.error_flag },
            ],
        )
    }?;
    // Armed after the launch is queued: a check that sees it reads the flag after the kernel.
    dev.arm_flag();
    Ok(out)
}
