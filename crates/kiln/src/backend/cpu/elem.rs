//! Scalar arithmetic per element type, used by the CPU kernels.
//!
//! Floats compute in [`Elem::C`] (f32 for the 16-bit types and f32, f64 for f64) and round
//! once; integers use wrapping arithmetic, and integer division by zero gives 0 (never a panic).

use crate::dtype::WithDType;
use half::{bf16, f16};
use num_traits::Float;

/// Extra math the `num_traits::Float` trait lacks.
pub(crate) trait Real: Float + Send + Sync + std::fmt::Debug + 'static {
    fn erf(self) -> Self;
    fn from_f64c(v: f64) -> Self;
}
impl Real for f32 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    #[inline(always)]
    fn from_f64c(v: f64) -> Self {
        v as f32
    }
}
impl Real for f64 {
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erf(self)
    }
    #[inline(always)]
    fn from_f64c(v: f64) -> Self {
        v
    }
}

/// Binary arithmetic on one element type.
pub(crate) trait Elem: WithDType {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// NaN-propagating maximum.
    fn maximum(self, o: Self) -> Self;
    fn minimum(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
}

/// Float element types and their compute type.
pub(crate) trait FloatElem: Elem {
    type C: Real;
    fn to_c(self) -> Self::C;
    fn from_c(v: Self::C) -> Self;
}

macro_rules! float_elem {
    ($ty:ty, $c:ty, $to:expr, $from:expr) => {
        impl FloatElem for $ty {
            type C = $c;
            #[inline(always)]
            fn to_c(self) -> $c {
                $to(self)
            }
            #[inline(always)]
            fn from_c(v: $c) -> Self {
                $from(v)
            }
        }
        impl Elem for $ty {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                Self::from_c(self.to_c() + o.to_c())
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                Self::from_c(self.to_c() - o.to_c())
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                Self::from_c(self.to_c() * o.to_c())
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                Self::from_c(self.to_c() / o.to_c())
            }
            #[inline(always)]
            fn maximum(self, o: Self) -> Self {
                if self.is_nan() || self > o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn minimum(self, o: Self) -> Self {
                if self.is_nan() || self < o {
                    self
                } else {
                    o
                }
            }
            #[inline(always)]
            fn neg(self) -> Self {
                Self::from_c(-self.to_c())
            }
            #[inline(always)]
            fn abs(self) -> Self {
                Self::from_c(self.to_c().abs())
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                self.to_c().is_nan()
            }
        }
    };
}

float_elem!(f16, f32, f16::to_f32, f16::from_f32);
float_elem!(bf16, f32, bf16::to_f32, bf16::from_f32);
float_elem!(f32, f32, |v| v, |v| v);
float_elem!(f64, f64, |v| v, |v| v);

macro_rules! int_elem {
    ($ty:ty, $abs:expr) => {
        impl Elem for $ty {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self.checked_div(o).unwrap_or(0)
            }
            #[inline(always)]
            fn maximum(self, o: Self) -> Self {
                self.max(o)
            }
            #[inline(always)]
            fn minimum(self, o: Self) -> Self {
                self.min(o)
            }
            #[inline(always)]
            fn neg(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $abs(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                false
            }
        }
    };
}

int_elem!(u8, |v| v);
int_elem!(u32, |v| v);
int_elem!(i64, |v: i64| v.wrapping_abs());
