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
