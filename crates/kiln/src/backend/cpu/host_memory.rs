//! Keeping freed host memory for reuse.
//!
//! glibc hands every freed block above 128 KiB back to the kernel (`munmap`), so the next
//! tensor of that size is fresh memory that page-faults and is zeroed by the kernel on first
//! touch. In a training step on the CPU (a dozen buffers of 100 KiB – 1 MiB) that cost more
//! than the arithmetic: a third of the time went to `clear_page`. Raising glibc's mmap and
//! trim thresholds keeps such blocks in the heap, where the next allocation reuses them.

/// Asks the C allocator to keep freed blocks up to 32 MiB for reuse instead of returning them
/// to the kernel. Process-wide; the `kiln` command calls it at start, and a program that
/// allocates many mid-sized tensors per step can do the same. Returns whether the allocator
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
        // SAFETY: mallopt only sets allocator tuning parameters; any value is memory-safe.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MAX_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * MAX_THRESHOLD) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
