//! [`Layout`]: how a tensor's logical indices map onto its storage. Every view op is a pure
//! function from one layout to another; none touches the data.

use crate::shape::{DimVec, Shape, Strides};
use crate::{Error, Result};

/// Shape, strides (in elements) and start offset of a tensor within its storage.
///
/// Element `[i0, i1, ..]` lives at `offset + Σ i_k * strides[k]`.
///
/// # Invariants
/// - `strides.len() == shape.rank()`.
/// - Every element the layout can address lies inside the storage it was made for: the
///   constructors that take a storage length check it, and every view only narrows the
///   addressable set (transpose, permute, narrow, slice, squeeze, unsqueeze) or repeats it
///   (broadcast, with stride 0).
/// - A dimension of extent 1 may carry any stride; code must not read meaning into it.
///
/// ```
/// use kiln::Layout;
/// let l = Layout::contiguous([2, 3]).transpose(0, 1).unwrap();
/// assert_eq!(l.dims(), &[3, 2]);
/// assert_eq!(l.strides(), &[1, 3]);
/// assert!(!l.is_contiguous());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    strides: Strides,
    offset: usize,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Layout {{ shape: {:?}, strides: {:?}, offset: {} }}",
            self.shape, self.strides, self.offset
        )
    }
}

impl Layout {
    /// Row-major layout of a freshly allocated tensor.
    pub fn contiguous(shape: impl Into<Shape>) -> Self {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    /// A layout from raw parts, checked against a storage of `storage_len` elements.
    pub fn new(
        shape: Shape,
        strides: Vec<usize>,
        offset: usize,
        storage_len: usize,
    ) -> Result<Self> {
        if strides.len() != shape.rank() {
            return Err(Error::InvalidLayout {
                op: "Layout::new",
                shape,
                strides,
                msg: "needs one stride per dimension".into(),
            });
        }
        let l = Layout {
            shape,
            strides: Strides(DimVec::from_vec(strides)),
            offset,
        };
        if l.elem_count() > 0 && l.max_offset() >= storage_len {
            return Err(Error::InvalidLayout {
                op: "Layout::new",
                shape: l.shape.clone(),
                strides: l.strides().to_vec(),
                msg: format!("offset {offset} reaches past a storage of {storage_len} elements"),
            });
        }
        Ok(l)
    }

    #[inline]
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    #[inline]
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    #[inline]
    pub fn strides(&self) -> &[usize] {
        self.strides.as_slice()
    }
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    #[inline]
    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }

    /// The largest storage offset this layout addresses (meaningless for zero elements).
    pub fn max_offset(&self) -> usize {
        self.offset
            + self
                .dims()
                .iter()
                .zip(self.strides())
                .map(|(&d, &s)| d.saturating_sub(1) * s)
                .sum::<usize>()
    }

    /// Storage offset of the element at `index` (no bounds check beyond debug builds).
    pub fn offset_of(&self, index: &[usize]) -> usize {
        debug_assert_eq!(index.len(), self.rank());
        self.offset
            + index
                .iter()
                .zip(self.strides())
                .map(|(i, s)| i * s)
                .sum::<usize>()
    }

