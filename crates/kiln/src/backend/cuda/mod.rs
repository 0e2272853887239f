//! The CUDA backend: device memory from a caching allocator, kernels compiled at run time by
//! NVRTC (sources in `kernels/`), cuBLAS for matrix products, all work queued on one stream
//! per device. CUDA's libraries are loaded at run time: without them, CUDA devices report
//! as unavailable and everything else works.

mod alloc;
pub mod compile;
mod conv_direct;
mod conv_few;
mod conv_route;
pub use conv_few::{conv_few_launches, force_conv_few_split};
mod conv_mma;
mod conv_mma_filter;
mod conv_wgrad_mma;
pub use conv_mma::{
    conv_mma_launches, force_conv_mma_tiling, set_conv_engine, ConvEngine, ConvMmaTiling,
};
pub use conv_mma_filter::{conv_mma_fused_launches, set_conv_mma_filter_prep, ConvMmaFilterPrep};
pub use conv_wgrad_mma::{conv_wgrad_mma_launches, force_conv_wgrad_mma_plan};
mod cudnn;
mod cudnn_choice;
mod cudnn_graph;
mod cusparse;
mod device;
mod elementwise;
mod fused;
mod gemm;
mod gemm_lt;
mod gemm_small;
mod graph;
mod index;
mod launch;
pub(crate) mod nccl;
mod reduce;
mod saved_choices;
mod softmax;
mod sparse;
pub use gemm_small::{set_gemm_engine, GemmEngine};
pub use sparse::{set_sparse_engine, set_spmm_group, SparseEngine};
mod transfer;
mod window;

pub use alloc::MemoryStats;
pub(crate) use device::CudaDevice;
pub use device::DeviceInfo;
pub use graph::Graph;

use crate::backend::cpu::CpuStorage;
use crate::backend::BackendStorage;
use crate::layout::Layout;
use crate::op::{BinaryOp, CmpOp, CrossEntropyRows, ReduceOp, UnaryOp, UpdateRule};
use crate::{DType, Device, Error, Result};
use cudarc::driver::sys::CUdeviceptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A device allocation from the caching allocator; returned to the pool on drop (to its
/// graph's pool when it was allocated during a graph capture).
pub(crate) struct CudaBuffer {
    pub ptr: CUdeviceptr,
    class: usize,
    pub device: Arc<CudaDevice>,
    graph: Option<Arc<graph::GraphPool>>,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        match &self.graph {
            Some(g) => g.release(self.ptr, self.class),
            None => self.device.free(self.ptr, self.class),
        }
    }
}

static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether `KILN_CUDA_TRACE=1`: then [`trace`] writes a line to standard error for each
/// collective launch, host wait on collectives, graph capture and replay (to see where a
/// multi-GPU run stops).
pub(crate) fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_TRACE").is_ok_and(|v| v == "1"))
}

/// `cuda_trace!("...", args)`: one [`trace`] line when [`tracing`] is on (the arguments are
/// not evaluated otherwise).
macro_rules! cuda_trace {
    ($($arg:tt)*) => {
        if $crate::backend::cuda::tracing() {
            $crate::backend::cuda::trace(format_args!($($arg)*));
        }
    };
}
pub(crate) use cuda_trace;

/// One trace line (see [`tracing`]): milliseconds since the first line, the thread, `what`.
pub(crate) fn trace(what: std::fmt::Arguments) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(std::time::Instant::now).elapsed();
    let thread = std::thread::current();
    eprintln!(
        "[kiln {:9.3} ms {}] {what}",
        t.as_secs_f64() * 1e3,
        thread.name().unwrap_or("?")
    );
}

/// Counts work items queued on a stream (kernels, library calls, graph launches).
#[inline]
pub(crate) fn note_launches(n: u64) {
    LAUNCHES.fetch_add(n, Ordering::Relaxed);
}

/// Launches queued by kiln on every CUDA device so far: each kernel, each cuBLAS/cuBLASLt
/// call (which may launch one or two kernels itself) and each graph replay counts one.
/// Take the difference across a region to count its launches.
///
/// ```
/// let before = kiln::cuda::launch_count();
/// // ... a training step ...
/// let launches = kiln::cuda::launch_count() - before;
/// # let _ = launches;
/// ```
pub fn launch_count() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// How sparse products run on CUDA devices, for `kiln info`.
pub fn sparse_path() -> String {
    match cusparse::unavailable_reason() {
        None => "kiln's kernels or cuSPARSE (f32/f64), whichever measures faster per matrix \
                 (once it is used repeatedly)"
            .into(),
        Some(reason) => format!("kiln's kernels (cuSPARSE not used: {reason})"),
    }
}

