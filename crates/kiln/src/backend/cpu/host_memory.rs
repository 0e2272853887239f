//! Keeping freed host memory for reuse.
//!
//! glibc hands every freed block above 128 KiB back to the kernel (`munmap`), so the next
//! tensor of that size is fresh memory that page-faults and is zeroed by the kernel on first
//! touch. In a training step on the CPU (a dozen buffers of 100 KiB – 1 MiB) that cost more
//! than the arithmetic: a third of the time went to `clear_page`. Raising glibc's trim
//! threshold and turning its mmap off keeps such blocks in the heap, where the next
//! allocation reuses them.

/// Asks the C allocator to serve every block from its heap and keep freed ones for reuse
/// instead of returning them to the kernel, with up to 1 GiB of free memory at the top of the
/// heap: the host counterpart of the CUDA backend's caching allocator. Process-wide; the
/// `kiln` command and `kiln_nn`'s trainer call it at start, and a program that allocates
/// many large tensors can do the same. The cost is memory: blocks freed below the top of the
/// heap stay with the process (reused by later tensors) until it exits. Returns whether the
/// allocator took the settings (always `false` off glibc, where there is nothing to do).
///
/// ```
/// let _kept = kiln::retain_freed_host_memory();
/// ```
pub fn retain_freed_host_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc's upper bound for the mmap threshold on 64-bit targets.
        const MAX_THRESHOLD: i32 = 32 << 20;
        // Blocks above that threshold would still be mapped afresh and unmapped when freed:
        // a 16M-element f32 map spent 20 of its 21 ms faulting in its 64 MiB output (2-core
        // EPYC, 2026-11-26). With no mmap at all they come from the heap too: 2.5 ms.
        const NO_MMAP: i32 = 0;
        // Free memory kept at the top of the heap. At 64 MiB, a CNN step's buffers (about
        // 100 MiB at batch 256) were handed back and faulted in again on every step once an
        // earlier workload had left long-lived blocks below them: the CPU CNN epoch took 23 s
        // instead of 12.5 after the conv benchmarks had run in the same process.
        const TRIM_THRESHOLD: i32 = 1 << 30;
        // SAFETY: mallopt only sets allocator tuning parameters; any value is memory-safe.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MAX_THRESHOLD) == 1
                && libc::mallopt(libc::M_MMAP_MAX, NO_MMAP) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
