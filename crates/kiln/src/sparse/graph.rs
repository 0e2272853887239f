//! Graph workloads on sparse matrices: edge lists (read from text or generated) and
//! PageRank by power iteration with [`Csr::matmul`].

use super::Csr;
use crate::{DType, Device, Error, Generator, Result, Tensor};
use std::io::BufRead;
use std::time::Instant;

/// Node ids at or above this are refused: a 10-byte line must not make kiln allocate
/// gigabytes of ranks (2³¹ nodes already take 16 GiB of f64 ranks).
pub const MAX_NODE_ID: u64 = i32::MAX as u64 - 1;

/// A directed graph as edges `src[i] → dst[i]` over nodes `0..nodes`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EdgeList {
    pub nodes: usize,
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
}

impl EdgeList {
    /// Reads one `src dst` pair of non-negative integers per line (whitespace-separated;
    /// `#` starts a comment; blank lines are skipped). The graph has nodes `0..=max id`.
    ///
    /// # Errors
    /// [`Error::InvalidSparse`] naming the line for a line that is not two non-negative
    /// integers, an id above [`MAX_NODE_ID`] or bytes that are not UTF-8; [`Error::Io`] for
    /// read errors.
    ///
    /// ```
    /// # use kiln::sparse::graph::EdgeList;
    /// let g = EdgeList::read("# a triangle\n0 1\n1 2\n\n2 0 # back\n".as_bytes())?;
    /// assert_eq!((g.nodes, g.src.len()), (3, 3));
    /// assert!(EdgeList::read("0 1\n1 x\n".as_bytes()).unwrap_err().to_string().contains("line 2"));
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn read(reader: impl BufRead) -> Result<EdgeList> {
        let mut g = EdgeList::default();
        let mut max_id: Option<u64> = None;
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => Error::InvalidSparse {
                    op: "EdgeList::read",
                    msg: format!("line {}: not UTF-8 text", i + 1),
                },
                _ => e.into(),
            })?;
            let text = line.split('#').next().unwrap_or("");
            let mut fields = text.split_whitespace();
            let Some(first) = fields.next() else { continue };
            let bad = |what: String| Error::InvalidSparse {
                op: "EdgeList::read",
                msg: format!("line {}: {what}: {:?}", i + 1, line.trim_end()),
            };
            let second = fields
                .next()
                .ok_or_else(|| bad("expected two node ids, found one".into()))?;
            if fields.next().is_some() {
                return Err(bad("expected two node ids, found more".into()));
            }
            let mut id = |s: &str| -> Result<u32> {
                let v: u64 = s
                    .parse()
                    .map_err(|_| bad(format!("{s:?} is not a non-negative integer")))?;
                if v > MAX_NODE_ID {
                    return Err(bad(format!("node id {v} is above {MAX_NODE_ID}")));
                }
                max_id = Some(max_id.map_or(v, |m| m.max(v)));
                Ok(v as u32)
            };
            let (s, d) = (id(first)?, id(second)?);
            g.src.push(s);
            g.dst.push(d);
        }
        g.nodes = max_id.map_or(0, |m| m as usize + 1);
        Ok(g)
    }

    /// A random graph of `nodes` nodes whose out-degrees follow a Pareto law (shape 1.5,
    /// at least 4, at most `nodes / 8`: mean about 11, and for a million nodes a few nodes
    /// with tens of thousands of edges) and whose destinations are uniform.
    pub fn power_law(nodes: usize, seed: u64) -> EdgeList {
        let mut rng = Generator::new(seed);
        let cap = (nodes / 8).max(1) as f64;
        let mut g = EdgeList {
            nodes,
            ..EdgeList::default()
        };
        for s in 0..nodes {
            let u = rng.uniform(f64::EPSILON, 1.0);
            let degree = (4.0 * u.powf(-1.0 / 1.5)).min(cap) as usize;
            for _ in 0..degree {
                g.src.push(s as u32);
                g.dst.push(rng.below(nodes) as u32);
            }
        }
        g
    }

    /// Edges sorted by (src, dst) with duplicates removed.
    fn unique_edges(&self) -> Vec<(u32, u32)> {
        let mut pairs: Vec<(u32, u32)> = self
            .src
            .iter()
            .copied()
            .zip(self.dst.iter().copied())
            .collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs
    }
}

/// Settings of [`pagerank`].
#[derive(Clone, Copy, Debug)]
pub struct PageRankOptions {
    /// The probability of following an edge (0.85 by default).
    pub damping: f64,
    /// Stop when the L1 change of the ranks between iterations is below this.
    pub tol: f64,
    pub max_iter: usize,
    /// The dtype the iteration runs in (f64 by default: f32 cannot resolve a change of
    /// 1e-10 over a million ranks).
    pub dtype: DType,
}

impl Default for PageRankOptions {
    fn default() -> Self {
        PageRankOptions {
            damping: 0.85,
            tol: 1e-10,
            max_iter: 100,
            dtype: DType::F64,
        }
    }
}

