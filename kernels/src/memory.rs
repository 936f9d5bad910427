//! Memory placement for the buffers kernels stream through.

/// Asks for transparent huge pages under a large buffer that is not yet touched (a fresh
/// `vec![0; n]` is mapped lazily). A matmul streams every weight once per token, and
/// with 4 KiB pages the TLB misses of a 30 MB matrix dominated its profile; the KV cache
/// is read the same way. Advice only: where it is refused nothing changes.
pub fn advise_huge_pages<T: Copy>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let base = buf.as_mut_ptr() as usize;
        let start = base.next_multiple_of(HUGE);
        let end = (base + std::mem::size_of_val(buf)) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`, which the caller owns; MADV_HUGEPAGE
            // changes only how the kernel backs the pages, never their contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// Types whose all-zero bit pattern is a valid value, zero itself: the float and integer
/// types the kernels store.
///
/// # Safety
///
/// An implementor must be plain data for which every byte being 0 is a valid value.
pub unsafe trait ZeroBits: Copy {}

// SAFETY: all-zero bits are 0 (or +0.0) for each of these.
unsafe impl ZeroBits for f32 {}
unsafe impl ZeroBits for i8 {}
unsafe impl ZeroBits for u8 {}
unsafe impl ZeroBits for half::bf16 {}
unsafe impl ZeroBits for half::f16 {}
unsafe impl ZeroBits for crate::kv_quant::E4m3 {}

/// `len` zeros of `T` from the allocator's zeroed allocation: a large one is fresh
/// anonymous memory that the kernel maps on first touch, so it costs neither resident
/// memory nor time until its pages are written. (`vec![T::default(); len]` writes every
/// element unless the standard library knows `T`'s zero, which it does not for `bf16`,
/// `f16` or [`crate::kv_quant::E4m3`].) `None` when `len` elements do not fit in memory's
/// address range or the allocator refuses.
pub fn zeroed_vec<T: ZeroBits>(len: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` elements of
    // `T`, so it is aligned and owns that capacity; all of it is zero bytes, which
    // `ZeroBits` makes `len` initialized values of `T`.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vectors_hold_zeros() {
        let v = zeroed_vec::<half::bf16>(5000).unwrap_or_default();
        assert_eq!(v.len(), 5000);
        assert!(v.iter().all(|x| x.to_f32() == 0.0));
        let e = zeroed_vec::<crate::kv_quant::E4m3>(3).unwrap_or_default();
        assert_eq!(e, vec![crate::kv_quant::E4m3(0); 3]);
        assert_eq!(zeroed_vec::<f32>(0), Some(Vec::new()));
        assert_eq!(zeroed_vec::<f32>(usize::MAX), None);
    }
}
