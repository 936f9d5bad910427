//! Which NCCL a process loaded, and whether it may put several ranks on one GPU: NCCL
//! refused that ("Duplicate GPU detected") until 2.30, which allows it when
//! `NCCL_MULTI_RANK_GPU_ENABLE=1` is set.

/// The variable NCCL 2.30 reads to allow several ranks on one GPU.
pub const MULTI_RANK_VARIABLE: &str = "NCCL_MULTI_RANK_GPU_ENABLE";

/// An NCCL version, from `ncclGetVersion`'s code (`major * 10000 + minor * 100 + patch`
/// since 2.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    pub fn from_code(code: i32) -> Self {
        let code = code.max(0) as u32;
        Self {
            major: code / 10000,
            minor: code % 10000 / 100,
            patch: code % 100,
        }
    }

    /// Whether this NCCL can put several ranks on one GPU at all.
    pub fn allows_ranks_sharing_a_gpu(self) -> bool {
        (self.major, self.minor) >= (2, 30)
    }
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Why `ranks` NCCL ranks cannot share one GPU with NCCL `version` and the variable's
/// value `enabled`, if they cannot.
pub fn refuse_ranks_sharing_a_gpu(
    version: NcclVersion,
    enabled: Option<&str>,
    ranks: usize,
) -> Option<String> {
    if ranks < 2 {
        return None;
    }
    if !version.allows_ranks_sharing_a_gpu() {
        return Some(format!(
            "{ranks} NCCL ranks cannot share one GPU with NCCL {version}: that needs NCCL 2.30 \
             or newer (with {MULTI_RANK_VARIABLE}=1); put the library first on \
             LD_LIBRARY_PATH, or leave --same-gpu-comm at `device`"
        ));
    }
    if enabled.map(str::trim) != Some("1") {
        return Some(format!(
            "{ranks} NCCL ranks sharing one GPU need {MULTI_RANK_VARIABLE}=1 (NCCL {version} \
             refuses them otherwise); set it, or leave --same-gpu-comm at `device`"
        ));
    }
    None
}

/// The NCCL this process loads (cudarc opens `libnccl.so` on first use).
#[cfg(feature = "cuda")]
pub fn loaded() -> crate::error::Result<NcclVersion> {
    use candle_core::cuda::cudarc::nccl::result;
    let code = result::get_nccl_version().map_err(|e| {
        crate::error::EngineError::Config(format!("cannot load NCCL (libnccl.so): {e:?}"))
    })?;
    Ok(NcclVersion::from_code(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_read_as_nccl_writes_them() {
        let v = NcclVersion::from_code(23007);
        assert_eq!((v.major, v.minor, v.patch), (2, 30, 7));
        assert_eq!(v.to_string(), "2.30.7");
        assert!(v.allows_ranks_sharing_a_gpu());
        assert!(!NcclVersion::from_code(22809).allows_ranks_sharing_a_gpu());
        assert!(NcclVersion::from_code(30001).allows_ranks_sharing_a_gpu());
    }

    #[test]
    fn ranks_share_a_gpu_only_on_a_new_nccl_told_to_allow_it() {
        let old = NcclVersion::from_code(22809);
        let new = NcclVersion::from_code(23007);
        let why = refuse_ranks_sharing_a_gpu(old, Some("1"), 2).unwrap_or_default();
        assert!(
            why.contains("2.28.9") && why.contains(MULTI_RANK_VARIABLE),
            "{why}"
        );
        let why = refuse_ranks_sharing_a_gpu(new, None, 3).unwrap_or_default();
        assert!(
            why.contains("2.30.7") && why.contains(MULTI_RANK_VARIABLE),
            "{why}"
        );
        assert!(refuse_ranks_sharing_a_gpu(new, Some("0"), 2).is_some());
        assert_eq!(refuse_ranks_sharing_a_gpu(new, Some("1"), 4), None);
        assert_eq!(refuse_ranks_sharing_a_gpu(old, None, 1), None);
    }
}
