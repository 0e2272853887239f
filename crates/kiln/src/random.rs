//! [`Generator`]: the explicit, seeded source of every random tensor.

use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

/// A seeded random generator. The same seed gives the same tensors on every device: values
/// are drawn on the host and then moved.
///
/// ```
/// use kiln::{Device, DType, Generator, Tensor};
/// let mut g = Generator::new(42);
/// let a = Tensor::randn([2, 3], 0.0, 1.0, DType::F32, &Device::Cpu, &mut g)?;
/// let b = Tensor::randn([2, 3], 0.0, 1.0, DType::F32, &Device::Cpu, &mut Generator::new(42))?;
/// assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Generator {
    rng: rand::rngs::StdRng,
}

impl Generator {
    pub fn new(seed: u64) -> Self {
        Generator {
            rng: rand::rngs::StdRng::seed_from_u64(seed),
        }
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.rng.random::<f64>()
    }

    /// Normal with mean `mean` and standard deviation `std`.
    pub fn normal(&mut self, mean: f64, std: f64) -> f64 {
        let z: f64 = StandardNormal.sample(&mut self.rng);
        mean + std * z
    }

    /// A uniformly random integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}
