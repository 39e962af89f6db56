//! Embedding row gather (`shaders/embedding.wgsl`): the rows of a [`QuantMatrix`] picked by
//! token ids, dequantized to f32 by the type's block decoder from `shaders/quant/`.

use crate::Result;
use crate::gpu::{Encoder, GpuContext, KernelSource, QuantMatrix, Tensor};
use crate::kernels::ensure;
use crate::quant::QuantType;

const SOURCE: &str = include_str!("../../shaders/embedding.wgsl");
const WG_SIZE: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    first_row: u32,
    cols: u32,
    count: u32,
    row_words: u32,
    blocks: u32,
    total_rows: u32,
    zero_missing: u32,
}

fn source(quant: QuantType, textures: bool) -> KernelSource {
    QuantMatrix::kernel_source(quant, textures, "embedding", &[SOURCE])
        .define("WG_SIZE", format!("{WG_SIZE}u"))
}

/// Records `out[i, :] = table[ids[i], :]` for the `[count]` u32 `ids` into `out` `[count, cols]`.
///
/// The ids live on the GPU, so they are not checked here: an id at or past `table.rows()`
/// yields a row of zeros and never reads outside the table. One dispatch per chunk of the
/// table; each writes the rows whose ids fall in its chunk.
pub fn embedding(
    ctx: &GpuContext,
    encoder: &mut Encoder,
    table: &QuantMatrix,
    ids: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let (count, cols) = (ids.len(), table.cols());
    ensure("embedding", count > 0 && out.shape() == [count, cols], || {
        format!(
            "table '{}' has {cols} columns and {count} ids were given, so out must be [{count}, {cols}] \
             (and at least one id); got out {:?}",
            table.name(),
            out.shape()
        )
    })?;
    let source = source(table.quant(), table.in_textures());
    let groups = ctx.grid(((count * cols / 8) as u32).div_ceil(WG_SIZE));
    for (i, chunk) in table.chunks().iter().enumerate() {
        let params = encoder.params(
            ctx,
            &Params {
                rows: chunk.rows as u32,
                first_row: chunk.first_row as u32,
                cols: cols as u32,
                count: count as u32,
                row_words: table.row_words() as u32,
                blocks: (cols / table.quant().block_elements()) as u32,
                total_rows: table.rows() as u32,
                zero_missing: u32::from(i == 0),
            },
        )?;
        ctx.dispatch(
            encoder,
            &source,
            &[chunk.binding(), ids.binding(), out.binding(), params.binding()],
            groups,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{POISON, Rng, assert_close, both_paths, gpu, validate_wgsl};
    use crate::quant::{dequantize_row, random_rows};

    /// Gathers `ids` (some out of range) from a random table split into chunks of at most
    /// `max_chunk_bytes`, and compares with `dequantize_row`, on both test devices (on a CPU
    /// adapter: the table in textures, then in buffers). The decoders use the CPU's f32
    /// operations, so only fused multiply-adds can differ: a 1e-6 relative bound.
    fn check(
        quant: QuantType,
        rows: usize,
        cols: usize,
        ids: &[u32],
        max_chunk_bytes: u64,
        rng: &mut Rng,
    ) -> usize {
        let bytes = random_rows(quant, rows, cols, rng);
        let chunks =
            both_paths().map(|(_, ctx)| check_on(ctx, quant, rows, cols, &bytes, ids, max_chunk_bytes));
        assert_eq!(chunks[0], chunks[1], "both devices split the table alike");
        chunks[0]
    }

    fn check_on(
        ctx: &GpuContext,
        quant: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        ids: &[u32],
        max_chunk_bytes: u64,
    ) -> usize {
        let table =
            QuantMatrix::upload_in_chunks(ctx, "table", quant, rows, cols, bytes, max_chunk_bytes).unwrap();
        let ids_gpu = Tensor::from_slice(ctx, "ids", &[ids.len()], ids).unwrap();
        let out = Tensor::empty(ctx, "out", &[ids.len(), cols]).unwrap();
        out.fill_bits(ctx, POISON);
        let mut encoder = ctx.encoder("test");
        embedding(ctx, &mut encoder, &table, &ids_gpu, &out).unwrap();
        ctx.submit(encoder).unwrap();
        let got = pollster::block_on(out.to_f32(ctx)).unwrap();
        let row_bytes = quant.row_bytes(cols).unwrap();
        let mut expected = vec![0.0f32; ids.len() * cols];
        for (&id, row) in ids.iter().zip(expected.chunks_exact_mut(cols)) {
            if (id as usize) < rows {
                let id = id as usize;
                dequantize_row(quant, &bytes[id * row_bytes..(id + 1) * row_bytes], row).unwrap();
            }
        }
        let what = format!(
            "{quant} {rows}x{cols}, {} ids, {} chunks in {} (element i is id i / {cols})",
            ids.len(),
            table.chunk_count(),
            if table.in_textures() { "textures" } else { "buffers" }
        );
        assert_close(&what, &got, &expected, 1e-6);
        table.chunk_count()
    }

    /// Random ids with repeats, the first and last rows, and two ids past the end.
    fn test_ids(rows: usize, count: usize, rng: &mut Rng) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..count).map(|_| rng.usize(0, rows) as u32).collect();
        ids[0] = (rows - 1) as u32;
        if count > 3 {
            ids[1] = 0;
            ids[2] = rows as u32;
            ids[count - 1] = u32::MAX;
        }
        ids
    }

    #[test]
    fn every_type_gathers_its_rows() {
        let mut rng = Rng::new("embedding");
        for quant in QuantType::ALL {
            let cols = match quant.block_elements() {
                1 => 8 * 29,
                32 => 32 * 5,
                _ => 256 * 3,
            };
            for count in [1, 17] {
                let ids = test_ids(67, count, &mut rng);
                check(quant, 67, cols, &ids, u64::MAX, &mut rng);
            }
        }
    }

    #[test]
    fn split_tables_gather_from_every_chunk() {
        let mut rng = Rng::new("embedding split");
        for quant in [QuantType::Q8_0, QuantType::Q6K, QuantType::Q4_1] {
            let cols = if quant == QuantType::Q6K { 512 } else { 640 };
            let ids = test_ids(259, 40, &mut rng);
            let chunks = check(quant, 259, cols, &ids, 30 * quant.row_bytes(cols).unwrap() as u64, &mut rng);
            assert!(chunks >= 8, "{quant}: {chunks} chunks");
        }
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let ctx = gpu();
        let mut rng = Rng::new("embedding shapes");
        let bytes = random_rows(QuantType::Q8_0, 7, 64, &mut rng);
        let table = QuantMatrix::upload(ctx, "table", QuantType::Q8_0, 7, 64, &bytes).unwrap();
        let ids = Tensor::from_slice(ctx, "ids", &[3], &[0u32, 1, 2]).unwrap();
        for shape in [[3usize, 32], [2, 64]] {
            let out = Tensor::empty(ctx, "out", &shape).unwrap();
            let err = embedding(ctx, &mut ctx.encoder("test"), &table, &ids, &out).unwrap_err();
            assert!(err.to_string().contains("'table' has 64 columns"), "{err}");
        }
    }

    #[test]
    fn every_type_validates() {
        for quant in QuantType::ALL {
            validate_wgsl(&source(quant, false));
            validate_wgsl(&source(quant, true));
        }
    }
}
