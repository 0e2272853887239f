//! CSR products on CUDA (kernels in `kernels/sparse.cu`), balanced by entries: rows of up
//! to [`LONG_ROW`](crate::backend::sparse::LONG_ROW) entries go to `lanes` threads each (1 to 32, from the mean row length:
//! the vector-per-row scheme), longer rows are cut into pieces of at most
//! `LONG_ROW_PIECE` entries, one warp each, whose partial sums one thread per row adds up.
//! SpMM gives each row a group of lanes that hold 4 columns each (or 16 bytes of columns,
//! read with one load, where X's rows are aligned), measured like SpMV's lanes. `Aᵀ·X` scatters with
//! atomics into an f32/f64 accumulator (no transpose is built).

use super::compile::KernelSource;
use super::launch::BLOCK;
use super::CudaStorage;
use crate::backend::sparse::{CsrProduct, CsrRef, SparseStorage};
use crate::layout::Layout;
use crate::{DType, Error, Result};
use cudarc::driver::LaunchConfig;

/// Kernel names per value dtype (f16, bf16, f32, f64) and index dtype (u32, i64).
macro_rules! sparse_names {
    ($p:literal) => {
        [
            [concat!($p, "_f16_u32"), concat!($p, "_f16_i64")],
            [concat!($p, "_bf16_u32"), concat!($p, "_bf16_i64")],
            [concat!($p, "_f32_u32"), concat!($p, "_f32_i64")],
            [concat!($p, "_f64_u32"), concat!($p, "_f64_i64")],
        ]
    };
}

const SPMV_ROWS: [[&str; 2]; 4] = sparse_names!("spmv_rows");
const SPMV_PIECES: [[&str; 2]; 4] = sparse_names!("spmv_pieces");
const SPMM_ROWS: [[&str; 2]; 4] = sparse_names!("spmm_rows");
const SPMM_PIECES: [[&str; 2]; 4] = sparse_names!("spmm_pieces");
const SPMM_ROWS_VEC: [[&str; 2]; 4] = sparse_names!("spmm_rows_vec");
const SPMM_PIECES_VEC: [[&str; 2]; 4] = sparse_names!("spmm_pieces_vec");
const SPMM_T_ROWS: [[&str; 2]; 4] = sparse_names!("spmm_t_rows");
const SPMM_T_PIECES: [[&str; 2]; 4] = sparse_names!("spmm_t_pieces");
const SAMPLED_ROWS: [[&str; 2]; 4] = sparse_names!("sampled_rows");
const SAMPLED_PIECES: [[&str; 2]; 4] = sparse_names!("sampled_pieces");
const FINISH: [&str; 4] = [
    "csr_finish_f16",
    "csr_finish_bf16",
    "csr_finish_f32",
    "csr_finish_f64",
];
const ACC_INIT: [&str; 4] = [
    "csr_acc_init_f16",
    "csr_acc_init_bf16",
    "csr_acc_init_f32",
    "csr_acc_init_f64",
];

fn float_index(dtype: DType, op: &'static str) -> Result<usize> {
    match dtype {
        DType::F16 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F32 => Ok(2),
        DType::F64 => Ok(3),
        dtype => Err(Error::UnsupportedDType { op, dtype }),
    }
}

fn index_index(dtype: DType, op: &'static str) -> Result<usize> {
    match dtype {
        DType::U32 => Ok(0),
        DType::I64 => Ok(1),
        dtype => Err(Error::UnsupportedDType { op, dtype }),
    }
}

/// The accumulation dtype of `dtype`'s kernels.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Threads per row for rows of `mean` entries: the power of two at or above it, 1 to 32.
/// `KILN_SPMV_LANES` overrides it (for measuring).
fn lanes_for(nnz: usize, rows: usize) -> u32 {
    if let Some(l) = std::env::var("KILN_SPMV_LANES")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|l| l.is_power_of_two() && *l <= 32)
    {
        return l;
    }
    let mean = nnz.div_ceil(rows.max(1)).max(1);
    (mean.next_power_of_two() as u32).min(32)
}

