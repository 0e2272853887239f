//! A raw pointer shared by the threads of one op, each of which writes its own elements.

/// The start of a buffer that several threads write at disjoint elements (a product's
/// halves, an optimizer update's chunks, a convolution's row ranges).
///
/// Invariant: whoever hands it to threads gives each a set of elements no other thread
/// touches, and keeps the buffer alive (and otherwise unborrowed) until they are done.
#[derive(Clone, Copy)]
pub(super) struct DisjointPtr<T>(pub(super) *mut T);

impl<T> DisjointPtr<T> {
    /// The pointer `i` elements on.
    ///
    /// # Safety
    /// As `pointer::add`: the result stays inside the buffer's allocation.
    pub(super) unsafe fn add(self, i: usize) -> Self {
        // SAFETY: forwarded to the caller.
        DisjointPtr(unsafe { self.0.add(i) })
    }
}

// SAFETY: the threads it is shared with write disjoint elements (the type's invariant).
unsafe impl<T> Send for DisjointPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for DisjointPtr<T> {}
