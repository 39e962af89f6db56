//! [`QuantMatrix`]: a 2-D weight in GPU memory, still quantized, split by rows into as many
//! buffers as the device's binding limit requires.
//!
//! GPU layout (what the decoders in `shaders/quant/` read): every row starts on a 16-byte
//! boundary and takes [`QuantMatrix::row_words`] words, a multiple of 4 (zero-padded), so that
//! kernels read weights with vec4 loads.
//! - F32, F16 and BF16 rows (`cols` is a multiple of 8) and Q5_1, Q4_K and Q5_K blocks (24,
//!   144, 176 bytes) are whole words, so a row is its GGUF bytes unchanged (Q4_K's and Q5_K's
//!   blocks are whole 16-byte pieces too).
//! - Q4_0, Q5_0, Q8_0 and Q6_K blocks are 18, 22, 34 and 210 bytes, so in GGUF every other
//!   block starts in the middle of a word; Q4_1's 20-byte blocks are whole words but put their
//!   16 bytes of nibbles one word off a 16-byte boundary. Their rows are repacked at upload:
//!   first each block without its f16 scale (Q4_1: its f16 scale and offset; Q5_0: its scale
//!   and its 4 bytes of fifth bits), back to back (16, 16, 32, 208 and 16 bytes: the 32
//!   weights' low bits of Q4_0, Q5_0, Q4_1 and Q8_0 are whole 16-byte pieces), then what was
//!   taken out, one array per field from a word boundary (scales two per word; Q4_1's pairs
//!   and Q5_0's fifth bits one per word). This costs a few bytes of padding a row (padding each
//!   block to a word would cost up to 11%) and spares every load in the kernels the two-word
//!   shifting that unaligned reads need.
//!
//! A chunk lives in a read-only storage buffer, or where the device reads textures faster
//! ([`GpuFeatures::weight_textures`]: CPU adapters) in an `rgba32uint` texture
//! [`TEXTURE_WIDTH`] texels wide: the same bytes, 16 to a texel, the chunk's word `i` in texel
//! `i / 4` counted row by row (a matrix row may continue on the next texture row).
//!
//! [`GpuFeatures::weight_textures`]: crate::gpu::GpuFeatures::weight_textures

use std::ops::Range;

use crate::gpu::memory::Reservation;
use crate::gpu::quant_types::{Field, decoder_parts};
use crate::gpu::{GpuContext, KernelSource};
use crate::quant::QuantType;
use crate::{Error, Result};

/// A `rows` × `cols` weight matrix on the GPU in its GGUF quantization, never expanded to f32.
///
/// GGUF's dimension 0 (`cols`) is contiguous: a row is `cols / block_elements` blocks. Rows are
/// stored in chunks, each its own buffer within [`GpuContext::max_binding_bytes`], so a tensor
/// larger than one binding (gemma3's 178 MB token embedding on a 128 MiB device) still fits;
/// kernels record one dispatch per chunk.
pub struct QuantMatrix {
    name: String,
    quant: QuantType,
    rows: usize,
    cols: usize,
    row_words: usize,
    /// Rows of each stacked part ([`QuantMatrix::upload_stacked`]); one entry otherwise.
    part_rows: Vec<usize>,
    chunks: Vec<WeightChunk>,
}

/// Width in texels of the textures that hold weights: 64 KiB a texture row, a multiple of the
/// 256 bytes a buffer-to-texture copy needs per row.
pub(crate) const TEXTURE_WIDTH: u32 = 4096;

/// Consecutive rows of a [`QuantMatrix`] in one buffer or texture.
pub(crate) struct WeightChunk {
    /// The rows, `row_words` words each.
    pub storage: ChunkStorage,
    /// Index in the whole matrix of the chunk's first row.
    pub first_row: usize,
    /// Number of rows in the chunk.
    pub rows: usize,
    /// The buffer's bytes, counted against the device's memory budget.
    _memory: Reservation,
}

/// Where a chunk's words are.
pub(crate) enum ChunkStorage {
    /// A read-only storage buffer of the words.
    Buffer(wgpu::Buffer),
    /// A view of an `rgba32uint` texture [`TEXTURE_WIDTH`] texels wide, four words a texel.
    Texture(wgpu::TextureView),
}

