//! One CUDA device: its context and stream, cuBLAS and cuBLASLt handles, loaded kernel modules, caching
//! allocator and error flag. Devices are created on first use and live for the process.

use super::alloc::{AllocError, MemoryStats, Pool};
use super::compile::{cubin_for, KernelSource, ModuleKey};
use super::cuda_trace;
use crate::{Device, Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A kernel parameter: its address is what cuLaunchKernel reads.
pub(crate) trait KernelArg {
    fn as_param(&mut self) -> *mut std::ffi::c_void;
}

impl<T: Copy> KernelArg for T {
    fn as_param(&mut self) -> *mut std::ffi::c_void {
        self as *mut T as *mut std::ffi::c_void
    }
}

thread_local! {
    /// The context this thread last made current through kiln (0: unknown).
    static BOUND: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Hashes a kernel name's address (already unique and well spread).
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ b as u64 ^ (self.0 >> 56);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Properties of a CUDA device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub multiprocessors: usize,
    /// Largest dynamic shared memory a block may opt into, in bytes.
    pub max_shared_per_block: usize,
    /// Shared memory of one multiprocessor, in bytes, where the driver says.
    pub max_shared_per_sm: Option<usize>,
}

/// A cuBLAS handle bound to the device's stream, with its workspace.
pub(crate) struct Blas {
    pub handle: cudarc::cublas::sys::cublasHandle_t,
    _workspace: sys::CUdeviceptr,
}

// SAFETY: the handle is only used under the device's `blas` mutex.
unsafe impl Send for Blas {}

pub struct CudaDevice {
    pub(crate) ordinal: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) info: DeviceInfo,
    pub(crate) blas: Mutex<Option<Blas>>,
    /// cuBLASLt handle and cached GEMM plans, created on first use.
    pub(crate) lt: Mutex<Option<super::gemm_lt::Lt>>,
    /// cuDNN handle and cached convolution plans, created on first use.
    pub(crate) cudnn: Mutex<Option<super::cudnn::State>>,
    /// The cuSPARSE handle, made on first use.
    pub(crate) cusparse: Mutex<Option<super::cusparse::Handle>>,
    modules: Mutex<HashMap<ModuleKey, Arc<CudaModule>>>,
    /// Dtypes whose modules were asked for (the first starts the dtype's background compiles).
    dtypes_seen: Mutex<std::collections::HashSet<crate::DType>>,
    /// Loaded kernels, keyed by the address of their (static) name.
    functions: Mutex<HashMap<usize, CudaFunction, BuildHasherDefault<AddressHasher>>>,
    pub(crate) pool: Mutex<Pool>,
    /// Device word that index kernels set on an out-of-range index.
    pub(crate) error_flag: sys::CUdeviceptr,
    /// Whether a kernel that may set the flag ran since the last check.
    pub(crate) flag_armed: AtomicBool,
    /// Two zeroed device counters with which the blocks of one kernel meet once (the
    /// convolution kernels' fused filter preparation, conv_mma.rs); the kernel zeroes them
    /// again before it ends. Safe to share because the device has one stream.
    pub(crate) grid_meet: sys::CUdeviceptr,
    /// Pinned buffers for large host transfers.
    pub(crate) staging: Mutex<Option<super::transfer::Staging>>,
    /// The graph capture in progress on this device's stream (see graph.rs).
    pub(crate) capture: Mutex<Option<super::graph::CaptureState>>,
    /// Whether `capture` is set: one atomic load on the hot path instead of a lock.
    pub(crate) capturing: AtomicBool,
}

// SAFETY: every mutable part sits behind a mutex; raw handles are used under them or on the
// device's one stream.
unsafe impl Send for CudaDevice {}
unsafe impl Sync for CudaDevice {}