/// What [`pagerank`] computed.
#[derive(Clone, Debug)]
pub struct PageRank {
    /// One rank per node, summing to 1.
    pub ranks: Tensor,
    pub iterations: usize,
    /// The L1 change of the last iteration.
    pub change: f64,
    /// Whether `change` fell below the tolerance within `max_iter` iterations.
    pub converged: bool,
    /// Median seconds per iteration (wall clock, the read of the change included; the
    /// median leaves out the first iterations' one-time costs: kernel compiles, and the
    /// measurement of the SpMV's launch configuration at its third use).
    pub seconds_per_iter: f64,
    /// Seconds of all iterations together.
    pub total_seconds: f64,
    /// Seconds spent building the matrix.
    pub setup_seconds: f64,
}

/// PageRank of `graph` on `device` by power iteration, as networkx's `pagerank` defines
/// it: duplicate edges count once, self-loops count, and a node without out-edges spreads
/// its rank evenly over all nodes. Each iteration is one SpMV with the transposed,
/// column-normalised adjacency matrix plus a few element-wise ops.
///
/// ```
/// # use kiln::sparse::graph::{pagerank, EdgeList, PageRankOptions};
/// # use kiln::Device;
/// let g = EdgeList::read("0 1\n1 2\n2 0\n".as_bytes())?;
/// let pr = pagerank(&g, &PageRankOptions::default(), &Device::Cpu)?;
/// for r in pr.ranks.to_vec::<f64>()? { assert!((r - 1.0 / 3.0).abs() < 1e-9); }
/// # Ok::<(), kiln::Error>(())
/// ```
///
/// # Errors
/// Arguments out of range (damping outside `[0, 1)`, a tolerance that is not positive, no
/// iterations, an empty graph, a non-float dtype) before any work.
pub fn pagerank(graph: &EdgeList, opts: &PageRankOptions, device: &Device) -> Result<PageRank> {
    let bad = |msg: String| Err(Error::Msg(format!("pagerank: {msg}")));
    if !(0.0..1.0).contains(&opts.damping) {
        return bad(format!("damping {} is outside [0, 1)", opts.damping));
    }
    if !(opts.tol > 0.0 && opts.tol.is_finite()) {
        return bad(format!("tolerance {} must be finite and > 0", opts.tol));
    }
    if opts.max_iter == 0 {
        return bad("max_iter must be at least 1".into());
    }
    if graph.nodes == 0 {
        return bad("the graph has no nodes".into());
    }
    if !opts.dtype.is_float() {
        return bad(format!("dtype {} is not a float type", opts.dtype));
    }
    if !device.supports(opts.dtype) {
        return bad(format!("{device} has no {} tensors", opts.dtype));
    }
    let start = Instant::now();
    let n = graph.nodes;
    let pairs = graph.unique_edges();
    let mut out_degree = vec![0u32; n];
    for &(s, _) in &pairs {
        out_degree[s as usize] += 1;
    }
    // M[dst, src] = 1 / out_degree(src): ranks flow along edges.
    let (rows, cols): (Vec<i64>, Vec<i64>) =
        pairs.iter().map(|&(s, d)| (d as i64, s as i64)).unzip();
    let weights: Vec<f64> = pairs
        .iter()
        .map(|&(s, _)| 1.0 / out_degree[s as usize] as f64)
        .collect();
    let e = pairs.len();
    let m = Csr::from_coo(
        n,
        n,
        &Tensor::from_vec(rows, e, &Device::Cpu)?,
        &Tensor::from_vec(cols, e, &Device::Cpu)?,
        &Tensor::from_vec(weights, e, &Device::Cpu)?.to_dtype(opts.dtype)?,
    )?
    .to_device(device)?;
    let dangling: Vec<f64> = out_degree
        .iter()
        .map(|&d| if d == 0 { 1.0 } else { 0.0 })
        .collect();
    // Converted on the host: a device may lack f64 (wgpu).
    let dangling = Tensor::from_vec(dangling, n, &Device::Cpu)?
        .to_dtype(opts.dtype)?
        .to_device(device)?;
    let mut ranks = Tensor::full(1.0 / n as f64, n, opts.dtype, device)?;
    let d = opts.damping;
    let setup_seconds = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let (mut iterations, mut change) = (0, f64::INFINITY);
    let mut times = Vec::new();
    while iterations < opts.max_iter {
        iterations += 1;
        let t = Instant::now();
        // Rank of dangling nodes and the teleport share, spread evenly.
        let spread = ranks.mul(&dangling)?.sum(crate::AllDims, false)?;
        let base = spread
            .mul_scalar(d / n as f64)?
            .add_scalar((1.0 - d) / n as f64)?;
        let next = m.matmul(&ranks)?.mul_scalar(d)?.add(&base)?;
        change = next
            .sub(&ranks)?
            .abs()?
            .sum(crate::AllDims, false)?
            .to_f64_vec()?[0];
        ranks = next;
        times.push(t.elapsed().as_secs_f64());
        if change < opts.tol {
            break;
        }
    }
    Ok(PageRank {
        ranks,
        iterations,
        change,
        converged: change < opts.tol,
        seconds_per_iter: {
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        },
        total_seconds: start.elapsed().as_secs_f64(),
        setup_seconds,
    })
}
