//! Keeping freed host memory for reuse.
//!
//! glibc hands every freed block above 128 KiB back to the kernel (`munmap`), so the next
//! tensor of that size is fresh memory that page-faults and is zeroed by the kernel on first
//! touch. In a training step on the CPU (a dozen buffers of 100 KiB – 1 MiB) that cost more
//! than the arithmetic: a third of the time went to `clear_page`. Raising glibc's mmap and
//! trim thresholds keeps such blocks in the heap, where the next allocation reuses them.

/// Asks the C allocator to keep freed blocks up to 32 MiB for reuse instead of returning them
/// to the kernel, and up to 1 GiB of free memory at the top of its heap. Process-wide; the
/// `kiln` command calls it at start, and a program that allocates many mid-sized tensors per
/// step can do the same. Returns whether the allocator
/// took the setting (always `false` off glibc, where there is nothing to do).
///
/// ```
/// let _kept = kiln::retain_freed_host_memory();
/// ```
pub fn retain_freed_host_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // glibc's upper bound for the mmap threshold on 64-bit targets.
        const MAX_THRESHOLD: i32 = 32 << 20;
        // Free memory kept at the top of the heap. At 64 MiB, a CNN step's buffers (about
        // 100 MiB at batch 256) were handed back and faulted in again on every step once an
        // earlier workload had left long-lived blocks below them: the CPU CNN epoch took 23 s
        // instead of 12.5 after the conv benchmarks had run in the same process.
        const TRIM_THRESHOLD: i32 = 1 << 30;
        // SAFETY: mallopt only sets allocator tuning parameters; any value is memory-safe.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MAX_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
