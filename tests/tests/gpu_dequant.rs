//! The GPU block decoders on real tensors: rows gathered by the embedding kernel from weights
//! uploaded as they are in the file must equal `dequant.json` (produced by the `gguf` Python
//! package) and the CPU dequantization, including gemma3's token embedding, which is larger
//! than one storage binding on lavapipe and so is split across buffers.

use std::collections::BTreeMap;

use flint_core::gguf::{GgufFile, TensorInfo};
use flint_core::gpu::{GpuContext, GpuOptions, QuantMatrix, Tensor};
use flint_core::kernels::embedding::embedding;
use flint_core::quant::dequantize_row;
use flint_e2e::{GEMMA3, ReferenceModel, reference_dir};

#[derive(serde::Deserialize)]
struct ReferenceTensor {
    model: String,
    tensor: String,
    rows: BTreeMap<String, Vec<f32>>,
}

fn gpu() -> std::sync::Arc<GpuContext> {
    pollster::block_on(GpuContext::new(&GpuOptions::from_env()))
        .unwrap_or_else(|e| panic!("GPU tests need an adapter (they never skip): {e}"))
}

fn upload(ctx: &GpuContext, file: &GgufFile, tensor: &TensorInfo) -> QuantMatrix {
    let cols = tensor.row_elements();
    QuantMatrix::upload(
        ctx,
        tensor.name(),
        tensor.quant(),
        tensor.rows(),
        cols,
        file.tensor_bytes(tensor).unwrap(),
    )
    .unwrap()
}

/// Gathers `rows` of `table` on the GPU, outputs poisoned with NaN first.
fn gather(ctx: &GpuContext, table: &QuantMatrix, rows: &[u32]) -> Vec<Vec<f32>> {
    let cols = table.cols();
    let ids = Tensor::from_slice(ctx, "ids", &[rows.len()], rows).unwrap();
    let out = Tensor::empty(ctx, "rows", &[rows.len(), cols]).unwrap();
    out.fill_bits(ctx, 0x7fc0_dead);
    let mut encoder = ctx.encoder("gather");
    embedding(ctx, &mut encoder, table, &ids, &out).unwrap();
    ctx.submit(encoder).unwrap();
    let values = pollster::block_on(out.to_f32(ctx)).unwrap();
    values.chunks(cols).map(<[f32]>::to_vec).collect()
}

fn assert_bits_equal(what: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.to_bits(), e.to_bits(), "{what}[{i}]: GPU {a:e}, expected {e:e}");
    }
}

#[test]
fn gpu_gathered_rows_match_the_reference() {
    let ctx = gpu();
    let path = reference_dir().join("dequant.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let references: Vec<ReferenceTensor> = serde_json::from_str(&text).unwrap();
    let mut files: BTreeMap<String, GgufFile> = BTreeMap::new();
    for reference in &references {
        let file = files.entry(reference.model.clone()).or_insert_with(|| {
            let model = ReferenceModel::by_reference_name(&reference.model).unwrap();
            GgufFile::open(model.path()).unwrap()
        });
        let tensor = file.tensor(&reference.tensor).unwrap();
        let rows: Vec<u32> = reference.rows.keys().map(|row| row.parse().unwrap()).collect();
        let gathered = gather(&ctx, &upload(&ctx, file, tensor), &rows);
        for ((row, expected), actual) in reference.rows.iter().zip(&gathered) {
            let what = format!("{} {} ({}) row {row}", reference.model, reference.tensor, tensor.quant());
            assert_bits_equal(&what, actual, expected);
        }
    }
}

/// gemma3's token embedding (262144 × 640 Q8_0, about 178 MB): rows on both sides of every
/// buffer boundary, compared with the CPU dequantization.
#[test]
fn split_token_embedding_matches_the_cpu() {
    let ctx = gpu();
    let file = GgufFile::open(GEMMA3.path()).unwrap();
    let tensor = file.tensor("token_embd.weight").unwrap();
    let bytes = file.tensor_bytes(tensor).unwrap();
    let table = upload(&ctx, &file, tensor);
    let ranges = table.chunk_row_ranges();
    if bytes.len() as u64 > ctx.max_binding_bytes() {
        assert!(ranges.len() > 1, "a {} byte tensor must be split on this device", bytes.len());
    }
    let last = tensor.rows() as u32 - 1;
    let mut rows = vec![0, 1, last - 1, last];
    for range in &ranges[1..] {
        let boundary = range.start as u32;
        rows.extend([boundary - 2, boundary - 1, boundary, boundary + 1]);
    }
    let gathered = gather(&ctx, &table, &rows);
    for (&row, actual) in rows.iter().zip(&gathered) {
        let row_bytes = tensor.row_bytes();
        let start = row as usize * row_bytes;
        let mut expected = vec![0.0; tensor.row_elements()];
        dequantize_row(tensor.quant(), &bytes[start..start + row_bytes], &mut expected).unwrap();
        assert_bits_equal(&format!("gemma3 token_embd row {row}"), actual, &expected);
    }
}