/// Which code computes `A·X` on CUDA (see [`set_sparse_engine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SparseEngine {
    /// kiln's kernels or cuSPARSE, whichever measured faster for the matrix (the default).
    Measure,
    /// kiln's kernels only.
    Kiln,
    /// cuSPARSE wherever it can (f32/f64 values, `beta = 0`, unit-stride vectors or row-major
    /// matrices), kiln's kernels elsewhere.
    Library,
}

static ENGINE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Forces the code that computes sparse products on CUDA in this process, for tests and
/// measurements; [`SparseEngine::Measure`] restores the default.
pub fn set_sparse_engine(engine: SparseEngine) {
    let code = match engine {
        SparseEngine::Measure => 0,
        SparseEngine::Kiln => 1,
        SparseEngine::Library => 2,
    };
    ENGINE.store(code, std::sync::atomic::Ordering::Relaxed);
}

static SPMM_GROUP: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Forces the lanes per row (a power of two, 1 to 32) of kiln's SpMM kernels in this
/// process instead of measuring them per matrix, for tests and measurements; `None` restores
/// the measured choice.
///
/// # Panics
/// If `group` is not a power of two from 1 to 32.
pub fn set_spmm_group(group: Option<u32>) {
    let g = group.unwrap_or(0);
    assert!(
        g == 0 || (g.is_power_of_two() && g <= 32),
        "set_spmm_group: {g} lanes per row is not a power of two from 1 to 32"
    );
    SPMM_GROUP.store(g, std::sync::atomic::Ordering::Relaxed);
}

fn engine() -> SparseEngine {
    match ENGINE.load(std::sync::atomic::Ordering::Relaxed) {
        1 => SparseEngine::Kiln,
        2 => SparseEngine::Library,
        _ => SparseEngine::Measure,
    }
}

/// Prints each measured choice to stderr when `KILN_SPARSE_LOG=1`.
fn log_choice(a: &CsrRef<'_, CudaStorage>, n: u64, what: std::fmt::Arguments) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var("KILN_SPARSE_LOG").is_ok_and(|v| v == "1")) {
        eprintln!(
            "kiln sparse: {}x{} with {} entries, {n} column(s): {what}",
            a.rows, a.cols, a.nnz
        );
    }
}

/// Threads per row of the row kernel for `a` times an operand of `n` columns: measured once
/// per pattern and column class among the powers of two around [`lanes_for`]'s guess (SpMV)
/// or the group covering `n` columns in 4 steps (SpMM), and kept in the pattern's
/// [`crate::backend::sparse::Tuning`]. Inside a graph capture (no timing there) the guess.
/// `KILN_SPMV_LANES` forces the SpMV choice.
fn threads_per_row(
    dev: &super::CudaDevice,
    a: &CsrRef<'_, CudaStorage>,
    n: u64,
    per_lane: u64,
    run: &dyn Fn(u32) -> Result<()>,
) -> Result<u32> {
    let key = threads_key(n, per_lane);
    let guess = if n == 1 {
        if std::env::var("KILN_SPMV_LANES").is_ok() {
            return Ok(lanes_for(a.nnz, a.rows));
        }
        lanes_for(a.nnz, a.rows)
    } else {
        match SPMM_GROUP.load(std::sync::atomic::Ordering::Relaxed) {
            0 => group_for(n, per_lane),
            forced => return Ok(forced),
        }
    };
    if let Some(t) = a.tuning.get(key) {
        return Ok(t as u32);
    }
    if dev.capturing() || a.rows < MEASURED_ROWS || a.tuning.count_use(key) < MEASURE_AT_USE {
        return Ok(guess);
    }
    let candidates: Vec<u32> = if n == 1 {
        vec![1, 2, 4, 8, 16, 32]
    } else {
        [guess / 2, guess, guess * 2]
            .into_iter()
            .filter(|g| (1..=32).contains(g))
            .collect()
    };
    let best = super::launch::fastest(dev, candidates.len(), [2, 3], |i| run(candidates[i]))?
        .map_or(guess, |i| candidates[i]);
    a.tuning.set(key, best as u64);
    log_choice(
        a,
        n,
        format_args!("{best} threads per row (of {candidates:?}; guess {guess})"),
    );
    Ok(best)
}

