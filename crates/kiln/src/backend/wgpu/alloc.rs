//! The caching allocator of a wgpu device: freed buffers return to a pool keyed by their
//! size class (the classes and statistics of the CUDA allocator) and are handed out again
//! without asking the driver. Every buffer has the same usages, so any buffer serves any
//! request of its class.

use super::context::WgpuDevice;
use super::WgpuBuffer;
use crate::backend::memory::{size_class, MemoryStats};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    pub stats: MemoryStats,
}

impl Pool {
    fn note_in_use(&mut self, class: u64) {
        self.stats.bytes_in_use += class as usize;
        self.stats.peak_bytes_in_use = self.stats.peak_bytes_in_use.max(self.stats.bytes_in_use);
    }
}

impl WgpuDevice {
    /// A buffer of at least `bytes` bytes (rounded to its size class), from the pool when it
    /// has one. Out of memory empties the pool and tries once more, then is
    /// [`Error::OutOfMemory`].
    pub(crate) fn alloc_raw(self: &Arc<Self>, bytes: u64) -> Result<Arc<WgpuBuffer>> {
        let class = size_class(bytes.max(4) as usize) as u64;
        if class > self.limits.max_buffer_size {
            return Err(self.error(format!(
                "a tensor of {bytes} bytes is larger than this adapter's largest buffer ({} bytes)",
                self.limits.max_buffer_size
            )));
        }
        {
            let mut pool = self.pool.lock();
            pool.stats.requests += 1;
            if let Some(buffer) = pool.free.get_mut(&class).and_then(Vec::pop) {
                pool.stats.reuses += 1;
                pool.stats.bytes_cached -= class as usize;
                pool.note_in_use(class);
                return Ok(self.wrap(buffer, class));
            }
        }
        let buffer = match self.create(class) {
            Some(b) => b,
            None => {
                self.release_cached()?;
                self.pool.lock().stats.oom_retries += 1;
                self.create(class).ok_or_else(|| {
                    self.pool.lock().stats.requests -= 1;
                    Error::OutOfMemory {
                        device: self.kiln_device(),
                        requested: bytes as usize,
                        free: 0,
                    }
                })?
            }
        };
        let mut pool = self.pool.lock();
        pool.stats.driver_allocations += 1;
        pool.note_in_use(class);
        drop(pool);
        Ok(self.wrap(buffer, class))
    }

    fn wrap(self: &Arc<Self>, buffer: wgpu::Buffer, class: u64) -> Arc<WgpuBuffer> {
        Arc::new(WgpuBuffer {
            buffer,
            class,
            device: self.clone(),
        })
    }

    /// A new buffer, `None` when the device is out of memory.
    fn create(&self, class: u64) -> Option<wgpu::Buffer> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: class,
            usage: USAGE,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            None => Some(buffer),
            Some(_) => None,
        }
    }

    /// Returns a buffer to the pool.
    pub(super) fn free(&self, buffer: wgpu::Buffer, class: u64) {
        let mut pool = self.pool.lock();
        pool.stats.bytes_in_use -= class as usize;
        pool.stats.bytes_cached += class as usize;
        pool.free.entry(class).or_default().push(buffer);
    }

    /// Gives every pooled buffer back to the driver (after the queue drains, so no
    /// submitted work still uses one).
    pub(crate) fn release_cached(self: &Arc<Self>) -> Result<()> {
        self.synchronize()?;
        let mut pool = self.pool.lock();
        for (_, buffers) in pool.free.drain() {
            for b in buffers {
                b.destroy();
            }
        }
        pool.stats.bytes_cached = 0;
        Ok(())
    }

    pub(crate) fn reset_peak(&self) {
        let mut pool = self.pool.lock();
        pool.stats.peak_bytes_in_use = pool.stats.bytes_in_use;
    }
}