/// The value that environment variable `var` names among `choices`, or `default` when it
/// is unset or names none of them. Callers keep the answer in a `OnceLock`.
pub(crate) fn env_choice<T: Copy>(var: &str, choices: &[(&str, T)], default: T) -> T {
    let value = std::env::var(var).ok();
    choices
        .iter()
        .find(|(name, _)| value.as_deref() == Some(*name))
        .map_or(default, |&(_, v)| v)
}

/// Where measured choices (GEMM plans, convolution algorithms) are saved for later processes:
/// the kernel cache directory unless `KILN_SAVED_CHOICES` names another; `None` when
/// `KILN_SAVED_CHOICES=off`.
///
/// ```no_run
/// println!("{:?}", kiln::cuda::saved_choices_dir());
/// ```
pub fn saved_choices_dir() -> Option<std::path::PathBuf> {
    saved_choices::directory()
}

/// How convolutions run on CUDA devices, for `kiln info`.
pub fn convolution_path() -> String {
    let own = "; kiln's direct kernel (at most 64 taps a channel), tensor-core kernel (at \
               most 64 input channels, f16/bf16/TF32, compute capability 8.0+) and \
               few-output-channel kernel (1-3 outputs, stride 1, 3x3/5x5/7x7), each measured \
               against cuDNN per problem, or without cuDNN run wherever they apply (the \
               direct weight gradient excepted)";
    let library = match (cudnn::unavailable_reason(), cudnn::version()) {
        (None, Some(v)) => format!(
            "cuDNN {}.{}.{} (legacy algorithms and graph-API engines measured once per \
             problem, the fastest kept{}); im2col + cuBLASLt where cuDNN has no algorithm",
            v / 10000,
            v / 100 % 100,
            v % 100,
            if conv_deterministic() {
                ", nondeterministic ones left out"
            } else {
                ""
            }
        ),
        (reason, _) => format!(
            "im2col kernel + cuBLASLt GEMM with bias/activation epilogue (cuDNN not used: {})",
            reason.unwrap_or("unknown")
        ),
    };
    library + own
}

/// `len` elements of `dtype` on a CUDA device.
pub struct CudaStorage {
    pub(crate) buf: CudaBuffer,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaStorage({} x {} on {})",
            self.len,
            self.dtype,
            self.buf.device.device()
        )
    }
}

impl CudaStorage {
    /// Uninitialised storage for `len` elements.
    pub(crate) fn alloc(dev: &Arc<CudaDevice>, len: usize, dtype: DType) -> Result<CudaStorage> {
        let (ptr, class, graph) = dev.alloc(len * dtype.size_in_bytes())?;
        Ok(CudaStorage {
            buf: CudaBuffer {
                ptr,
                class,
                device: dev.clone(),
                graph,
            },
            len,
            dtype,
        })
    }

    pub(crate) fn dev(&self) -> &Arc<CudaDevice> {
        &self.buf.device
    }

    /// Device address of the element at `offset`.
    pub(crate) fn ptr_at(&self, offset: usize) -> u64 {
        self.buf.ptr + (offset * self.dtype.size_in_bytes()) as u64
    }

    pub(crate) fn full(
        dev: &Arc<CudaDevice>,
        value: f64,
        len: usize,
        dtype: DType,
    ) -> Result<CudaStorage> {
        let out = CudaStorage::alloc(dev, len, dtype)?;
        elementwise::fill(&out, value)?;
        Ok(out)
    }

    pub(crate) fn from_cpu(dev: &Arc<CudaDevice>, cpu: &CpuStorage) -> Result<CudaStorage> {
        transfer::upload(dev, cpu)
    }

    /// A host copy of the elements at `layout`, contiguous. Waits for queued work.
    pub(crate) fn to_cpu(&self, layout: &Layout) -> Result<CpuStorage> {
        let whole =
            layout.is_contiguous() && layout.offset() == 0 && layout.elem_count() == self.len;
        let cpu = if whole {
            transfer::download(self, 0, self.len)?
        } else if layout.is_contiguous() {
            transfer::download(self, layout.offset(), layout.elem_count())?
        } else {
            let c = self.copy_contiguous(layout)?;
            transfer::download(&c, 0, c.len)?
        };
        self.dev().check_error_flag()?;
        Ok(cpu)
    }

