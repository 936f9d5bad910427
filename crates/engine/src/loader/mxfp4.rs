//! MXFP4 (OCP microscaling FP4: 32 e2m1 codes and one power-of-two scale per block) as
//! Q5_0 blocks of the same values. The e2m1 values doubled are the integers 0, ±1, ±2,
//! ±3, ±4, ±6, ±8, ±12, which Q5_0's five-bit quants (-16..=15) hold, so a block is a
//! Q5_0 block (an f16 scale, 32 five-bit values: 22 bytes) holding the doubled codes,
//! with half the block's power of two as its scale. That is exact wherever f16 holds the
//! scale (blocks whose largest value lies between 6·2^-23 and 6·2^16); a block of
//! smaller values rounds to multiples of 2^-24, and a larger one (never seen in a
//! trained model) saturates at 15 times the largest scale. Q5_0 runs on Tessera's CPU
//! kernels (and candle's quantized CUDA matmuls) in 22 bytes a block where MXFP4 takes
//! 17 and Q8_0 would take 34: gpt-oss-20b's experts take about 12 GiB.
//!
//! Two layouts: Hugging Face checkpoints keep codes (`*_blocks`, element `2j` in the low
//! nibble of byte `j`) and scales (`*_scales`) in separate tensors; GGUF files (ggml type
//! 39) keep 17-byte blocks, the scale byte first, then element `j` in the low nibble of
//! byte `j` and element `j + 16` in its high nibble.

/// Twice the e2m1 values of the 16 MXFP4 codes (the high bit is the sign).
const FP4_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
/// Values per MXFP4 block (one shared scale), and the bytes of their codes.
pub(crate) const MXFP4_BLOCK: usize = 32;
pub(crate) const MXFP4_CODE_BYTES: usize = MXFP4_BLOCK / 2;
/// Bytes of a GGUF MXFP4 block: the scale, then the codes.
pub(crate) const GGML_MXFP4_BLOCK_BYTES: usize = 1 + MXFP4_CODE_BYTES;
/// Bytes of a Q5_0 block: an f16 scale, the 32 fifth bits, then 16 bytes of nibbles.
pub(crate) const Q5_0_BLOCK_BYTES: usize = 2 + 4 + MXFP4_BLOCK / 2;
/// ggml's type code of MXFP4.
pub(crate) const GGML_TYPE_MXFP4: u32 = 39;

/// One Q5_0 block for 32 codes (in value order) and an MXFP4 scale byte, appended to
/// `out`: the doubled codes and the scale `2^(scale − 128)`, which f16 holds from 2^-24 to
/// 2^15 (outside that, the nearest end, and the values rounded to it). ggml's Q5_0 keeps
/// `q + 16`: its low four bits of element `j` in the low nibble of byte `j` (the nibbles'
/// second half, `j + 16`, in the high ones), its fifth bit as bit `j` of a 32-bit word.
fn push_q5_0(codes: impl Iterator<Item = u8>, scale: u8, out: &mut Vec<u8>) {
    let exponent = i32::from(scale) - 128;
    let kept = exponent.clamp(-24, 15);
    let rescale = 2f32.powi(exponent - kept);
    let mut unsigned = [0u8; MXFP4_BLOCK];
    for (u, code) in unsigned.iter_mut().zip(codes) {
        let q = FP4_DOUBLED[usize::from(code & 0x0f)];
        let q = match exponent == kept {
            true => q,
            false => (f32::from(q) * rescale).round().clamp(-16.0, 15.0) as i8,
        };
        *u = (q + 16) as u8;
    }
    out.extend_from_slice(&half::f16::from_f32(2f32.powi(kept)).to_le_bytes());
    let fifth = unsigned
        .iter()
        .enumerate()
        .fold(0u32, |bits, (j, u)| bits | (u32::from(u >> 4) << j));
    out.extend_from_slice(&fifth.to_le_bytes());
    let half = MXFP4_BLOCK / 2;
    out.extend((0..half).map(|j| (unsigned[j] & 0x0f) | ((unsigned[j + half] & 0x0f) << 4)));
}