impl WeightChunk {
    /// The chunk bound as `@binding(0)` of a kernel that reads weights.
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        match &self.storage {
            ChunkStorage::Buffer(buffer) => buffer.as_entire_binding(),
            ChunkStorage::Texture(view) => wgpu::BindingResource::TextureView(view),
        }
    }
}

/// The byte ranges of a GGUF block that stay in its body when `fields` move out, in order.
fn body_ranges(block_bytes: usize, fields: &[Field]) -> Vec<Range<usize>> {
    let mut moved: Vec<Range<usize>> = fields.iter().map(|field| field.range()).collect();
    moved.sort_by_key(|field| field.start);
    let mut body = Vec::new();
    let mut at = 0;
    for field in moved {
        if field.start > at {
            body.push(at..field.start);
        }
        at = field.end;
    }
    if at < block_bytes {
        body.push(at..block_bytes);
    }
    body
}

/// Words a row of `blocks` blocks takes in the GPU layout: the bodies (each a whole number of
/// words), then each moved field's array from a word boundary, padded to 16 bytes.
fn gpu_row_words(quant: QuantType, blocks: usize) -> usize {
    let fields = quant.gpu().moved_fields;
    let moved_bytes: usize = fields.iter().map(|field| field.len).sum();
    let body_words = (blocks * (quant.block_bytes() - moved_bytes)).div_ceil(4);
    let field_words: usize = fields.iter().map(|field| (blocks * field.len).div_ceil(4)).sum();
    (body_words + field_words).next_multiple_of(4)
}

/// Words of a row of `cols` weights in the GPU layout, and the rows of one chunk: as many as fit
/// `max_chunk_bytes` and the device's limit on one buffer (or texture).
fn chunking(
    ctx: &GpuContext,
    name: &str,
    quant: QuantType,
    cols: usize,
    max_chunk_bytes: u64,
) -> Result<(usize, usize)> {
    let row_words = gpu_row_words(quant, cols / quant.block_elements());
    let device_limit = if ctx.features().weight_textures {
        let texture_rows = u64::from(ctx.limits().max_texture_dimension_2d);
        (u64::from(TEXTURE_WIDTH) * 16 * texture_rows).min(ctx.limits().max_buffer_size)
    } else {
        ctx.max_binding_bytes()
    };
    let chunk_limit = max_chunk_bytes.min(device_limit);
    let rows_per_chunk = (chunk_limit / (row_words as u64 * 4)).min(u32::MAX as u64) as usize;
    if rows_per_chunk == 0 {
        return Err(Error::TooLarge {
            name: name.to_string(),
            bytes: row_words as u64 * 4,
            reason: format!("one row must fit in one buffer of at most {chunk_limit} bytes"),
        });
    }
    Ok((row_words, rows_per_chunk))
}

/// The memory a chunk of `words` takes: a buffer, or a texture of whole rows of texels.
fn chunk_bytes(ctx: &GpuContext, words: usize) -> u64 {
    if ctx.features().weight_textures {
        u64::from(texture_size(words).height) * u64::from(TEXTURE_WIDTH) * 16
    } else {
        words as u64 * 4
    }
}

/// Bytes the matrix of `rows` rows of `cols` weights takes once uploaded with
/// [`QuantMatrix::upload`] on `ctx`'s device, or why it cannot be.
pub(crate) fn uploaded_bytes(
    ctx: &GpuContext,
    name: &str,
    quant: QuantType,
    rows: usize,
    cols: usize,
) -> Result<u64> {
    let (row_words, rows_per_chunk) = chunking(ctx, name, quant, cols, ctx.max_binding_bytes())?;
    let full_chunks = (rows / rows_per_chunk) as u64;
    let last = rows % rows_per_chunk;
    let last_bytes = if last > 0 { chunk_bytes(ctx, last * row_words) } else { 0 };
    Ok(full_chunks * chunk_bytes(ctx, rows_per_chunk * row_words) + last_bytes)
}

fn shape_error(reason: String) -> Error {
    Error::KernelArguments { kernel: "QuantMatrix::upload", reason }
}

/// Every decoder yields 8 consecutive weights at a time, so rows are a multiple of 8 long.
const DECODE_WEIGHTS: usize = 8;

