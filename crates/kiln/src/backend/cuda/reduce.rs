//! Reductions on CUDA. Every reduction becomes one of two shapes over a contiguous input:
//! rows (`[rows, cols]`, reduce each row) or columns (`[R, C]`, reduce over R). A layout that
//! is neither is first copied into rows form (kept dims first, reduced dims last), unless
//! the reduced dims surround the kept ones in a contiguous input (two passes, no copy); a few
//! short columns run as strided rows. Long reductions are split across blocks, with a second
//! pass over the partial results.

use super::compile::KernelSource;
use super::launch::{kernel_names, name_for};
use super::CudaStorage;
use crate::layout::Layout;
use crate::op::ReduceOp;
use crate::shape::DimVec;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;

const ROWS: [&str; 7] = kernel_names!("reduce_rows");
const PARTS: [&str; 7] = kernel_names!("reduce_parts");
const COLS: [&str; 7] = kernel_names!("reduce_cols");
const PLANES: [&str; 7] = kernel_names!("reduce_planes");

fn op_code(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        ReduceOp::Min => 2,
        ReduceOp::ArgMax => 3,
        ReduceOp::ArgMin => 4,
    }
}

/// The accumulator dtype of the kernels (`Compute<T>`): f32 for 16-bit floats.
fn acc_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

pub(super) fn reduce(
    x: &CudaStorage,
    l: &Layout,
    dims: &[usize],
    op: ReduceOp,
) -> Result<CudaStorage> {
    let kept: DimVec = (0..l.rank()).filter(|d| !dims.contains(d)).collect();
    let n_out: usize = kept.iter().map(|&d| l.dims()[d]).product();
    let n_red: usize = dims.iter().map(|&d| l.dims()[d]).product();
    let out_dtype = if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        DType::I64
    } else {
        x.dtype
    };
    let out = CudaStorage::alloc(x.dev(), n_out, out_dtype)?;
    if n_out == 0 {
        return Ok(out);
    }
    if n_red == 0 {
        // Only sums reach here (the tensor layer rejects empty max/min): the sum is zero.
        super::elementwise::fill(&out, 0.0)?;
        return Ok(out);
    }
    let perm: DimVec = kept.iter().chain(dims.iter()).copied().collect();
    let rows_layout = l.permute(&perm)?;
    // The reduced dims outermost in memory, the kept ones inside in their own order: a
    // column reduction of contiguous memory (e.g. the column sums of a transposed view,
    // which would otherwise be copied first).
    let outer: DimVec = dims.iter().chain(kept.iter()).copied().collect();
    let cols_layout = l.permute(&outer)?;
    if rows_layout.is_contiguous() {
        rows(
            x,
            rows_layout.offset(),
            (n_out, n_red),
            (n_red, 1),
            op,
            &out,
        )?;
    } else if cols_layout.is_contiguous() {
        if n_out < SMALL_COLS && n_red * n_out <= SMALL_COLS_ELEMENTS {
            // A few short columns (a narrow layer's bias gradient): each a strided row, one
            // launch, where the column kernel would split R and fold the splits in a second.
            rows(
                x,
                cols_layout.offset(),
                (n_out, n_red),
                (1, n_out),
                op,
                &out,
            )?;
        } else {
            cols(x, cols_layout.offset(), n_red, n_out, op, &out)?;
        }
    } else if let Some((outer, inner)) = outer_and_inner(l, dims, op, x.dtype) {
        // Reduced dims on both sides of the kept ones (a convolution's bias gradient over N, H
        // and W): planes folded into partials per kept index, then the partials' columns,
        // instead of copying the whole input into rows form.
        planes(x, l.offset(), (outer, n_out, inner), op, &out)?;
    } else {
        let c = super::elementwise::cast(x, &rows_layout, x.dtype)?;
        rows(&c, 0, (n_out, n_red), (n_red, 1), op, &out)?;
    }
    Ok(out)
}

/// For a contiguous input whose reduced dims are a leading and a trailing run around the
/// kept ones, the element counts of the two runs; `None` otherwise, and for reductions a
/// two-pass order would change: arg-reductions and integer sums. (16-bit float sums keep
/// their partial sums in f32, as the rows path does.)
fn outer_and_inner(
    l: &Layout,
    dims: &[usize],
    op: ReduceOp,
    dtype: DType,
) -> Option<(usize, usize)> {
    let exact = match op {
        ReduceOp::Max | ReduceOp::Min => true,
        ReduceOp::Sum => dtype.is_float(),
        ReduceOp::ArgMax | ReduceOp::ArgMin => false,
    };
    if !exact || !l.is_contiguous() {
        return None;
    }
    let rank = l.rank();
    let lead = (0..rank).take_while(|d| dims.contains(d)).count();
    let trail = (0..rank).rev().take_while(|d| dims.contains(d)).count();
    if lead == 0 || trail == 0 || lead + trail != dims.len() || lead + trail >= rank {
        return None;
    }
    let d = l.dims();
    Some((
        d[..lead].iter().product(),
        d[rank - trail..].iter().product(),
    ))
}

