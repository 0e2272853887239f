//! Kernel sources, compiled by NVRTC for the device's architecture on first use and cached
//! on disk as cubins (key: source hash, architecture, NVRTC version), so a second run of a
//! program compiles nothing.

use crate::{DType, Error, Result};
use cudarc::nvrtc::sys;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// One CUDA C source file of the crate, compiled in pieces: one module per dtype (and, for
/// the unary kernels, per op), with `common.cuh` (and `elementwise.cuh` for the element-wise
/// ones) prepended. See [`ModuleKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSource {
    Unary,
    Binary,
    Cast,
    Reduce,
    Softmax,
    Index,
    /// Fused softmax cross-entropy.
    Loss,
    /// Fused optimizer updates.
    Optim,
    /// Convolution and pooling windows.
    Window,
    /// CSR sparse products.
    Sparse,
    /// Small dense matrix products (a candidate of the GEMM tuner).
    Gemm,
    /// Convolutions of few input channels on tensor cores (implicit GEMM).
    ConvMma,
    /// Convolutions of few output channels (an image network's first input gradient).
    ConvFew,
}

const COMMON: &str = include_str!("kernels/common.cuh");
const ELEMENTWISE: &str = include_str!("kernels/elementwise.cuh");
const WINDOW: &str = include_str!("kernels/window.cuh");
/// The convolution kernels' shared part: window.cuh, then the tensor-core building blocks.
const WINDOW_MMA: &str = concat!(
    include_str!("kernels/window.cuh"),
    "\n#line 1 \"mma.cuh\"\n",
    include_str!("kernels/mma.cuh")
);

impl KernelSource {
    pub const ALL: [KernelSource; 13] = [
        KernelSource::Unary,
        KernelSource::Binary,
        KernelSource::Cast,
        KernelSource::Reduce,
        KernelSource::Softmax,
        KernelSource::Index,
        KernelSource::Loss,
        KernelSource::Optim,
        KernelSource::Window,
        KernelSource::Sparse,
        KernelSource::Gemm,
        KernelSource::ConvMma,
        KernelSource::ConvFew,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelSource::Unary => "unary",
            KernelSource::Binary => "binary",
            KernelSource::Cast => "cast",
            KernelSource::Reduce => "reduce",
            KernelSource::Softmax => "softmax",
            KernelSource::Index => "index",
            KernelSource::Loss => "loss",
            KernelSource::Optim => "optim",
            KernelSource::Window => "window",
            KernelSource::Sparse => "sparse",
            KernelSource::Gemm => "gemm",
            KernelSource::ConvMma => "conv_mma",
            KernelSource::ConvFew => "conv_few",
        }
    }

    /// The dtypes the source has kernels for (for casts: the input dtype).
    pub fn dtypes(self) -> &'static [DType] {
        match self {
            KernelSource::Softmax
            | KernelSource::Loss
            | KernelSource::Optim
            | KernelSource::Window
            | KernelSource::ConvFew
            | KernelSource::Sparse => &DType::FLOATS,
            KernelSource::Gemm => &[DType::F32],
            KernelSource::ConvMma => &[DType::F16, DType::BF16, DType::F32],
            _ => &DType::ALL,
        }
    }

    /// The whole file: the shared headers followed by the file, every dtype.
    pub fn source(self) -> String {
        let (shared, body) = self.parts();
        format!("{COMMON}\n{shared}\n#line 1 \"{}.cu\"\n{body}", self.name())
    }

    fn parts(self) -> (&'static str, &'static str) {
        match self {
            KernelSource::Unary => (ELEMENTWISE, include_str!("kernels/unary.cu")),
            KernelSource::Binary => (ELEMENTWISE, include_str!("kernels/binary.cu")),
            KernelSource::Cast => (ELEMENTWISE, include_str!("kernels/cast.cu")),
            KernelSource::Reduce => ("", include_str!("kernels/reduce.cu")),
            KernelSource::Softmax => ("", include_str!("kernels/softmax.cu")),
            KernelSource::Index => ("", include_str!("kernels/index.cu")),
            KernelSource::Loss => (ELEMENTWISE, include_str!("kernels/loss.cu")),
            KernelSource::Optim => (ELEMENTWISE, include_str!("kernels/optim.cu")),
            KernelSource::Window => (WINDOW, include_str!("kernels/window.cu")),
            KernelSource::ConvMma => (
                WINDOW_MMA,
                concat!(
                    include_str!("kernels/conv_mma.cu"),
                    "\n#line 1 \"conv_wgrad_mma.cu\"\n",
                    include_str!("kernels/conv_wgrad_mma.cu")
                ),
            ),
            KernelSource::ConvFew => (WINDOW, include_str!("kernels/conv_few.cu")),
            KernelSource::Sparse => ("", include_str!("kernels/sparse.cu")),
            KernelSource::Gemm => ("", include_str!("kernels/gemm.cu")),
        }
    }
}