/// Why CUDA cannot be used here, or `None` when the driver works and has devices.
pub(crate) fn unavailable_reason() -> Option<String> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            // SAFETY: probes for the driver library without calling into it.
            if !unsafe { sys::is_culib_present() } {
                return Some("the CUDA driver (libcuda) is not installed".into());
            }
            if let Err(e) = result::init() {
                return Some(format!("cuInit failed: {e:?}"));
            }
            match CudaContext::device_count() {
                Ok(0) => Some("no CUDA device is present".into()),
                Ok(_) => None,
                Err(e) => Some(format!("cannot count CUDA devices: {e:?}")),
            }
        })
        .clone()
}

pub fn device_count() -> usize {
    if unavailable_reason().is_some() {
        return 0;
    }
    CudaContext::device_count().map(|n| n as usize).unwrap_or(0)
}

fn registry() -> &'static Mutex<HashMap<usize, Arc<CudaDevice>>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
    DEVICES.get_or_init(Default::default)
}

fn driver_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}

impl CudaDevice {
    /// The device with this ordinal, initialised on first use.
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        let device = Device::Cuda(ordinal);
        if let Some(d) = registry()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ordinal)
        {
            return Ok(d.clone());
        }
        if let Some(reason) = unavailable_reason() {
            return Err(Error::DeviceUnavailable { device, reason });
        }
        let count = device_count();
        if ordinal >= count {
            return Err(Error::DeviceUnavailable {
                device,
                reason: format!("there are {count} CUDA devices"),
            });
        }
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = reg.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(CudaDevice::create(ordinal)?);
        d.note_bound();
        reg.insert(ordinal, d.clone());
        Ok(d)
    }

    fn create(ordinal: usize) -> Result<CudaDevice> {
        let ctx = CudaContext::new(ordinal).map_err(driver_err("creating the CUDA context"))?;
        // kiln orders all work on one stream per device and owns its memory, so cudarc's
        // per-buffer event tracking would only add cost.
        // SAFETY: no cudarc CudaSlice of this context is shared across streams.
        unsafe { ctx.disable_event_tracking() };
        // A stream of its own rather than the legacy default stream, which cannot be captured
        // into a graph.
        let stream = ctx
            .new_stream()
            .map_err(driver_err("creating the device's stream"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().unwrap_or_else(|_| "unknown".into()),
            compute_capability: ctx
                .compute_capability()
                .map_err(driver_err("compute capability"))?,
            total_memory: ctx.total_mem().unwrap_or(0),
            multiprocessors: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .unwrap_or(1) as usize,
            max_shared_per_block: ctx
                .attribute(
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                )
                .unwrap_or(48 << 10) as usize,
            max_shared_per_sm: ctx
                .attribute(
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                )
                .ok()
                .map(|v| v as usize),
        };
        ctx.bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        // SAFETY: a 4-byte device allocation, zeroed before use.
        let error_flag =
            unsafe { result::malloc_sync(4) }.map_err(driver_err("allocating the error flag"))?;
        // SAFETY: `error_flag` holds 4 bytes.
        unsafe { result::memset_d8_sync(error_flag, 0, 4) }
            .map_err(driver_err("clearing the error flag"))?;
        // SAFETY: an 8-byte device allocation, zeroed before use.
        let grid_meet = unsafe { result::malloc_sync(8) }
            .map_err(driver_err("allocating the grid counters"))?;
        // SAFETY: `grid_meet` holds 8 bytes.
        unsafe { result::memset_d8_sync(grid_meet, 0, 8) }
            .map_err(driver_err("clearing the grid counters"))?;
        Ok(CudaDevice {
            ordinal,
            ctx,
            stream,
            info,
            blas: Mutex::new(None),
            lt: Mutex::new(None),
            cudnn: Mutex::new(None),
            cusparse: Mutex::new(None),
            modules: Mutex::new(HashMap::new()),
            dtypes_seen: Mutex::new(Default::default()),
            functions: Mutex::new(HashMap::default()),
            pool: Mutex::new(Pool::default()),
            error_flag,
            flag_armed: AtomicBool::new(false),
            grid_meet,
            staging: Mutex::new(None),
            capture: Mutex::new(None),
            capturing: AtomicBool::new(false),
        })
    }

    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// Whether a graph capture is in progress on this device's stream.
    #[inline]
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// Makes this device's context current on the calling thread (a thread-local cache
    /// skips the driver call when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        let ctx = self.ctx.cu_ctx() as usize;
        if BOUND.with(|b| b.get()) == ctx {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        BOUND.with(|b| b.set(ctx));
        Ok(())
    }

    /// Launches kernel `name` of `source` with the given parameters, each passed as
    /// `&mut {value}` (temporaries live until the launch returns).
    ///
    /// # Safety
    /// As [`CudaDevice::launch`]: the parameters must match the kernel's list, and the memory
    /// the kernel touches must be live and large enough.
    pub(crate) unsafe fn call(
        &self,
        source: KernelSource,
        name: &'static str,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut [&mut dyn KernelArg],
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.call_variant(source, name, None, cfg, args) }
    }

    /// [`CudaDevice::call`] of the variant of kernel `name` compiled with unary op `op` fixed
    /// (see [`ModuleKey`]).
    ///
    /// # Safety
    /// As [`CudaDevice::call`].
    pub(crate) unsafe fn call_variant(
        &self,
        source: KernelSource,
        name: &'static str,
        op: Option<u8>,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut [&mut dyn KernelArg],
    ) -> Result<()> {
        let f = self.function_variant(source, name, op)?;
        let mut params: smallvec::SmallVec<[*mut std::ffi::c_void; 16]> =
            args.iter_mut().map(|a| a.as_param()).collect();
        // SAFETY: forwarded to the caller.
        unsafe { self.launch(&f, name, cfg, &mut params) }
    }

    /// Records that a cudarc call made this device's context current on this thread (cudarc
    /// binds contexts itself), keeping [`CudaDevice::bind`]'s cache true with several GPUs.
    pub(crate) fn note_bound(&self) {
        BOUND.with(|b| b.set(self.ctx.cu_ctx() as usize));
    }

    /// Launches `f` on the device's stream with `args` (a pointer to each kernel parameter,
    /// in order), without allocating.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list, and every pointer the kernel follows
    /// must address live device memory of the sizes it assumes.
    pub(crate) unsafe fn launch(
        &self,
        f: &CudaFunction,
        name: &str,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        self.check_capture(name)?;
        self.bind()?;
        if !self.capturing() {
            super::note_launches(1);
        }
        // SAFETY: forwarded to the caller; the stream belongs to this context.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream.cu_stream(),
                args,
            )
        }
        .map_err(|e| Error::Cuda(format!("launching {name}: {e:?}")))
    }

    /// The kernel `name` from `source`, compiling and loading its module on first use.
    pub(crate) fn function(
        &self,
        source: KernelSource,
        name: &'static str,
    ) -> Result<CudaFunction> {
        self.function_variant(source, name, None)
    }

    /// The kernel `name` of module ([`ModuleKey`]) `source`/dtype/`op`, compiling and loading
    /// the module on first use. The first module of a dtype also starts compiling the
    /// dtype's other modules in the background.
    pub(crate) fn function_variant(
        &self,
        source: KernelSource,
        name: &'static str,
        op: Option<u8>,
    ) -> Result<CudaFunction> {
        // Names are static strings: their address identifies them; the op goes in the low
        // bits of the key (addresses are distinct, ops < 64).
        let key = (name.as_ptr() as usize) << 6 | op.map_or(63, |o| o as usize & 63);
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(f.clone());
        }
        let module_key = ModuleKey::of_kernel(source, name, op);
        let loaded = self
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&module_key)
            .cloned();
        let module = match loaded {
            Some(m) => m,
            None => {
                self.refuse_in_capture(
                    name,
                    "its kernel module is not loaded yet, and compiling or loading it cannot \
                     be recorded; run the same work once before capturing",
                )?;
                let arch = self.info.compute_capability;
                if std::env::var_os("KILN_NO_KERNEL_PREFETCH").is_none() {
                    let first_of_dtype = self
                        .dtypes_seen
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(module_key.dtype);
                    if first_of_dtype {
                        let siblings: Vec<ModuleKey> = KernelSource::ALL
                            .into_iter()
                            .filter(|s| *s != KernelSource::Unary && *s != source)
                            .filter(|s| s.dtypes().contains(&module_key.dtype))
                            .map(|s| ModuleKey {
                                source: s,
                                dtype: module_key.dtype,
                                op: None,
                            })
                            .collect();
                        super::compile::prefetch(&siblings, arch);
                    }
                }
                // Compiled without holding the module table: other modules load meanwhile.
                let cubin = cubin_for(module_key, arch)?;
                let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
                match modules.get(&module_key) {
                    Some(m) => m.clone(),
                    None => {
                        let m = self
                            .ctx
                            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                            .map_err(driver_err("loading a kernel module"))?;
                        self.note_bound();
                        modules.insert(module_key, m.clone());
                        m
                    }
                }
            }
        };
        let f = module
            .load_function(name)
            .map_err(|e| Error::Cuda(format!("kernel {name} not found: {e:?}")))?;
        self.functions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, f.clone());
        Ok(f)
    }

    /// Allocates `bytes` of device memory from the pool (from the graph's pool while a graph
    /// is captured, see graph.rs). On out-of-memory, the cache is released and the
    /// allocation retried once; a second failure is `Error::OutOfMemory`.
    pub(crate) fn alloc(
        &self,
        bytes: usize,
    ) -> Result<(
        sys::CUdeviceptr,
        usize,
        Option<Arc<super::graph::GraphPool>>,
    )> {
        if let Some(graph) = self.capture_pool() {
            self.check_capture("allocation")?;
            let class = super::alloc::size_class(bytes);
            if let Some(ptr) = graph.take(class) {
                return Ok((ptr, class, Some(graph)));
            }
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            self.bind()?;
            return match pool.alloc(bytes) {
                Ok((ptr, class)) => {
                    graph.own(class);
                    Ok((ptr, class, Some(graph)))
                }
                Err(AllocError::OutOfMemory { free }) => {
                    drop(pool);
                    self.refuse_in_capture(
                        "allocation",
                        &format!(
                            "{bytes} bytes do not fit ({free} bytes free), and releasing the \
                             cache would synchronise"
                        ),
                    )
                    .map(|_| unreachable!("refused while capturing"))
                }
                Err(AllocError::Driver(e)) => {
                    Err(Error::Cuda(format!("allocating {bytes} bytes: {e}")))
                }
            };
        }
        crate::backend::check_not_capturing_elsewhere(self.device(), "allocation")?;
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if !pool.has_cached(bytes) {
            self.bind()?;
        }
        match pool.alloc(bytes) {
            Ok((p, c)) => return Ok((p, c, None)),
            Err(AllocError::Driver(e)) => {
                return Err(Error::Cuda(format!("allocating {bytes} bytes: {e}")))
            }
            Err(AllocError::OutOfMemory { .. }) => {}
        }
        // Queued kernels may still read cached buffers: wait for them before freeing.
        self.stream
            .synchronize()
            .map_err(driver_err("synchronising before releasing the cache"))?;
        pool.stats.oom_retries += 1;
        pool.release_cached();
        match pool.alloc(bytes) {
            Ok((p, c)) => Ok((p, c, None)),
            Err(AllocError::OutOfMemory { free }) => Err(Error::OutOfMemory {
                device: self.device(),
                requested: bytes,
                free,
            }),
            Err(AllocError::Driver(e)) => {
                Err(Error::Cuda(format!("allocating {bytes} bytes: {e}")))
            }
        }
    }

    /// Returns a buffer to the pool. While a graph is captured, the graph adopts it instead:
    /// the graph may read it on every replay.
    pub(crate) fn free(&self, ptr: sys::CUdeviceptr, class: usize) {
        if let Some(graph) = self.capture_pool() {
            // It stays counted in use in the device's statistics until the graph lets it go.
            graph.adopt(ptr, class);
            return;
        }
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free(ptr, class);
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    pub fn reset_peak(&self) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.stats.peak_bytes_in_use = pool.stats.bytes_in_use;
    }

    /// Returns every cached buffer to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.refuse_in_capture("empty_cache", "freeing memory synchronises with the device")?;
        self.bind()?;
        self.synchronize()?;
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release_cached();
        Ok(())
    }

    /// Waits for all queued work, then reports an out-of-range index that an index kernel
    /// met since the last check. The flag is per device: the first read or synchronisation
    /// after the faulty op, from any thread, reports it.
    pub fn synchronize(&self) -> Result<()> {
        self.refuse_in_capture(
            "synchronize",
            "waiting for the device cannot be recorded; read results after a replay",
        )?;
        self.bind()?;
        cuda_trace!("synchronize {}", self.device());
        self.stream
            .synchronize()
            .map_err(driver_err("synchronising the stream"))?;
        self.check_error_flag()
    }

    pub(crate) fn check_error_flag(&self) -> Result<()> {
        self.refuse_in_capture(
            "reading the error flag",
            "reading device memory from the host cannot be recorded",
        )?;
        if !self.flag_armed.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let mut flag = [0u32];
        // SAFETY: the flag holds 4 bytes; the stream was synchronised by the caller (the
        // blocking copy orders after queued work on the legacy default stream anyway).
        unsafe { result::memcpy_dtoh_sync(&mut flag, self.error_flag) }
            .map_err(driver_err("reading the error flag"))?;
        if flag[0] != 0 {
            // SAFETY: 4 bytes at `error_flag`.
            unsafe { result::memset_d8_sync(self.error_flag, 0, 4) }
                .map_err(driver_err("clearing the error flag"))?;
            let what = match flag[0] {
                2 => "cross_entropy met a label outside [0, classes)",
                _ => "an index op (index_select, gather or scatter_add) met an index out of range",
            };
            return Err(Error::Msg(format!(
                "{what} on {}; its result is invalid",
                self.device()
            )));
        }
        Ok(())
    }

    /// The cuBLAS handle, created on first use with a 32 MiB workspace.
    pub(crate) fn with_blas<R>(
        &self,
        f: impl FnOnce(cudarc::cublas::sys::cublasHandle_t) -> Result<R>,
    ) -> Result<R> {
        use cudarc::cublas::{result as blas, sys as bsys};
        let mut guard = self.blas.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            self.refuse_in_capture(
                "cuBLAS",
                "cuBLAS is first used here and its set-up cannot be recorded; run the same \
                 work once before capturing",
            )?;
            self.bind()?;
            // SAFETY: probes for the library without calling into it.
            if !unsafe { bsys::is_culib_present() } {
                return Err(Error::Cuda(
                    "cuBLAS (libcublas) is not installed or not on the library path".into(),
                ));
            }
            let handle =
                blas::create_handle().map_err(|e| Error::Cuda(format!("cublasCreate: {e:?}")))?;
            // SAFETY: the handle is live; the stream belongs to this context.
            unsafe { blas::set_stream(handle, self.stream.cu_stream() as _) }
                .map_err(|e| Error::Cuda(format!("cublasSetStream: {e:?}")))?;
            const WORKSPACE: usize = 32 << 20;
            // SAFETY: a plain allocation owned by the handle for the process lifetime.
            let ws = unsafe { result::malloc_sync(WORKSPACE) }
                .map_err(driver_err("allocating the cuBLAS workspace"))?;
            // SAFETY: the workspace is WORKSPACE bytes and outlives the handle.
            unsafe { bsys::cublasSetWorkspace_v2(handle, ws as *mut _, WORKSPACE) }
                .result()
                .map_err(|e| Error::Cuda(format!("cublasSetWorkspace: {e:?}")))?;
            *guard = Some(Blas {
                handle,
                _workspace: ws,
            });
        }
        f(guard.as_ref().expect("created above").handle)
    }
}
