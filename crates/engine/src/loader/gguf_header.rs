//! Reads the header of a GGUF file (metadata and tensor infos) into candle's [`Content`],
//! trusting nothing it says.
//!
//! candle's own `Content::read` bounds lengths by the file size but divides by the
//! `general.alignment` it reads, so a file declaring alignment 0 panics the loader. This
//! reader refuses that and checks everything else before allocating: every string,
//! array and count must fit in the bytes left, nesting is capped, tensor shapes must not
//! overflow and every tensor's data must lie inside the file.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use super::mxfp4::{GGML_MXFP4_BLOCK_BYTES, GGML_TYPE_MXFP4, MXFP4_BLOCK};

/// Longest string (key, token, chat template) a header may hold.
const MAX_STRING_BYTES: u64 = 1 << 30;
/// Nesting of arrays inside arrays.
const MAX_DEPTH: usize = 8;
/// Dimensions of one tensor (GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;
const DEFAULT_ALIGNMENT: u64 = 32;

/// What can be wrong with a header, as a message for the user.
pub type HeaderError = String;

/// An MXFP4 tensor (ggml type 39, which candle does not know): its shape, slowest
/// dimension first, and its data's offset from the start of the tensor data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mxfp4Tensor {
    pub dims: Vec<usize>,
    pub offset: u64,
}

/// A header as candle's [`Content`], and its MXFP4 tensors, which the loader converts.
#[derive(Debug)]
pub struct HeaderParts {
    pub content: Content,
    pub mxfp4: HashMap<String, Mxfp4Tensor>,
}

/// Reads the header from `reader` (positioned at the start of the file), its MXFP4
/// tensors left out.
pub fn read_gguf_header<R: Read + Seek>(reader: &mut R) -> Result<Content, HeaderError> {
    read_gguf_parts(reader).map(|parts| parts.content)
}

/// Reads the header from `reader` (positioned at the start of the file).
pub fn read_gguf_parts<R: Read + Seek>(reader: &mut R) -> Result<HeaderParts, HeaderError> {
    let file_len = reader.seek(SeekFrom::End(0)).map_err(io)?;
    reader.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut r = Bounded {
        reader,
        pos: 0,
        len: file_len,
        magic: VersionedMagic::GgufV3,
    };
    let magic = r.u32()?;
    if magic != 0x4655_4747 {
        return Err(format!("not a GGUF file (magic 0x{magic:08x})"));
    }
    r.magic = match r.u32()? {
        1 => VersionedMagic::GgufV1,
        2 => VersionedMagic::GgufV2,
        3 => VersionedMagic::GgufV3,
        v => return Err(format!("unsupported GGUF version {v}")),
    };
    let tensor_count = r.length()?;
    let kv_count = r.length()?;
    // A key-value pair takes at least a length prefix, a type and one byte; a tensor info
    // a length prefix, a dimension count, a type and an offset.
    r.need(kv_count, 4 + 4 + 1, "metadata entries")?;
    r.need(tensor_count, 4 + 4 + 4 + 8, "tensor infos")?;
    let mut metadata = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0)?;
        metadata.insert(key, value);
    }
    let mut tensor_infos = HashMap::new();
    let mut mxfp4 = HashMap::new();
    for _ in 0..tensor_count {
        let name = r.string()?;
        match r.tensor_info(&name)? {
            Info::Known(info) => tensor_infos.insert(name, info).map(|_| ()),
            Info::Mxfp4(t) => mxfp4.insert(name, t).map(|_| ()),
        };
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(other) => {
            return Err(format!(
                "general.alignment must be a power of two u32, got {other:?}"
            ))
        }
    };
    let tensor_data_offset = r
        .pos
        .checked_next_multiple_of(alignment)
        .ok_or("tensor data offset overflows")?;
    for (name, info) in &tensor_infos {
        check_tensor_bounds(name, info, tensor_data_offset, file_len)?;
    }
    for (name, t) in &mxfp4 {
        let bytes = mxfp4_bytes(&t.dims).ok_or_else(|| {
            format!(
                "tensor '{name}': shape {:?} is not whole MXFP4 blocks",
                t.dims
            )
        })?;
        check_data_end(name, t.offset, bytes, tensor_data_offset, file_len)?;
    }
    Ok(HeaderParts {
        content: Content {
            magic: r.magic,
            metadata,
            tensor_infos,
            tensor_data_offset,
        },
        mxfp4,
    })
}

