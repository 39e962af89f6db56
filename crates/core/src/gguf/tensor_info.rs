//! Tensor infos: name, shape, type and where each tensor's bytes lie.

use crate::gguf::cursor::{Cursor, Reason};
use crate::gguf::gguf_error;
use crate::quant::QuantType;
use crate::{Error, Result};

/// GGML tensors have at most 4 dimensions (`GGML_MAX_DIMS`).
pub(super) const MAX_DIMS: u32 = 4;

/// The fewest bytes one tensor info takes: name length, n_dims, one dimension, type, offset.
pub(super) const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor of a GGUF file, validated: its bytes lie inside the file, overlap no other
/// tensor's, and its rows are whole blocks of its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    name: String,
    shape: Vec<usize>,
    quant: QuantType,
    offset: u64,
    file_offset: u64,
    bytes: usize,
}

impl TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shape as GGUF gives it: `shape()[0]` is the contiguous dimension (the length of a
    /// row), so a `[576, 49152]` embedding has 49152 rows of 576 weights.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The type of the weights.
    pub fn quant(&self) -> QuantType {
        self.quant
    }

    /// Offset of the first byte from the start of the data section, as stored in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset of the first byte from the start of the file.
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// Size of the tensor's data in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of weights (the product of the shape).
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Weights per row: `shape()[0]`.
    pub fn row_elements(&self) -> usize {
        self.shape[0]
    }

    /// Number of rows: the product of every dimension but the first.
    pub fn rows(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// Bytes per row (whole blocks of [`TensorInfo::quant`]).
    pub fn row_bytes(&self) -> usize {
        self.bytes / self.rows()
    }
}

/// A tensor info as read from the file, before the data section's start is known.
pub(super) struct TensorHeader {
    pub(super) name: String,
    shape: Vec<usize>,
    quant: QuantType,
    offset: u64,
    bytes: usize,
}

fn tensor_error(name: &str) -> impl FnOnce(Reason) -> Error + '_ {
    move |reason| gguf_error(format!("tensor '{name}'"), reason)
}

/// The GGML types flint reads, by name, for the error about one it does not.
fn supported_types() -> String {
    // GGML type ids are below 64; every type flint reads is among them.
    (0..64).filter_map(QuantType::from_ggml_id).map(QuantType::name).collect::<Vec<_>>().join(", ")
}

/// Reads the `index`-th tensor info and checks everything that does not need the other
/// tensors or the data section: dimensions, type, size, and that `offset` is aligned.
pub(super) fn read_tensor_header(
    cursor: &mut Cursor,
    index: usize,
    alignment: usize,
) -> Result<TensorHeader> {
    let name =
        cursor.string().map_err(|reason| gguf_error(format!("tensor info {index}"), reason))?.to_owned();
    let fail = |reason: Reason| tensor_error(&name)(reason);

    let n_dims = cursor.u32().map_err(fail)?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(fail(format!("has {n_dims} dimensions; GGUF tensors have 1 to {MAX_DIMS}")));
    }
    let dims = (0..n_dims).map(|_| cursor.u64()).collect::<Result<Vec<u64>, _>>().map_err(fail)?;
    if let Some(zero) = dims.iter().position(|&dim| dim == 0) {
        return Err(fail(format!("dimension {zero} of shape {dims:?} is zero")));
    }
    let type_id = cursor.u32().map_err(fail)?;
    let quant = QuantType::from_ggml_id(type_id).ok_or_else(|| match QuantType::ggml_name(type_id) {
        "unknown" => fail(format!("unknown GGML type id {type_id}")),
        name => fail(format!(
            "type {name} (GGML type id {type_id}) is not supported; flint reads {}",
            supported_types()
        )),
    })?;
    let offset = cursor.u64().map_err(fail)?;

    let elements = dims
        .iter()
        .try_fold(1u64, |product, &dim| product.checked_mul(dim))
        .and_then(|elements| usize::try_from(elements).ok())
        .ok_or_else(|| fail(format!("shape {dims:?} has more elements than this target can address")))?;
    // `elements` fits a usize and every dimension divides it, so each dimension fits too.
    let shape: Vec<usize> = dims.iter().map(|&dim| dim as usize).collect();
    let row_elements = shape[0];
    if !row_elements.is_multiple_of(quant.block_elements()) {
        return Err(fail(format!(
            "rows of {row_elements} weights are not a whole number of {quant} blocks ({} weights each)",
            quant.block_elements()
        )));
    }
    // Checked here rather than through `QuantType::row_bytes`: hostile shapes overflow.
    let blocks = elements / quant.block_elements();
    let bytes = blocks.checked_mul(quant.block_bytes()).ok_or_else(|| {
        fail(format!("shape {dims:?} of {quant} needs more bytes than this target can address"))
    })?;
    if !offset.is_multiple_of(alignment as u64) {
        return Err(fail(format!(
            "data offset {offset} is not a multiple of the file's alignment {alignment}"
        )));
    }
    Ok(TensorHeader { name, shape, quant, offset, bytes })
}

/// Places a tensor whose data section starts at `data_start` in a file of `file_bytes`,
/// checking that its data lies inside the file.
pub(super) fn locate(header: TensorHeader, data_start: usize, file_bytes: u64) -> Result<TensorInfo> {
    let TensorHeader { name, shape, quant, offset, bytes } = header;
    let data_start = data_start as u64;
    let start = offset.checked_add(data_start);
    let range = start.and_then(|start| Some(start..start.checked_add(bytes as u64)?));
    match range {
        Some(range) if range.end <= file_bytes => Ok(TensorInfo {
            offset: range.start - data_start,
            file_offset: range.start,
            bytes,
            shape,
            quant,
            name,
        }),
        _ => Err(tensor_error(&name)(format!(
            "data of {bytes} bytes at offset {offset} of the data section (which starts at byte \
             {data_start}) lies past the end of the file ({file_bytes} bytes)"
        ))),
    }
}

/// Checks that no two tensors share a byte of data.
pub(super) fn check_disjoint(tensors: &[TensorInfo]) -> Result<()> {
    let mut by_start: Vec<&TensorInfo> = tensors.iter().collect();
    by_start.sort_by_key(|tensor| (tensor.file_offset, tensor.bytes));
    for pair in by_start.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        if second.file_offset < first.file_offset + first.bytes as u64 {
            return Err(gguf_error(
                format!("tensor '{}'", second.name),
                format!(
                    "data (bytes {}..{} of the file) overlaps tensor '{}' (bytes {}..{})",
                    second.file_offset,
                    second.file_offset + second.bytes as u64,
                    first.name,
                    first.file_offset,
                    first.file_offset + first.bytes as u64
                ),
            ));
        }
    }
    Ok(())
}
