//! A GGUF writer for the reader's tests.
//!
//! It writes what it is given without judging it (duplicate keys, five dimensions, unknown
//! type ids), so tests can build hostile files too, and it records where each count, length,
//! type and offset field lies so tests can corrupt exactly those bytes.

use crate::gguf::{MetadataArray, MetadataValue};

/// Byte positions of the fields of a written file.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    /// The header's tensor count (u64).
    pub tensor_count: usize,
    /// The header's metadata count (u64).
    pub metadata_count: usize,
    /// Every u64 length of a string: keys, string values, string array elements, tensor names.
    pub string_lengths: Vec<usize>,
    /// Every u32 value type and array element type.
    pub value_types: Vec<usize>,
    /// Every u64 array count.
    pub array_counts: Vec<usize>,
    /// Each tensor's u32 dimension count.
    pub n_dims: Vec<usize>,
    /// Each tensor's u64 dimensions, all tensors in order.
    pub dims: Vec<usize>,
    /// Each tensor's u32 GGML type id.
    pub type_ids: Vec<usize>,
    /// Each tensor's u64 data offset.
    pub offsets: Vec<usize>,
    /// Where the data section starts.
    pub data_start: usize,
}

struct TestTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory.
pub(crate) struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TestTensor>,
}

/// GGUF value type id of a value.
fn type_id(value: &MetadataValue) -> u32 {
    match value {
        MetadataValue::U8(_) => 0,
        MetadataValue::I8(_) => 1,
        MetadataValue::U16(_) => 2,
        MetadataValue::I16(_) => 3,
        MetadataValue::U32(_) => 4,
        MetadataValue::I32(_) => 5,
        MetadataValue::F32(_) => 6,
        MetadataValue::Bool(_) => 7,
        MetadataValue::String(_) => 8,
        MetadataValue::Array(_) => 9,
        MetadataValue::U64(_) => 10,
        MetadataValue::I64(_) => 11,
        MetadataValue::F64(_) => 12,
    }
}

/// GGUF value type id of an array's elements.
fn element_type_id(array: &MetadataArray) -> u32 {
    match array {
        MetadataArray::U8(_) => 0,
        MetadataArray::I8(_) => 1,
        MetadataArray::U16(_) => 2,
        MetadataArray::I16(_) => 3,
        MetadataArray::U32(_) => 4,
        MetadataArray::I32(_) => 5,
        MetadataArray::F32(_) => 6,
        MetadataArray::Bool(_) => 7,
        MetadataArray::String(_) => 8,
        MetadataArray::Array(_) => 9,
        MetadataArray::U64(_) => 10,
        MetadataArray::I64(_) => 11,
        MetadataArray::F64(_) => 12,
    }
}

struct Output {
    bytes: Vec<u8>,
    layout: Layout,
}

impl Output {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    fn put_u32(&mut self, value: u32) {
        self.put(&value.to_le_bytes());
    }

    fn put_u64(&mut self, value: u64) {
        self.put(&value.to_le_bytes());
    }

    fn put_string(&mut self, text: &str) {
        self.layout.string_lengths.push(self.bytes.len());
        self.put_u64(text.len() as u64);
        self.put(text.as_bytes());
    }

    fn put_type(&mut self, type_id: u32) {
        self.layout.value_types.push(self.bytes.len());
        self.put_u32(type_id);
    }

    fn put_value(&mut self, value: &MetadataValue) {
        match value {
            MetadataValue::U8(v) => self.put(&v.to_le_bytes()),
            MetadataValue::I8(v) => self.put(&v.to_le_bytes()),
            MetadataValue::U16(v) => self.put(&v.to_le_bytes()),
            MetadataValue::I16(v) => self.put(&v.to_le_bytes()),
            MetadataValue::U32(v) => self.put(&v.to_le_bytes()),
            MetadataValue::I32(v) => self.put(&v.to_le_bytes()),
            MetadataValue::F32(v) => self.put(&v.to_le_bytes()),
            MetadataValue::Bool(v) => self.put(&[u8::from(*v)]),
            MetadataValue::String(v) => self.put_string(v),
            MetadataValue::Array(v) => self.put_array(v),
            MetadataValue::U64(v) => self.put(&v.to_le_bytes()),
            MetadataValue::I64(v) => self.put(&v.to_le_bytes()),
            MetadataValue::F64(v) => self.put(&v.to_le_bytes()),
        }
    }

    fn put_array(&mut self, array: &MetadataArray) {
        self.put_type(element_type_id(array));
        self.layout.array_counts.push(self.bytes.len());
        self.put_u64(array.len() as u64);
        match array {
            MetadataArray::U8(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::I8(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::U16(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::I16(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::U32(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::I32(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::F32(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::Bool(v) => v.iter().for_each(|x| self.put(&[u8::from(*x)])),
            MetadataArray::String(v) => v.iter().for_each(|x| self.put_string(x)),
            MetadataArray::Array(v) => v.iter().for_each(|x| self.put_array(x)),
            MetadataArray::U64(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::I64(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
            MetadataArray::F64(v) => v.iter().for_each(|x| self.put(&x.to_le_bytes())),
        }
    }

    fn pad_to(&mut self, alignment: usize) {
        self.bytes.resize(self.bytes.len().next_multiple_of(alignment), 0);
    }
}

impl GgufWriter {
    /// An empty file of GGUF `version`.
    pub(crate) fn new(version: u32) -> Self {
        GgufWriter { version, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Adds a metadata entry.
    pub(crate) fn metadata(mut self, key: &str, value: MetadataValue) -> Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor of GGML type `type_id` with `data` as its bytes.
    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(TestTensor { name: name.to_owned(), dims: dims.to_vec(), type_id, data });
        self
    }

    /// The file's bytes and where its fields lie. Tensors are placed back to back in the data
    /// section, each at the next multiple of the alignment, with no padding after the last.
    pub(crate) fn build(&self) -> (Vec<u8>, Layout) {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(key, value)| match (key.as_str(), value) {
                ("general.alignment", MetadataValue::U32(alignment)) => Some(*alignment as usize),
                _ => None,
            })
            .unwrap_or(crate::gguf::DEFAULT_ALIGNMENT);
        let mut out = Output { bytes: Vec::new(), layout: Layout::default() };
        out.put(b"GGUF");
        out.put_u32(self.version);
        out.layout.tensor_count = out.bytes.len();
        out.put_u64(self.tensors.len() as u64);
        out.layout.metadata_count = out.bytes.len();
        out.put_u64(self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            out.put_string(key);
            out.put_type(type_id(value));
            out.put_value(value);
        }
        let mut offset = 0;
        for tensor in &self.tensors {
            out.put_string(&tensor.name);
            out.layout.n_dims.push(out.bytes.len());
            out.put_u32(tensor.dims.len() as u32);
            for &dim in &tensor.dims {
                out.layout.dims.push(out.bytes.len());
                out.put_u64(dim);
            }
            out.layout.type_ids.push(out.bytes.len());
            out.put_u32(tensor.type_id);
            out.layout.offsets.push(out.bytes.len());
            out.put_u64(offset as u64);
            offset = (offset + tensor.data.len()).next_multiple_of(alignment);
        }
        if !self.tensors.is_empty() {
            out.pad_to(alignment);
        }
        out.layout.data_start = out.bytes.len();
        for (index, tensor) in self.tensors.iter().enumerate() {
            if index > 0 {
                out.pad_to(alignment);
            }
            out.put(&tensor.data);
        }
        (out.bytes, out.layout)
    }
}
