//! The error type of every fallible kiln operation. Each variant names the op and the
//! offending shapes, dtypes, devices or indices.

use crate::{DType, Device, Shape};

/// Result alias with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: shapes {lhs} and {rhs} do not match")]
    ShapeMismatch {
        op: &'static str,
        lhs: Shape,
        rhs: Shape,
    },

    #[error("{op}: shapes {lhs} and {rhs} cannot be broadcast together")]
    BroadcastIncompatible {
        op: &'static str,
        lhs: Shape,
        rhs: Shape,
    },

    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        op: &'static str,
        dim: isize,
        rank: usize,
    },

    #[error("{op}: dtypes {lhs} and {rhs} do not match")]
    DTypeMismatch {
        op: &'static str,
        lhs: DType,
        rhs: DType,
    },

    #[error("{op} does not support dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },

    #[error("{op}: tensors are on different devices, {lhs} and {rhs}; move one with to_device")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },

    #[error("{op}: index {index} is out of range for dimension {dim} of size {size}")]
    IndexOutOfRange {
        op: &'static str,
        index: i64,
        dim: usize,
        size: usize,
    },

    #[error("{op}: range {start}..{end} is out of bounds for dimension {dim} of size {size} (shape {shape})")]
    RangeOutOfBounds {
        op: &'static str,
        dim: usize,
        start: usize,
        end: usize,
        size: usize,
        shape: Shape,
    },

    #[error("{op}: cannot treat {from} ({from_count} elements) as {to} ({to_count} elements)")]
    ElementCountMismatch {
        op: &'static str,
        from: Shape,
        from_count: usize,
        to: Shape,
        to_count: usize,
    },

    #[error("{op}: shape {shape} with strides {strides:?}: {msg}")]
    InvalidLayout {
        op: &'static str,
        shape: Shape,
        strides: Vec<usize>,
        msg: String,
    },

    #[error("matmul: shapes {lhs} and {rhs} are incompatible: {msg}")]
    MatmulShape { lhs: Shape, rhs: Shape, msg: String },

    #[error("{op}: input {input} with kernel {kernel:?}: {msg}")]
    WindowShape {
        op: &'static str,
        input: Shape,
        kernel: [usize; 2],
        msg: String,
    },

    /// Malformed sparse-matrix input (CSR arrays, COO triplets, an edge list).
    #[error("{op}: {msg}")]
    InvalidSparse { op: &'static str, msg: String },

    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable { device: Device, reason: String },

    #[error("out of memory on {device}: requested {requested} bytes, {free} bytes free")]
    OutOfMemory {
        device: Device,
        requested: usize,
        free: usize,
    },

    /// An op that cannot be recorded into the CUDA graph being captured (a host transfer, a
    /// synchronisation, a kernel compile, an op on another device, ...). The capture is
    /// discarded.
    #[error("{op} cannot run while a CUDA graph is captured on {device}: {reason}")]
    GraphCapture {
        op: String,
        device: Device,
        reason: String,
    },

    /// A collective or the rendezvous of a process group failed: a peer rank failed, left
    /// or timed out, NCCL is missing, or the ranks disagree.
    #[error("{op}: {reason}")]
    Collective { op: String, reason: String },

    #[error("CUDA: {0}")]
    Cuda(String),

    #[error(transparent)]
    Io(#[from] std::io::Error),

    #[error("{0}")]
    Msg(String),
}

impl Error {
    pub(crate) fn msg(s: impl Into<String>) -> Self {
        Error::Msg(s.into())
    }

    /// The same error naming `op` instead (a view built from another view's checks).
    pub(crate) fn with_op(self, op: &'static str) -> Error {
        match self {
            Error::RangeOutOfBounds {
                dim,
                start,
                end,
                size,
                shape,
                ..
            } => Error::RangeOutOfBounds {
                op,
                dim,
                start,
                end,
                size,
                shape,
            },
            Error::DimOutOfRange { dim, rank, .. } => Error::DimOutOfRange { op, dim, rank },
            e => e,
        }
    }
}

/// Returns early with `Error::Msg(format!(...))`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Msg(format!($($arg)*)))
    };
}
