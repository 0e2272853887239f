//! Run-time instruction-set dispatch for the CPU kernels.
//!
//! Each kernel is written once, as plain branch-free Rust over slices, and compiled several
//! times by [`simd_fn!`]: for AVX-512 and for AVX2 + FMA (x86-64), for NEON (aarch64, always
//! present there), and for the target's baseline. The compiler vectorises each copy for its
//! instruction set; [`level`] picks one at run time, once per process. One binary runs on
//! every CPU of its target.
//!
//! `KILN_CPU_SIMD=scalar|avx2|avx512|neon` (read once) or [`set_simd_level`] forces a lower
//! level, so tests can check the baseline code on a machine that has more.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod kernels;
pub(crate) mod math;
pub(crate) mod reduce;
#[cfg(target_arch = "x86_64")]
pub(crate) mod transpose;
pub(crate) mod typed;

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction set the CPU kernels are compiled for, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// No run-time features: the target's baseline (SSE2 on x86-64, which the compiler may
    /// still use four lanes at a time), without fused multiply-add.
    Scalar,
    /// aarch64 NEON with FMA (every aarch64 CPU).
    Neon,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 (F, BW, DQ, VL) with FMA and F16C.
    Avx512,
}

impl SimdLevel {
    /// The name `KILN_CPU_SIMD` accepts.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Neon => "neon",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        [
            SimdLevel::Scalar,
            SimdLevel::Neon,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
        ]
        .into_iter()
        .find(|l| l.name() == s.trim().to_ascii_lowercase())
    }

    /// Whether this CPU can run code compiled for this level.
    pub fn is_supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                SimdLevel::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best level this CPU supports.
    pub fn best() -> Self {
        [SimdLevel::Avx512, SimdLevel::Avx2, SimdLevel::Neon]
            .into_iter()
            .find(|l| l.is_supported())
            .unwrap_or(SimdLevel::Scalar)
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// 0: not chosen yet; otherwise 1 + the level's index.
static LEVEL: AtomicU8 = AtomicU8::new(0);

fn encode(l: SimdLevel) -> u8 {
    1 + l as u8
}

fn decode(v: u8) -> SimdLevel {
    match v {
        2 => SimdLevel::Neon,
        3 => SimdLevel::Avx2,
        4 => SimdLevel::Avx512,
        _ => SimdLevel::Scalar,
    }
}

#[cold]
fn choose() -> SimdLevel {
    let best = SimdLevel::best();
    let level = match std::env::var("KILN_CPU_SIMD") {
        Ok(s) => match SimdLevel::from_name(&s) {
            Some(l) if l.is_supported() => l,
            _ => {
                eprintln!(
                    "kiln: KILN_CPU_SIMD={s:?} is not a level this CPU runs \
                     (scalar, neon, avx2, avx512); using {best}"
                );
                best
            }
        },
        Err(_) => best,
    };
    LEVEL.store(encode(level), Ordering::Relaxed);
    level
}

/// The instruction set the CPU kernels use.
///
/// ```
/// let level = kiln::simd_level();
/// assert!(level.is_supported());
/// ```
#[inline]
pub fn simd_level() -> SimdLevel {
    match LEVEL.load(Ordering::Relaxed) {
        0 => choose(),
        v => decode(v),
    }
}

/// Makes the CPU kernels use `level` (process-wide), e.g. [`SimdLevel::Scalar`] to check the
/// baseline code; an error if this CPU lacks it.
///
/// ```
/// use kiln::SimdLevel;
/// let before = kiln::simd_level();
/// kiln::set_simd_level(SimdLevel::Scalar)?;
/// assert_eq!(kiln::simd_level(), SimdLevel::Scalar);
/// kiln::set_simd_level(before)?;
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn set_simd_level(level: SimdLevel) -> crate::Result<()> {
    if !level.is_supported() {
        return Err(crate::Error::Msg(format!(
            "set_simd_level: this CPU cannot run {level} code (best: {})",
            SimdLevel::best()
        )));
    }
    LEVEL.store(encode(level), Ordering::Relaxed);
    Ok(())
}

/// Defines a kernel compiled once per [`SimdLevel`] and dispatched at run time.
///
/// The body sees a `const FMA: bool` (true where the level has fused multiply-add), which it
/// passes to the math in [`math`]. The body must be `#[inline(always)]`-able code: everything
/// it calls is inlined into each compiled copy, so it vectorises for that copy's instruction
/// set.
macro_rules! simd_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident $(<$($g:ident : $bound:path),*>)? ($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn body<$($($g: $bound,)*)? const FMA: bool>($($arg: $ty),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
            #[allow(clippy::too_many_arguments)]
            fn avx512 $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
                body::<$($($g,)*)? true>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            #[allow(clippy::too_many_arguments)]
            fn avx2 $(<$($g: $bound),*>)? ($($arg: $ty),*) $(-> $ret)? {
                body::<$($($g,)*)? true>($($arg),*)
            }
            match $crate::backend::cpu::simd::simd_level() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `simd_level` reports AVX-512 only where the CPU has every feature
                // `avx512` is compiled for (`SimdLevel::is_supported`).
                $crate::backend::cpu::simd::SimdLevel::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as above, for AVX2, FMA and F16C.
                $crate::backend::cpu::simd::SimdLevel::Avx2 => unsafe { avx2($($arg),*) },
                // NEON and FMA are part of every aarch64 target: no attribute needed.
                #[cfg(target_arch = "aarch64")]
                $crate::backend::cpu::simd::SimdLevel::Neon => body::<$($($g,)*)? true>($($arg),*),
                _ => body::<$($($g,)*)? false>($($arg),*),
            }
        }
    };
}
pub(crate) use simd_fn;
