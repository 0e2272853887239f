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

/// Buffers from this size up ask for 2 MiB pages ([`with_capacity_huge`]).
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// An empty vector with room for `n` elements whose whole 2 MiB pages the kernel may back
/// with transparent huge pages (`madvise(MADV_HUGEPAGE)`, before anything touches them), where
/// the buffer is at least 4 MiB.
///
/// Why: with 4 KiB pages a core's hardware prefetcher stops at every page boundary, and a
/// streaming read of 64 MiB on the 2-core EPYC ran at 21–24 GB/s on one core against
/// 42–44 GB/s with 2 MiB pages (35–59 against 74–89 GB/s on two; 2026-11-27). Linux's
/// default THP mode is `madvise`, so without the advice every tensor gets 4 KiB pages.
/// Elsewhere (another OS, THP off) the advice is a no-op.
pub(crate) fn with_capacity_huge<T>(n: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(n);
    advise_huge_pages(
        v.as_ptr().cast(),
        n.saturating_mul(std::mem::size_of::<T>()),
    );
    v
}

/// `n` copies of `value`, in a buffer from [`with_capacity_huge`] where that is large,
/// written in two halves (the hot helper or the pool) from [`SPLIT_FILL_BYTES`] on. Zeros
/// are written by `memset`: a 64 MiB `resize` took 2.3–2.8 ms against 1.2–1.8 ms for
/// `calloc`'s clearing (2-core EPYC, 2026-11-27).
pub(crate) fn filled_huge<T: bytemuck::Pod + Send + Sync>(value: T, n: usize) -> Vec<T> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if bytes < SPLIT_FILL_BYTES {
        return vec![value; n];
    }
    let mut v = with_capacity_huge(n);
    let zero = bytemuck::bytes_of(&value).iter().all(|&b| b == 0);
    // Work is counted in 4-byte copies; a store of up to 8 bytes moves no more than one.
    super::chunked::split_output(&mut v.spare_capacity_mut()[..n], 1, 1, true, |_, part| {
        if zero {
            // SAFETY: `part` is `part.len()` writable elements of the vector's spare
            // capacity; all-zero bytes are a valid `T` (`Pod`) and are `value`'s own pattern.
            unsafe { std::ptr::write_bytes(part.as_mut_ptr(), 0, part.len()) }
        } else {
            part.fill(std::mem::MaybeUninit::new(value));
        }
    });
    // SAFETY: every one of the first `n` elements was written above (the halves or chunks
    // of `split_output` cover the slice).
    unsafe { v.set_len(n) };
    v
}

/// Fills from this size on are split between two threads. 1 MiB of zeros took 18.7 µs on
/// one thread (`calloc`'s clearing) against PyTorch's 7.5 (2-core EPYC, session 33's table).
const SPLIT_FILL_BYTES: usize = 256 << 10;

/// Advises the kernel to back the whole 2 MiB pages of `[ptr, ptr + bytes)` with huge pages.
fn advise_huge_pages(ptr: *const u8, bytes: usize) {
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
        let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
        if end > start {
            // SAFETY: `[start, end)` lies inside the caller's allocation (page-aligned, from
            // the process's own anonymous memory); MADV_HUGEPAGE changes only how the kernel
            // backs those pages, never their contents or the mapping. A failure (THP absent
            // or disabled) leaves the default pages, so the result is ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The kB of `AnonHugePages` in the mappings of `/proc/self/smaps` that overlap
    /// `[start, end)`.
    fn huge_kb_in(start: usize, end: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut total = 0;
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
                let (a, b) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16));
                inside = matches!((a, b), (Ok(a), Ok(b)) if a < end && b > start);
            } else if inside && first == "AnonHugePages:" {
                total += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
            }
        }
        total
    }

    /// Fills of every size class (one thread, split in two, split by the pool) hold `value`
    /// in every element, for element sizes 1, 2, 4 and 8, zeros and not.
    #[test]
    fn fills_write_every_element() {
        fn check<T: bytemuck::Pod + Send + Sync + std::fmt::Debug>(value: T) {
            let size = std::mem::size_of::<T>();
            for bytes in [
                100,
                SPLIT_FILL_BYTES - 8,
                SPLIT_FILL_BYTES + 24,
                3 << 20,
                9 << 20,
            ] {
                // Odd counts (halves of unequal length), after a dirty heap, so that zeros
                // cannot come from fresh pages alone.
                let n = bytes / size + 1;
                let dirty: Vec<u8> = vec![0xA5; n * size];
                drop(dirty);
                let v = filled_huge(value, n);
                assert_eq!(v.len(), n);
                // Bit patterns: -0.0 must not come back as 0.0.
                let want = bytemuck::bytes_of(&value);
                if let Some(i) = v.iter().position(|x| bytemuck::bytes_of(x) != want) {
                    panic!(
                        "{bytes} bytes of {value:?}: element {i} of {n} is {:?}",
                        v[i]
                    );
                }
            }
        }
        check(7u8);
        check(0u8);
        check(half::f16::from_f32(-2.5));
        check(0.0f32);
        check(1.5f32);
        check(-0.0f64); // not all-zero bytes: filled by value
        check(0u64);
    }

    #[test]
    fn large_buffers_get_huge_pages_where_the_kernel_offers_them() {
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if !mode.is_ok_and(|m| m.contains("[madvise]") || m.contains("[always]")) {
            eprintln!("skipped: transparent huge pages are off here");
            return;
        }
        let n = 16 << 20;
        let v = filled_huge(1.5f32, n);
        assert!(v.iter().all(|&x| x == 1.5));
        let start = v.as_ptr() as usize;
        let huge = huge_kb_in(start, start + 4 * n);
        // At least half of the 64 MiB: the kernel may fall back to small pages for some.
        assert!(
            huge >= 32 << 10,
            "{huge} kB of huge pages in a 64 MiB buffer"
        );
        // Zeros by memset, and -0.0 (not all-zero bytes) element by element.
        let zeros = filled_huge(0f32, 2 << 20);
        assert!(zeros.len() == 2 << 20 && zeros.iter().all(|&x| x.to_bits() == 0));
        let negative = filled_huge(-0f32, 2 << 20);
        assert!(negative.iter().all(|&x| x.to_bits() == 0x8000_0000));
        // Small buffers are left alone (and must still work).
        let small = filled_huge(2u8, 1000);
        assert_eq!(small.len(), 1000);
    }
}
