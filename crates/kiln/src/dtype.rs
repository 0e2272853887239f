//! Element types: the runtime tag [`DType`] and the Rust types that carry it.

use half::{bf16, f16};

/// The element type of a tensor, known at run time.
///
/// ```
/// use kiln::DType;
/// assert_eq!(DType::BF16.size_in_bytes(), 2);
/// assert!(DType::F32.is_float() && !DType::I64.is_float());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
    F64,
    U8,
    U32,
    I64,
}

impl DType {
    /// Every dtype, for tests and documentation.
    pub const ALL: [DType; 7] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::U8,
        DType::U32,
        DType::I64,
    ];

    /// The floating-point dtypes.
    pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::U32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    pub fn is_int(self) -> bool {
        !self.is_float()
    }

    /// The name PyTorch and safetensors use (`"f32"`, `"bf16"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I64 => "i64",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A vector of one dtype's elements: host memory as the CPU backend keeps it (there it is
/// named `CpuStorage`).
#[derive(Clone, Debug)]
pub enum TypedVec {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    U8(Vec<u8>),
    U32(Vec<u32>),
    I64(Vec<i64>),
}

/// A Rust type that is the element of a tensor of dtype [`WithDType::DTYPE`].
///
/// Conversions go through `f64`, which holds every value of every supported type exactly
/// except `i64` beyond 2^53.
pub trait WithDType:
    Copy + Send + Sync + PartialOrd + PartialEq + std::fmt::Debug + bytemuck::Pod + 'static
{
    const DTYPE: DType;
    const ZERO: Self;
    const ONE: Self;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Integer value (floats truncate toward zero and saturate).
    fn to_i64(self) -> i64;
    /// From an integer; integer types wrap (two's complement), as C and PyTorch casts do.
    fn from_i64(v: i64) -> Self;
    /// Wraps a vector in the variant of this type.
    fn into_cpu_storage(v: Vec<Self>) -> TypedVec;
    /// Unwraps the vector of this type, `None` for another dtype.
    fn from_cpu_storage(s: TypedVec) -> Option<Vec<Self>>;
    /// Borrows the vector of this type, `None` for another dtype.
    fn cpu_slice(s: &TypedVec) -> Option<&[Self]>;
    fn cpu_slice_mut(s: &mut TypedVec) -> Option<&mut [Self]>;
}

/// f64 to f32 rounding to odd: an inexact result gets its last bit set, so that rounding it
/// again to a type with fewer bits (f16, bf16) gives what one rounding from f64 would.
/// (`half`'s own f64 conversions drop the low 32 bits before rounding, which misrounds
/// values just above a tie.)
#[inline(always)]
fn f64_to_f32_round_odd(v: f64) -> f32 {
    let f = v as f32;
    if !f.is_finite() || f as f64 == v {
        return f;
    }
    // Toward zero first (|f| > |v| means f is not zero), then mark the lost bits.
    let t = if (f as f64).abs() > v.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(t.to_bits() | 1)
}

macro_rules! with_dtype {
    ($ty:ty, $variant:ident, $zero:expr, $one:expr, $from:expr, $to:expr, $to_i:expr, $from_i:expr) => {
        impl WithDType for $ty {
            const DTYPE: DType = DType::$variant;
            const ZERO: Self = $zero;
            const ONE: Self = $one;
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                $to(self)
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                $to_i(self)
            }
            #[inline(always)]
            fn from_i64(v: i64) -> Self {
                $from_i(v)
            }
            fn into_cpu_storage(v: Vec<Self>) -> TypedVec {
                TypedVec::$variant(v)
            }
            fn from_cpu_storage(s: TypedVec) -> Option<Vec<Self>> {
                match s {
                    TypedVec::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_slice(s: &TypedVec) -> Option<&[Self]> {
                match s {
                    TypedVec::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn cpu_slice_mut(s: &mut TypedVec) -> Option<&mut [Self]> {
                match s {
                    TypedVec::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

with_dtype!(
    f16,
    F16,
    f16::ZERO,
    f16::ONE,
    |v| f16::from_f32(f64_to_f32_round_odd(v)),
    f16::to_f64,
    |v: f16| v.to_f64() as i64,
    |v| f16::from_f32(f64_to_f32_round_odd(v as f64))
);
with_dtype!(
    bf16,
    BF16,
    bf16::ZERO,
    bf16::ONE,
    |v| bf16::from_f32(f64_to_f32_round_odd(v)),
    bf16::to_f64,
    |v: bf16| v.to_f64() as i64,
    |v| bf16::from_f32(f64_to_f32_round_odd(v as f64))
);
with_dtype!(
    f32,
    F32,
    0.0,
    1.0,
    |v| v as f32,
    |v: f32| v as f64,
    |v: f32| v as i64,
    |v| v as f32
);
with_dtype!(f64, F64, 0.0, 1.0, |v| v, |v| v, |v: f64| v as i64, |v| v
    as f64);
with_dtype!(
    u8,
    U8,
    0,
    1,
    |v: f64| v as u8,
    |v: u8| v as f64,
    |v: u8| v as i64,
    |v| v as u8
);
with_dtype!(
    u32,
    U32,
    0,
    1,
    |v: f64| v as u32,
    |v: u32| v as f64,
    |v: u32| v as i64,
    |v| v as u32
);
with_dtype!(
    i64,
    I64,
    0,
    1,
    |v: f64| v as i64,
    |v: i64| v as f64,
    |v| v,
    |v| v
);

/// Floating-point element types; half types compute through `f32` and round once.
pub trait FloatDType: WithDType {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl FloatDType for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl FloatDType for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl FloatDType for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl FloatDType for f64 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
}