/// One compiled module: the kernels of `source` for `dtype` (every kernel of the file whose
/// instantiation line names it, e.g. `UNARY_FOR(float, f32)`), and for the unary kernels
/// with `op` fixed at compile time (the kernel then holds that op alone). Small modules
/// compile in a fraction of a second, so a program compiles only what it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey {
    pub source: KernelSource,
    pub dtype: DType,
    /// The unary op code compiled in (`KILN_FIXED_OP`), or none: every op, chosen at run time.
    pub op: Option<u8>,
}

impl ModuleKey {
    /// The module of kernel `name` (whose first `_`-separated dtype token is its dtype, e.g.
    /// `softmax_f32_16_v`, `cast_f16_i64`: casts are grouped by input dtype).
    pub fn of_kernel(source: KernelSource, name: &str, op: Option<u8>) -> ModuleKey {
        let dtype = name
            .split('_')
            .find_map(|t| DType::ALL.into_iter().find(|d| d.as_str() == t))
            .unwrap_or(DType::F32);
        ModuleKey { source, dtype, op }
    }

    /// The module's name: `unary-f32-op3`, `binary-i64`.
    pub fn name(&self) -> String {
        match self.op {
            Some(op) => format!("{}-{}-op{op}", self.source.name(), self.dtype),
            None => format!("{}-{}", self.source.name(), self.dtype),
        }
    }

    /// The module's source: the file with only this dtype's instantiation lines kept.
    pub fn source_text(&self) -> String {
        let (shared, body) = self.source.parts();
        let keep = |line: &str| match instantiation_dtype(line) {
            Some(d) => d == self.dtype.as_str(),
            None => true,
        };
        let body: Vec<&str> = body.lines().filter(|l| keep(l)).collect();
        let fixed = self
            .op
            .map_or(String::new(), |op| format!("#define KILN_FIXED_OP {op}\n"));
        format!(
            "{fixed}{COMMON}\n{shared}\n#line 1 \"{}.cu\"\n{}\n",
            self.source.name(),
            body.join("\n")
        )
    }
}

/// The dtype name of an instantiation line `MACRO(type, name)`, if the line is one.
fn instantiation_dtype(line: &str) -> Option<&str> {
    let line = line.trim();
    let (mac, rest) = line.split_once('(')?;
    if mac.is_empty() || !mac.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        return None;
    }
    let args = rest.strip_suffix(')')?;
    let (_, name) = args.split_once(',')?;
    let name = name.trim();
    DType::ALL
        .iter()
        .any(|d| d.as_str() == name)
        .then_some(name)
}

/// Whether NVRTC can be loaded (it may be present without a GPU, as in CI).
pub fn nvrtc_available() -> bool {
    // SAFETY: probes for the shared library without calling into it.
    unsafe { sys::is_culib_present() }
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("NVRTC {what}: {r:?}")))
    }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(Error::Cuda(
            "NVRTC (libnvrtc) is not installed or not on the library path".into(),
        ));
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes.
    check(
        unsafe { sys::nvrtcVersion(&mut major, &mut minor) },
        "version",
    )?;
    Ok((major, minor))
}