/// Reduces a contiguous `[outer, kept, inner]` over `outer` and `inner` (sum, max or min):
/// `reduce_planes` into `[splits, kept]` partials (a block per kept index and split, about
/// four blocks per multiprocessor in all), then [`fold_parts`] (`[kept, splits]`).
fn planes(
    x: &CudaStorage,
    offset: usize,
    (outer, kept, inner): (usize, usize, usize),
    op: ReduceOp,
    out: &CudaStorage,
) -> Result<()> {
    let dev = x.dev();
    let splits = (4 * dev.info.multiprocessors)
        .div_ceil(kept)
        .clamp(1, outer.clamp(1, 1024));
    let vec_width = 16 / x.dtype.size_in_bytes();
    let x_ptr = x.ptr_at(offset);
    let vec = i32::from(x_ptr.is_multiple_of(16) && inner.is_multiple_of(vec_width));
    let pv = CudaStorage::alloc(dev, splits * kept, acc_dtype(x.dtype))?;
    let pi = CudaStorage::alloc(dev, splits * kept, DType::I64)?;
    let code = op_code(op);
    let cfg = LaunchConfig {
        grid_dim: (kept as u32, splits as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: x holds outer*kept*inner contiguous elements from x_ptr (the caller's
    // contiguous layout); the partial buffers hold splits*kept entries; matches
    // `reduce_planes_<T>`.
    unsafe {
        dev.call(
            KernelSource::Reduce,
            name_for(&PLANES, x.dtype),
            cfg,
            &mut [
                &mut { x_ptr },
                &mut { outer as u64 },
                &mut { kept as u64 },
                &mut { inner as u64 },
                &mut { code },
                &mut { vec },
                &mut { pv.buf.ptr },
                &mut { pi.buf.ptr },
            ],
        )
    }?;
    fold_parts(x, (&pv, &pi), (kept, splits), op, out)
}

/// The second pass of a split reduction: `rows` rows of `splits` partials (`[rows, splits]`,
/// values and indices) folded into `out`, one block per row (`reduce_parts`).
fn fold_parts(
    x: &CudaStorage,
    (pv, pi): (&CudaStorage, &CudaStorage),
    (rows, splits): (usize, usize),
    op: ReduceOp,
    out: &CudaStorage,
) -> Result<()> {
    let (ov, oi) = out_ptrs(out, op);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: pv and pi hold rows*splits partials; out holds `rows` results; matches
    // `reduce_parts_<T>`.
    unsafe {
        x.dev().call(
            KernelSource::Reduce,
            name_for(&PARTS, x.dtype),
            cfg,
            &mut [
                &mut { pv.buf.ptr },
                &mut { pi.buf.ptr },
                &mut { splits as u64 },
                &mut { op_code(op) },
                &mut { ov },
                &mut { oi },
            ],
        )
    }
}

/// Output pointers: (values, indices); the one `op` does not write is null. (An i64 sum
/// writes values, an argmax of any dtype writes indices: the op decides, not the dtype.)
fn out_ptrs(out: &CudaStorage, op: ReduceOp) -> (u64, u64) {
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        (0, out.buf.ptr)
    } else {
        (out.buf.ptr, 0)
    }
}

/// Column reductions of fewer columns than this, over at most [`SMALL_COLS_ELEMENTS`]
/// elements, run as strided rows (one launch; their reads are uncoalesced, which only small
/// problems can afford).
const SMALL_COLS: usize = 32;
const SMALL_COLS_ELEMENTS: usize = 1 << 16;

/// Reduces `rows` rows of `cols` elements: row `r` starts `r * rstride` elements after
/// `offset`, its elements `estride` apart.
fn rows(
    x: &CudaStorage,
    offset: usize,
    (rows, cols): (usize, usize),
    (rstride, estride): (usize, usize),
    op: ReduceOp,
    out: &CudaStorage,
) -> Result<()> {
    let dev = x.dev();
    let sms = dev.info.multiprocessors;
    let vec_width = 16 / x.dtype.size_in_bytes();
    // Enough blocks to fill the device: split long rows when there are few of them.
    let mut splits = 1;
    if rows < 4 * sms && cols >= 8192 {
        splits = (4 * sms).div_ceil(rows).min(cols / 4096).clamp(1, 1024);
    }
    let mut chunk = cols.div_ceil(splits);
    chunk = chunk.div_ceil(vec_width) * vec_width;
    let splits = cols.div_ceil(chunk);
    let x_ptr = x.ptr_at(offset);
    let vec: i32 = (estride == 1
        && x_ptr.is_multiple_of(16)
        && rstride.is_multiple_of(vec_width)
        && cols.is_multiple_of(vec_width)) as i32;
    let code = op_code(op);
    let (ov, oi) = out_ptrs(out, op);
    let (rows64, cols64, chunk64) = (rows as u64, cols as u64, chunk as u64);
    let (rstride64, estride64) = (rstride as u64, estride as u64);
    let block = if chunk >= 4096 { 512 } else { 256 };
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, splits as u32, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    };
    let name = name_for(&ROWS, x.dtype);
    if splits == 1 {
        let null = 0u64;
        // SAFETY: x holds every element the strides reach (row r's element j at
        // r*rstride + j*estride < the layout's extent, checked by the layouts above); out
        // holds `rows` results; matches `reduce_rows_<T>`.
        unsafe {
            dev.call(
                KernelSource::Reduce,
                name,
                cfg,
                &mut [
                    &mut { x_ptr },
                    &mut { rows64 },
                    &mut { cols64 },
                    &mut { rstride64 },
                    &mut { estride64 },
                    &mut { chunk64 },
                    &mut { code },
                    &mut { vec },
                    &mut { null },
                    &mut { null },
                    &mut { ov },
                    &mut { oi },
                ],
            )
        }?;
        return Ok(());
    }
    let pv = CudaStorage::alloc(dev, rows * splits, acc_dtype(x.dtype))?;
    let pi = CudaStorage::alloc(dev, rows * splits, DType::I64)?;
    let (null_v, null_i) = (0u64, 0u64);
    // SAFETY: as above; the partial buffers hold rows*splits entries.
    unsafe {
        dev.call(
            KernelSource::Reduce,
            name,
            cfg,
            &mut [
                &mut { x_ptr },
                &mut { rows64 },
                &mut { cols64 },
                &mut { rstride64 },
                &mut { estride64 },
                &mut { chunk64 },
                &mut { code },
                &mut { vec },
                &mut { pv.buf.ptr },
                &mut { pi.buf.ptr },
                &mut { null_v },
                &mut { null_i },
            ],
        )
    }?;
    fold_parts(x, (&pv, &pi), (rows, splits), op, out)
}

fn cols(
    x: &CudaStorage,
    offset: usize,
    r: usize,
    c: usize,
    op: ReduceOp,
    out: &CudaStorage,
) -> Result<()> {
    let dev = x.dev();
    let block = 256usize;
    let col_blocks = c.div_ceil(block);
    // Split R so that about 4 blocks per multiprocessor run.
    let splits = (4 * dev.info.multiprocessors)
        .div_ceil(col_blocks)
        .min(r.div_ceil(16))
        .clamp(1, 1024);
    let rchunk = r.div_ceil(splits);
    let splits = r.div_ceil(rchunk);
    let name = name_for(&COLS, x.dtype);
    let code = op_code(op);
    let (ov, oi) = out_ptrs(out, op);
    let x_ptr = x.ptr_at(offset);
    let null = 0u64;
    let (r64, c64, rchunk64) = (r as u64, c as u64, rchunk as u64);
    let cfg = LaunchConfig {
        grid_dim: (col_blocks as u32, splits as u32, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    if splits == 1 {
        // SAFETY: x holds r*c elements from x_ptr; out holds c results.
        return unsafe {
            cols_launch(
                dev,
                name,
                cfg,
                (x_ptr, null, null),
                (r64, c64, rchunk64),
                code,
                (null, null),
                (ov, oi),
            )
        };
    }
    let pv = CudaStorage::alloc(dev, splits * c, acc_dtype(x.dtype))?;
    let pi = CudaStorage::alloc(dev, splits * c, DType::I64)?;
    let parts = (pv.buf.ptr, pi.buf.ptr);
    // SAFETY: as above; the partial buffers hold splits*c entries.
    unsafe {
        cols_launch(
            dev,
            name,
            cfg,
            (x_ptr, null, null),
            (r64, c64, rchunk64),
            code,
            parts,
            (null, null),
        )
    }?;
    // Second pass: the partials are [splits, c]; fold them in one split.
    let splits64 = splits as u64;
    let cfg = LaunchConfig {
        grid_dim: (col_blocks as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: reads the splits*c partials written above; out holds c results.
    unsafe {
        cols_launch(
            dev,
            name,
            cfg,
            (null, parts.0, parts.1),
            (splits64, c64, splits64),
            code,
            (null, null),
            (ov, oi),
        )
    }
}

/// One launch of `reduce_cols_<T>`: folds `rows` rows (`rchunk` per split) of `input` (the
/// data pointer, or null and the (values, indices) of partials), writing partials or results.
///
/// # Safety
/// The pointers must address buffers of the sizes the kernel reads and writes for these
/// extents (see reduce.cu), on `dev`.
#[allow(clippy::too_many_arguments)]
unsafe fn cols_launch(
    dev: &super::CudaDevice,
    name: &'static str,
    cfg: LaunchConfig,
    input: (u64, u64, u64),
    (rows, c, rchunk): (u64, u64, u64),
    code: i32,
    partials: (u64, u64),
    out: (u64, u64),
) -> Result<()> {
    let args: &mut [&mut dyn super::device::KernelArg] = &mut [
        &mut { input.0 },
        &mut { input.1 },
        &mut { input.2 },
        &mut { rows },
        &mut { c },
        &mut { rchunk },
        &mut { code },
        &mut { partials.0 },
        &mut { partials.1 },
        &mut { out.0 },
        &mut { out.1 },
    ];
    // SAFETY: forwarded to the caller; the list matches `reduce_cols_<T>`.
    unsafe { dev.call(KernelSource::Reduce, name, cfg, args) }
}
