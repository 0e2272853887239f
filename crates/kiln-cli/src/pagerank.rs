//! `kiln pagerank`: PageRank of an edge-list file or a generated power-law graph, a thin
//! layer of arguments over [`kiln::sparse::graph::pagerank`].

use clap::Args;
use kiln::sparse::graph::{pagerank, EdgeList, PageRankOptions};
use kiln::DType;
use std::io::Write;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PageRankArgs {
    /// Edge list: one `src dst` pair of non-negative integers per line; `#` comments and
    /// blank lines allowed.
    #[arg(
        long,
        conflicts_with = "generate",
        required_unless_present = "generate"
    )]
    pub edges: Option<PathBuf>,
    /// Generate a graph instead: `powerlaw:N` (N nodes, Pareto out-degrees).
    #[arg(long)]
    pub generate: Option<String>,
    /// Probability of following an edge, in [0, 1).
    #[arg(long, default_value_t = 0.85)]
    pub damping: f64,
    /// Stop when the L1 change between iterations is below this.
    #[arg(long, default_value_t = 1e-10)]
    pub tol: f64,
    #[arg(long, default_value_t = 100)]
    pub max_iter: usize,
    /// Device: cpu, cuda, cuda:N, wgpu, wgpu:N, or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Precision of the iteration: f64 (default) or f32.
    #[arg(long, default_value = "f64")]
    pub dtype: String,
    /// Seed of `--generate`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write `node rank` per line, in node order.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Runs the command; a run that does not converge within `--max-iter` is an error (the ranks
/// are still written, so that they can be inspected).
pub fn run(args: &PageRankArgs) -> Result<(), String> {
    let dtype = match args.dtype.as_str() {
        "f64" => DType::F64,
        "f32" => DType::F32,
        other => return Err(format!("--dtype {other}: expected f64 or f32")),
    };
    let opts = PageRankOptions {
        damping: args.damping,
        tol: args.tol,
        max_iter: args.max_iter,
        dtype,
    };
    let device = crate::train::resolve_device(&args.device).map_err(|e| e.to_string())?;
    if let Some(out) = &args.out {
        std::fs::File::create(out).map_err(|e| format!("--out {}: {e}", out.display()))?;
    }
    let graph = match (&args.edges, &args.generate) {
        (Some(path), _) => {
            let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            EdgeList::read(std::io::BufReader::new(f))
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        (None, Some(spec)) => {
            let n = spec
                .strip_prefix("powerlaw:")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| (1..=kiln::sparse::graph::MAX_NODE_ID as usize).contains(&n))
                .ok_or_else(|| {
                    format!("--generate {spec}: expected powerlaw:N with N a positive node count")
                })?;
            EdgeList::power_law(n, args.seed)
        }
        (None, None) => return Err("give --edges FILE or --generate powerlaw:N".into()),
    };
    eprintln!(
        "pagerank of {} nodes, {} edges on {device} ({})",
        graph.nodes,
        graph.src.len(),
        args.dtype
    );
    let pr = pagerank(&graph, &opts, &device).map_err(|e| e.to_string())?;
    println!(
        "iterations {}  final change {:.3e}  {:.3} ms per iteration (median; {:.1} ms in all, \
         setup {:.0} ms)",
        pr.iterations,
        pr.change,
        pr.seconds_per_iter * 1e3,
        pr.total_seconds * 1e3,
        pr.setup_seconds * 1e3
    );
    if let Some(out) = &args.out {
        let ranks = pr.ranks.to_f64_vec().map_err(|e| e.to_string())?;
        let write = || -> std::io::Result<()> {
            let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
            for (node, r) in ranks.iter().enumerate() {
                writeln!(w, "{node} {r:.17e}")?;
            }
            w.flush()
        };
        write().map_err(|e| format!("--out {}: {e}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    if !pr.converged {
        return Err(format!(
            "did not converge: L1 change {:.3e} after {} iterations is above --tol {:.1e}; \
             raise --max-iter or --tol",
            pr.change, pr.iterations, args.tol
        ));
    }
    Ok(())
}