/// Hugging Face MXFP4 (codes of block `b`, 16 bytes, element `2j` in the low nibble of
/// byte `j`; `scales[b]`) appended to `out` as Q5_0 blocks.
pub(super) fn hf_blocks_to_q5_0(codes: &[u8], scales: &[u8], out: &mut Vec<u8>) {
    for (block, &scale) in codes.chunks_exact(MXFP4_CODE_BYTES).zip(scales) {
        let values = block.iter().flat_map(|byte| [byte & 0x0f, byte >> 4]);
        push_q5_0(values, scale, out);
    }
}

/// GGUF MXFP4 blocks (17 bytes: the scale, then element `j` in the low nibble of byte
/// `j` and `j + 16` in its high nibble) appended to `out` as Q5_0 blocks.
pub(super) fn ggml_blocks_to_q5_0(blocks: &[u8], out: &mut Vec<u8>) {
    for block in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES) {
        let codes = &block[1..];
        let values = codes
            .iter()
            .map(|b| b & 0x0f)
            .chain(codes.iter().map(|b| b >> 4));
        push_q5_0(values, block[0], out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of every weight of Q5_0 blocks, decoded as ggml decodes them.
    fn q5_0_values(data: &[u8]) -> Vec<f32> {
        data.chunks_exact(Q5_0_BLOCK_BYTES)
            .flat_map(|b| {
                let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                let fifth = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let nibbles = &b[6..];
                (0..MXFP4_BLOCK).map(move |j| {
                    let low = match j < 16 {
                        true => nibbles[j] & 0x0f,
                        false => nibbles[j - 16] >> 4,
                    };
                    let u = i32::from(low) | (((fifth >> j) & 1) as i32) << 4;
                    d * (u - 16) as f32
                })
            })
            .collect()
    }

    fn q5_0_of(codes: &[u8], scales: &[u8]) -> Vec<f32> {
        let mut out = Vec::new();
        hf_blocks_to_q5_0(codes, scales, &mut out);
        q5_0_values(&out)
    }

    #[test]
    fn mxfp4_blocks_become_q5_0_blocks_of_the_same_values() {
        let fp4 = [
            0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0,
            -6.0,
        ];
        // Every code in both nibbles, with scales from the top of f16's range to the
        // bottom of its subnormals, in two blocks at a time.
        let block: Vec<u8> = (0..16u8).map(|i| i | ((15 - i) << 4)).collect();
        let codes = [block.clone(), block].concat();
        for scales in [[127 + 16, 127], [127 - 7, 127 - 23]] {
            let got = q5_0_of(&codes, &scales);
            let want: Vec<f32> = scales
                .iter()
                .flat_map(|s| {
                    let factor = 2f32.powi(i32::from(*s) - 127);
                    (0..16).flat_map(move |i| [fp4[i] * factor, fp4[15 - i] * factor])
                })
                .collect();
            assert_eq!(got, want, "scales {scales:?}");
        }
        // Below f16's range values round to multiples of 2^-24: 6·2^-26 to 2·2^-24, and
        // 0.5·2^-26 to 0.
        let got = q5_0_of(&[0x17; 16], &[127 - 26]);
        assert_eq!(got[..2], [2.0 * 2f32.powi(-24), 0.0]);
    }

    #[test]
    fn ggml_blocks_hold_the_second_half_in_the_high_nibbles() {
        // The HF block of the first test, repacked as llama.cpp's converter repacks it.
        let block: Vec<u8> = (0..16u8).map(|i| i | ((15 - i) << 4)).collect();
        let values: Vec<u8> = block.iter().flat_map(|b| [b & 0x0f, b >> 4]).collect();
        let mut ggml = vec![127 - 7];
        ggml.extend((0..16).map(|j| values[j] | (values[j + 16] << 4)));
        let mut from_ggml = Vec::new();
        ggml_blocks_to_q5_0(&ggml, &mut from_ggml);
        assert_eq!(q5_0_values(&from_ggml), q5_0_of(&block, &[127 - 7]));
    }
}
