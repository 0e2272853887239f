//! The `sparse` suite: SpMV and SpMM (64 dense columns) of f32 CSR matrices with a million
//! rows, beside `torch.sparse_csr` in `bench/torch_bench.py`, which builds the same matrices
//! from the same hash (`bench_matrix` there). Effective bandwidth counts row pointers,
//! column indices and values once, the dense operand read once and the result written once.

use crate::suites::Ctx;
use kiln::sparse::Csr;
use kiln::{DType, Device, Result, Tensor};

/// The matrices: the seeds' 1M-node cycle, 16 uniformly random entries per row, and a
/// power-law graph (Pareto out-degrees of shape 1.5 from 4 up, capped at n/8).
pub const MATRICES: [&str; 3] = ["cycle", "random16", "powerlaw"];

/// SplitMix64's finaliser: the hash both benchmark programs draw the matrices from.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `(row_ptr, col_idx)` of matrix `kind` (one of [`MATRICES`]) with `n` rows and columns,
/// each row sorted by column (repeats kept). Matches `bench_matrix` in
/// `bench/torch_bench.py` entry for entry; `bench/tools/cpu_micro` times the same matrices.
///
/// ```
/// let (row_ptr, col_idx) = kiln_bench::bench_matrix("random16", 64);
/// assert_eq!((row_ptr.len(), col_idx.len()), (65, 16 * 64));
/// ```
pub fn bench_matrix(kind: &str, n: usize) -> (Vec<i64>, Vec<i64>) {
    let degree = |i: usize| -> usize {
        match kind {
            "cycle" => 1,
            "random16" => 16,
            _ => {
                let u = ((mix(0xD0 ^ i as u64) >> 11) + 1) as f64 * (1.0f64 / (1u64 << 53) as f64);
                ((4.0 * u.powf(-2.0 / 3.0)).floor() as usize).min(n / 8)
            }
        }
    };
    let (mut row_ptr, mut col_idx) = (vec![0i64], Vec::new());
    for i in 0..n {
        let start = col_idx.len();
        for j in 0..degree(i) {
            col_idx.push(match kind {
                "cycle" => ((i + 1) % n) as i64,
                _ => (mix(0xC0 ^ ((i as u64) << 24 | j as u64)) % n as u64) as i64,
            });
        }
        col_idx[start..].sort_unstable();
        row_ptr.push(col_idx.len() as i64);
    }
    (row_ptr, col_idx)
}

pub(crate) fn sparse(ctx: &mut Ctx) -> Result<()> {
    let n = if ctx.quick { 1 << 16 } else { 1 << 20 };
    let cols = 64;
    // `KILN_SPARSE_ENGINE=kiln|cusparse` forces the code of CUDA products (to compare).
    #[cfg(feature = "cuda")]
    {
        use kiln::cuda::{set_sparse_engine, SparseEngine};
        set_sparse_engine(match std::env::var("KILN_SPARSE_ENGINE").as_deref() {
            Ok("kiln") => SparseEngine::Kiln,
            Ok("cusparse") => SparseEngine::Library,
            _ => SparseEngine::Measure,
        });
    }
    // `KILN_BENCH_MATRICES=random16,powerlaw` runs a subset (for profiling one).
    let only = std::env::var("KILN_BENCH_MATRICES").ok();
    for kind in MATRICES {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|m| m == kind))
        {
            continue;
        }
        let (rp, ci) = bench_matrix(kind, n);
        let nnz = ci.len();
        let cpu = Device::Cpu;
        let values = ctx.randn(&[nnz], DType::F32)?;
        let a = Csr::new(
            n,
            n,
            &Tensor::from_vec(rp, n + 1, &cpu)?,
            &Tensor::from_vec(ci, nnz, &cpu)?,
            &values,
        )?;
        let index_bytes = a.index_type().dtype().size_in_bytes() as f64;
        let matrix_bytes = index_bytes * (n + 1 + nnz) as f64 + 4.0 * nnz as f64;
        let x = ctx.randn(&[n], DType::F32)?;
        let ms = ctx.timer.median_ms(|| a.matmul(&x).map(drop))?;
        ctx.bandwidth(
            "sparse",
            format!("sparse/{kind}/spmv"),
            ms,
            matrix_bytes + 8.0 * n as f64,
        );
        let xm = ctx.randn(&[n, cols], DType::F32)?;
        let ms = ctx.timer.median_ms(|| a.matmul(&xm).map(drop))?;
        ctx.bandwidth(
            "sparse",
            format!("sparse/{kind}/spmm{cols}"),
            ms,
            matrix_bytes + 8.0 * (n * cols) as f64,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_have_the_documented_shape() {
        let n = 1 << 14;
        let (rp, ci) = bench_matrix("cycle", n);
        assert_eq!((rp[n], ci[0], ci[n - 1]), (n as i64, 1, 0));
        let (rp, _) = bench_matrix("random16", n);
        assert_eq!(rp[n], 16 * n as i64);
        let (rp, ci) = bench_matrix("powerlaw", n);
        let longest = rp.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(
            rp[n] > 9 * n as i64 && rp[n] < 14 * n as i64,
            "{} entries",
            rp[n]
        );
        assert!(longest > 200, "longest row {longest}");
        assert!(ci.iter().all(|&c| (0..n as i64).contains(&c)));
        // Pinned to what `bench_matrix` in bench/torch_bench.py gives (printed there for
        // n = 2^14): the two programs must build the same matrices.
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!((rp[n], longest), (178_472, 2048));
        assert_eq!(
            bench_matrix("random16", n).1[..5],
            [941, 1638, 2377, 3172, 3819]
        );
    }
}
