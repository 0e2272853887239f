//! Softmax, log-softmax and logsumexp on CUDA: one block per row of a contiguous
//! `[rows, cols]` view; another dim is moved last (and back) with copies.

use super::compile::KernelSource;
use super::launch::launch_err;
use super::CudaStorage;
use crate::layout::Layout;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;

/// Kernel names `softmax_<dtype>_<items>[_v]` and `softmax_<dtype>_big`.
macro_rules! softmax_names {
    ($t:literal) => {
        [
            concat!("softmax_", $t, "_1"),
            concat!("softmax_", $t, "_2"),
            concat!("softmax_", $t, "_4"),
            concat!("softmax_", $t, "_8"),
            concat!("softmax_", $t, "_16"),
            concat!("softmax_", $t, "_32"),
            concat!("softmax_", $t, "_1_v"),
            concat!("softmax_", $t, "_2_v"),
            concat!("softmax_", $t, "_4_v"),
            concat!("softmax_", $t, "_8_v"),
            concat!("softmax_", $t, "_16_v"),
            concat!("softmax_", $t, "_32_v"),
            concat!("softmax_", $t, "_big"),
            concat!("softmax_", $t, "_smem"),
        ]
    };
}

fn names(dtype: DType) -> [&'static str; 14] {
    match dtype {
        DType::F16 => softmax_names!("f16"),
        DType::BF16 => softmax_names!("bf16"),
        DType::F32 => softmax_names!("f32"),
        _ => softmax_names!("f64"),
    }
}

const BLOCK: usize = 256;

pub(super) fn softmax(x: &CudaStorage, l: &Layout, dim: usize, log: bool) -> Result<CudaStorage> {
    let last = l.rank() - 1;
    if dim != last {
        // Move `dim` last, compute, and move it back into a contiguous result.
        let moved = l.transpose(dim, last)?;
        let c = super::elementwise::cast(x, &moved, x.dtype)?;
        let r = softmax(&c, &Layout::contiguous(moved.shape().clone()), last, log)?;
        let back = Layout::contiguous(moved.shape().clone()).transpose(dim, last)?;
        return super::elementwise::cast(&r, &back, x.dtype);
    }
    if !l.is_contiguous() {
        let c = super::elementwise::cast(x, l, x.dtype)?;
        return softmax(&c, &Layout::contiguous(l.shape().clone()), dim, log);
    }
    let cols = l.dims()[dim];
    let rows = l.elem_count() / cols.max(1);
    let out = CudaStorage::alloc(x.dev(), l.elem_count(), x.dtype)?;
    if rows == 0 || cols == 0 {
        return Ok(out);
    }
    let x_ptr = x.ptr_at(l.offset());
    let per_thread = cols.div_ceil(BLOCK);
    let table = names(x.dtype);
    let vec_width = 16 / x.dtype.size_in_bytes();
    let dev = x.dev();
    // A whole row of compute values (f32 for 16-bit types) in shared memory, when it fits.
    let row_bytes = cols * if x.dtype == DType::F64 { 8 } else { 4 };
    let (name, block, smem) = match [1usize, 2, 4, 8, 16, 32]
        .iter()
        .position(|&items| per_thread <= items)
    {
        Some(i) => {
            let items = 1 << i;
            let width = items.min(vec_width);
            let vec_ok = width > 1
                && cols.is_multiple_of(width)
                && x_ptr.is_multiple_of(16)
                && out.buf.ptr.is_multiple_of(16);
            (table[if vec_ok { 6 + i } else { i }], BLOCK, 0)
        }
        None if row_bytes <= dev.info.max_shared_per_block => (table[13], 1024, row_bytes),
        None => (table[12], 1024, 0),
    };
    if smem > 0 {
        let f = dev.function(KernelSource::Softmax, name)?;
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(launch_err(name))?;
    }
    let (cols64, log_flag) = (cols as u64, log as i32);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: x and out hold rows*cols contiguous elements; matches `softmax_<T>_*`.
    unsafe {
        dev.call(
            KernelSource::Softmax,
            name,
            cfg,
            &mut [
                &mut { x_ptr },
                &mut { out.buf.ptr },
                &mut { cols64 },
                &mut { log_flag },
            ],
        )
    }?;
    Ok(out)
}

/// `ln Σ e^x` along `dim`, contiguous with `dim` kept as size 1: one block per row of the
/// contiguous view with `dim` last (a copy moves it there first, the other dims keeping
/// their order, so the rows come out in the result's order).
pub(super) fn logsumexp(x: &CudaStorage, l: &Layout, dim: usize) -> Result<CudaStorage> {
    let last = l.rank() - 1;
    if dim != last || !l.is_contiguous() {
        let perm: Vec<usize> = (0..l.rank()).filter(|&d| d != dim).chain([dim]).collect();
        let moved = l.permute(&perm)?;
        let c = super::elementwise::cast(x, &moved, x.dtype)?;
        return logsumexp(&c, &Layout::contiguous(moved.shape().clone()), last);
    }
    let cols = l.dims()[dim];
    let rows = l.elem_count() / cols.max(1);
    let out = CudaStorage::alloc(x.dev(), rows, x.dtype)?;
    if rows == 0 {
        return Ok(out);
    }
    if cols == 0 {
        // The log of an empty sum.
        super::elementwise::fill(&out, f64::NEG_INFINITY)?;
        return Ok(out);
    }
    let name = match x.dtype {
        DType::F16 => "logsumexp_f16",
        DType::BF16 => "logsumexp_bf16",
        DType::F32 => "logsumexp_f32",
        _ => "logsumexp_f64",
    };
    // A thread per 16 bytes of the row, 32 to 256 threads.
    let per_pack = 16 / x.dtype.size_in_bytes();
    let block = cols
        .div_ceil(per_pack)
        .next_multiple_of(32)
        .clamp(32, BLOCK);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (x_ptr, cols64) = (x.ptr_at(l.offset()), cols as u64);
    // SAFETY: x holds rows*cols contiguous elements from `x_ptr`, out holds `rows`; matches
    // `logsumexp_<T>`.
    unsafe {
        x.dev().call(
            KernelSource::Softmax,
            name,
            cfg,
            &mut [&mut { x_ptr }, &mut { out.buf.ptr }, &mut { cols64 }],
        )
    }?;
    Ok(out)
}