impl QuantMatrix {
    /// A kernel that reads `quant` weights: `family` (the kernel's own files) after the WGSL
    /// parts that give it `decode8()` and `load32()` for the type in this module's layout, with
    /// `TEXTURE_WEIGHTS` defined for chunks in `textures` ([`QuantMatrix::in_textures`]).
    pub(crate) fn kernel_source(
        quant: QuantType,
        textures: bool,
        entry: &'static str,
        family: &[&'static str],
    ) -> KernelSource {
        let mut parts = decoder_parts(quant);
        parts.extend_from_slice(family);
        KernelSource::new(entry, &parts)
            .define("TEXTURE_WEIGHTS", textures)
            .define("TEXTURE_WIDTH", format!("{TEXTURE_WIDTH}u"))
    }

    /// Uploads a weight from its GGUF bytes (`rows` rows of `quant.row_bytes(cols)` bytes),
    /// in chunks of at most [`GpuContext::max_binding_bytes`].
    pub fn upload(
        ctx: &GpuContext,
        name: &str,
        quant: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        Self::upload_in_chunks(ctx, name, quant, rows, cols, bytes, ctx.max_binding_bytes())
    }

    /// As [`QuantMatrix::upload`], with chunks of at most `max_chunk_bytes` (capped at the
    /// device's binding limit): small values split small tensors, which tests use to exercise
    /// the multi-buffer path.
    pub fn upload_in_chunks(
        ctx: &GpuContext,
        name: &str,
        quant: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = Self::row_bytes(name, quant, cols)?;
        if rows.checked_mul(row_bytes) != Some(bytes.len()) {
            return Err(shape_error(format!(
                "weight '{name}': {rows} rows of {cols} {quant} weights are {row_bytes} bytes each, \
                 but {} bytes were given",
                bytes.len()
            )));
        }
        Self::upload_parts(ctx, name, quant, cols, &[bytes], max_chunk_bytes)
    }

    /// Uploads weights of the same type and width stacked into one matrix: the rows of
    /// `parts[0]`, then those of `parts[1]`, and so on (each part whole rows of GGUF bytes).
    /// A kernel then reads them all in one pass, as [`crate::kernels::matmul::MatmulOutput::Split`]
    /// does for the query, key and value projections of one input.
    pub fn upload_stacked(
        ctx: &GpuContext,
        name: &str,
        quant: QuantType,
        cols: usize,
        parts: &[&[u8]],
    ) -> Result<Self> {
        Self::upload_parts(ctx, name, quant, cols, parts, ctx.max_binding_bytes())
    }

    /// The bytes of a GGUF row of `cols` weights, if such a row can be uploaded.
    fn row_bytes(name: &str, quant: QuantType, cols: usize) -> Result<usize> {
        quant.row_bytes(cols).filter(|_| cols > 0 && cols.is_multiple_of(DECODE_WEIGHTS)).ok_or_else(|| {
            shape_error(format!(
                "weight '{name}': {cols} columns is not a positive multiple of the {quant} block \
                 ({} weights) and of {DECODE_WEIGHTS}",
                quant.block_elements()
            ))
        })
    }

    /// As [`QuantMatrix::upload_stacked`], with chunks of at most `max_chunk_bytes` (capped at
    /// the device's binding limit), which tests use to split chunks across parts.
    pub(crate) fn upload_parts(
        ctx: &GpuContext,
        name: &str,
        quant: QuantType,
        cols: usize,
        parts: &[&[u8]],
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        let row_bytes = Self::row_bytes(name, quant, cols)?;
        if let Some(part) = parts.iter().position(|p| p.is_empty() || !p.len().is_multiple_of(row_bytes)) {
            return Err(shape_error(format!(
                "weight '{name}': part {part} of {} bytes is not a positive number of rows of {cols} \
                 {quant} weights ({row_bytes} bytes each)",
                parts[part].len()
            )));
        }
        let part_rows: Vec<usize> = parts.iter().map(|p| p.len() / row_bytes).collect();
        let matrix = Self::allocate(ctx, name, quant, cols, &part_rows, max_chunk_bytes)?;
        for (part, bytes) in parts.iter().enumerate() {
            matrix.part_writer(part).write(ctx, quant, bytes)?;
        }
        Ok(matrix)
    }

    /// A matrix of the stacked parts of `part_rows` rows each, in buffers (or textures) not
    /// written yet: each part's [`PartWriter`] writes its rows when its bytes are at hand (a
    /// streaming load allocates every matrix first, then writes tensors in the file's order).
    pub(crate) fn allocate(
        ctx: &GpuContext,
        name: &str,
        quant: QuantType,
        cols: usize,
        part_rows: &[usize],
        max_chunk_bytes: u64,
    ) -> Result<Self> {
        Self::row_bytes(name, quant, cols)?;
        let rows: usize = part_rows.iter().sum();
        // Kernels index rows and columns with u32.
        if part_rows.contains(&0) || rows > u32::MAX as usize || cols > u32::MAX as usize {
            return Err(shape_error(format!(
                "weight '{name}' has parts of {part_rows:?} rows and {cols} columns: each must be \
                 between 1 and {}",
                u32::MAX
            )));
        }
        let (row_words, rows_per_chunk) = chunking(ctx, name, quant, cols, max_chunk_bytes)?;
        let mut chunks = Vec::new();
        for first_row in (0..rows).step_by(rows_per_chunk) {
            let chunk_rows = rows_per_chunk.min(rows - first_row);
            let label = format!("{name} rows {first_row}..{}", first_row + chunk_rows);
            let words = chunk_rows * row_words;
            let memory = ctx.memory.reserve(&label, chunk_bytes(ctx, words))?;
            let storage = if ctx.features().weight_textures {
                let texture = words_texture(ctx, &label, words);
                ChunkStorage::Texture(texture.create_view(&wgpu::TextureViewDescriptor::default()))
            } else {
                ctx.count_created_buffer();
                ChunkStorage::Buffer(ctx.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&label),
                    size: (words * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_DST
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                }))
            };
            chunks.push(WeightChunk { storage, first_row, rows: chunk_rows, _memory: memory });
        }
        Ok(QuantMatrix {
            name: name.to_string(),
            quant,
            rows,
            cols,
            row_words,
            part_rows: part_rows.to_vec(),
            chunks,
        })
    }

    /// What writes the rows of stacked part `part` (0 for an unstacked matrix).
    ///
    /// # Panics
    /// If the matrix has no such part.
    pub(crate) fn part_writer(&self, part: usize) -> PartWriter {
        let first_row: usize = self.part_rows[..part].iter().sum();
        let rows = first_row..first_row + self.part_rows[part];
        let chunks = self
            .chunks
            .iter()
            .filter(|chunk| chunk.first_row < rows.end && rows.start < chunk.first_row + chunk.rows)
            .map(|chunk| {
                let storage = match &chunk.storage {
                    ChunkStorage::Buffer(buffer) => ChunkTarget::Buffer(buffer.clone()),
                    ChunkStorage::Texture(view) => ChunkTarget::Texture(view.texture().clone()),
                };
                (storage, chunk.first_row..chunk.first_row + chunk.rows)
            })
            .collect();
        PartWriter {
            name: self.name.clone(),
            quant: self.quant,
            cols: self.cols,
            row_words: self.row_words,
            rows,
            chunks,
        }
    }

    /// The tensor's name (for error messages).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quantization of the weights.
    pub fn quant(&self) -> QuantType {
        self.quant
    }

    /// Number of rows (outputs of a matrix × vector product).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (weights per row, GGUF's contiguous dimension 0).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Words a row takes in the GPU layout.
    pub fn row_words(&self) -> usize {
        self.row_words
    }

    /// Number of buffers the rows are split into.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// The number of rows of each stacked part, in order (one part unless uploaded with
    /// [`QuantMatrix::upload_stacked`]).
    pub fn part_rows(&self) -> &[usize] {
        &self.part_rows
    }

    /// The chunks, in row order.
    /// The rows each buffer holds, in order: one range unless the weight exceeds a binding.
    pub fn chunk_row_ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.chunks.iter().map(|chunk| chunk.first_row..chunk.first_row + chunk.rows).collect()
    }

    pub(crate) fn chunks(&self) -> &[WeightChunk] {
        &self.chunks
    }

    /// The chunks are textures ([`GpuFeatures::weight_textures`]), not storage buffers.
    ///
    /// [`GpuFeatures::weight_textures`]: crate::gpu::GpuFeatures::weight_textures
    pub(crate) fn in_textures(&self) -> bool {
        matches!(self.chunks.first().map(|c| &c.storage), Some(ChunkStorage::Texture(..)))
    }
}

