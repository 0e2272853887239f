//! [`DimVec`]: the list of extents or strides behind [`crate::Shape`] and [`crate::Layout`].
//!
//! Views clone a shape and strides on every call, so cloning must be cheap: up to
//! [`INLINE_DIMS`] values live in a fixed-size array, which clones as a constant-size copy (a
//! few vector moves, no call into `memcpy` and no branch on the length); beyond that they
//! live in a `Vec`. The length is a `u32` rather than a `u8`: with a byte, the enum's padding
//! was copied in odd-sized overlapping pieces that stalled store forwarding (transpose view
//! 34 → 23 ns).

use std::ops::{Deref, DerefMut};

/// Inline capacity of shapes and strides: views of tensors up to this rank allocate nothing.
/// Four covers NCHW and keeps a [`crate::Tensor`] at 128 bytes, small enough that moving one
/// is an inline copy (see the size test below).
pub const INLINE_DIMS: usize = 4;

/// A short list of `usize`, inline up to [`INLINE_DIMS`] entries.
///
/// # Invariants
/// - `Inline { len, .. }` has `len <= INLINE_DIMS`; entries past `len` carry no meaning
///   (equality and hashing compare the slices).
/// - A list longer than `INLINE_DIMS` is always `Heap`; a `Heap` list may be short (after
///   `remove`), which is harmless.
///
/// The type is public only because [`crate::Dims::to_indexes`] returns it; it cannot be
/// named outside kiln, and its representation is private.
#[derive(Clone)]
pub struct DimVec(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u32, buf: [usize; INLINE_DIMS] },
    Heap(Vec<usize>),
}

impl DimVec {
    #[inline]
    pub(crate) const fn new() -> Self {
        DimVec(Repr::Inline {
            len: 0,
            buf: [0; INLINE_DIMS],
        })
    }

    #[inline]
    pub(crate) fn from_slice(values: &[usize]) -> Self {
        if values.len() <= INLINE_DIMS {
            let mut buf = [0; INLINE_DIMS];
            buf[..values.len()].copy_from_slice(values);
            DimVec(Repr::Inline {
                len: values.len() as u32,
                buf,
            })
        } else {
            DimVec(Repr::Heap(values.to_vec()))
        }
    }

    pub(crate) fn from_vec(values: Vec<usize>) -> Self {
        if values.len() <= INLINE_DIMS {
            Self::from_slice(&values)
        } else {
            DimVec(Repr::Heap(values))
        }
    }

    #[inline]
    pub(crate) fn from_elem(value: usize, n: usize) -> Self {
        if n <= INLINE_DIMS {
            let mut buf = [0; INLINE_DIMS];
            buf[..n].fill(value);
            DimVec(Repr::Inline { len: n as u32, buf })
        } else {
            DimVec(Repr::Heap(vec![value; n]))
        }
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[usize] {
        match &self.0 {
            Repr::Inline { len, buf } => &buf[..*len as usize],
            Repr::Heap(v) => v,
        }
    }

    #[inline]
    pub(crate) fn as_mut_slice(&mut self) -> &mut [usize] {
        match &mut self.0 {
            Repr::Inline { len, buf } => &mut buf[..*len as usize],
            Repr::Heap(v) => v,
        }
    }

    /// Moves an inline list onto the heap with room for one more entry.
    fn spill(&mut self) -> &mut Vec<usize> {
        if let Repr::Inline { .. } = self.0 {
            let mut v = Vec::with_capacity(INLINE_DIMS * 2);
            v.extend_from_slice(self.as_slice());
            self.0 = Repr::Heap(v);
        }
        match &mut self.0 {
            Repr::Heap(v) => v,
            Repr::Inline { .. } => unreachable!("spilled just above"),
        }
    }

    pub(crate) fn push(&mut self, value: usize) {
        match &mut self.0 {
            Repr::Inline { len, buf } if (*len as usize) < INLINE_DIMS => {
                buf[*len as usize] = value;
                *len += 1;
            }
            _ => self.spill().push(value),
        }
    }

    /// Removes and returns the last entry, if any.
    pub(crate) fn pop(&mut self) -> Option<usize> {
        match &mut self.0 {
            Repr::Inline { len, buf } => {
                let n = (*len as usize).checked_sub(1)?;
                *len -= 1;
                Some(std::mem::take(&mut buf[n]))
            }
            Repr::Heap(v) => v.pop(),
        }
    }

    /// Inserts `value` before position `index` (`index == len` appends).
    ///
    /// # Panics
    /// If `index > len`, as `Vec::insert`.
    pub(crate) fn insert(&mut self, index: usize, value: usize) {
        match &mut self.0 {
            Repr::Inline { len, buf } if (*len as usize) < INLINE_DIMS => {
                let n = *len as usize;
                assert!(index <= n, "DimVec::insert: index {index} > len {n}");
                buf.copy_within(index..n, index + 1);
                buf[index] = value;
                *len += 1;
            }
            _ => self.spill().insert(index, value),
        }
    }

    /// Removes and returns the entry at `index`.
    ///
    /// # Panics
    /// If `index >= len`, as `Vec::remove`.
    pub(crate) fn remove(&mut self, index: usize) -> usize {
        match &mut self.0 {
            Repr::Inline { len, buf } => {
                let n = *len as usize;
                assert!(index < n, "DimVec::remove: index {index} >= len {n}");
                let value = buf[index];
                buf.copy_within(index + 1..n, index);
                buf[n - 1] = 0;
                *len -= 1;
                value
            }
            Repr::Heap(v) => v.remove(index),
        }
    }
}

impl Default for DimVec {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl Deref for DimVec {
    type Target = [usize];
    #[inline]
    fn deref(&self) -> &[usize] {
        self.as_slice()
    }
}

impl DerefMut for DimVec {
    #[inline]
    fn deref_mut(&mut self) -> &mut [usize] {
        self.as_mut_slice()
    }
}

impl PartialEq for DimVec {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}
impl Eq for DimVec {}

impl std::hash::Hash for DimVec {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state)
    }
}