/// Bytes of an MXFP4 tensor of shape `dims`, `None` when rows are not whole blocks.
pub fn mxfp4_bytes(dims: &[usize]) -> Option<u64> {
    let elems = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))?;
    if !dims.last().is_some_and(|c| c.is_multiple_of(MXFP4_BLOCK)) {
        return None;
    }
    (elems / MXFP4_BLOCK as u64).checked_mul(GGML_MXFP4_BLOCK_BYTES as u64)
}

/// Bytes of a tensor's data, or `None` when its shape does not fit its type's blocks or
/// the size overflows.
pub fn tensor_bytes(info: &TensorInfo) -> Option<u64> {
    let elems = info
        .shape
        .dims()
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))?;
    let block = info.ggml_dtype.block_size() as u64;
    if elems % block != 0 {
        return None;
    }
    (elems / block).checked_mul(info.ggml_dtype.type_size() as u64)
}

fn check_tensor_bounds(
    name: &str,
    info: &TensorInfo,
    data_offset: u64,
    file_len: u64,
) -> Result<(), HeaderError> {
    let bytes = tensor_bytes(info).ok_or_else(|| {
        format!(
            "tensor '{name}': shape {:?} does not fit {:?} blocks",
            info.shape.dims(),
            info.ggml_dtype
        )
    })?;
    check_data_end(name, info.offset, bytes, data_offset, file_len)
}

/// The tensor `name`'s `bytes` at `offset` from the data start must end inside the file.
fn check_data_end(
    name: &str,
    offset: u64,
    bytes: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<(), HeaderError> {
    let end = data_offset
        .checked_add(offset)
        .and_then(|start| start.checked_add(bytes));
    match end {
        Some(end) if end <= file_len => Ok(()),
        Some(end) => Err(format!(
            "truncated: tensor '{name}' ends at byte {end} but the file has {file_len} bytes"
        )),
        None => Err(format!("tensor '{name}': data offset overflows")),
    }
}

fn io(e: std::io::Error) -> HeaderError {
    format!("cannot read the GGUF header: {e}")
}

/// A reader that knows how many bytes are left and refuses any claim beyond them.
struct Bounded<'a, R> {
    reader: &'a mut R,
    pos: u64,
    len: u64,
    magic: VersionedMagic,
}