/// The SpMM row group whose lanes, `per_lane` columns each, cover `n` columns in one tile
/// (1 to 32 lanes).
fn group_for(n: u64, per_lane: u64) -> u32 {
    (n.div_ceil(per_lane).next_power_of_two() as u32).clamp(1, 32)
}

/// The tuning key of a product's thread count: SpMV, or SpMM of a column class (the
/// columns [`group_for`] maps to one group, and the columns per lane).
fn threads_key(n: u64, per_lane: u64) -> u64 {
    if n == 1 {
        1
    } else {
        2 << 32 | per_lane << 8 | group_for(n, per_lane) as u64
    }
}

/// Whether cuSPARSE computes this product: once kiln's kernels have their measured thread
/// count for the pattern, both are timed once (whole products) and the faster is kept.
fn use_library(
    dev: &super::CudaDevice,
    a: &CsrRef<'_, CudaStorage>,
    n: u64,
    per_lane: u64,
    kiln_kernels: &dyn Fn() -> Result<()>,
    library: &dyn Fn() -> Result<()>,
) -> Result<bool> {
    // Per column class, as the thread count.
    let key = 1 << 40 | threads_key(n, per_lane);
    if let Some(choice) = a.tuning.get(key) {
        return Ok(choice == 1);
    }
    if dev.capturing() || a.tuning.get(threads_key(n, per_lane)).is_none() {
        return Ok(false);
    }
    let run = |i: usize| if i == 0 { kiln_kernels() } else { library() };
    let best = super::launch::fastest(dev, 2, [2, 3], run)?.unwrap_or(0);
    a.tuning.set(key, best as u64);
    log_choice(
        a,
        n,
        format_args!("{} measured faster", ["kiln's kernels", "cuSPARSE"][best]),
    );
    Ok(best == 1)
}

/// Patterns with fewer rows run with the guessed thread count (timing them costs more than
/// it saves).
const MEASURED_ROWS: usize = 4096;
/// The use of a pattern at which its choices are measured: one-off products never pay.
const MEASURE_AT_USE: u64 = 3;