    /// True when the elements are densely packed in row-major order, so that the data is
    /// `storage[offset .. offset + elem_count]`.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.dims().iter().zip(self.strides()).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// `Some(start..end)` of the storage when contiguous.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.elem_count())
    }

    /// Swaps two dimensions.
    #[inline]
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Self> {
        let rank = self.rank();
        if d0 >= rank || d1 >= rank {
            return Err(Error::DimOutOfRange {
                op: "transpose",
                dim: d0.max(d1) as isize,
                rank,
            });
        }
        let mut l = self.clone();
        l.swap_dims(d0, d1);
        Ok(l)
    }

    /// Swaps two dimensions in place.
    ///
    /// # Panics
    /// If `d0` or `d1` is not below the rank (callers check first).
    #[inline]
    pub(crate) fn swap_dims(&mut self, d0: usize, d1: usize) {
        self.shape.0.swap(d0, d1);
        self.strides.0.swap(d0, d1);
    }

    /// Reorders dimensions: new dim `i` is old dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Self> {
        let rank = self.rank();
        let mut seen = [false; 64];
        if perm.len() != rank
            || rank > 64
            || perm
                .iter()
                .any(|&p| p >= rank || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::Msg(format!(
                "permute: {perm:?} is not a permutation of the {rank} dimensions of shape {}",
                self.shape
            )));
        }
        let mut l = self.clone();
        for (i, &p) in perm.iter().enumerate() {
            l.shape.0[i] = self.shape.0[p];
            l.strides.0[i] = self.strides.0[p];
        }
        Ok(l)
    }

    /// Elements `start .. start + len` of dimension `dim`.
    #[inline]
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        self.slice(dim, start, start.saturating_add(len), 1)
            .map_err(|e| e.with_op("narrow"))
    }

    /// Elements `start, start + step, ..` below `end` of dimension `dim`.
    #[inline]
    pub fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> Result<Self> {
        let mut l = self.clone();
        l.slice_in_place(dim, start, end, step)?;
        Ok(l)
    }

    /// [`Layout::slice`] in place (unchanged on error).
    #[inline]
    pub(crate) fn slice_in_place(
        &mut self,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<()> {
        let rank = self.rank();
        if dim >= rank {
            return Err(Error::DimOutOfRange {
                op: "slice",
                dim: dim as isize,
                rank,
            });
        }
        let size = self.shape.0[dim];
        if start > end || end > size {
            return Err(Error::RangeOutOfBounds {
                op: "slice",
                dim,
                start,
                end,
                size,
                shape: self.shape.clone(),
            });
        }
        if step == 0 {
            return Err(Error::msg("slice: step must be at least 1"));
        }
        let len = (end - start).div_ceil(step);
        let stride = self.strides.0[dim];
        if len > 0 {
            self.offset += start * stride;
        }
        self.shape.0[dim] = len;
        self.strides.0[dim] = stride * step;
        Ok(())
    }

    /// Numpy-style broadcast to `shape`: new leading dims and dims of extent 1 get stride 0.
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let rank = shape.rank();
        let incompatible = || Error::BroadcastIncompatible {
            op: "broadcast_as",
            lhs: self.shape.clone(),
            rhs: shape.clone(),
        };
        if rank < self.rank() {
            return Err(incompatible());
        }
        let lead = rank - self.rank();
        let mut strides = DimVec::from_elem(0, rank);
        for i in 0..self.rank() {
            let (from, to) = (self.shape.0[i], shape.0[lead + i]);
            strides[lead + i] = if from == to {
                self.strides.0[i]
            } else if from == 1 {
                0
            } else {
                return Err(incompatible());
            };
        }
        Ok(Layout {
            shape,
            strides: Strides(strides),
            offset: self.offset,
        })
    }

    /// Inserts a dimension of extent 1 before `dim` (`dim == rank` appends).
    #[inline]
    pub fn unsqueeze(&self, dim: usize) -> Result<Self> {
        let mut l = self.clone();
        l.unsqueeze_in_place(dim)?;
        Ok(l)
    }

    /// [`Layout::unsqueeze`] in place (unchanged on error).
    #[inline]
    pub(crate) fn unsqueeze_in_place(&mut self, dim: usize) -> Result<()> {
        let rank = self.rank();
        if dim > rank {
            return Err(Error::DimOutOfRange {
                op: "unsqueeze",
                dim: dim as isize,
                rank: rank + 1,
            });
        }
        let stride = if dim < rank {
            self.strides.0[dim] * self.shape.0[dim]
        } else {
            1
        };
        self.shape.0.insert(dim, 1);
        self.strides.0.insert(dim, stride);
        Ok(())
    }

    /// Removes dimension `dim` if its extent is 1; otherwise returns the layout unchanged
    /// (PyTorch's behaviour).
    #[inline]
    pub fn squeeze(&self, dim: usize) -> Result<Self> {
        let mut l = self.clone();
        l.squeeze_in_place(dim)?;
        Ok(l)
    }

    /// [`Layout::squeeze`] in place (unchanged on error).
    #[inline]
    pub(crate) fn squeeze_in_place(&mut self, dim: usize) -> Result<()> {
        let rank = self.rank();
        if dim >= rank {
            return Err(Error::DimOutOfRange {
                op: "squeeze",
                dim: dim as isize,
                rank,
            });
        }
        if self.shape.0[dim] == 1 {
            self.shape.0.remove(dim);
            self.strides.0.remove(dim);
        }
        Ok(())
    }

    /// The layout of the same elements in the same row-major order with shape `shape`, if
    /// the strides allow it without a copy (numpy's no-copy reshape rule); `None` otherwise.
    pub fn reshape_view(&self, shape: &Shape) -> Option<Self> {
        if shape.elem_count() != self.elem_count() {
            return None;
        }
        if self.is_contiguous() || self.elem_count() == 0 {
            let mut l = Layout::contiguous(shape.clone());
            l.offset = self.offset;
            return Some(l);
        }
        // Drop extent-1 dims, then match groups of old dims to groups of new dims with the same
        // product; each old group must be internally contiguous.
        let (od, os): (DimVec, DimVec) = self
            .dims()
            .iter()
            .zip(self.strides())
            .filter(|(d, _)| **d != 1)
            .map(|(&d, &s)| (d, s))
            .unzip();
        let nd = shape.dims();
        let mut ns = DimVec::from_elem(0, nd.len());
        let (mut oi, mut oj, mut ni, mut nj) = (0, 1, 0, 1);
        while ni < nd.len() && oi < od.len() {
            let (mut np, mut op) = (nd[ni], od[oi]);
            while np != op {
                if np < op {
                    np *= *nd.get(nj)?;
                    nj += 1;
                } else {
                    op *= *od.get(oj)?;
                    oj += 1;
                }
            }
            for ok in oi..oj - 1 {
                if os[ok] != od[ok + 1] * os[ok + 1] {
                    return None;
                }
            }
            ns[nj - 1] = os[oj - 1];
            for nk in (ni + 1..nj).rev() {
                ns[nk - 1] = ns[nk] * nd[nk];
            }
            ni = nj;
            nj += 1;
            oi = oj;
            oj += 1;
        }
        // Remaining new dims are extent-1: any stride works.
        for s in ns.iter_mut().skip(ni) {
            *s = 1;
        }
        Some(Layout {
            shape: shape.clone(),
            strides: Strides(ns),
            offset: self.offset,
        })
    }

    /// Iterates the storage offset of every element in row-major order.
    pub fn offsets(&self) -> StridedOffsets<'_> {
        self.offsets_from(0)
    }

    /// Like [`Layout::offsets`], starting at the element with row-major position `start`.
    pub fn offsets_from(&self, start: usize) -> StridedOffsets<'_> {
        let mut index = DimVec::from_elem(0, self.rank());
        let mut rem = start;
        for (i, &d) in index.iter_mut().zip(self.dims()).rev() {
            *i = rem % d.max(1);
            rem /= d.max(1);
        }
        let next = (start < self.elem_count()).then(|| self.offset_of(&index));
        StridedOffsets {
            layout: self,
            index,
            next,
        }
    }
}

