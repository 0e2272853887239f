//! The `kiln` command's subcommands as a library, so that tests can drive them.

pub mod bench_plot;
pub mod pagerank;
pub mod plot;
pub mod train;
