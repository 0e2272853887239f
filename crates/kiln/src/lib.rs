//! # kiln
//!
//! Device-tracked, layout-aware tensors. A [`Tensor`] is shared [`storage`] seen through a
//! [`Layout`]; views (transpose, narrow, slice, broadcast, reshape when strides allow) are
//! O(1) and copy nothing; every op accepts any view. Ops run on the tensor's [`Device`]:
//! the CPU backend is always there.
//!
//! ```
//! use kiln::{Device, DType, Generator, Tensor};
//! let mut rng = Generator::new(0);
//! let x = Tensor::randn([4, 3], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
//! let w = Tensor::randn([5, 3], 0.0, 1.0, DType::F32, &Device::Cpu, &mut rng)?;
//! let y = x.matmul(&w.t()?)?.relu()?.softmax(-1)?; // w.t() is a view: no copy
//! assert_eq!(y.dims(), &[4, 5]);
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! Layout of the crate: [`layout`] (the view algebra), [`backend`] (the primitive-op trait
//! and one folder per backend), [`storage`] (per-device dispatch), and `tensor/` (the
//! public API: broadcasting, checks and composite ops on top of the primitives).

pub mod autograd;
pub mod backend;
mod device;
mod dimvec;
pub mod dist;
mod dtype;
mod error;
pub mod layout;
pub mod op;
mod random;
mod records;
mod shape;
pub mod sparse;
pub mod storage;
mod tensor;

pub use autograd::{grad_enabled, no_grad, Grads};
pub use backend::cpu::host_memory::retain_freed_host_memory;
pub use backend::cpu::simd::{set_simd_level, simd_level, SimdLevel};
pub use backend::cpu::threads::{num_threads, set_num_threads};
/// The CUDA backend's device queries, memory statistics and settings.
#[cfg(feature = "cuda")]
pub use backend::cuda;
#[cfg(feature = "wgpu")]
pub use backend::wgpu;
pub use device::Device;
pub use dtype::{DType, FloatDType, TypedVec, WithDType};
pub use error::{Error, Result};
pub use half::{bf16, f16};
pub use layout::Layout;
pub use random::Generator;
pub use records::Records;
pub use shape::{AllDims, Dim, Dims, Shape, Strides, INLINE_DIMS};
pub use tensor::{Conv2dOptions, DropoutStream, EpochSums, ParamUpdate, RunningStats, Tensor};