/// Merges the dimensions of layouts that share one shape wherever every layout is
/// contiguous across the pair, and drops extent-1 dimensions. Returns the merged extents and
/// each layout's strides, outermost first (empty for a single element). Iterating the merged
/// space in row-major order visits the same elements in the same order.
pub(crate) fn merge_dims<const K: usize>(layouts: [&Layout; K]) -> (DimVec, [DimVec; K]) {
    let dims = layouts[0].dims();
    debug_assert!(layouts.iter().all(|l| l.dims() == dims));
    let mut md = DimVec::new();
    let mut ms: [DimVec; K] = std::array::from_fn(|_| DimVec::new());
    for d in (0..dims.len()).rev() {
        if dims[d] == 1 {
            continue;
        }
        let mergeable = !md.is_empty()
            && (0..K)
                .all(|k| layouts[k].strides()[d] == ms[k].last().unwrap() * md.last().unwrap());
        if mergeable {
            *md.last_mut().unwrap() *= dims[d];
        } else {
            md.push(dims[d]);
            for (s, l) in ms.iter_mut().zip(&layouts) {
                s.push(l.strides()[d]);
            }
        }
    }
    md.reverse();
    for s in ms.iter_mut() {
        s.reverse();
    }
    (md, ms)
}

/// Row-major iterator over the storage offsets of a layout (see [`Layout::offsets`]).
pub struct StridedOffsets<'a> {
    layout: &'a Layout,
    index: DimVec,
    next: Option<usize>,
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        let current = self.next?;
        let dims = self.layout.dims();
        let strides = self.layout.strides();
        let mut off = current;
        let mut d = dims.len();
        loop {
            if d == 0 {
                self.next = None;
                break;
            }
            d -= 1;
            if self.index[d] + 1 < dims[d] {
                self.index[d] += 1;
                self.next = Some(off + strides[d]);
                break;
            }
            off -= self.index[d] * strides[d];
            self.index[d] = 0;
        }
        Some(current)
    }
}