impl<R: Read> Bounded<'_, R> {
    fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    /// Fails unless `count` items of at least `min_bytes` each fit in what is left.
    fn need(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), HeaderError> {
        let needed = count.saturating_mul(min_bytes);
        if needed > self.remaining() {
            return Err(format!(
                "the header claims {count} {what} (at least {needed} bytes) but only {} bytes are left",
                self.remaining()
            ));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], HeaderError> {
        let mut buf = [0u8; N];
        self.reader.read_exact(&mut buf).map_err(io)?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, HeaderError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> Result<u64, HeaderError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    /// A length or count: 32 bits in version 1, 64 after.
    fn length(&mut self) -> Result<u64, HeaderError> {
        match self.magic {
            VersionedMagic::GgufV1 => self.u32().map(u64::from),
            _ => self.u64(),
        }
    }

    fn string(&mut self) -> Result<String, HeaderError> {
        let len = self.length()?;
        if len > MAX_STRING_BYTES {
            return Err(format!("a string of {len} bytes is too long"));
        }
        self.need(len, 1, "string bytes")?;
        let mut buf = vec![0u8; len as usize];
        self.reader.read_exact(&mut buf).map_err(io)?;
        self.pos += len;
        // Strings should not be NUL-terminated, but some writers do it.
        while buf.last() == Some(&0) {
            buf.pop();
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Smallest encoding of a value of type `kind`, for bounding array lengths.
    fn min_size(&self, kind: u32) -> u64 {
        let prefix = match self.magic {
            VersionedMagic::GgufV1 => 4,
            _ => 8,
        };
        match kind {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => prefix,
            9 => 4 + prefix,
            _ => 8,
        }
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<Value, HeaderError> {
        Ok(match kind {
            0 => Value::U8(self.bytes::<1>()?[0]),
            1 => Value::I8(i8::from_le_bytes(self.bytes()?)),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => match self.bytes::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("invalid bool byte {b}")),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(format!("arrays nested deeper than {MAX_DEPTH}"));
                }
                let item = self.u32()?;
                let len = self.length()?;
                self.need(len, self.min_size(item), "array items")?;
                let mut items = Vec::new();
                for _ in 0..len {
                    items.push(self.value(item, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }

    fn tensor_info(&mut self, name: &str) -> Result<Info, HeaderError> {
        let n_dims = self.u32()?;
        if n_dims > MAX_DIMS {
            return Err(format!("tensor '{name}' has {n_dims} dimensions"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.length()?;
            let d = usize::try_from(d).map_err(|_| format!("tensor '{name}': dimension {d}"))?;
            dims.push(d);
        }
        // GGUF lists dimensions fastest-first; candle shapes are slowest-first.
        dims.reverse();
        let code = self.u32()?;
        if code == GGML_TYPE_MXFP4 {
            let offset = self.u64()?;
            return Ok(Info::Mxfp4(Mxfp4Tensor { dims, offset }));
        }
        let ggml_dtype =
            dtype(code).ok_or_else(|| format!("tensor '{name}': unknown type {code}"))?;
        let offset = self.u64()?;
        Ok(Info::Known(TensorInfo {
            ggml_dtype,
            shape: candle_core::Shape::from(dims),
            offset,
        }))
    }
}

/// A tensor info as read.
enum Info {
    Known(TensorInfo),
    Mxfp4(Mxfp4Tensor),
}

/// GGML type codes candle knows.
fn dtype(code: u32) -> Option<GgmlDType> {
    Some(match code {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::{read_gguf_header, read_gguf_parts, Mxfp4Tensor};

    fn header(kv: &[u8], kv_count: u64) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&kv_count.to_le_bytes());
        out.extend_from_slice(kv);
        out
    }

    fn u32_kv(key: &str, value: u32) -> Vec<u8> {
        let mut out = (key.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&4u32.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
        out
    }

    #[test]
    fn alignment_zero_is_refused_not_a_division_by_zero() {
        let bytes = header(&u32_kv("general.alignment", 0), 1);
        let err = read_gguf_header(&mut Cursor::new(bytes)).err();
        assert!(err.is_some_and(|e| e.contains("alignment")));
    }

    #[test]
    fn counts_beyond_the_file_are_refused_before_allocating() {
        let bytes = header(&[], u64::MAX);
        let err = read_gguf_header(&mut Cursor::new(bytes)).err();
        assert!(err.is_some_and(|e| e.contains("metadata entries")));
    }

    /// A file of one MXFP4 tensor `w` of GGUF dimensions `dims` (fastest first) and
    /// `data_bytes` bytes of data.
    fn mxfp4_file(dims: &[u64], data_bytes: usize) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
        out.push(b'w');
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&39u32.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.resize(out.len().next_multiple_of(32) + data_bytes, 0);
        out
    }

    #[test]
    fn mxfp4_tensors_are_read_aside_and_checked_against_the_file() {
        // 3 rows of 64 columns: 6 blocks of 17 bytes.
        let parts = read_gguf_parts(&mut Cursor::new(mxfp4_file(&[64, 3], 102)));
        let parts = parts.expect("read");
        assert!(parts.content.tensor_infos.is_empty());
        assert_eq!(
            parts.mxfp4.get("w"),
            Some(&Mxfp4Tensor {
                dims: vec![3, 64],
                offset: 0
            })
        );
        let short = read_gguf_parts(&mut Cursor::new(mxfp4_file(&[64, 3], 101))).err();
        assert!(
            short.as_ref().is_some_and(|e| e.contains("truncated")),
            "{short:?}"
        );
        let partial = read_gguf_parts(&mut Cursor::new(mxfp4_file(&[48, 4], 102))).err();
        assert!(
            partial.as_ref().is_some_and(|e| e.contains("MXFP4 blocks")),
            "{partial:?}"
        );
    }

    #[test]
    fn a_good_header_reads() {
        let bytes = header(&u32_kv("general.alignment", 64), 1);
        let content = read_gguf_header(&mut Cursor::new(bytes));
        assert!(content.is_ok_and(|c| c.tensor_data_offset == 64));
    }
}
