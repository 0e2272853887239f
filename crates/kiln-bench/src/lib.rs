//! kiln's benchmark suites. Each suite times workloads on one device (CUDA: device events;
//! CPU: wall clock) after a warm-up, takes medians over repeats, uses random data, and
//! rotates inputs among buffers larger than the GPU's L2 where a cache would flatter the
//! figure. Results go to a JSON report whose schema `bench/torch_bench.py` also writes, so
//! [`compare`] can put kiln and PyTorch side by side.

mod conv;
pub mod dist;
mod report;
mod sparse;
mod suites;
mod timing;
mod train;

pub use report::{check, compare, Record, Regression, Report};
pub use sparse::{bench_matrix, MATRICES};
pub use suites::{run, Options, SUITES};
