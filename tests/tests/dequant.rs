//! CPU dequantization of real tensors against `dequant.json`: rows 0, 1 and the last of a few
//! tensors of each type in the two models (Q8_0, Q4_1, Q5_0, Q4_K, Q6_K), dequantized by the
//! `gguf` Python package, which mirrors ggml.

use std::collections::BTreeMap;

use flint_core::gguf::GgufFile;
use flint_core::quant::dequantize_row;
use flint_e2e::{ReferenceModel, reference_dir};

#[derive(serde::Deserialize)]
struct ReferenceTensor {
    model: String,
    tensor: String,
    #[serde(rename = "type")]
    quant: String,
    shape: Vec<usize>,
    /// Read as f32: the values are f32s printed exactly, and serde_json's default f64 parsing
    /// may miss by an f64 ulp, which rounding to f32 removes.
    rows: BTreeMap<String, Vec<f32>>,
}

/// What held when this test was written: every weight equals the reference bit for bit.
/// Each format's arithmetic (an f16 scale
/// times a small integer, minus an f16 minimum times another) rounds the same way in numpy's
/// f32 as in ours.
#[test]
fn dequantized_rows_match_the_gguf_python_package() {
    let path = reference_dir().join("dequant.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let references: Vec<ReferenceTensor> = serde_json::from_str(&text).unwrap();
    assert_eq!(references.len(), 6, "dequant.json changed: update this test's expectations");

    let mut files: BTreeMap<String, GgufFile> = BTreeMap::new();
    let mut types_seen = Vec::new();
    for reference in &references {
        let file = files.entry(reference.model.clone()).or_insert_with(|| {
            let model = ReferenceModel::by_reference_name(&reference.model)
                .unwrap_or_else(|| panic!("dequant.json names an unknown model '{}'", reference.model));
            GgufFile::open(model.path()).unwrap()
        });
        let what = format!("{} {}", reference.model, reference.tensor);
        let tensor = file.tensor(&reference.tensor).unwrap_or_else(|| panic!("{what}: no such tensor"));
        assert_eq!(tensor.quant().name(), reference.quant, "{what}: type");
        assert_eq!(tensor.shape(), reference.shape, "{what}: shape");
        types_seen.push(tensor.quant().name());

        let data = file.tensor_bytes(tensor).unwrap();
        let row_bytes = tensor.row_bytes();
        let last_row = (tensor.rows() - 1).to_string();
        let row_names: Vec<&str> = reference.rows.keys().map(String::as_str).collect();
        assert_eq!(row_names, ["0", "1", last_row.as_str()], "{what}: rows 0, 1 and the last");
        for (row, expected) in &reference.rows {
            let row: usize = row.parse().unwrap();
            assert!(row < tensor.rows(), "{what}: row {row} of {}", tensor.rows());
            assert_eq!(expected.len(), tensor.row_elements(), "{what} row {row}: length");
            let mut actual = vec![f32::NAN; tensor.row_elements()];
            dequantize_row(tensor.quant(), &data[row * row_bytes..(row + 1) * row_bytes], &mut actual)
                .unwrap();
            for (column, (&actual, &expected)) in actual.iter().zip(expected).enumerate() {
                assert_eq!(
                    actual.to_bits(),
                    expected.to_bits(),
                    "{what} row {row}[{column}]: actual {actual:e}, expected {expected:e}"
                );
            }
        }
    }
    types_seen.sort();
    types_seen.dedup();
    assert_eq!(types_seen, ["Q4_1", "Q4_K", "Q5_0", "Q6_K", "Q8_0"]);
}
