//! Model-file headers from untrusted bytes: GGUF (header, model config, tokenizer from the
//! metadata) and safetensors (header and every tensor converted as the loader does).
//! Either is refused with an error or read within memory bounded by the input's size.

use std::io::Cursor;

use tessera_engine::loader::{tensors_from_bytes, tokenizer_from_metadata, GgufHeader};

/// A GGUF file's bytes.
pub fn gguf_header(data: &[u8]) {
    match GgufHeader::read(&mut Cursor::new(data)) {
        Ok(header) => {
            assert!(header.content.tensor_data_offset <= data.len() as u64 + 64);
            let _ = tokenizer_from_metadata(&header.content.metadata);
        }
        Err(message) => assert!(!message.is_empty()),
    }
    // Files without a model config still carry a tokenizer worth reading.
    if let Ok(content) = tessera_engine::loader::read_gguf_header(&mut Cursor::new(data)) {
        let _ = tokenizer_from_metadata(&content.metadata);
    }
}

/// A `.safetensors` file's bytes.
pub fn safetensors_header(data: &[u8]) {
    if let Ok(tensors) = tensors_from_bytes(data) {
        let elems: usize = tensors.iter().map(|(_, t)| t.elem_count()).sum();
        // Every element took at least one bit of the input.
        assert!(
            elems <= data.len() * 8,
            "{elems} elements from {} bytes",
            data.len()
        );
    }
}
