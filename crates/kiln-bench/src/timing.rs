//! Median timings on a device.

use kiln::{Device, Result};
use std::time::{Duration, Instant};

pub struct Timer {
    pub device: Device,
    pub quick: bool,
}

/// What [`Timer::median_us_per_call`] counts.
#[derive(Clone, Copy)]
pub enum Clock {
    /// Up to the synchronisation after the last call: the host's and the device's work.
    Wall,
    /// Up to the last call's return, after synchronising before the run: the host's share
    /// alone, for runs too short to fill the device's launch queue.
    Host,
}

impl Timer {
    /// Median milliseconds of `f` over repeats after `warmup` calls. On CUDA each repeat is
    /// timed with events on the device stream; on wgpu with GPU timestamps around each of a
    /// burst of repeats; on the CPU with the wall clock.
    pub fn median_ms(&self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let (warmup, min_reps, budget) = if self.quick {
            (1, 3, Duration::from_millis(100))
        } else {
            (3, 10, Duration::from_millis(800))
        };
        for _ in 0..warmup {
            f()?;
        }
        self.sync()?;
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < min_reps || (start.elapsed() < budget && times.len() < 200) {
            match self.device {
                // Bursts of back-to-back runs, read once (`kiln::wgpu::time_each`): less
                // idle time for NVIDIA's Vulkan driver to lower the clock over, though it
                // still does (docs/benchmarks.md, session 19).
                #[cfg(feature = "wgpu")]
                Device::Wgpu(o) => times.extend(kiln::wgpu::time_each(o, min_reps, &mut f)?),
                _ => times.push(self.once(&mut f)?),
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    fn once(&self, f: &mut impl FnMut() -> Result<()>) -> Result<f64> {
        match self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => Ok(kiln::cuda::time_region(o, &mut *f)?.1 as f64),
            _ => {
                let t = Instant::now();
                f()?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            }
        }
    }

    /// Median wall-clock milliseconds of `f`, synchronising the device before each stop of
    /// the clock (for host-side costs and transfers).
    pub fn median_wall_ms(&self, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        let reps = if self.quick { 3 } else { 9 };
        f()?;
        self.sync()?;
        let mut times = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            f()?;
            self.sync()?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Median over `runs` runs of the microseconds per call of `reps` back-to-back calls
    /// of `f`, measured with the wall clock as `clock` says.
    pub fn median_us_per_call(
        &self,
        runs: usize,
        reps: usize,
        clock: Clock,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f64> {
        let mut per_call = Vec::with_capacity(runs);
        for _ in 0..runs.max(1) {
            if let Clock::Host = clock {
                self.sync()?;
            }
            let t = Instant::now();
            for _ in 0..reps {
                f()?;
            }
            if let Clock::Wall = clock {
                self.sync()?;
            }
            per_call.push(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
        }
        self.sync()?;
        per_call.sort_by(f64::total_cmp);
        Ok(per_call[per_call.len() / 2])
    }

    pub fn sync(&self) -> Result<()> {
        match self.device {
            #[cfg(feature = "cuda")]
            Device::Cuda(o) => kiln::cuda::synchronize(o),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(o) => kiln::wgpu::synchronize(o),
            _ => Ok(()),
        }
    }
}
