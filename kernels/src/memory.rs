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

/// Touches every page of a fresh, lazily mapped buffer (writing the zero it already
/// reads: `T::default()` must be all zero bits, as it is for the float and integer types
/// the kernels store), so that the page faults and zeroing happen now rather than on the
/// first writes of a hot loop, and a machine short of memory fails here instead of there.
pub fn prefault<T: Copy + Default>(buf: &mut [T]) {
    let page = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..buf.len()).step_by(page) {
        // SAFETY: `i` is in bounds; a volatile write is not removed as a store of the
        // value the freshly mapped memory already holds.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), T::default()) };
    }
}