    /// The operand checks of a binary op: one device, one dtype, no integer `pow`.
    fn check_binary(&self, rhs: &CudaStorage, op: BinaryOp) -> Result<()> {
        self.same_device(rhs, op.name())?;
        if self.dtype != rhs.dtype {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                lhs: self.dtype,
                rhs: rhs.dtype,
            });
        }
        if op == BinaryOp::Pow && self.dtype.is_int() {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype,
            });
        }
        Ok(())
    }

    fn same_device(&self, other: &CudaStorage, op: &'static str) -> Result<()> {
        if !Arc::ptr_eq(self.dev(), other.dev()) {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.dev().device(),
                rhs: other.dev().device(),
            });
        }
        Ok(())
    }
}

impl BackendStorage for CudaStorage {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.dev().device()
    }

    fn unary(&self, l: &Layout, op: UnaryOp) -> Result<Self> {
        if self.dtype.is_int() && !op.supports_int() {
            return Err(Error::UnsupportedDType {
                op: op.name(),
                dtype: self.dtype,
            });
        }
        elementwise::unary(self, l, op)
    }

    fn binary(&self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<Self> {
        self.check_binary(rhs, op)?;
        elementwise::binary(self, l, rhs, rl, op)
    }

    fn binary_assign(&mut self, l: &Layout, rhs: &Self, rl: &Layout, op: BinaryOp) -> Result<()> {
        self.check_binary(rhs, op)?;
        elementwise::binary_assign(self, l, rhs, rl, op)
    }

    fn affine(
        &self,
        l: &Layout,
        scale: &Self,
        sl: &Layout,
        shift: &Self,
        hl: &Layout,
    ) -> Result<Self> {
        self.same_device(scale, "affine")?;
        self.same_device(shift, "affine")?;
        for other in [scale.dtype, shift.dtype] {
            if other != self.dtype {
                return Err(Error::DTypeMismatch {
                    op: "affine",
                    lhs: self.dtype,
                    rhs: other,
                });
            }
        }
        elementwise::affine(self, l, scale, sl, shift, hl)
    }

    fn matmul_bias_act(
        &self,
        l: &Layout,
        rhs: &Self,
        rl: &Layout,
        bias: &Self,
        bl: &Layout,
        act: crate::op::EpilogueActivation,
    ) -> Result<(Self, Option<Self>)> {
        self.same_device(rhs, "matmul_bias_act")?;
        self.same_device(bias, "matmul_bias_act")?;
        gemm::matmul_bias_act(self, l, rhs, rl, bias, bl, act)
    }

    fn compare(&self, l: &Layout, rhs: &Self, rl: &Layout, op: CmpOp) -> Result<Self> {
        self.same_device(rhs, op.name())?;
        if self.dtype != rhs.dtype {
            return Err(Error::DTypeMismatch {
                op: op.name(),
                lhs: self.dtype,
                rhs: rhs.dtype,
            });
        }
        elementwise::compare(self, l, rhs, rl, op)
    }

    fn where_cond(&self, l: &Layout, t: &Self, tl: &Layout, f: &Self, fl: &Layout) -> Result<Self> {
        self.same_device(t, "where_cond")?;
        self.same_device(f, "where_cond")?;
        if t.dtype != f.dtype {
            return Err(Error::DTypeMismatch {
                op: "where_cond",
                lhs: t.dtype,
                rhs: f.dtype,
            });
        }
        elementwise::where_cond(self, l, t, tl, f, fl)
    }

    fn cast(&self, l: &Layout, dtype: DType) -> Result<Self> {
        elementwise::cast(self, l, dtype)
    }

    fn copy_contiguous(&self, l: &Layout) -> Result<Self> {
        elementwise::cast(self, l, self.dtype)
    }

    fn copy_into(&self, l: &Layout, dst: &mut Self, dl: &Layout) -> Result<()> {
        self.same_device(dst, "copy_into")?;
        elementwise::copy_into(self, l, dst, dl)
    }

    fn reduce(&self, l: &Layout, dims: &[usize], op: ReduceOp) -> Result<Self> {
        reduce::reduce(self, l, dims, op)
    }

    fn softmax(&self, l: &Layout, dim: usize, log: bool) -> Result<Self> {
        if self.dtype.is_int() {
            return Err(Error::UnsupportedDType {
                op: if log { "log_softmax" } else { "softmax" },
                dtype: self.dtype,
            });
        }
        softmax::softmax(self, l, dim, log)
    }

    fn logsumexp(&self, l: &Layout, dim: usize) -> Option<Result<Self>> {
        if self.dtype.is_int() {
            return Some(Err(Error::UnsupportedDType {
                op: "logsumexp",
                dtype: self.dtype,
            }));
        }
        Some(softmax::logsumexp(self, l, dim))
    }

    fn matmul(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<Self> {
        self.same_device(rhs, "matmul")?;
        gemm::matmul(self, l, rhs, rl)
    }

    fn matmul_bias(
        &self,
        l: &Layout,
        rhs: &Self,
        rl: &Layout,
        bias: &Self,
        bl: &Layout,
    ) -> Result<Self> {
        self.same_device(rhs, "matmul_bias")?;
        self.same_device(bias, "matmul_bias")?;
        gemm::matmul_bias(self, l, rhs, rl, bias, bl)
    }

    fn matmul_row_sums(&self, l: &Layout, rhs: &Self, rl: &Layout) -> Result<(Self, Self)> {
        self.same_device(rhs, "matmul_row_sums")?;
        gemm::matmul_row_sums(self, l, rhs, rl)
    }

    fn index_select(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.same_device(ids, "index_select")?;
        index::index_select(self, l, ids, il, dim)
    }

    fn gather(&self, l: &Layout, ids: &Self, il: &Layout, dim: usize) -> Result<Self> {
        self.same_device(ids, "gather")?;
        index::gather(self, l, ids, il, dim)
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
        self.same_device(ids, "scatter_add")?;
        self.same_device(src, "scatter_add")?;
        index::scatter_add(self, l, ids, il, src, sl, dim)
    }

    fn cross_entropy(
        &self,
        l: &Layout,
        targets: &Self,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
    ) -> Result<CrossEntropyRows<Self>> {
        self.same_device(targets, "cross_entropy")?;
        fused::cross_entropy(self, l, targets, tl, smoothing, scale, None)
    }

    fn dropout_mask(
        &self,
        step_layout: &Layout,
        n: usize,
        dtype: DType,
        draw: &crate::op::DropoutDraw,
    ) -> Result<Option<Self>> {
        elementwise::dropout_mask(self, step_layout.offset(), n, dtype, draw).map(Some)
    }

    fn cross_entropy_accumulate(
        &self,
        l: &Layout,
        targets: &Self,
        tl: &Layout,
        smoothing: f64,
        scale: f64,
        sums: [(&mut Self, &Layout); 3],
    ) -> Result<Option<CrossEntropyRows<Self>>> {
        self.same_device(targets, "cross_entropy")?;
        let n = l.dims().first().copied().unwrap_or(0);
        let mut ptrs = [0u64; 3];
        for (ptr, (s, sl)) in ptrs.iter_mut().zip(&sums) {
            self.same_device(s, "cross_entropy (epoch sums)")?;
            if s.dtype != DType::F32 || sl.contiguous_range().map(|r| r.len()) != Some(n) {
                return Ok(None);
            }
            *ptr = s.ptr_at(sl.offset());
        }
        fused::cross_entropy(self, l, targets, tl, smoothing, scale, Some(ptrs)).map(Some)
    }

    fn update(
        &mut self,
        l: &Layout,
        grad: &Self,
        gl: &Layout,
        state: &mut [(&mut Self, &Layout)],
        rule: UpdateRule,
    ) -> Result<()> {
        let state = state.iter_mut().map(|(s, sl)| (&mut **s, *sl)).collect();
        Self::update_group(
            &mut [crate::backend::UpdateSlot {
                param: self,
                layout: l,
                grad,
                grad_layout: gl,
                state,
            }],
            rule,
            None,
        )
    }

    fn update_group(
        slots: &mut [crate::backend::UpdateSlot<'_, Self>],
        rule: UpdateRule,
        schedule: Option<&Self>,
    ) -> Result<()> {
        if let Some(first) = slots.first() {
            let dev = first.param.dev().clone();
            if let Some(s) = schedule {
                if !Arc::ptr_eq(&dev, s.dev()) {
                    return Err(Error::DeviceMismatch {
                        op: rule.name(),
                        lhs: dev.device(),
                        rhs: s.device(),
                    });
                }
            }
            for s in slots.iter() {
                for other in [&*s.param, s.grad]
                    .into_iter()
                    .chain(s.state.iter().map(|(b, _)| &**b))
                {
                    if !Arc::ptr_eq(&dev, other.dev()) {
                        return Err(Error::DeviceMismatch {
                            op: rule.name(),
                            lhs: dev.device(),
                            rhs: other.dev().device(),
                        });
                    }
                }
            }
        }
        fused::update_group(slots, rule, schedule)
    }
}

// ---- the public `kiln::cuda` API ---------------------------------------------------------

/// Whether at least one CUDA device can be used.
///
/// ```
/// if kiln::cuda::is_available() {
///     println!("{} CUDA devices", kiln::cuda::device_count());
/// }
/// ```
pub fn is_available() -> bool {
    device::unavailable_reason().is_none() && device::device_count() > 0
}

/// Why CUDA is unavailable (`None` when it is available).
pub fn unavailable_reason() -> Option<String> {
    device::unavailable_reason()
}

pub fn device_count() -> usize {
    device::device_count()
}

/// Name, compute capability, memory and multiprocessor count of device `ordinal`.
pub fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    Ok(CudaDevice::get(ordinal)?.info.clone())
}

/// Free and total device memory in bytes, as the driver reports them.
pub fn mem_info(ordinal: usize) -> Result<(usize, usize)> {
    let dev = CudaDevice::get(ordinal)?;
    dev.refuse_in_capture("mem_info", "querying memory is not part of a graph")?;
    dev.bind()?;
    let info = dev
        .ctx
        .mem_get_info()
        .map_err(|e| Error::Cuda(format!("cuMemGetInfo: {e:?}")));
    dev.note_bound();
    info
}

/// Waits for all work queued on device `ordinal`; reports an out-of-range index met by an
/// index kernel since the last check.
pub fn synchronize(ordinal: usize) -> Result<()> {
    CudaDevice::get(ordinal)?.synchronize()
}

/// The caching allocator's statistics for device `ordinal`.
pub fn memory_stats(ordinal: usize) -> Result<MemoryStats> {
    Ok(CudaDevice::get(ordinal)?.memory_stats())
}

/// Sets the peak of `memory_stats` to the bytes in use now.
pub fn reset_peak(ordinal: usize) -> Result<()> {
    CudaDevice::get(ordinal)?.reset_peak();
    Ok(())
}

/// Returns the cached (free) device buffers of device `ordinal` to the driver.
pub fn empty_cache(ordinal: usize) -> Result<()> {
    CudaDevice::get(ordinal)?.empty_cache()
}

static TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 matrix products use TF32 tensor cores (about 10 mantissa bits). Off by default,
/// as in PyTorch: f32 GEMMs are exact f32 unless this is set.
pub fn set_tf32(enabled: bool) {
    TF32.store(enabled, Ordering::Relaxed);
}

pub fn tf32_enabled() -> bool {
    TF32.load(Ordering::Relaxed)
}

/// Unset (0: read `KILN_CUDNN_DETERMINISTIC` on first use), off (1) or on (2).
static CONV_DETERMINISTIC: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Leaves cuDNN's nondeterministic convolution algorithms and engines (those that add
/// partial sums with atomics, e.g. the legacy `BWD_FILTER_ALGO_0` and `BWD_DATA_ALGO_0`, and
/// graph engines with the `NONDETERMINISTIC` note) out of the search, as PyTorch's
/// `torch.backends.cudnn.deterministic` does: convolutions and their gradients then give the
/// same bits on every run, with the measured choices saved between processes
/// (`KILN_SAVED_CHOICES`) across runs too. kiln's own convolution kernels are deterministic
/// either way. Off by default; `KILN_CUDNN_DETERMINISTIC=1` turns it on for a whole process.
/// Like [`set_conv_transforms`], the setting is part of each plan's key.
///
/// ```no_run
/// kiln::cuda::set_conv_deterministic(true);
/// ```
pub fn set_conv_deterministic(enabled: bool) {
    CONV_DETERMINISTIC.store(if enabled { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether convolutions leave cuDNN's nondeterministic algorithms out (see
/// [`set_conv_deterministic`]).
pub fn conv_deterministic() -> bool {
    flag_or_env(&CONV_DETERMINISTIC, "KILN_CUDNN_DETERMINISTIC")
}

/// A three-state setting: unset (0, then `var=1` decides on first use), off (1) or on (2).
fn flag_or_env(flag: &std::sync::atomic::AtomicU8, var: &str) -> bool {
    match flag.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var(var).is_ok_and(|v| v == "1");
            // A racing setter wins over the environment.
            let _ = flag.compare_exchange(
                0,
                if on { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            flag.load(Ordering::Relaxed) == 2
        }
        v => v == 2,
    }
}

/// Unset (0: read `KILN_CUDNN_TRANSFORMS` on first use), off (1) or on (2).
static CONV_TRANSFORMS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Lets exact-precision convolutions (f32 without TF32, f64) run cuDNN's FFT and Winograd
/// algorithms, as PyTorch's `cudnn.benchmark` does: up to 2× faster on f32 ResNet-stage
/// shapes, but their rounding grows with the transform (5e-4 relative on an f32 5×5 input
/// gradient on the H100, against about 1e-7 for the direct and GEMM algorithms). Off by
/// default; `KILN_CUDNN_TRANSFORMS=1` turns it on for a whole process. TF32, bf16 and f16
/// convolutions may always use them. Problems already planned keep their choice only while
/// the setting they were planned under holds (the setting is part of each plan's key).
///
/// ```no_run
/// kiln::cuda::set_conv_transforms(true);
/// ```
pub fn set_conv_transforms(enabled: bool) {
    CONV_TRANSFORMS.store(if enabled { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether exact-precision convolutions may run FFT and Winograd algorithms (see
/// [`set_conv_transforms`]).
pub fn conv_transforms_enabled() -> bool {
    flag_or_env(&CONV_TRANSFORMS, "KILN_CUDNN_TRANSFORMS")
}

/// Compiles every kernel module (each source for each of its dtypes, the unary kernels with
/// the op chosen at run time) for compute capability `arch` with NVRTC, bypassing the cache,
/// and returns each module's name and cubin size. Needs NVRTC, not a GPU.
pub fn compile_all_kernels(arch: (i32, i32)) -> Result<Vec<(String, usize)>> {
    let keys: Vec<compile::ModuleKey> = compile::KernelSource::ALL
        .iter()
        .flat_map(|&source| {
            source
                .dtypes()
                .iter()
                .map(move |&dtype| compile::ModuleKey {
                    source,
                    dtype,
                    op: None,
                })
        })
        .collect();
    // One compile per core at a time (each NVRTC compile takes a few hundred MB).
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(k) = keys.get(i) else { break };
                let r = compile::compile_cubin(&k.name(), &k.source_text(), arch)
                    .map(|c| (k.name(), c.len()));
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, r));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Runs `f` between two events recorded on device `ordinal`'s stream and returns its result
/// with the device time between them in milliseconds (waits for the work to finish).
///
/// ```no_run
/// # use kiln::{Device, DType, Tensor};
/// let x = Tensor::ones([4096, 4096], DType::F32, &Device::Cuda(0))?;
/// let (_, ms) = kiln::cuda::time_region(0, || x.matmul(&x))?;
/// println!("{ms:.3} ms");
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn time_region<R>(ordinal: usize, f: impl FnOnce() -> Result<R>) -> Result<(R, f32)> {
    let dev = CudaDevice::get(ordinal)?;
    dev.refuse_in_capture("time_region", "timing waits for the device")?;
    let err = |e: cudarc::driver::DriverError| Error::Cuda(format!("timing events: {e:?}"));
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = dev.ctx.new_event(flags).map_err(err)?;
    let end = dev.ctx.new_event(flags).map_err(err)?;
    dev.note_bound();
    start.record(&dev.stream).map_err(err)?;
    let r = f()?;
    end.record(&dev.stream).map_err(err)?;
    end.synchronize().map_err(err)?;
    let ms = start.elapsed_ms(&end).map_err(err)?;
    dev.check_error_flag()?;
    Ok((r, ms))
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_choice_maps_known_names_and_defaults_otherwise() {
        // A variable no other test touches.
        const VAR: &str = "KILN_TEST_ENV_CHOICE";
        let names = [("a", 1), ("bb", 2)];
        std::env::remove_var(VAR);
        assert_eq!(super::env_choice(VAR, &names, 0), 0);
        std::env::set_var(VAR, "bb");
        assert_eq!(super::env_choice(VAR, &names, 0), 2);
        std::env::set_var(VAR, "b");
        assert_eq!(super::env_choice(VAR, &names, 0), 0);
        std::env::remove_var(VAR);
    }
}
