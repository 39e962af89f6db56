//! The GGUF file reader: header, metadata, tensor infos and each tensor's bytes.
//!
//! A GGUF file (versions 2 and 3, little-endian) is laid out as
//!
//! ```text
//! "GGUF" | version u32 | tensor count u64 | metadata count u64
//! metadata:     key (u64 length + UTF-8) | value type u32 | value        (metadata count times)
//! tensor infos: name | n_dims u32 | dims u64 × n_dims | GGML type u32 | offset u64   (tensor count times)
//! padding to `general.alignment` (default 32)
//! data section: each tensor's bytes at its offset from the section's start
//! ```
//!
//! Everything is validated when the file is opened, so a [`GgufFile`] never hands out bytes
//! outside the file. Input is treated as hostile: every count and length is checked against
//! the bytes left before anything is allocated, offsets and sizes use checked arithmetic, and
//! each problem is an [`Error::Gguf`] naming where it is ("header", "metadata key 'x'",
//! "tensor 'blk.0.attn_q.weight'"), never a panic.
//!
//! The bytes come from a memory-mapped file natively ([`GgufFile::open`]) or from any byte
//! buffer on every target ([`GgufFile::from_bytes`]; the web hands in an `ArrayBuffer`'s bytes).

mod cursor;
mod metadata;
mod summary;
mod tensor_info;

#[cfg(test)]
mod tests;
mod writer;

use std::collections::HashMap;

pub use metadata::{FromMetadata, Metadata, MetadataArray, MetadataValue};
pub use summary::{HyperParameters, ModelSummary, TensorTypeSummary, TokenizerSummary};
pub use tensor_info::TensorInfo;
pub use writer::{GgufWriter, Layout};

use crate::{Error, Result};
use cursor::Cursor;
use metadata::key_error;

/// The first four bytes of every GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The fewest bytes one metadata entry takes: key length, value type, a one-byte value.
const MIN_METADATA_ENTRY_BYTES: u64 = 8 + 4 + 1;

/// Builds the crate's GGUF error.
fn gguf_error(context: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Gguf { context: context.into(), reason: reason.into() }
}

