//! The caching device allocator. Freed buffers return to a pool keyed by their rounded size
//! and are handed out again without a driver call. All work runs on one stream per device,
//! so a buffer freed while a kernel still reads it is only rewritten by work queued after
//! that kernel: reuse needs no synchronisation.

use cudarc::driver::{result, sys::CUdeviceptr};
use std::collections::HashMap;

pub use crate::backend::memory::{size_class, MemoryStats};

#[derive(Default)]
pub struct Pool {
    free: HashMap<usize, Vec<CUdeviceptr>>,
    pub stats: MemoryStats,
}

/// Why an allocation failed.
pub enum AllocError {
    OutOfMemory { free: usize },
    Driver(String),
}

impl Pool {
    /// Whether a request for `bytes` would be served from the pool.
    pub fn has_cached(&self, bytes: usize) -> bool {
        self.free
            .get(&size_class(bytes))
            .is_some_and(|v| !v.is_empty())
    }

    /// A buffer of at least `bytes` (its size class). The device's context must be current
    /// when the pool has none.
    pub fn alloc(&mut self, bytes: usize) -> std::result::Result<(CUdeviceptr, usize), AllocError> {
        let class = size_class(bytes);
        self.stats.requests += 1;
        if let Some(ptr) = self.free.get_mut(&class).and_then(Vec::pop) {
            self.stats.reuses += 1;
            self.stats.bytes_cached -= class;
            self.note_in_use(class);
            return Ok((ptr, class));
        }
        let ptr = match Self::driver_alloc(class) {
            Ok(p) => p,
            Err(e) => {
                self.stats.requests -= 1;
                return Err(match e.0 {
                    cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                        AllocError::OutOfMemory {
                            free: result::mem_get_info().map(|(f, _)| f).unwrap_or(0),
                        }
                    }
                    _ => AllocError::Driver(format!("{e:?}")),
                });
            }
        };
        self.stats.driver_allocations += 1;
        self.note_in_use(class);
        Ok((ptr, class))
    }

    fn driver_alloc(bytes: usize) -> std::result::Result<CUdeviceptr, cudarc::driver::DriverError> {
        // SAFETY: a plain device allocation; the caller made the device's context current.
        unsafe { result::malloc_sync(bytes) }
    }

    fn note_in_use(&mut self, class: usize) {
        self.stats.bytes_in_use += class;
        self.stats.peak_bytes_in_use = self.stats.peak_bytes_in_use.max(self.stats.bytes_in_use);
    }

    /// Returns a buffer to the pool.
    pub fn free(&mut self, ptr: CUdeviceptr, class: usize) {
        self.stats.bytes_in_use -= class;
        self.stats.bytes_cached += class;
        self.free.entry(class).or_default().push(ptr);
    }

    /// Frees every cached buffer back to the driver. Work still queued may read them, so the
    /// caller synchronises the stream first.
    pub fn release_cached(&mut self) {
        for (_, ptrs) in self.free.drain() {
            for p in ptrs {
                // SAFETY: `p` came from `malloc_sync` and is not in use (it is in the pool).
                let _ = unsafe { result::free_sync(p) };
            }
        }
        self.stats.bytes_cached = 0;
    }
}