impl std::fmt::Debug for DimVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl Extend<usize> for DimVec {
    fn extend<I: IntoIterator<Item = usize>>(&mut self, iter: I) {
        for v in iter {
            self.push(v);
        }
    }
}

impl FromIterator<usize> for DimVec {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut v = DimVec::new();
        v.extend(iter);
        v
    }
}

impl<'a> IntoIterator for &'a DimVec {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_a_vec_across_the_inline_limit() {
        let mut d = DimVec::new();
        let mut v = Vec::new();
        for i in 0..(INLINE_DIMS + 3) {
            d.push(i * 10);
            v.push(i * 10);
            assert_eq!(d.as_slice(), v.as_slice());
        }
        for (at, value) in [(0, 7), (3, 8), (v.len(), 9)] {
            d.insert(at, value);
            v.insert(at, value);
            assert_eq!(d.as_slice(), v.as_slice());
        }
        assert_eq!(d.pop(), v.pop());
        while !v.is_empty() {
            let at = v.len() / 2;
            assert_eq!(d.remove(at), v.remove(at));
            assert_eq!(d.as_slice(), v.as_slice());
        }
        let mut small = DimVec::from_slice(&[1, 2, 3]);
        small.insert(1, 5);
        assert_eq!(small.remove(0), 1);
        assert_eq!(small.pop(), Some(3));
        small.push(3);
        assert_eq!(small, DimVec::from_slice(&[5, 2, 3]));
        assert_eq!(DimVec::from_elem(4, 8).as_slice(), &[4; 8]);
        assert_eq!(DimVec::from_vec(vec![1, 2]), DimVec::from_slice(&[1, 2]));
        let collected: DimVec = (0..9).collect();
        assert_eq!(collected.as_slice(), (0..9).collect::<Vec<_>>().as_slice());
        // Equal lists are equal however they are stored.
        let mut heap = DimVec::from_slice(&[0; INLINE_DIMS + 1]);
        heap.remove(0);
        assert_eq!(heap, DimVec::from_elem(0, INLINE_DIMS));
    }
}
#[cfg(test)]
mod size {
    /// Views move tensors by value; at 128 bytes or less a move is a few vector copies
    /// inline, above it a call into `memcpy` (measured: a transpose view cost 34 ns with
    /// 6 inline dims and a 160-byte tensor, 23 ns with 4 and 128 bytes, 2-core EPYC).
    #[test]
    fn a_tensor_and_its_result_stay_within_128_bytes() {
        assert!(std::mem::size_of::<crate::Tensor>() <= 128);
        assert!(std::mem::size_of::<crate::Result<crate::Tensor>>() <= 128);
        assert_eq!(std::mem::size_of::<super::DimVec>(), 40);
    }
}
