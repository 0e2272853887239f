//! The portable GPU backend on wgpu: Vulkan (AMD, Intel, NVIDIA, lavapipe), Metal (Apple)
//! and DX12. Kernels are WGSL compute shaders generated per dtype (`codegen.rs`, helpers in
//! `shaders/`), compiled once per device and cached; work is recorded into a batch and
//! submitted when the host needs a value (`context.rs`); memory comes from a caching
//! allocator (`alloc.rs`).
//!
//! dtypes: f32 everywhere, f16 where the adapter has `SHADER_F16`, u8, u32 and i64 (two
//! words); f64 and bf16 are [`Error::UnsupportedDType`].
//!
//! ```no_run
//! use kiln::{Device, Tensor};
//! let x = Tensor::from_vec(vec![1f32, 2., 3.], 3, &Device::Wgpu(0))?;
//! assert_eq!(x.exp()?.sum(kiln::AllDims, false)?.to_scalar::<f32>()?, 1f32.exp() + 2f32.exp() + 3f32.exp());
//! # Ok::<(), kiln::Error>(())
//! ```

mod alloc;
mod codegen;
mod context;
mod elementwise;
mod fused;
mod index;
mod matmul;
mod reduce;
mod sparse;
mod window;

pub use crate::backend::memory::MemoryStats;
pub(crate) use context::WgpuDevice;
pub use context::{adapters, dispatch_count, AdapterInfo};

use crate::backend::cpu::{match_storage, CpuStorage};
use crate::backend::BackendStorage;
use crate::dtype::WithDType;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, CrossEntropyRows, ReduceOp, UnaryOp, UpdateRule};
use crate::{DType, Device, Error, Result};
use elementwise::Target;
use std::sync::Arc;

/// A buffer from the caching allocator, returned to the pool on drop.
pub(crate) struct WgpuBuffer {
    pub buffer: wgpu::Buffer,
    class: u64,
    pub device: Arc<WgpuDevice>,
}

impl WgpuBuffer {
    /// Wraps a buffer kiln did not allocate from the pool (class 0: dropped, not pooled).
    pub(crate) fn wrap_foreign(dev: &Arc<WgpuDevice>, buffer: wgpu::Buffer) -> WgpuBuffer {
        WgpuBuffer {
            buffer,
            class: 0,
            device: dev.clone(),
        }
    }
}

impl Drop for WgpuBuffer {
    fn drop(&mut self) {
        if self.class == 0 {
            return;
        }
        // `wgpu::Buffer` is a shared handle: the pool keeps this one alive.
        self.device.free(self.buffer.clone(), self.class);
    }
}

/// A tensor's elements on a wgpu device: `len` elements of `dtype` from the start of `buf`.
#[derive(Clone)]
pub struct WgpuStorage {
    pub(crate) buf: Arc<WgpuBuffer>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
}

impl std::fmt::Debug for WgpuStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WgpuStorage({} x {}, wgpu:{})",
            self.len, self.dtype, self.buf.device.ordinal
        )
    }
}

/// Allocation statistics of wgpu device `ordinal`.
pub fn memory_stats(ordinal: usize) -> Result<MemoryStats> {
    Ok(WgpuDevice::get(ordinal)?.memory_stats())
}

/// Resets the peak of [`memory_stats`] to the bytes in use now.
pub fn reset_peak(ordinal: usize) -> Result<()> {
    WgpuDevice::get(ordinal)?.reset_peak();
    Ok(())
}

/// Waits for all work queued on wgpu device `ordinal`; reports errors met meanwhile.
pub fn synchronize(ordinal: usize) -> Result<()> {
    WgpuDevice::get(ordinal)?.synchronize()
}

/// Runs `f` and returns its value with the GPU time of the work it queued on wgpu device
/// `ordinal`, in milliseconds (see `kiln::cuda::time_region`).
pub fn time_region<T>(ordinal: usize, f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    WgpuDevice::get(ordinal)?.time_region(f)
}

/// Runs `f` `reps` times back to back on wgpu device `ordinal` and returns each run's GPU
/// time in milliseconds, all read once at the end (no host wait between runs).
///
/// ```no_run
/// # use kiln::{DType, Device, Tensor};
/// let x = Tensor::ones(1 << 20, DType::F32, &Device::Wgpu(0))?;
/// let times = kiln::wgpu::time_each(0, 20, || x.exp().map(drop))?;
/// assert_eq!(times.len(), 20);
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn time_each(ordinal: usize, reps: usize, f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    WgpuDevice::get(ordinal)?.time_each(reps, f)
}

/// Gives the pooled (free) buffers of device `ordinal` back to the driver.
pub fn release_cached(ordinal: usize) -> Result<()> {
    WgpuDevice::get(ordinal)?.release_cached()
}

impl WgpuStorage {
    /// Uninitialised storage for `len` elements of `dtype`.
    pub(crate) fn alloc(dev: &Arc<WgpuDevice>, dtype: DType, len: usize) -> Result<WgpuStorage> {
        codegen::word(len)?;
        let buf = dev.alloc_raw(codegen::buffer_bytes(dtype, len))?;
        Ok(WgpuStorage { buf, dtype, len })
    }