/// NVRTC's target for compute capability `arch`: `sm_90a` for (9, 0), else `sm_XY`.
fn target_name(arch: (i32, i32)) -> String {
    let suffix = if arch == (9, 0) { "a" } else { "" };
    format!("sm_{}{}{suffix}", arch.0, arch.1)
}

/// Compiles `src` to a cubin for compute capability `arch` (e.g. (9, 0)). Errors carry the
/// compiler's log.
pub fn compile_cubin(name: &str, src: &str, arch: (i32, i32)) -> Result<Vec<u8>> {
    nvrtc_version()?;
    let csrc =
        CString::new(src).map_err(|_| Error::Cuda("kernel source contains a NUL byte".into()))?;
    let cname = CString::new(name).expect("kernel names have no NUL");
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: the strings outlive the call; no headers are passed.
    check(
        unsafe {
            sys::nvrtcCreateProgram(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "create program",
    )?;
    let opts: Vec<CString> = [
        // sm_90 compiles for sm_90a, whose cubins run on sm_90 alone (kiln compiles for the
        // device it runs on) and may use wgmma (the warpgroup convolution in conv_mma.cu).
        format!("--gpu-architecture={}", target_name(arch)),
        "-std=c++17".into(),
        "-lineinfo".into(),
    ]
    .into_iter()
    .map(|s| CString::new(s).expect("no NUL"))
    .collect();
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: `prog` is a live program and the option pointers outlive the call.
    let compiled =
        unsafe { sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let result = if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        Err(Error::Cuda(format!(
            "NVRTC failed to compile {name} for {}:\n{}",
            target_name(arch),
            program_log(prog)
        )))
    } else {
        let mut size = 0usize;
        // SAFETY: `prog` compiled; `size` is valid for writes and the buffer has `size` bytes.
        check(
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) },
            "cubin size",
        )
        .and_then(|_| {
            let mut cubin = vec![0u8; size];
            // SAFETY: the buffer holds the `size` bytes NVRTC reported for this program.
            check(
                unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()) },
                "get cubin",
            )
            .map(|_| cubin)
        })
    };
    // SAFETY: destroys the program created above, exactly once.
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: `prog` is live; the buffer holds `size` bytes including the terminating NUL.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS
            || size == 0
        {
            return String::new();
        }
        let mut buf = vec![0u8; size];
        if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) != sys::nvrtcResult::NVRTC_SUCCESS
        {
            return String::new();
        }
        CStr::from_bytes_until_nul(&buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// FNV-1a: a hash that is stable across runs, builds and Rust versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Where compiled kernels are kept: `$KILN_KERNEL_CACHE`, else `$XDG_CACHE_HOME/kiln/kernels`,
/// else `~/.cache/kiln/kernels`, else a folder under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KILN_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("kiln/kernels");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache/kiln/kernels");
    }
    std::env::temp_dir().join("kiln-kernels")
}

/// The cubin of module `key` for `arch`, from the disk cache or freshly compiled (and then
/// cached; a cache that cannot be written is not an error). One compile per module at a
/// time: a caller that finds another thread compiling it waits and reads its result.
pub fn cubin_for(key: ModuleKey, arch: (i32, i32)) -> Result<Vec<u8>> {
    cubin_cached(&cache_dir(), key, arch)
}

