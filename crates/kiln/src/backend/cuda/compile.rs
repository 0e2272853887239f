//! Kernel sources, compiled by NVRTC for the device's architecture on first use and cached
//! on disk as cubins (key: source hash, architecture, NVRTC version), so a second run of a
//! program compiles nothing.

use crate::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;

/// One CUDA C source file of the crate: a module compiled on its own, with `common.cuh`
/// (and `elementwise.cuh` for the element-wise ones) prepended.
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
}

const COMMON: &str = include_str!("kernels/common.cuh");
const ELEMENTWISE: &str = include_str!("kernels/elementwise.cuh");

impl KernelSource {
    pub const ALL: [KernelSource; 8] = [
        KernelSource::Unary,
        KernelSource::Binary,
        KernelSource::Cast,
        KernelSource::Reduce,
        KernelSource::Softmax,
        KernelSource::Index,
        KernelSource::Loss,
        KernelSource::Optim,
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
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The full source: the shared headers followed by the file.
    pub fn source(self) -> String {
        let (shared, body) = match self {
            KernelSource::Unary => (ELEMENTWISE, include_str!("kernels/unary.cu")),
            KernelSource::Binary => (ELEMENTWISE, include_str!("kernels/binary.cu")),
            KernelSource::Cast => (ELEMENTWISE, include_str!("kernels/cast.cu")),
            KernelSource::Reduce => ("", include_str!("kernels/reduce.cu")),
            KernelSource::Softmax => ("", include_str!("kernels/softmax.cu")),
            KernelSource::Index => ("", include_str!("kernels/index.cu")),
            KernelSource::Loss => (ELEMENTWISE, include_str!("kernels/loss.cu")),
            KernelSource::Optim => (ELEMENTWISE, include_str!("kernels/optim.cu")),
        };
        format!("{COMMON}\n{shared}\n#line 1 \"{}.cu\"\n{body}", self.name())
    }
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
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
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
            "NVRTC failed to compile {name} for sm_{}{}:\n{}",
            arch.0,
            arch.1,
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

/// The cubin of `source` for `arch`, from the disk cache or freshly compiled (and then
/// cached; a cache that cannot be written is not an error). One compile per source at a time:
/// a caller that finds another thread compiling waits and reads its result.
pub fn cubin_for(source: KernelSource, arch: (i32, i32)) -> Result<Vec<u8>> {
    cubin_cached(&cache_dir(), source, arch)
}

/// [`cubin_for`] with the cache in `dir`.
pub fn cubin_cached(
    dir: &std::path::Path,
    source: KernelSource,
    arch: (i32, i32),
) -> Result<Vec<u8>> {
    static LOCKS: [Mutex<()>; KernelSource::ALL.len()] =
        [const { Mutex::new(()) }; KernelSource::ALL.len()];
    let _compiling = LOCKS[source.index()]
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let path = cache_path(dir, source, arch)?;
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok(bytes);
        }
    }
    let cubin = compile_cubin(source.name(), &source.source(), arch)?;
    let _ = write_atomically(&path, &cubin);
    Ok(cubin)
}

/// Where the cubin of `source` for `arch` is cached in `dir` (the name holds a hash of the
/// source, the architecture and NVRTC's version).
fn cache_path(dir: &std::path::Path, source: KernelSource, arch: (i32, i32)) -> Result<PathBuf> {
    let (maj, min) = nvrtc_version()?;
    Ok(dir.join(format!(
        "{}-{:016x}-sm{}{}-nvrtc{}.{}.cubin",
        source.name(),
        fnv1a(source.source().as_bytes()),
        arch.0,
        arch.1,
        maj,
        min
    )))
}

/// Background compiles still running, and a signal when that count changes.
static PREFETCHING: (Mutex<usize>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// Starts compiling, on background threads, every source that is not cached yet, so the first
/// ops a program runs rarely wait for the compiler. NVRTC runs one compile per thread.
///
/// A process must not exit while NVRTC compiles on another thread: NVRTC's exit-time
/// destructors free state a compile is using (a crash at exit: `free(): invalid pointer`,
/// SIGSEGV). So the first call loads NVRTC with a trivial compile and then registers an exit
/// hook that waits for the compiles in flight; exit hooks run in reverse order of
/// registration, so it runs before NVRTC's destructors. The cubins written make the next run
/// start at once.
pub fn prefetch(arch: (i32, i32)) {
    let dir = cache_dir();
    let missing: Vec<KernelSource> = KernelSource::ALL
        .into_iter()
        .filter(|&s| cache_path(&dir, s, arch).is_ok_and(|p| !p.exists()))
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
    for source in missing {
        *count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        std::thread::spawn(move || {
            let _ = cubin_for(source, arch);
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

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache paths have a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
