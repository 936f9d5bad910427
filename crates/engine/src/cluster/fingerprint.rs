//! A cheap fingerprint of a model file (or folder), so that the nodes of a group can
//! check at rendezvous that they load the same weights without reading gigabytes.
//!
//! What it covers: the file's size, its first and last MiB (a GGUF file's header holds
//! all metadata and the tensor table; a safetensors file's header, its tensor table),
//! and 16 chunks of 64 KiB at evenly spaced offsets, hashed with 64-bit FNV-1a. A
//! folder is fingerprinted file by file (names sorted, each name and fingerprint
//! hashed in). Two different checkpoints of one architecture differ in their sampled
//! weights; a file damaged only between the samples is not caught — a full hash would
//! read the whole model on every start.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::Result;

const EDGE_BYTES: u64 = 1 << 20;
const SAMPLE_BYTES: u64 = 64 << 10;
const SAMPLES: u64 = 16;

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn read_at(f: &mut File, offset: u64, len: u64, h: &mut Fnv) -> Result<()> {
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::new();
    f.take(len).read_to_end(&mut buf)?;
    h.update(&buf);
    Ok(())
}

fn file_hash(path: &Path) -> Result<u64> {
    let mut f = File::open(path)?;
    let size = f.metadata()?.len();
    let mut h = Fnv::new();
    h.update(&size.to_le_bytes());
    read_at(&mut f, 0, EDGE_BYTES, &mut h)?;
    read_at(&mut f, size.saturating_sub(EDGE_BYTES), EDGE_BYTES, &mut h)?;
    for i in 0..SAMPLES {
        read_at(&mut f, size / SAMPLES * i, SAMPLE_BYTES, &mut h)?;
    }
    Ok(h.0)
}

/// The fingerprint of a model file or folder, as 16 hex digits.
pub fn model_fingerprint(path: &Path) -> Result<String> {
    let hash = if path.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
            .map(|e| e.file_name())
            .collect();
        names.sort();
        let mut h = Fnv::new();
        for name in names {
            h.update(name.to_string_lossy().as_bytes());
            h.update(&file_hash(&path.join(&name))?.to_le_bytes());
        }
        h.0
    } else {
        file_hash(path)?
    };
    Ok(format!("{hash:016x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_same_print_and_a_sampled_change_differs() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tessera-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let data: Vec<u8> = (0..5_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        std::fs::write(&a, &data)?;
        std::fs::write(&b, &data)?;
        assert_eq!(model_fingerprint(&a)?, model_fingerprint(&b)?);
        let mut other = data.clone();
        // Inside the sample at 8/16 of the file.
        other[2_500_010] ^= 1;
        std::fs::write(&b, &other)?;
        assert_ne!(model_fingerprint(&a)?, model_fingerprint(&b)?);
        std::fs::write(&b, &data[..data.len() - 1])?;
        assert_ne!(model_fingerprint(&a)?, model_fingerprint(&b)?);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