/// Writes one stacked part of a [`QuantMatrix`] (or a whole unstacked one) from its GGUF bytes,
/// repacked into the GPU layout, through the queue: made by [`QuantMatrix::part_writer`] so
/// that the bytes can come after the matrix was built.
pub(crate) struct PartWriter {
    name: String,
    quant: QuantType,
    cols: usize,
    row_words: usize,
    /// The part's rows in the whole matrix.
    rows: Range<usize>,
    /// The chunks holding some of those rows, and the rows of the whole matrix each holds.
    chunks: Vec<(ChunkTarget, Range<usize>)>,
}

/// A chunk's buffer or texture, to write into.
enum ChunkTarget {
    Buffer(wgpu::Buffer),
    Texture(wgpu::Texture),
}

/// Rows written in one piece at most: the queue's staging memory is flushed after each.
const WRITE_PIECE_BYTES: usize = 16 << 20;

impl PartWriter {
    /// Writes the part's rows from `bytes`, their GGUF bytes in `quant`: the matrix's own type,
    /// or one that widens to it exactly (see [`widen_to_q8_0`]).
    ///
    /// [`widen_to_q8_0`]: crate::quant::widen_to_q8_0
    pub fn write(&self, ctx: &GpuContext, quant: QuantType, bytes: &[u8]) -> Result<()> {
        let rows = quant.row_bytes(self.cols).map_or(0, |row_bytes| bytes.len() / row_bytes.max(1));
        if rows != self.rows.len() {
            return Err(shape_error(format!(
                "weight '{}': {} bytes were given for {} rows of {} {quant} weights",
                self.name,
                bytes.len(),
                self.rows.len(),
                self.cols
            )));
        }
        self.write_rows(ctx, quant, 0, bytes)
    }