    /// Whether wgpu adapter `ordinal` holds tensors of `dtype` (false for an adapter that
    /// cannot be opened).
    pub(crate) fn supports(ordinal: usize, dtype: DType) -> bool {
        WgpuDevice::get(ordinal).is_ok_and(|d| codegen::class(&d, dtype, "supports").is_ok())
    }

    pub(crate) fn device_arc(&self) -> &Arc<WgpuDevice> {
        &self.buf.device
    }

    /// Copies host data to the device `ordinal`.
    pub(crate) fn from_cpu(ordinal: usize, cpu: &CpuStorage) -> Result<WgpuStorage> {
        let dev = WgpuDevice::get(ordinal)?;
        let dtype = cpu.dtype();
        codegen::class(&dev, dtype, "to_device")?;
        let out = WgpuStorage::alloc(&dev, dtype, cpu.len())?;
        let bytes: &[u8] = match_storage!(cpu, v => bytemuck::cast_slice(v));
        dev.upload(&out.buf, bytes)?;
        Ok(out)
    }

    /// `n` elements equal to `value`.
    pub(crate) fn full(ordinal: usize, value: f64, n: usize, dtype: DType) -> Result<WgpuStorage> {
        WgpuStorage::fill(&WgpuDevice::get(ordinal)?, value, n, dtype)
    }

    /// A host copy of the elements at `layout`, contiguous (waits for queued work).
    pub(crate) fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        let n = layout.elem_count();
        let Some(range) = layout.contiguous_range().filter(|_| layout.is_contiguous()) else {
            return self
                .copy_impl(layout, Target::New)?
                .expect("new")
                .to_cpu(&Layout::contiguous(layout.shape().clone()));
        };
        let size = self.dtype.size_in_bytes() as u64;
        let start = range.start as u64 * size;
        let aligned = start / 4 * 4;
        let end = (start + n as u64 * size).next_multiple_of(4);
        let raw = self.buf.device.read(&self.buf, aligned, end - aligned)?;
        let skip = (start - aligned) as usize;
        let bytes = &raw[skip..skip + n * size as usize];
        fn typed<T: WithDType>(bytes: &[u8]) -> CpuStorage {
            CpuStorage::from_vec(bytemuck::pod_collect_to_vec::<u8, T>(bytes))
        }
        Ok(match self.dtype {
            DType::F16 => typed::<half::f16>(bytes),
            DType::BF16 => typed::<half::bf16>(bytes),
            DType::F32 => typed::<f32>(bytes),
            DType::F64 => typed::<f64>(bytes),
            DType::U8 => typed::<u8>(bytes),
            DType::U32 => typed::<u32>(bytes),
            DType::I64 => typed::<i64>(bytes),
        })
    }

    fn new_of(r: Result<Option<WgpuStorage>>) -> Result<WgpuStorage> {
        r.map(|o| o.expect("a new buffer"))
    }
}

impl BackendStorage for WgpuStorage {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        Device::Wgpu(self.buf.device.ordinal)
    }

    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        self.unary_impl(layout, op)
    }

    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        Self::new_of(self.binary_impl(l, rhs, rl, op, Target::New))
    }

    fn binary_assign(&mut self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<()> {
        self.binary_impl(l, rhs, rl, op, Target::First).map(|_| ())
    }

    fn affine(
        &self,
        l: &Layout,
        scale: &Self,
        sl: &Layout,
        shift: &Self,
        hl: &Layout,
    ) -> Result<Self> {
        self.affine_impl(l, scale, sl, shift, hl)
    }

    fn compare(&self, l: &Layout, rhs: &Self, rl: &Layout, op: CmpOp) -> Result<Self> {
        self.compare_impl(l, rhs, rl, op)
    }

    fn where_cond(&self, l: &Layout, t: &Self, tl: &Layout, f: &Self, fl: &Layout) -> Result<Self> {
        self.where_impl(l, t, tl, f, fl)
    }

    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        self.cast_impl(l, dtype)
    }

    fn copy_contiguous(&self, l: &Layout) -> Result<Self> {
        Self::new_of(self.copy_impl(l, Target::New))
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, dl: &Layout) -> Result<()> {
        if dst.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                op: "copy_into",
                lhs: self.dtype,
                rhs: dst.dtype,
            });
        }
        self.copy_impl(l, Target::Into(dst, dl)).map(|_| ())
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        self.reduce_impl(l, dims, op)
    }

    fn softmax(&self, l: &Layout, dim: usize, log: bool) -> Result<Self> {
        self.softmax_impl(l, dim, log)
    }

    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self> {
        self.matmul_impl(l, rhs, rl)
    }

    fn index_select(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.index_select_impl(l, ids, il, dim)
    }

    fn gather(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.gather_impl(l, ids, il, dim)
    }

    fn scatter_add(
        &self,
        l: &Layout,
        ids: &Self,
        il: &Layout,
        src: &Self,
        sl: &Layout,
        dim: usize,
    ) -> Result<Self> {
        self.scatter_add_impl(l, ids, il, src, sl, dim)
    }

    fn cross_entropy(
        &self,
        l: &Layout,
        targets: &Self,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Self>> {
        self.cross_entropy_impl(l, targets, tl, smoothing, scale)
    }

    fn update(
        &mut self,
        l: &Layout,
        grad: &Self,
        gl: &Layout,
        state: &mut [(&mut Self, &Layout)],
        rule: UpdateRule,
    ) -> Result<()> {
        self.update_impl(l, grad, gl, state, rule)
    }
}
