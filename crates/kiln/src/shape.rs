//! Shapes and dimension arguments.

pub use crate::dimvec::DimVec;
pub use crate::dimvec::INLINE_DIMS;
use crate::{Error, Result};

/// The extent of each dimension, outermost first. A rank-0 shape `[]` holds one element.
///
/// ```
/// use kiln::Shape;
/// let s = Shape::from([2, 3, 4]);
/// assert_eq!((s.rank(), s.elem_count()), (3, 24));
/// assert_eq!(s.contiguous_strides().as_slice(), &[12, 4, 1]);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub(crate) DimVec);

impl Shape {
    #[inline]
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    #[inline]
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    #[inline]
    pub fn elem_count(&self) -> usize {
        self.0.iter().product()
    }

    /// Row-major strides of a contiguous tensor of this shape.
    pub fn contiguous_strides(&self) -> Strides {
        let mut strides = DimVec::from_elem(0, self.rank());
        let mut acc = 1;
        for (s, &d) in strides.iter_mut().zip(self.0.iter()).rev() {
            *s = acc;
            acc *= d;
        }
        Strides(strides)
    }

    /// The numpy broadcast of two shapes: dims are aligned at the right, and each pair must be
    /// equal or contain a 1.
    pub fn broadcast_with(&self, other: &Shape, op: &'static str) -> Result<Shape> {
        let rank = self.rank().max(other.rank());
        let mut dims = DimVec::from_elem(0, rank);
        for i in 0..rank {
            let a = if i < rank - self.rank() {
                1
            } else {
                self.0[i - (rank - self.rank())]
            };
            let b = if i < rank - other.rank() {
                1
            } else {
                other.0[i - (rank - other.rank())]
            };
            dims[i] = match (a, b) {
                (a, b) if a == b => a,
                (1, b) => b,
                (a, 1) => a,
                _ => {
                    return Err(Error::BroadcastIncompatible {
                        op,
                        lhs: self.clone(),
                        rhs: other.clone(),
                    });
                }
            };
        }
        Ok(Shape(dims))
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(DimVec::from_slice(&d))
    }
}
impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(DimVec::from_slice(d))
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(DimVec::from_vec(d))
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Self {
        Shape(DimVec::from_slice(d))
    }
}
impl From<usize> for Shape {
    fn from(d: usize) -> Self {
        Shape(DimVec::from_slice(&[d]))
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(DimVec::new())
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

/// Element strides, one per dimension (0 for a broadcast dimension).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Strides(pub(crate) DimVec);

impl Strides {
    #[inline]
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }
}

impl std::fmt::Debug for Strides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0.as_slice())
    }
}

/// A dimension argument: a `usize` counts from the front, a negative `i32`/`isize` from the
/// back (`-1` is the last dimension).
pub trait Dim: Copy {
    /// The dimension as an index below `rank`, or [`Error::DimOutOfRange`] naming `op`.
    fn to_index(self, rank: usize, op: &'static str) -> Result<usize>;
}

impl Dim for usize {
    #[inline]
    fn to_index(self, rank: usize, op: &'static str) -> Result<usize> {
        if self < rank {
            Ok(self)
        } else {
            Err(Error::DimOutOfRange {
                op,
                dim: self as isize,
                rank,
            })
        }
    }
}

impl Dim for isize {
    #[inline]
    fn to_index(self, rank: usize, op: &'static str) -> Result<usize> {
        let d = if self < 0 { self + rank as isize } else { self };
        if d >= 0 && (d as usize) < rank {
            Ok(d as usize)
        } else {
            Err(Error::DimOutOfRange {
                op,
                dim: self,
                rank,
            })
        }
    }
}

impl Dim for i32 {
    #[inline]
    fn to_index(self, rank: usize, op: &'static str) -> Result<usize> {
        (self as isize).to_index(rank, op)
    }
}

/// A set of dimensions (for reductions): one [`Dim`], an array, a slice or a vector of them.
/// Duplicates are an error.
pub trait Dims {
    fn to_indexes(&self, rank: usize, op: &'static str) -> Result<DimVec>;
}

fn collect_dims<D: Dim>(ds: &[D], rank: usize, op: &'static str) -> Result<DimVec> {
    let mut out = DimVec::new();
    for &d in ds {
        let i = d.to_index(rank, op)?;
        if out.contains(&i) {
            return Err(Error::Msg(format!("{op}: dimension {i} is listed twice")));
        }
        out.push(i);
    }
    out.sort_unstable();
    Ok(out)
}

impl<D: Dim> Dims for D {
    fn to_indexes(&self, rank: usize, op: &'static str) -> Result<DimVec> {
        collect_dims(&[*self], rank, op)
    }
}
impl<D: Dim, const N: usize> Dims for [D; N] {
    fn to_indexes(&self, rank: usize, op: &'static str) -> Result<DimVec> {
        collect_dims(self, rank, op)
    }
}
impl<D: Dim> Dims for &[D] {
    fn to_indexes(&self, rank: usize, op: &'static str) -> Result<DimVec> {
        collect_dims(self, rank, op)
    }
}
impl<D: Dim> Dims for Vec<D> {
    fn to_indexes(&self, rank: usize, op: &'static str) -> Result<DimVec> {
        collect_dims(self, rank, op)
    }
}

/// Every dimension of the tensor (e.g. `t.sum(AllDims, false)` sums to a scalar).
#[derive(Clone, Copy, Debug)]
pub struct AllDims;

impl Dims for AllDims {
    fn to_indexes(&self, rank: usize, _op: &'static str) -> Result<DimVec> {
        Ok((0..rank).collect())
    }
}