    /// Writes rows `first..` of the part from `bytes`, whole rows of GGUF bytes in `quant` (as
    /// [`PartWriter::write`]): a large tensor comes in pieces.
    pub fn write_rows(&self, ctx: &GpuContext, quant: QuantType, first: usize, bytes: &[u8]) -> Result<()> {
        let widened;
        let bytes = if quant == self.quant {
            bytes
        } else {
            widened = crate::quant::widen_to_q8_0(quant, bytes)
                .filter(|_| self.quant == QuantType::Q8_0)
                .ok_or_else(|| {
                    shape_error(format!(
                        "weight '{}': {quant} rows do not re-encode as {}",
                        self.name, self.quant
                    ))
                })?;
            &widened
        };
        let row_bytes = QuantMatrix::row_bytes(&self.name, self.quant, self.cols)?;
        let count = bytes.len() / row_bytes;
        if !bytes.len().is_multiple_of(row_bytes) || first + count > self.rows.len() {
            return Err(shape_error(format!(
                "weight '{}': {} bytes from row {first} are not whole rows of {} {} weights \
                 ({row_bytes} bytes each) within its {} rows",
                self.name,
                bytes.len(),
                self.cols,
                self.quant,
                self.rows.len()
            )));
        }
        let written = self.rows.start + first..self.rows.start + first + count;
        let gpu_row_bytes = self.row_words * 4;
        let fields = self.quant.gpu().moved_fields;
        let body = body_ranges(self.quant.block_bytes(), fields);
        let piece_rows = (WRITE_PIECE_BYTES / gpu_row_bytes).max(1);
        let mut repacked = Vec::new();
        for (target, chunk_rows) in &self.chunks {
            let run = written.start.max(chunk_rows.start)..written.end.min(chunk_rows.end);
            for first in run.clone().step_by(piece_rows) {
                let rows = first..(first + piece_rows).min(run.end);
                let src =
                    &bytes[(rows.start - written.start) * row_bytes..(rows.end - written.start) * row_bytes];
                let gpu_bytes: &[u8] = if fields.is_empty() && row_bytes == gpu_row_bytes {
                    src
                } else {
                    repacked.resize(rows.len() * gpu_row_bytes, 0);
                    for (src_row, out) in
                        src.chunks_exact(row_bytes).zip(repacked.chunks_exact_mut(gpu_row_bytes))
                    {
                        repack_row(self.quant, fields, &body, src_row, out);
                    }
                    &repacked
                };
                let at = ((rows.start - chunk_rows.start) * gpu_row_bytes) as u64;
                match target {
                    ChunkTarget::Buffer(buffer) => ctx.queue().write_buffer(buffer, at, gpu_bytes),
                    ChunkTarget::Texture(texture) => write_texture_words(ctx, texture, at, gpu_bytes),
                }
                ctx.staged_upload(gpu_bytes.len() as u64);
            }
        }
        Ok(())
    }
}