fn grid(threads: u64, y: u32) -> Result<LaunchConfig> {
    let blocks = threads.div_ceil(BLOCK as u64).max(1);
    if blocks > i32::MAX as u64 {
        return Err(Error::Msg(format!(
            "sparse product on CUDA: {threads} threads exceed one launch"
        )));
    }
    Ok(LaunchConfig {
        grid_dim: (blocks as u32, y, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// `x` as row-major with unit column stride: `(storage to read, pointer, leading dim)`.
fn row_major(x: &CudaStorage, l: &Layout) -> Result<(Option<CudaStorage>, u64, u64)> {
    let (d, s) = (l.dims(), l.strides());
    let unit_cols = d[1] <= 1 || s[1] == 1;
    if unit_cols && (d[0] <= 1 || s[0] >= d[1]) {
        // One row: its stride is never stepped over, and cuSPARSE wants ld >= n.
        let ld = if d[0] <= 1 { d[1].max(1) } else { s[0] };
        return Ok((None, x.ptr_at(l.offset()), ld as u64));
    }
    let c = super::elementwise::cast(x, l, x.dtype)?;
    let ptr = c.buf.ptr;
    Ok((Some(c), ptr, d[1] as u64))
}

impl SparseStorage for CudaStorage {
    fn csr_matmul(
        a: CsrRef<'_, Self>,
        x: &Self,
        xl: &Layout,
        product: CsrProduct,
        acc: Option<(f64, &Self, &Layout)>,
    ) -> Result<Option<Self>> {
        const OP: &str = "Csr::matmul";
        let (ti, ii) = (
            float_index(a.values.dtype, OP)?,
            index_index(a.row_ptr.dtype, OP)?,
        );
        let dev = a.values.dev();
        let n = xl.dims()[1] as u64;
        let m = if product.transpose { a.cols } else { a.rows } as u64;
        let (_xc, x_ptr, ldx) = row_major(x, xl)?;
        // Y is read as a contiguous [m, n] (copied when it is not), only when beta != 0.
        let (beta, _yc, y_ptr) = match acc {
            Some((beta, y, yl)) if beta != 0.0 => {
                if yl.is_contiguous() {
                    (beta, None, y.ptr_at(yl.offset()))
                } else {
                    let c = super::elementwise::cast(y, yl, y.dtype)?;
                    let p = c.buf.ptr;
                    (beta, Some(c), p)
                }
            }
            _ => (0.0, None, 0u64),
        };
        let (rp, ci, v, pieces) = (
            a.row_ptr.buf.ptr,
            a.col_idx.buf.ptr,
            a.values.buf.ptr,
            a.pieces.buf.ptr,
        );
        let (rows, np, alpha) = (a.rows as u64, a.n_pieces as u64, product.alpha);
        if product.transpose {
            let lanes = lanes_for(a.nnz, a.rows);
            let cd = compute_dtype(a.values.dtype);
            let accum = CudaStorage::alloc(dev, (m * n) as usize, cd)?;
            if accum.len == 0 {
                return Ok(Some(CudaStorage::alloc(dev, 0, a.values.dtype)?));
            }
            let lanes = if n == 1 { lanes } else { 32 };
            // SAFETY (all three launches): every array has the length CsrRef's invariants
            // state; x is [rows, n] with leading dimension ldx, accum and Y are [cols, n]
            // contiguous; the parameter lists match sparse.cu.
            unsafe {
                dev.call(
                    KernelSource::Sparse,
                    ACC_INIT[ti],
                    grid(m * n, 1)?,
                    &mut [
                        &mut { accum.buf.ptr },
                        &mut { m },
                        &mut { n },
                        &mut { beta },
                        &mut { y_ptr },
                        &mut { n },
                    ],
                )?;
                if rows > 0 {
                    dev.call(
                        KernelSource::Sparse,
                        SPMM_T_ROWS[ti][ii],
                        grid(rows * lanes as u64, 1)?,
                        &mut [
                            &mut { rp },
                            &mut { ci },
                            &mut { v },
                            &mut { x_ptr },
                            &mut { ldx },
                            &mut { n },
                            &mut { accum.buf.ptr },
                            &mut { rows },
                            &mut { alpha },
                            &mut { lanes },
                        ],
                    )?;
                }
                if np > 0 {
                    dev.call(
                        KernelSource::Sparse,
                        SPMM_T_PIECES[ti][ii],
                        grid(np * 32, 1)?,
                        &mut [
                            &mut { pieces },
                            &mut { np },
                            &mut { ci },
                            &mut { v },
                            &mut { x_ptr },
                            &mut { ldx },
                            &mut { n },
                            &mut { accum.buf.ptr },
                            &mut { alpha },
                        ],
                    )?;
                }
            }
            if cd == a.values.dtype {
                return Ok(Some(accum));
            }
            let l = Layout::contiguous([m as usize, n as usize]);
            return Ok(Some(super::elementwise::cast(&accum, &l, a.values.dtype)?));
        }
        let out = CudaStorage::alloc(dev, (m * n) as usize, a.values.dtype)?;
        if out.len == 0 {
            return Ok(Some(out));
        }
        let partial = if np > 0 {
            Some(CudaStorage::alloc(
                dev,
                (np * n) as usize,
                compute_dtype(a.values.dtype),
            )?)
        } else {
            None
        };
        let partial_ptr = partial.as_ref().map_or(0, |p| p.buf.ptr);
        // 16-byte loads of X's columns where its rows (and Y's, which has n columns) are
        // aligned to 16 bytes; otherwise 4 columns per lane, read one by one.
        let vector = 16 / a.values.dtype.size_in_bytes() as u64;
        let vec = n > 1
            && n.is_multiple_of(vector)
            && ldx.is_multiple_of(vector)
            && x_ptr.is_multiple_of(16)
            && out.buf.ptr.is_multiple_of(16);
        let per_lane = if vec { vector } else { 4 };
        let (spmm_rows, spmm_pieces) = if vec {
            (SPMM_ROWS_VEC[ti][ii], SPMM_PIECES_VEC[ti][ii])
        } else {
            (SPMM_ROWS[ti][ii], SPMM_PIECES[ti][ii])
        };
        let rows_kernel = |threads: u32| -> Result<()> {
            let t = threads as u64;
            // SAFETY: as above, with out [rows, n] contiguous; any power of two up to 32
            // threads per row is valid for both kernels.
            unsafe {
                if n == 1 {
                    dev.call(
                        KernelSource::Sparse,
                        SPMV_ROWS[ti][ii],
                        grid(rows * t, 1)?,
                        &mut [
                            &mut { rp },
                            &mut { ci },
                            &mut { v },
                            &mut { x_ptr },
                            &mut { ldx },
                            &mut { out.buf.ptr },
                            &mut { rows },
                            &mut { alpha },
                            &mut { beta },
                            &mut { y_ptr },
                            &mut { n },
                            &mut { threads },
                        ],
                    )
                } else {
                    dev.call(
                        KernelSource::Sparse,
                        spmm_rows,
                        grid(rows * t, n.div_ceil(per_lane * t) as u32)?,
                        &mut [
                            &mut { rp },
                            &mut { ci },
                            &mut { v },
                            &mut { x_ptr },
                            &mut { ldx },
                            &mut { n },
                            &mut { out.buf.ptr },
                            &mut { rows },
                            &mut { alpha },
                            &mut { beta },
                            &mut { y_ptr },
                            &mut { n },
                            &mut { threads },
                        ],
                    )
                }
            }
        };
        let threads = threads_per_row(dev, &a, n, per_lane, &rows_kernel)?;
        let long_rows = || -> Result<()> {
            // SAFETY: as above, with `partial` holding n compute-type values per piece.
            unsafe {
                if n == 1 {
                    if np > 0 {
                        dev.call(
                            KernelSource::Sparse,
                            SPMV_PIECES[ti][ii],
                            grid(np * 32, 1)?,
                            &mut [
                                &mut { pieces },
                                &mut { np },
                                &mut { ci },
                                &mut { v },
                                &mut { x_ptr },
                                &mut { ldx },
                                &mut { partial_ptr },
                            ],
                        )?;
                    }
                } else if np > 0 {
                    dev.call(
                        KernelSource::Sparse,
                        spmm_pieces,
                        grid(np * 32, n.div_ceil(per_lane * threads as u64) as u32)?,
                        &mut [
                            &mut { pieces },
                            &mut { np },
                            &mut { ci },
                            &mut { v },
                            &mut { x_ptr },
                            &mut { ldx },
                            &mut { n },
                            &mut { partial_ptr },
                            &mut { threads },
                        ],
                    )?;
                }
                if np > 0 {
                    dev.call(
                        KernelSource::Sparse,
                        FINISH[ti],
                        grid(np * n, 1)?,
                        &mut [
                            &mut { pieces },
                            &mut { np },
                            &mut { partial_ptr },
                            &mut { n },
                            &mut { out.buf.ptr },
                            &mut { alpha },
                            &mut { beta },
                            &mut { y_ptr },
                            &mut { n },
                        ],
                    )?;
                }
            }
            Ok(())
        };
        let kiln_kernels = || -> Result<()> {
            rows_kernel(threads)?;
            long_rows()
        };
        let out_ptr = out.buf.ptr;
        // cuSPARSE computes A·X with beta = 0 from a unit-stride vector or a row-major matrix.
        let by_library = || -> Result<()> {
            // SAFETY: the arrays satisfy CsrRef's invariants, x is [cols, n] with leading
            // dimension ldx and out is [rows, n] contiguous.
            unsafe { super::cusparse::csr_mm(dev, &a, x_ptr, ldx, n, out_ptr, alpha) }
        };
        let library_fits =
            beta == 0.0 && (n > 1 || ldx == 1) && super::cusparse::supports(a.values.dtype);
        let library = match engine() {
            SparseEngine::Kiln => false,
            SparseEngine::Library => library_fits,
            SparseEngine::Measure => {
                library_fits && use_library(dev, &a, n, per_lane, &kiln_kernels, &by_library)?
            }
        };
        if library {
            by_library()?;
        } else {
            kiln_kernels()?;
        }
        Ok(Some(out))
    }

    fn csr_sampled_dot(
        a: CsrRef<'_, Self>,
        lhs: &Self,
        ll: &Layout,
        rhs: &Self,
        rl: &Layout,
    ) -> Result<Self> {
        const OP: &str = "Csr::matmul backward";
        let (ti, ii) = (
            float_index(a.values.dtype, OP)?,
            index_index(a.row_ptr.dtype, OP)?,
        );
        let dev = a.values.dev();
        let out = CudaStorage::alloc(dev, a.nnz, a.values.dtype)?;
        if out.len == 0 {
            return Ok(out);
        }
        let n = ll.dims()[1] as u64;
        let (_lc, l_ptr, ldl) = row_major(lhs, ll)?;
        let (_rc, r_ptr, ldr) = row_major(rhs, rl)?;
        let (rp, ci, pieces) = (a.row_ptr.buf.ptr, a.col_idx.buf.ptr, a.pieces.buf.ptr);
        let (rows, np) = (a.rows as u64, a.n_pieces as u64);
        let lanes = if n == 1 { lanes_for(a.nnz, a.rows) } else { 32 };
        // SAFETY: lhs is [rows, n] (leading dim ldl), rhs [cols, n] (ldr), out [nnz]; the
        // CSR arrays satisfy CsrRef's invariants; the parameter lists match sparse.cu.
        unsafe {
            if rows > 0 {
                dev.call(
                    KernelSource::Sparse,
                    SAMPLED_ROWS[ti][ii],
                    grid(rows * lanes as u64, 1)?,
                    &mut [
                        &mut { rp },
                        &mut { ci },
                        &mut { l_ptr },
                        &mut { ldl },
                        &mut { r_ptr },
                        &mut { ldr },
                        &mut { n },
                        &mut { out.buf.ptr },
                        &mut { rows },
                        &mut { lanes },
                    ],
                )?;
            }
            if np > 0 {
                dev.call(
                    KernelSource::Sparse,
                    SAMPLED_PIECES[ti][ii],
                    grid(np * 32, 1)?,
                    &mut [
                        &mut { pieces },
                        &mut { np },
                        &mut { ci },
                        &mut { l_ptr },
                        &mut { ldl },
                        &mut { r_ptr },
                        &mut { ldr },
                        &mut { n },
                        &mut { out.buf.ptr },
                    ],
                )?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::sparse::LONG_ROW;

    /// The kernels skip rows by the same threshold the host cuts pieces with.
    #[test]
    fn kernels_share_the_long_row_threshold() {
        let src = include_str!("kernels/sparse.cu");
        assert!(src.contains(&format!("#define LONG_ROW {LONG_ROW}\n")));
    }
}
