//! What the device backends' caching allocators share: their statistics and size classes.

/// Allocation statistics of one device, as returned by `kiln::cuda::memory_stats` and `kiln::wgpu::memory_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Requests served (driver allocations plus reuses).
    pub requests: u64,
    /// Requests that called the driver.
    pub driver_allocations: u64,
    /// Requests served from the pool.
    pub reuses: u64,
    /// Bytes held by live buffers (rounded sizes).
    pub bytes_in_use: usize,
    /// Bytes held in the pool, free for reuse.
    pub bytes_cached: usize,
    /// Highest `bytes_in_use` seen since the last `reset_peak`.
    pub peak_bytes_in_use: usize,
    /// Times the pool was emptied to satisfy an allocation after an out-of-memory error.
    pub oom_retries: u64,
}

impl MemoryStats {
    /// Fraction of requests served from the pool.
    pub fn reuse_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.reuses as f64 / self.requests as f64
        }
    }
}

/// Rounds a request up to its size class: multiples of 512 bytes up to 1 MiB, of 2 MiB above.
pub fn size_class(bytes: usize) -> usize {
    const SMALL: usize = 512;
    const LARGE: usize = 2 << 20;
    if bytes <= 1 << 20 {
        bytes.max(1).div_ceil(SMALL) * SMALL
    } else {
        bytes.div_ceil(LARGE) * LARGE
    }
}