/// Writes `bytes` (whole texels) into a [`words_texture`] from its byte `at` on: the rest of
/// the first texture row, whole rows, then the start of the last.
fn write_texture_words(ctx: &GpuContext, texture: &wgpu::Texture, at: u64, bytes: &[u8]) {
    let width = u64::from(TEXTURE_WIDTH);
    let mut texel = at / 16;
    let mut data = bytes;
    while !data.is_empty() {
        let (x, y) = ((texel % width) as u32, (texel / width) as u32);
        let texels = data.len() as u64 / 16;
        // From the row's start, whole rows at once; otherwise up to the row's end.
        let (columns, rows) = if x == 0 && texels >= width {
            (TEXTURE_WIDTH, (texels / width) as u32)
        } else {
            ((texels.min(width - u64::from(x))) as u32, 1)
        };
        let len = u64::from(columns) * u64::from(rows) * 16;
        ctx.queue().write_texture(
            wgpu::TexelCopyTextureInfo {
                texture,
                mip_level: 0,
                origin: wgpu::Origin3d { x, y, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            &data[..len as usize],
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(columns * 16),
                rows_per_image: None,
            },
            wgpu::Extent3d { width: columns, height: rows, depth_or_array_layers: 1 },
        );
        texel += len / 16;
        data = &data[len as usize..];
    }
}

/// The texture that holds `words` words, four a texel, [`TEXTURE_WIDTH`] texels a row.
fn texture_size(words: usize) -> wgpu::Extent3d {
    let texels = words.div_ceil(4) as u32;
    wgpu::Extent3d { width: TEXTURE_WIDTH, height: texels.div_ceil(TEXTURE_WIDTH), depth_or_array_layers: 1 }
}

/// An `rgba32uint` texture [`TEXTURE_WIDTH`] texels wide that holds `words` words, four a texel,
/// for kernels to read with `textureLoad` (the layout of weight chunks in textures).
pub(crate) fn words_texture(ctx: &GpuContext, label: &str, words: usize) -> wgpu::Texture {
    ctx.device().create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: texture_size(words),
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba32Uint,
        usage: wgpu::TextureUsages::STORAGE_BINDING
            | wgpu::TextureUsages::COPY_DST
            | wgpu::TextureUsages::COPY_SRC,
        view_formats: &[],
    })
}

/// The rows of texels a [`words_texture`] of `words` words has.
pub(crate) fn words_texture_rows(words: usize) -> u32 {
    texture_size(words).height
}

