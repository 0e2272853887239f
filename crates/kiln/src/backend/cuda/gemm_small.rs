//! kiln's own kernel for small f32 matrix products (`kernels/gemm.cu`): 16×16 tiles of the
//! output, the inner dimension split four ways inside each block and summed in a fixed order.
//! It is one more candidate for the cuBLASLt plan's tuner (see `gemm_lt.rs`). It is meant for
//! products with few outputs over a long inner dimension, where cuBLASLt's algorithms use few
//! of the SMs.

use super::compile::KernelSource;
use super::gemm_lt::{Epilogue, Problem};
use super::CudaDevice;
use crate::{DType, Result};
use cudarc::driver::LaunchConfig;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which code computes CUDA matrix products that kiln's small kernel can take (see
/// [`set_gemm_engine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmEngine {
    /// cuBLASLt's candidates and kiln's kernel, whichever measured fastest for the problem
    /// (the default).
    Measure,
    /// kiln's kernel wherever it applies (f32 without TF32; no epilogue, a bias, or a bias
    /// and ReLU; at most 2¹⁹ outputs per product).
    Kiln,
    /// cuBLASLt only.
    Library,
}

/// The forced engine's code; `UNSET` until [`set_gemm_engine`] is called, when
/// `KILN_GEMM_ENGINE` (`measure`, `kiln` or `library`) decides.
static ENGINE: AtomicU8 = AtomicU8::new(UNSET);
const UNSET: u8 = u8::MAX;

/// Forces the code that computes CUDA matrix products in this process, for tests and
/// measurements (`KILN_GEMM_ENGINE=kiln|library|measure` does the same from the
/// environment); [`GemmEngine::Measure`] restores the default. Each engine keeps plans of
/// its own, so a switch never reuses another engine's choice.
pub fn set_gemm_engine(engine: GemmEngine) {
    let code = match engine {
        GemmEngine::Measure => 0,
        GemmEngine::Kiln => 1,
        GemmEngine::Library => 2,
    };
    ENGINE.store(code, Ordering::Relaxed);
}

pub(super) fn engine() -> GemmEngine {
    static FROM_ENV: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    let mut code = ENGINE.load(Ordering::Relaxed);
    if code == UNSET {
        code = *FROM_ENV.get_or_init(|| match std::env::var("KILN_GEMM_ENGINE").as_deref() {
            Ok("kiln") => 1,
            Ok("library") => 2,
            _ => 0,
        });
    }
    match code {
        1 => GemmEngine::Kiln,
        2 => GemmEngine::Library,
        _ => GemmEngine::Measure,
    }
}

const TILE: usize = 16;
const SLICES: u32 = 4;
/// Products with more outputs than this are left to cuBLASLt (the kernel reads each operand
/// once per tile, which only pays while the tiles are few).
const MAX_OUTPUTS: usize = 1 << 19;

/// Whether the kernel can compute `p` with `epilogue`.
pub(super) fn applies(p: &Problem, epilogue: Epilogue) -> bool {
    p.dtype == DType::F32
        && !p.tf32
        && matches!(
            epilogue,
            Epilogue::None | Epilogue::Bias(_) | Epilogue::BiasRelu(_)
        )
        && p.m * p.n <= MAX_OUTPUTS
        && (1..=65_535).contains(&p.batch)
        && p.m > 0
        && p.n > 0
}

/// Computes `p` with kiln's kernel.
///
/// # Safety
/// As `gemm_lt::matmul`: the operands' pointers, leading dimensions and batch strides
/// describe memory inside live device buffers of f32; D holds `batch·m·n` elements and the
/// bias (if any) `m`. `applies(p, epilogue)` must hold.
pub(super) unsafe fn run(dev: &CudaDevice, p: &Problem, epilogue: Epilogue) -> Result<()> {
    debug_assert!(applies(p, epilogue));
    let (bias, relu): (u64, i32) = match epilogue {
        Epilogue::None => (0, 0),
        Epilogue::Bias(b) => (b, 0),
        Epilogue::BiasRelu(b) => (b, 1),
        _ => unreachable!("checked by `applies`"),
    };
    let cfg = LaunchConfig {
        grid_dim: (
            p.m.div_ceil(TILE) as u32,
            p.n.div_ceil(TILE) as u32,
            p.batch as u32,
        ),
        block_dim: (TILE as u32, TILE as u32, SLICES),
        shared_mem_bytes: 0,
    };
    let (m, n, k) = (p.m as u64, p.n as u64, p.k as u64);
    let (lda, ldb) = (p.a.ld as u64, p.b.ld as u64);
    let (a_batch, b_batch) = (p.a.batch_stride as u64, p.b.batch_stride as u64);
    let (ta, tb) = (p.a.transposed as i32, p.b.transposed as i32);
    // SAFETY: the caller's contract covers every pointer; the arguments match
    // `gemm_small_f32` in kernels/gemm.cu; the grid covers m×n×batch in 16×16 tiles.
    unsafe {
        dev.call(
            KernelSource::Gemm,
            "gemm_small_f32",
            cfg,
            &mut [
                &mut { p.d },
                &mut { p.a.ptr },
                &mut { p.b.ptr },
                &mut { bias },
                &mut { m },
                &mut { n },
                &mut { k },
                &mut { lda },
                &mut { ldb },
                &mut { a_batch },
                &mut { b_batch },
                &mut { ta },
                &mut { tb },
                &mut { relu },
            ],
        )
    }
}