/// A parsed, validated GGUF file that owns (or maps) its bytes, or only its header and the
/// bytes of the tensors read since ([`GgufFile::from_header`]).
pub struct GgufFile {
    data: Data,
    /// The memory map the bytes are, when [`GgufFile::open`] made them one.
    #[cfg(not(target_arch = "wasm32"))]
    mapping: Option<std::sync::Arc<memmap2::Mmap>>,
    version: u32,
    metadata: Metadata,
    alignment: usize,
    data_offset: usize,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Where a [`GgufFile`]'s tensor bytes are.
enum Data {
    /// The whole file, in memory or mapped.
    Whole(Box<dyn AsRef<[u8]> + Send + Sync>),
    /// Only the header was read: the file's length, and the tensors read since, by index.
    Header { file_bytes: u64, tensors: HashMap<usize, Vec<u8>> },
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_bytes", &self.file_bytes())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the GGUF file at `path`.
    ///
    /// ```no_run
    /// # fn main() -> flint_core::Result<()> {
    /// let file = flint_core::gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
    /// let embedding = file.tensor("token_embd.weight").expect("every llama model has one");
    /// let first_row = &file.tensor_bytes(embedding)?[..embedding.row_bytes()];
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        let io_error = |source| Error::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io_error)?;
        // Mapping a directory fails with "No such device"; say what is wrong instead.
        if file.metadata().map_err(io_error)?.is_dir() {
            return Err(io_error(std::io::ErrorKind::IsADirectory.into()));
        }
        // SAFETY: the map is read-only and private to this process. If another process
        // truncates or rewrites the file while it is mapped, reads may fault or see new bytes:
        // the risk every memory-mapping reader accepts in exchange for not copying gigabytes.
        let map = std::sync::Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(io_error)?);
        let mut file = Self::from_bytes(SharedMap(map.clone()))?;
        file.mapping = Some(map);
        Ok(file)
    }

    /// Lets the operating system drop the pages of `info`'s bytes that a memory-mapped file holds
    /// in memory, once they have been copied elsewhere (a model's upload calls this after each
    /// tensor): they are read from the file again if touched. A load's resident memory then does
    /// not grow by the file's size on top of what the device holds. Does nothing for files held
    /// in memory, and on platforms without `madvise`.
    pub fn release_pages(&self, info: &TensorInfo) {
        #[cfg(all(unix, not(target_arch = "wasm32")))]
        if let Some(map) = &self.mapping {
            // Whole pages inside the tensor's bytes only: its neighbours may still be wanted.
            // 16 KiB: a multiple of the 4 KiB and 16 KiB pages of the platforms flint runs on.
            const PAGE: usize = 16 << 10;
            // A mapped file is in the address space whole: its offsets fit a usize.
            let offset = info.file_offset() as usize;
            let start = offset.next_multiple_of(PAGE);
            let end = (offset + info.bytes()) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is read-only and private and never written through, so a
                // dropped page holds nothing but the file's bytes: touched again, it is read
                // back from the file, and references into it stay valid.
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
                };
            }
        }
        #[cfg(not(all(unix, not(target_arch = "wasm32"))))]
        let _ = info;
    }

    /// Parses a GGUF file held in memory: a `Vec<u8>`, `Arc<[u8]>`, `Box<[u8]>`, a static
    /// slice, or a memory map. The bytes are kept, not copied.
    pub fn from_bytes(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Self> {
        let parsed = parse(&mut Cursor::new(bytes.as_ref()))?;
        Ok(Self::with_data(parsed, Data::Whole(Box::new(bytes))))
    }

    /// Parses the header of a file of `file_bytes` bytes from its first bytes, `prefix`: what a
    /// streaming load reads before any tensor (the browser's, whose files may exceed its
    /// memory). `Ok(None)` when the header goes on past `prefix`: read more and try again.
    /// The tensors' bytes are then read one by one and handed in with
    /// [`GgufFile::insert_tensor_bytes`].
    pub fn from_header(prefix: &[u8], file_bytes: u64) -> Result<Option<Self>> {
        let mut cursor = Cursor::prefix(prefix, file_bytes);
        match parse(&mut cursor) {
            Ok(parsed) => {
                Ok(Some(Self::with_data(parsed, Data::Header { file_bytes, tensors: HashMap::new() })))
            }
            Err(_) if cursor.ran_past_prefix() => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn with_data(parsed: ParsedFile, data: Data) -> Self {
        GgufFile {
            data,
            #[cfg(not(target_arch = "wasm32"))]
            mapping: None,
            version: parsed.version,
            metadata: parsed.metadata,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
        }
    }

    /// Hands in the bytes of `name`, read from the file, to a file opened with
    /// [`GgufFile::from_header`]; [`GgufFile::tensor_bytes`] gives them from then on.
    pub fn insert_tensor_bytes(&mut self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let index = *self
            .tensor_index
            .get(name)
            .ok_or_else(|| gguf_error(format!("tensor '{name}'"), "is not in the file"))?;
        let expected = self.tensors[index].bytes();
        if bytes.len() != expected {
            return Err(gguf_error(
                format!("tensor '{name}'"),
                format!("{} bytes were read for it, but it has {expected}", bytes.len()),
            ));
        }
        match &mut self.data {
            Data::Header { tensors, .. } => {
                tensors.insert(index, bytes);
                Ok(())
            }
            Data::Whole(_) => Err(gguf_error(
                format!("tensor '{name}'"),
                "the whole file is at hand: its bytes are not handed in",
            )),
        }
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata entries, with typed lookups.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The alignment of the data section and of every tensor in it.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Offset of the data section from the start of the file.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_bytes(&self) -> u64 {
        match &self.data {
            Data::Whole(bytes) => (**bytes).as_ref().len() as u64,
            Data::Header { file_bytes, .. } => *file_bytes,
        }
    }

    /// Every tensor, in the order of the file.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file (`info.bytes()` bytes). An error when `info` is not
    /// one of this file's tensors, or when the file was opened from its header and the tensor's
    /// bytes have not been handed in.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8]> {
        let context = || format!("tensor '{}'", info.name());
        let index = self
            .tensor_index
            .get(info.name())
            .filter(|&&index| self.tensors[index] == *info)
            .ok_or_else(|| gguf_error(context(), "is not one of this file's tensors"))?;
        match &self.data {
            // Validated at parsing: the range lies inside the file, which is in memory whole.
            Data::Whole(bytes) => {
                let start = info.file_offset() as usize;
                Ok(&(**bytes).as_ref()[start..start + info.bytes()])
            }
            Data::Header { tensors, .. } => tensors.get(index).map(Vec::as_slice).ok_or_else(|| {
                gguf_error(context(), "its bytes have not been read (the file was opened from its header)")
            }),
        }
    }

    /// The summary `flint inspect` prints: architecture, hyper-parameters, tokenizer, tensors.
    pub fn summary(&self) -> Result<ModelSummary> {
        ModelSummary::of(self)
    }
}

/// A memory map shared by the file's bytes and [`GgufFile::release_pages`].
#[cfg(not(target_arch = "wasm32"))]
struct SharedMap(std::sync::Arc<memmap2::Mmap>);

#[cfg(not(target_arch = "wasm32"))]
impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// What [`parse`] finds in a file's bytes.
struct ParsedFile {
    version: u32,
    metadata: Metadata,
    alignment: usize,
    data_offset: usize,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

/// Parses a file's header and tensor infos from `cursor`, at its start.
fn parse(cursor: &mut Cursor) -> Result<ParsedFile> {
    let header = |reason| gguf_error("header", reason);

    let magic = cursor.take(4).map_err(header)?;
    if magic != MAGIC {
        return Err(header(format!(
            "not a GGUF file: it starts with bytes {magic:02x?} instead of \"GGUF\" ({:02x?})",
            MAGIC
        )));
    }
    let version = cursor.u32().map_err(header)?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(header(
                "GGUF version 1 is not supported (flint reads versions 2 and 3); re-convert the model \
                 with a current llama.cpp"
                    .into(),
            ));
        }
        swapped if (2..=3).contains(&swapped.swap_bytes()) => {
            return Err(header(
                "big-endian GGUF files are not supported; use a little-endian conversion".into(),
            ));
        }
        other => {
            return Err(header(format!("unsupported GGUF version {other} (flint reads versions 2 and 3)")));
        }
    }
    let tensor_count = cursor.u64().map_err(header)?;
    let metadata_count = cursor.u64().map_err(header)?;
    // The counts are untrusted: the entries they claim must fit in the bytes left, which also
    // bounds the vectors allocated for them below.
    let least_bytes = metadata_count
        .checked_mul(MIN_METADATA_ENTRY_BYTES)
        .zip(tensor_count.checked_mul(tensor_info::MIN_TENSOR_INFO_BYTES))
        .and_then(|(metadata, tensors)| metadata.checked_add(tensors));
    if !least_bytes.is_some_and(|least| cursor.fits(least)) {
        return Err(header(format!(
            "{metadata_count} metadata entries and {tensor_count} tensor infos cannot fit in the {} bytes \
             left in the file (the header is corrupt or the file truncated)",
            cursor.remaining()
        )));
    }

    let metadata = read_metadata(cursor, metadata_count)?;
    let alignment = match metadata.optional::<u32>("general.alignment")? {
        None => DEFAULT_ALIGNMENT,
        Some(alignment) if alignment.is_power_of_two() => alignment as usize,
        Some(alignment) => {
            return Err(key_error("general.alignment")(format!("{alignment} is not a power of two")));
        }
    };

    // Cannot truncate: tensor_count * MIN_TENSOR_INFO_BYTES fits in the bytes left.
    let tensor_count = tensor_count as usize;
    let mut headers = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for index in 0..tensor_count {
        let header = tensor_info::read_tensor_header(cursor, index, alignment)?;
        if let Some(first) = tensor_index.insert(header.name.clone(), index) {
            return Err(gguf_error(
                format!("tensor '{}'", header.name),
                format!("appears twice (tensor infos {first} and {index})"),
            ));
        }
        headers.push(header);
    }

    let data_offset = cursor
        .position()
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| gguf_error("data section", format!("start overflows when aligned to {alignment}")))?;
    let tensors = headers
        .into_iter()
        .map(|header| tensor_info::locate(header, data_offset, cursor.file_bytes()))
        .collect::<Result<Vec<_>>>()?;
    tensor_info::check_disjoint(&tensors)?;
    Ok(ParsedFile { version, metadata, alignment, data_offset, tensors, tensor_index })
}

fn read_metadata(cursor: &mut Cursor, count: u64) -> Result<Metadata> {
    // `count` was checked against the file's size by the caller.
    let mut entries = Vec::with_capacity(count as usize);
    for index in 0..count {
        let key = cursor
            .string()
            .map_err(|reason| gguf_error(format!("metadata entry {index}"), format!("key: {reason}")))?;
        let value =
            cursor.u32().and_then(|type_id| metadata::read_value(cursor, type_id)).map_err(key_error(key))?;
        entries.push((key.to_owned(), value));
    }
    Metadata::from_entries(entries)
}