/// Records a copy of the first `bytes` of `buffer` (a multiple of 16) into a [`words_texture`]
/// at least that large: whole texture rows, then the texels of the last, partial row.
pub(crate) fn record_copy_to_texture(
    encoder: &mut wgpu::CommandEncoder,
    buffer: &wgpu::Buffer,
    bytes: u64,
    texture: &wgpu::Texture,
) {
    let row_bytes = u64::from(TEXTURE_WIDTH) * 16;
    let full_rows = (bytes / row_bytes) as u32;
    let last_texels = ((bytes % row_bytes) / 16) as u32;
    for (first_row, rows, width) in [(0, full_rows, TEXTURE_WIDTH), (full_rows, 1, last_texels)] {
        if rows == 0 || width == 0 {
            continue;
        }
        encoder.copy_buffer_to_texture(
            wgpu::TexelCopyBufferInfo {
                buffer,
                layout: wgpu::TexelCopyBufferLayout {
                    offset: u64::from(first_row) * row_bytes,
                    bytes_per_row: Some(TEXTURE_WIDTH * 16),
                    rows_per_image: None,
                },
            },
            wgpu::TexelCopyTextureInfo {
                texture,
                mip_level: 0,
                origin: wgpu::Origin3d { x: 0, y: first_row, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            wgpu::Extent3d { width, height: rows, depth_or_array_layers: 1 },
        );
    }
}

/// Writes one GGUF row into `out` in its GPU layout: the `body` bytes of each block back to
/// back, then each of the moved `fields` as an array from a word boundary; the padding stays
/// zero. With no moved fields this copies the row.
fn repack_row(quant: QuantType, fields: &[Field], body: &[Range<usize>], src: &[u8], out: &mut [u8]) {
    let block_bytes = quant.block_bytes();
    let body_bytes: usize = body.iter().map(|range| range.len()).sum();
    let blocks = src.len() / block_bytes;
    let mut at = 0;
    for block in src.chunks_exact(block_bytes) {
        for range in body {
            out[at..at + range.len()].copy_from_slice(&block[range.clone()]);
            at += range.len();
        }
    }
    let mut array_at = (blocks * body_bytes).next_multiple_of(4);
    for field in fields {
        for (b, block) in src.chunks_exact(block_bytes).enumerate() {
            let at = array_at + b * field.len;
            out[at..at + field.len].copy_from_slice(&block[field.range()]);
        }
        array_at = (array_at + blocks * field.len).next_multiple_of(4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{Rng, both_paths, gpu};
    use crate::quant::random_rows;

    /// The chunks read back and concatenated.
    fn read_back(ctx: &GpuContext, matrix: &QuantMatrix) -> Vec<u8> {
        let mut bytes = Vec::new();
        for chunk in matrix.chunks() {
            let len = (chunk.rows * matrix.row_words() * 4) as u64;
            let words = match &chunk.storage {
                ChunkStorage::Buffer(buffer) => pollster::block_on(ctx.read_bytes(buffer, 0, len)),
                ChunkStorage::Texture(view) => {
                    let texture = view.texture();
                    let copy = ctx.device().create_buffer(&wgpu::BufferDescriptor {
                        label: Some("texture words"),
                        size: u64::from(texture.height() * TEXTURE_WIDTH * 16),
                        usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                        mapped_at_creation: false,
                    });
                    let mut encoder = ctx.encoder("texture words");
                    encoder.raw().copy_texture_to_buffer(
                        texture.as_image_copy(),
                        wgpu::TexelCopyBufferInfo {
                            buffer: &copy,
                            layout: wgpu::TexelCopyBufferLayout {
                                offset: 0,
                                bytes_per_row: Some(TEXTURE_WIDTH * 16),
                                rows_per_image: None,
                            },
                        },
                        texture.size(),
                    );
                    ctx.submit(encoder).unwrap();
                    pollster::block_on(ctx.read_bytes(&copy, 0, len))
                }
            };
            bytes.extend(words.unwrap());
        }
        bytes
    }

    /// Uploads 2 rows of 3 blocks of `quant` and checks their GPU layout: `row_words` words a
    /// row; the `body` bytes of each GGUF block back to back; each moved field (a name, its bytes
    /// in the GGUF block, the byte its array starts at) as an array; zeros after the last array.
    fn assert_repacked(
        ctx: &GpuContext,
        rng: &mut Rng,
        quant: QuantType,
        row_words: usize,
        body: Range<usize>,
        arrays: &[(&str, Range<usize>, usize)],
    ) {
        let (blocks, block_bytes) = (3, quant.block_bytes());
        let cols = blocks * quant.block_elements();
        let src = random_rows(quant, 2, cols, rng);
        let matrix = QuantMatrix::upload(ctx, "w", quant, 2, cols, &src).unwrap();
        assert_eq!(matrix.row_words(), row_words, "{quant}");
        let got = read_back(ctx, &matrix);
        let (row_bytes, gpu_row_bytes) = (blocks * block_bytes, row_words * 4);
        for r in 0..2 {
            let row = &src[r * row_bytes..(r + 1) * row_bytes];
            let gpu_row = &got[r * gpu_row_bytes..(r + 1) * gpu_row_bytes];
            for b in 0..blocks {
                let block = &row[b * block_bytes..(b + 1) * block_bytes];
                let body_at = b * body.len();
                assert_eq!(
                    &gpu_row[body_at..body_at + body.len()],
                    &block[body.clone()],
                    "{quant} row {r} body {b}"
                );
                for (name, field, array_at) in arrays {
                    let at = array_at + b * field.len();
                    assert_eq!(
                        &gpu_row[at..at + field.len()],
                        &block[field.clone()],
                        "{quant} row {r} {name} {b}"
                    );
                }
            }
            let padding_at = arrays.iter().map(|(_, field, at)| at + blocks * field.len()).max().unwrap();
            assert!(gpu_row[padding_at..].iter().all(|&b| b == 0), "{quant} row {r} padding");
        }
    }

    #[test]
    fn unaligned_types_are_repacked_scales_last() {
        let mut rng = Rng::new("repack");
        for (_, ctx) in both_paths() {
            // Q8_0: bodies of 32 bytes, then 3 scales in 2 words, padded to 28 words.
            assert_repacked(ctx, &mut rng, QuantType::Q8_0, 28, 2..34, &[("scale", 0..2, 96)]);
            // Q4_1: nibbles of 16 bytes, then 3 (d, m) pairs of 4 bytes, padded to 16 words.
            assert_repacked(ctx, &mut rng, QuantType::Q4_1, 16, 4..20, &[("head", 0..4, 48)]);
            // Q5_0: low nibbles of 16 bytes, then 3 qh words, then 3 scales in 2 words, padded
            // to 20 words.
            let arrays = [("qh", 2..6, 48), ("scale", 0..2, 60)];
            assert_repacked(ctx, &mut rng, QuantType::Q5_0, 20, 6..22, &arrays);
        }
    }

    #[test]
    fn aligned_types_are_unchanged_and_split_by_rows() {
        let mut rng = Rng::new("split");
        for (_, ctx) in both_paths() {
            aligned_and_split(ctx, &mut rng);
        }
    }

    fn aligned_and_split(ctx: &GpuContext, rng: &mut Rng) {
        // 300 rows of 288 bytes fill more than one 64 KiB texture row, the last one partly.
        let src = random_rows(QuantType::Q4K, 300, 512, rng);
        let matrix = QuantMatrix::upload(ctx, "q4k", QuantType::Q4K, 300, 512, &src).unwrap();
        assert_eq!(read_back(ctx, &matrix), src);
        let src = random_rows(QuantType::Q4K, 7, 512, rng);
        // 288 bytes a row: 3 rows a chunk gives chunks of 3, 3 and 1 rows.
        let matrix =
            QuantMatrix::upload_in_chunks(ctx, "q4k", QuantType::Q4K, 7, 512, &src, 3 * 288 + 100).unwrap();
        let rows: Vec<(usize, usize)> = matrix.chunks().iter().map(|c| (c.first_row, c.rows)).collect();
        assert_eq!(rows, [(0, 3), (3, 3), (6, 1)]);
        assert_eq!(read_back(ctx, &matrix), src);
        // Q5_1 rows of 2 blocks are 12 words, already a multiple of 4; of 1 block, 6 words, padded
        // to 8.
        let src = random_rows(QuantType::Q5_1, 3, 32, rng);
        let matrix = QuantMatrix::upload(ctx, "q5_1", QuantType::Q5_1, 3, 32, &src).unwrap();
        assert_eq!(matrix.row_words(), 8);
        let got = read_back(ctx, &matrix);
        for r in 0..3 {
            assert_eq!(&got[r * 32..r * 32 + 24], &src[r * 24..(r + 1) * 24], "row {r}");
            assert_eq!(&got[r * 32 + 24..(r + 1) * 32], &[0; 8], "row {r} padding");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let ctx = gpu();
        let cases = [
            (QuantType::Q4_0, 2, 48, 36), // not whole blocks
            (QuantType::F16, 1, 12, 24),  // not a multiple of 8
            (QuantType::Q8_0, 2, 32, 34), // too few bytes
            (QuantType::Q8_0, 0, 32, 0),  // no rows
        ];
        for (quant, rows, cols, len) in cases {
            let err = QuantMatrix::upload(ctx, "w", quant, rows, cols, &vec![0; len]).err().unwrap();
            assert!(err.to_string().contains("'w'"), "{quant} {rows}x{cols}: {err}");
        }
        let err =
            QuantMatrix::upload_in_chunks(ctx, "w", QuantType::F32, 2, 64, &[0; 512], 100).err().unwrap();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    }
}
