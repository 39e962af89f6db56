//! [`GgufWriter`]: writes GGUF files, streaming tensor data that does not fit in memory.
//!
//! It writes what it is given without judging it (duplicate keys, five dimensions, unknown
//! type ids), so the reader's tests build hostile files with it too, and it records where each
//! count, length, type and offset field lies so tests can corrupt exactly those bytes.

use std::io::Write;

use crate::gguf::{MetadataArray, MetadataValue};

/// Byte positions of the fields of a written file.
#[derive(Debug, Default)]
pub struct Layout {
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

/// A tensor to write: its bytes now, or their length and the bytes later ([`GgufWriter::write`]).
struct TensorEntry {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: TensorData,
}

enum TensorData {
    Bytes(Vec<u8>),
    Later(usize),
}

impl TensorEntry {
    fn len(&self) -> usize {
        match &self.data {
            TensorData::Bytes(bytes) => bytes.len(),
            TensorData::Later(len) => *len,
        }
    }
}

/// Builds a GGUF file in memory.
/// A GGUF file being described: metadata and tensors, in the order they are added.
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorEntry>,
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

/// Where the bytes go, how many went, and where the fields lie; the first write error is kept.
struct Output<'w> {
    out: &'w mut dyn Write,
    written: usize,
    layout: Layout,
    error: Option<std::io::Error>,
}

impl Output<'_> {
    fn put(&mut self, bytes: &[u8]) {
        if self.error.is_none()
            && let Err(error) = self.out.write_all(bytes)
        {
            self.error = Some(error);
        }
        self.written += bytes.len();
    }

    fn put_u32(&mut self, value: u32) {
        self.put(&value.to_le_bytes());
    }

    fn put_u64(&mut self, value: u64) {
        self.put(&value.to_le_bytes());
    }

    fn put_string(&mut self, text: &str) {
        self.layout.string_lengths.push(self.written);
        self.put_u64(text.len() as u64);
        self.put(text.as_bytes());
    }

    fn put_type(&mut self, type_id: u32) {
        self.layout.value_types.push(self.written);
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
        self.layout.array_counts.push(self.written);
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
        let padding = self.written.next_multiple_of(alignment) - self.written;
        self.put(&vec![0; padding]);
    }
}

impl GgufWriter {
    /// An empty file of GGUF `version` (3 is current).
    pub fn new(version: u32) -> Self {
        GgufWriter { version, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Adds a metadata entry.
    pub fn metadata(mut self, key: &str, value: MetadataValue) -> Self {
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Adds a tensor with its bytes.
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        let data = TensorData::Bytes(data);
        self.tensors.push(TensorEntry { name: name.to_owned(), dims: dims.to_vec(), type_id, data });
        self
    }

    /// Adds a tensor of `len` bytes that [`GgufWriter::write`] asks for when it gets to it.
    pub fn tensor_later(mut self, name: &str, dims: &[u64], type_id: u32, len: usize) -> Self {
        let data = TensorData::Later(len);
        self.tensors.push(TensorEntry { name: name.to_owned(), dims: dims.to_vec(), type_id, data });
        self
    }

    /// The whole file in memory, and where its fields lie.
    pub fn build(&self) -> (Vec<u8>, Layout) {
        let mut bytes = Vec::new();
        let layout = self
            .write(&mut bytes, |_, _| Ok(()))
            .unwrap_or_else(|error| unreachable!("writing to memory cannot fail: {error}"));
        (bytes, layout)
    }

    /// Writes the file to `out`: header, metadata, tensor infos, then each tensor's bytes, those
    /// added with [`GgufWriter::tensor_later`] written by `later(index, out)`, which must write
    /// exactly the length given. Returns where the fields lie.
    pub fn write(
        &self,
        out: &mut dyn Write,
        mut later: impl FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<Layout> {
        let alignment = self
            .metadata
            .iter()
            .find_map(|(key, value)| match (key.as_str(), value) {
                ("general.alignment", MetadataValue::U32(alignment)) => Some(*alignment as usize),
                _ => None,
            })
            .unwrap_or(crate::gguf::DEFAULT_ALIGNMENT);
        let mut out = Output { out, written: 0, layout: Layout::default(), error: None };
        out.put(b"GGUF");
        out.put_u32(self.version);
        out.layout.tensor_count = out.written;
        out.put_u64(self.tensors.len() as u64);
        out.layout.metadata_count = out.written;
        out.put_u64(self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            out.put_string(key);
            out.put_type(type_id(value));
            out.put_value(value);
        }
        let mut offset = 0;
        for tensor in &self.tensors {
            out.put_string(&tensor.name);
            out.layout.n_dims.push(out.written);
            out.put_u32(tensor.dims.len() as u32);
            for &dim in &tensor.dims {
                out.layout.dims.push(out.written);
                out.put_u64(dim);
            }
            out.layout.type_ids.push(out.written);
            out.put_u32(tensor.type_id);
            out.layout.offsets.push(out.written);
            out.put_u64(offset as u64);
            offset = (offset + tensor.len()).next_multiple_of(alignment);
        }
        if !self.tensors.is_empty() {
            out.pad_to(alignment);
        }
        out.layout.data_start = out.written;
        for (index, tensor) in self.tensors.iter().enumerate() {
            if index > 0 {
                out.pad_to(alignment);
            }
            match &tensor.data {
                TensorData::Bytes(bytes) => out.put(bytes),
                TensorData::Later(len) => {
                    if let Some(error) = out.error.take() {
                        return Err(error);
                    }
                    let mut counted = CountingWriter { out: &mut *out.out, written: 0 };
                    later(index, &mut counted)?;
                    if counted.written != *len {
                        return Err(std::io::Error::other(format!(
                            "tensor '{}' was declared {len} bytes but {} were written",
                            tensor.name, counted.written
                        )));
                    }
                    out.written += len;
                }
            }
        }
        match out.error {
            Some(error) => Err(error),
            None => Ok(out.layout),
        }
    }
}

/// Counts what passes through to the file.
struct CountingWriter<'w> {
    out: &'w mut dyn Write,
    written: usize,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.out.write(bytes)?;
        self.written += written;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