/// [`cubin_for`] with the cache in `dir`.
pub fn cubin_cached(dir: &std::path::Path, key: ModuleKey, arch: (i32, i32)) -> Result<Vec<u8>> {
    static LOCKS: OnceLock<Mutex<HashMap<ModuleKey, Arc<Mutex<()>>>>> = OnceLock::new();
    let lock = LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone();
    let _compiling = lock.lock().unwrap_or_else(|e| e.into_inner());
    let src = key.source_text();
    let path = cache_path(dir, &key, &src, arch)?;
    if let Ok(bytes) = std::fs::read(&path) {
        if is_cubin(&bytes) {
            return Ok(bytes);
        }
        // A truncated or foreign file: compile afresh and replace it.
    }
    let cubin = compile_cubin(&key.name(), &src, arch)?;
    let _ = write_atomically(&path, &cubin);
    Ok(cubin)
}

/// Whether `bytes` look like a whole cubin (an ELF file whose section headers lie inside it).
fn is_cubin(bytes: &[u8]) -> bool {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return false;
    }
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().expect("2 bytes"));
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a) as u64, u16_at(0x3c) as u64);
    shoff
        .checked_add(shentsize.saturating_mul(shnum))
        .is_some_and(|end| end <= bytes.len() as u64)
}

/// Where the cubin of module `key` for `arch` is cached in `dir` (the name holds a hash of
/// the module's source, the architecture and NVRTC's version).
fn cache_path(
    dir: &std::path::Path,
    key: &ModuleKey,
    src: &str,
    arch: (i32, i32),
) -> Result<PathBuf> {
    let (maj, min) = nvrtc_version()?;
    Ok(dir.join(format!(
        "{}-{:016x}-{}-nvrtc{}.{}.cubin",
        key.name(),
        fnv1a(src.as_bytes()),
        target_name(arch),
        maj,
        min
    )))
}

/// Background compiles still running, and a signal when that count changes.
static PREFETCHING: (Mutex<usize>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// Starts compiling `keys` that are not cached yet on background threads (NVRTC runs one
/// compile per thread), so the ops a program runs next rarely wait for the compiler: the
/// CUDA backend calls it with the other modules of a dtype when the dtype is first used.
///
/// A process must not exit while NVRTC compiles on another thread: NVRTC's exit-time
/// destructors free state a compile is using (a crash at exit: `free(): invalid pointer`,
/// SIGSEGV). So the first call loads NVRTC with a trivial compile and then registers an exit
/// hook that waits for the compiles in flight; exit hooks run in reverse order of
/// registration, so it runs before NVRTC's destructors. The cubins written make the next run
/// start at once.
pub fn prefetch(keys: &[ModuleKey], arch: (i32, i32)) {
    let dir = cache_dir();
    let missing: Vec<ModuleKey> = keys
        .iter()
        .copied()
        .filter(|k| cache_path(&dir, k, &k.source_text(), arch).is_ok_and(|p| !p.exists()))
        .collect();
    if missing.is_empty() {
        return;
    }
    static EXIT_HOOK: std::sync::Once = std::sync::Once::new();
    EXIT_HOOK.call_once(|| {
        let _ = compile_cubin("load", "extern \"C\" __global__ void kiln_load() {}", arch);
        #[cfg(unix)]
        // SAFETY: registers a plain `extern "C" fn()` that only waits on a static condvar.
        unsafe {
            libc::atexit(wait_for_prefetch);
        }
    });
    let (count, changed) = &PREFETCHING;
    for key in missing {
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        std::thread::spawn(move || {
            let _ = cubin_for(key, arch);
            *count.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            changed.notify_all();
        });
    }
}

/// Blocks until no background compile is running (the exit hook of [`prefetch`]).
pub extern "C" fn wait_for_prefetch() {
    let (count, changed) = &PREFETCHING;
    let mut n = count.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        n = changed.wait(n).unwrap_or_else(|e| e.into_inner());
    }
}

/// Writes `bytes` to a temporary name unique to this process and call, then renames it
/// over `path`: readers in any process see the old file or the whole new one, never a
/// torn one, and concurrent writers of one key (two processes, or a background compile and
/// the thread that needed the module) each rename a complete file.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp",
        path.file_name().unwrap().to_string_lossy(),
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
