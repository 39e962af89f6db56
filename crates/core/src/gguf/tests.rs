//! The reader against files built in memory: every value type in v2 and v3, then hostile input.

use std::sync::Arc;

use crate::gguf::{GgufFile, MetadataArray, MetadataValue};
use crate::gguf::{GgufWriter, Layout};
use crate::quant::QuantType;

const F32: u32 = 0;
const F16: u32 = 1;
const Q8_0: u32 = 8;
const Q4_K: u32 = 12;

/// `count` bytes that differ from tensor to tensor (`seed`), so a misplaced slice is caught.
fn pattern(seed: u8, count: usize) -> Vec<u8> {
    (0..count).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// One value of every scalar type, strings and arrays of every element type, nested arrays.
fn every_value_type() -> Vec<(&'static str, MetadataValue)> {
    use MetadataValue as V;
    vec![
        ("general.architecture", V::String("llama".into())),
        ("test.u8", V::U8(200)),
        ("test.i8", V::I8(-100)),
        ("test.u16", V::U16(60_000)),
        ("test.i16", V::I16(-30_000)),
        ("test.u32", V::U32(4_000_000_000)),
        ("test.i32", V::I32(-2_000_000_000)),
        ("test.f32", V::F32(-1.5e-5)),
        ("test.bool_true", V::Bool(true)),
        ("test.bool_false", V::Bool(false)),
        ("test.string", V::String("héllo, wörld ✓".into())),
        ("test.empty_string", V::String(String::new())),
        ("test.u64", V::U64(u64::MAX - 1)),
        ("test.i64", V::I64(i64::MIN + 1)),
        ("test.f64", V::F64(std::f64::consts::PI)),
        ("test.array_u8", V::Array(MetadataArray::U8(vec![0, 1, 255]))),
        ("test.array_i8", V::Array(MetadataArray::I8(vec![-128, 127]))),
        ("test.array_u16", V::Array(MetadataArray::U16(vec![1, 65535]))),
        ("test.array_i16", V::Array(MetadataArray::I16(vec![-1, 2, -3]))),
        ("test.array_u32", V::Array(MetadataArray::U32(vec![7]))),
        ("test.array_i32", V::Array(MetadataArray::I32(vec![-7, 3, 3, 1]))),
        ("test.array_f32", V::Array(MetadataArray::F32(vec![0.25, -1000.0]))),
        ("test.array_bool", V::Array(MetadataArray::Bool(vec![true, false, true]))),
        (
            "test.array_string",
            V::Array(MetadataArray::String(vec!["Ġt".into(), String::new(), "<|im_end|>".into()])),
        ),
        ("test.array_u64", V::Array(MetadataArray::U64(vec![u64::MAX]))),
        ("test.array_i64", V::Array(MetadataArray::I64(vec![i64::MIN, 0]))),
        ("test.array_f64", V::Array(MetadataArray::F64(vec![1e300, -0.5]))),
        ("test.array_empty", V::Array(MetadataArray::U32(vec![]))),
        (
            "test.array_nested",
            V::Array(MetadataArray::Array(vec![
                MetadataArray::U8(vec![1, 2]),
                MetadataArray::String(vec!["a".into()]),
                MetadataArray::Array(vec![MetadataArray::F32(vec![2.0]), MetadataArray::Bool(vec![])]),
            ])),
        ),
    ]
}

/// A small file of GGUF `version` with every value type and tensors of four types.
fn sample(version: u32) -> GgufWriter {
    let mut writer = GgufWriter::new(version);
    for (key, value) in every_value_type() {
        writer = writer.metadata(key, value);
    }
    writer
        .tensor("token_embd.weight", &[64, 3], Q8_0, pattern(1, 3 * 2 * 34))
        .tensor("output_norm.weight", &[5], F32, pattern(2, 5 * 4))
        .tensor("blk.0.ffn_down.weight", &[256, 1, 2], Q4_K, pattern(3, 2 * 144))
        .tensor("rope_freqs.weight", &[3, 1, 1, 1], F16, pattern(4, 3 * 2))
}

fn rejection(bytes: Vec<u8>) -> String {
    match GgufFile::from_bytes(bytes) {
        Ok(file) => panic!("a corrupt file was accepted: {file:?}"),
        Err(err) => err.to_string(),
    }
}

/// Asserts that `bytes` are rejected with a message containing every one of `needles`.
fn assert_rejected(bytes: Vec<u8>, needles: &[&str]) {
    let message = rejection(bytes);
    for needle in needles {
        assert!(message.contains(needle), "message {message:?} does not contain {needle:?}");
    }
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn reads_every_value_type_and_tensor_in_v2_and_v3() {
    for version in [2, 3] {
        let (bytes, layout) = sample(version).build();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(file.version(), version);
        let expected = every_value_type();
        assert_eq!(file.metadata().len(), expected.len());
        for ((key, value), (expected_key, expected_value)) in file.metadata().entries().iter().zip(&expected)
        {
            assert_eq!((key.as_str(), value), (*expected_key, expected_value));
        }
        assert_eq!(file.alignment(), 32);
        assert_eq!(file.data_offset(), layout.data_start);
        assert_eq!(file.data_offset() % 32, 0);
        assert_eq!(file.file_bytes(), bytes.len() as u64);

        let expected_tensors = [
            ("token_embd.weight", vec![64, 3], QuantType::Q8_0, 1, 3 * 2 * 34),
            ("output_norm.weight", vec![5], QuantType::F32, 2, 20),
            ("blk.0.ffn_down.weight", vec![256, 1, 2], QuantType::Q4K, 3, 288),
            ("rope_freqs.weight", vec![3, 1, 1, 1], QuantType::F16, 4, 6),
        ];
        assert_eq!(file.tensors().len(), expected_tensors.len());
        for (tensor, (name, shape, quant, seed, bytes)) in file.tensors().iter().zip(expected_tensors) {
            assert_eq!(
                (tensor.name(), tensor.shape(), tensor.quant(), tensor.bytes()),
                (name, &shape[..], quant, bytes)
            );
            assert_eq!(tensor.offset() % 32, 0);
            assert_eq!(tensor.file_offset(), file.data_offset() as u64 + tensor.offset());
            assert_eq!(file.tensor_bytes(tensor).unwrap(), pattern(seed, bytes), "{name}");
            assert_eq!(file.tensor(name), Some(tensor));
        }
        assert_eq!(file.tensor("missing.weight"), None);
    }
}

#[test]
fn tensor_geometry_follows_the_gguf_shape() {
    let (bytes, _) = sample(3).build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let embedding = file.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embedding.elements(), embedding.row_elements(), embedding.rows(), embedding.row_bytes()),
        (192, 64, 3, 68)
    );
    let ffn = file.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!((ffn.elements(), ffn.rows(), ffn.row_bytes()), (512, 2, 144));
    let norm = file.tensor("output_norm.weight").unwrap();
    assert_eq!((norm.rows(), norm.row_bytes()), (1, 20));
}

#[test]
fn honours_general_alignment() {
    let (bytes, layout) = GgufWriter::new(3)
        .metadata("general.alignment", MetadataValue::U32(256))
        .tensor("a", &[3], F32, pattern(5, 12))
        .tensor("b", &[32, 2], Q8_0, pattern(6, 68))
        .build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!((file.alignment(), file.data_offset()), (256, layout.data_start));
    assert_eq!(file.data_offset() % 256, 0);
    assert_eq!(file.tensor("b").unwrap().offset(), 256);
    assert_eq!(file.tensor_bytes(file.tensor("b").unwrap()).unwrap(), pattern(6, 68));
}

#[test]
fn accepts_any_byte_container() {
    let (bytes, _) = sample(3).build();
    let shared: Arc<[u8]> = bytes.clone().into();
    let boxed: Box<[u8]> = bytes.clone().into_boxed_slice();
    let leaked: &'static [u8] = Vec::leak(bytes.clone());
    for file in [GgufFile::from_bytes(shared), GgufFile::from_bytes(boxed), GgufFile::from_bytes(leaked)] {
        assert_eq!(file.unwrap().tensors().len(), 4);
    }
}

#[test]
fn a_file_can_move_to_and_be_shared_by_other_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
}

#[test]
fn a_file_without_tensors_is_valid() {
    let (bytes, _) = GgufWriter::new(2).metadata("general.name", MetadataValue::String("x".into())).build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!((file.tensors().len(), file.metadata().get_str("general.name").unwrap()), (0, "x"));
}

#[test]
fn typed_lookups_convert_or_name_the_key() {
    let (bytes, _) = sample(3).build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let metadata = file.metadata();
    assert_eq!(metadata.get_u32("test.u8").unwrap(), 200);
    assert_eq!(metadata.get_u32("test.u16").unwrap(), 60_000);
    assert_eq!(metadata.require::<i64>("test.i8").unwrap(), -100);
    assert_eq!(metadata.require::<u64>("test.u64").unwrap(), u64::MAX - 1);
    assert_eq!(metadata.require::<usize>("test.u16").unwrap(), 60_000);
    assert_eq!(metadata.get_f32("test.f32").unwrap(), -1.5e-5);
    assert_eq!(metadata.get_f32("test.f64").unwrap(), std::f32::consts::PI);
    assert!(metadata.require::<bool>("test.bool_true").unwrap());
    assert_eq!(metadata.get_str("test.string").unwrap(), "héllo, wörld ✓");
    assert_eq!(metadata.require::<&[String]>("test.array_string").unwrap()[2], "<|im_end|>");
    assert_eq!(metadata.require::<&[i32]>("test.array_i32").unwrap(), &[-7, 3, 3, 1]);
    assert_eq!(metadata.require::<&[f32]>("test.array_f32").unwrap(), &[0.25, -1000.0]);
    assert_eq!(metadata.require::<&[u32]>("test.array_u32").unwrap(), &[7]);
    assert_eq!(metadata.get_array("test.array_nested").unwrap().len(), 3);
    assert_eq!(metadata.optional::<u32>("test.absent").unwrap(), None);
    assert_eq!(metadata.optional::<u32>("test.u32").unwrap(), Some(4_000_000_000));

    let message = |result: crate::Result<()>| result.unwrap_err().to_string();
    let missing = message(metadata.get_u32("llama.block_count").map(drop));
    assert_eq!(missing, "GGUF file metadata key 'llama.block_count': missing (a u32 was expected)");
    let negative = message(metadata.get_u32("test.i32").map(drop));
    assert_eq!(negative, "GGUF file metadata key 'test.i32': value -2000000000 (i32) does not fit in u32");
    let too_big = message(metadata.require::<i32>("test.u32").map(drop));
    assert!(too_big.contains("value 4000000000 (u32) does not fit in i32"), "{too_big}");
    let wrong = message(metadata.get_str("test.u32").map(drop));
    assert_eq!(wrong, "GGUF file metadata key 'test.u32': expected string, found u32");
    let wrong_array = message(metadata.require::<&[f32]>("test.array_string").map(drop));
    assert!(wrong_array.ends_with("expected array of f32, found array of 3 string"), "{wrong_array}");
    let optional_wrong = message(metadata.optional::<f32>("test.string").map(drop));
    assert!(optional_wrong.contains("'test.string': expected f32, found string"), "{optional_wrong}");
}

#[test]
fn every_truncation_is_an_error() {
    let (bytes, _) = sample(3).build();
    for length in 0..bytes.len() {
        let message = rejection(bytes[..length].to_vec());
        assert!(
            ["truncated", "left in the file", "past the end of the file"].iter().any(|n| message.contains(n)),
            "truncated to {length} bytes: {message}"
        );
    }
}

#[test]
fn flipped_bytes_never_panic() {
    let (bytes, _) = sample(2).build();
    let mut accepted = 0;
    for position in 0..bytes.len() {
        for mask in [0x01, 0x80, 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[position] ^= mask;
            accepted += usize::from(GgufFile::from_bytes(corrupt).is_ok());
        }
    }
    // Flips inside values and tensor data leave a valid file; flips in structure do not.
    assert!(accepted < 3 * bytes.len());
}

/// Sets each u64 field at `positions` to each of `values` and expects a rejection naming `needle`.
fn corrupt_u64_fields(layout_field: impl Fn(&Layout) -> &Vec<usize>, values: &[u64], needle: &str) {
    let (bytes, layout) = sample(3).build();
    let positions = layout_field(&layout);
    assert!(!positions.is_empty());
    for &at in positions {
        for &value in values {
            let mut corrupt = bytes.clone();
            put_u64(&mut corrupt, at, value);
            let message = rejection(corrupt);
            assert!(message.contains(needle), "u64 at {at} set to {value}: {message}");
        }
    }
}

const HUGE: [u64; 4] = [u64::MAX, 1 << 63, 1 << 60, 1 << 40];

#[test]
fn huge_string_lengths_are_rejected_before_allocating() {
    corrupt_u64_fields(|layout| &layout.string_lengths, &HUGE, "does not fit");
    let (mut bytes, layout) = sample(3).build();
    put_u64(&mut bytes, layout.string_lengths[0], 4 << 30);
    assert_rejected(bytes, &["metadata entry 0", "string of 4294967296 bytes", "truncated"]);
}

#[test]
fn huge_array_counts_are_rejected_before_allocating() {
    corrupt_u64_fields(|layout| &layout.array_counts, &HUGE, "left in the file");
    let (mut bytes, layout) = sample(3).build();
    put_u64(&mut bytes, layout.array_counts[0], 1 << 60);
    assert_rejected(bytes, &["metadata key 'test.array_u8'", "array of 1152921504606846976 elements"]);
}

#[test]
fn huge_counts_in_the_header_are_rejected() {
    let (bytes, layout) = sample(3).build();
    for (at, what) in [(layout.tensor_count, "tensor infos"), (layout.metadata_count, "metadata entries")] {
        for value in HUGE {
            let mut corrupt = bytes.clone();
            put_u64(&mut corrupt, at, value);
            let message = rejection(corrupt);
            assert!(message.starts_with("GGUF file header: ") && message.contains(what), "{message}");
        }
    }
    let mut corrupt = bytes.clone();
    put_u64(&mut corrupt, layout.tensor_count, 1 << 40);
    assert_rejected(corrupt, &["1099511627776 tensor infos cannot fit"]);
}

#[test]
fn huge_dimensions_and_offsets_are_rejected() {
    corrupt_u64_fields(|layout| &layout.dims, &HUGE, "tensor '");
    corrupt_u64_fields(
        |layout| &layout.offsets,
        &[u64::MAX - 31, 1 << 62, 1 << 40],
        "past the end of the file",
    );
}

#[test]
fn unknown_value_types_are_rejected() {
    let (bytes, layout) = sample(3).build();
    for &at in &layout.value_types {
        let mut corrupt = bytes.clone();
        put_u32(&mut corrupt, at, 13);
        assert_rejected(corrupt, &["metadata key '", "unknown value type 13"]);
    }
}

#[test]
fn bad_magic_and_versions_are_rejected() {
    let (bytes, _) = sample(3).build();
    let mut elf = bytes.clone();
    elf[..4].copy_from_slice(b"\x7fELF");
    assert_rejected(elf, &["GGUF file header: not a GGUF file", "7f, 45, 4c, 46"]);
    for (version, needle) in [
        (1, "version 1 is not supported"),
        (3u32.swap_bytes(), "big-endian"),
        (4, "unsupported GGUF version 4"),
        (0, "unsupported GGUF version 0"),
    ] {
        let mut corrupt = bytes.clone();
        put_u32(&mut corrupt, 4, version);
        assert_rejected(corrupt, &["header", needle]);
    }
    assert_rejected(Vec::new(), &["header", "truncated"]);
}

#[test]
fn bad_dimension_counts_are_rejected() {
    let (bytes, layout) = sample(3).build();
    for n_dims in [0, 5, u32::MAX] {
        let mut corrupt = bytes.clone();
        put_u32(&mut corrupt, layout.n_dims[0], n_dims);
        assert_rejected(corrupt, &["tensor 'token_embd.weight'", &format!("has {n_dims} dimensions")]);
    }
    let (five, _) = GgufWriter::new(3).tensor("t", &[1, 1, 1, 1, 1], F32, vec![0; 4]).build();
    assert_rejected(five, &["tensor 't': has 5 dimensions; GGUF tensors have 1 to 4"]);
}

#[test]
fn zero_dimensions_are_rejected() {
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[4, 0], F32, Vec::new()).build();
    assert_rejected(bytes, &["tensor 't': dimension 1 of shape [4, 0] is zero"]);
}

#[test]
fn element_counts_that_overflow_are_rejected() {
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[1 << 32, 1 << 32, 1 << 32], F32, Vec::new()).build();
    assert_rejected(bytes, &["tensor 't'", "more elements than this target can address"]);
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[1 << 61, 4], F32, Vec::new()).build();
    assert_rejected(bytes, &["tensor 't'", "needs more bytes than this target can address"]);
}

#[test]
fn unknown_and_unsupported_ggml_types_are_rejected() {
    let (bytes, _) = GgufWriter::new(3).tensor("blk.0.attn_q.weight", &[256], 10, vec![0; 84]).build();
    assert_rejected(
        bytes,
        &["tensor 'blk.0.attn_q.weight'", "type Q2_K (GGML type id 10) is not supported", "Q4_K", "Q6_K"],
    );
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[32], 1234, vec![0; 64]).build();
    assert_rejected(bytes, &["tensor 't': unknown GGML type id 1234"]);
}

#[test]
fn rows_must_be_whole_blocks() {
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[33, 2], Q8_0, vec![0; 68]).build();
    assert_rejected(
        bytes,
        &["tensor 't'", "rows of 33 weights are not a whole number of Q8_0 blocks (32 weights each)"],
    );
    let (bytes, _) = GgufWriter::new(3).tensor("t", &[128], Q4_K, vec![0; 144]).build();
    assert_rejected(bytes, &["not a whole number of Q4_K blocks (256 weights each)"]);
}

#[test]
fn tensor_data_past_the_end_is_rejected() {
    let (mut bytes, _) = sample(3).build();
    bytes.pop();
    assert_rejected(bytes, &["tensor 'rope_freqs.weight'", "past the end of the file"]);
    let (mut bytes, layout) = sample(3).build();
    let file_bytes = bytes.len() as u64;
    put_u64(&mut bytes, layout.offsets[1], file_bytes.next_multiple_of(32));
    assert_rejected(bytes, &["tensor 'output_norm.weight'", "past the end of the file"]);
}

#[test]
fn misaligned_offsets_are_rejected() {
    let (mut bytes, layout) = sample(3).build();
    put_u64(&mut bytes, layout.offsets[2], 224 + 4);
    assert_rejected(
        bytes,
        &["tensor 'blk.0.ffn_down.weight'", "offset 228 is not a multiple of the file's alignment 32"],
    );
}

#[test]
fn overlapping_tensors_are_rejected() {
    let writer = GgufWriter::new(3).tensor("a", &[16], F32, vec![0; 64]).tensor("b", &[16], F32, vec![0; 64]);
    let (bytes, layout) = writer.build();
    for offset in [0, 32] {
        let mut corrupt = bytes.clone();
        put_u64(&mut corrupt, layout.offsets[1], offset);
        assert_rejected(corrupt, &["overlaps tensor '"]);
    }
    // Back to back is fine.
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

#[test]
fn duplicate_tensor_names_are_rejected() {
    let (bytes, _) =
        GgufWriter::new(3).tensor("a", &[8], F32, vec![0; 32]).tensor("a", &[8], F32, vec![0; 32]).build();
    assert_rejected(bytes, &["tensor 'a': appears twice (tensor infos 0 and 1)"]);
}

#[test]
fn duplicate_metadata_keys_are_rejected() {
    let (bytes, _) = GgufWriter::new(3)
        .metadata("general.name", MetadataValue::String("a".into()))
        .metadata("general.size_label", MetadataValue::String("b".into()))
        .metadata("general.name", MetadataValue::U32(1))
        .build();
    assert_rejected(bytes, &["metadata key 'general.name': appears twice (entries 0 and 2)"]);
}

#[test]
fn bad_alignments_are_rejected() {
    for (value, needle) in [
        (MetadataValue::U32(0), "0 is not a power of two"),
        (MetadataValue::U32(48), "48 is not a power of two"),
        (MetadataValue::String("32".into()), "expected u32, found string"),
        (MetadataValue::I32(-32), "value -32 (i32) does not fit in u32"),
    ] {
        let (bytes, _) = GgufWriter::new(3).metadata("general.alignment", value).build();
        assert_rejected(bytes, &["metadata key 'general.alignment'", needle]);
    }
}

#[test]
fn invalid_text_and_bools_are_rejected() {
    let (mut bytes, layout) =
        GgufWriter::new(3).metadata("general.name", MetadataValue::String("abc".into())).build();
    bytes[layout.string_lengths[0] + 8] = 0xff;
    assert_rejected(bytes, &["metadata entry 0", "not valid UTF-8"]);

    let (mut bytes, layout) =
        GgufWriter::new(3).metadata("general.name", MetadataValue::String("abc".into())).build();
    bytes[layout.string_lengths[1] + 9] = 0xc3;
    assert_rejected(bytes, &["metadata key 'general.name'", "not valid UTF-8"]);

    let (mut bytes, _) = GgufWriter::new(3).metadata("flag", MetadataValue::Bool(true)).build();
    *bytes.last_mut().unwrap() = 2;
    assert_rejected(bytes, &["metadata key 'flag'", "a bool must be 0 or 1, found 2"]);

    let (mut bytes, _) = GgufWriter::new(3)
        .metadata("flags", MetadataValue::Array(MetadataArray::Bool(vec![false, true])))
        .build();
    *bytes.last_mut().unwrap() = 0x80;
    assert_rejected(bytes, &["metadata key 'flags'", "found 128"]);
}

fn nested(depth: usize) -> MetadataValue {
    let mut array = MetadataArray::U8(vec![42]);
    for _ in 1..depth {
        array = MetadataArray::Array(vec![array]);
    }
    MetadataValue::Array(array)
}

#[test]
fn array_nesting_is_bounded() {
    let (bytes, _) = GgufWriter::new(3).metadata("deep", nested(8)).build();
    let file = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(file.metadata().get("deep"), Some(&nested(8)));
    for depth in [9, 1000] {
        let (bytes, _) = GgufWriter::new(3).metadata("deep", nested(depth)).build();
        assert_rejected(bytes, &["metadata key 'deep'", "arrays nested more than 8 deep"]);
    }
}

#[test]
fn a_header_read_from_the_first_bytes_gives_tensor_bytes_once_handed_in() {
    let (bytes, _) = sample(3).build();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let size = bytes.len() as u64;
    // Any prefix too short for the header asks for more; one that holds it parses as the file.
    for len in 0..file.data_offset() {
        if let Some(header) = GgufFile::from_header(&bytes[..len], size).unwrap() {
            assert_eq!(header.tensors(), file.tensors(), "a prefix of {len} bytes");
        }
    }
    assert!(GgufFile::from_header(&bytes[..40], size).unwrap().is_none());
    let mut header = GgufFile::from_header(&bytes[..file.data_offset()], size).unwrap().unwrap();
    assert_eq!(header.metadata().entries(), file.metadata().entries());
    assert_eq!((header.tensors(), header.file_bytes()), (file.tensors(), size));

    let norm = file.tensor("output_norm.weight").unwrap();
    let error = header.tensor_bytes(norm).unwrap_err().to_string();
    assert!(error.contains("output_norm.weight") && error.contains("not been read"), "{error}");
    let error = header.insert_tensor_bytes("output_norm.weight", vec![0; 3]).unwrap_err().to_string();
    assert!(error.contains("3 bytes") && error.contains("20"), "{error}");
    let error = header.insert_tensor_bytes("nope", vec![]).unwrap_err().to_string();
    assert!(error.contains("'nope'") && error.contains("not in the file"), "{error}");
    header.insert_tensor_bytes("output_norm.weight", file.tensor_bytes(norm).unwrap().to_vec()).unwrap();
    assert_eq!(header.tensor_bytes(norm).unwrap(), file.tensor_bytes(norm).unwrap());

    // A corrupt header is an error at once, not a request for more bytes; so is a tensor that
    // lies past the file's announced end.
    let mut corrupt = bytes.clone();
    corrupt[0] = b'X';
    assert!(GgufFile::from_header(&corrupt[..40], size).is_err());
    let error = GgufFile::from_header(&bytes[..file.data_offset()], size - 1).unwrap_err().to_string();
    assert!(error.contains("past the end of the file"), "{error}");
}

/// A browser reads files larger than its 32-bit address space from their header: offsets past
/// 4 GiB are kept whole.
#[test]
fn a_header_locates_tensors_past_4_gib() {
    let huge_rows: u64 = 1 << 27;
    let writer = GgufWriter::new(3)
        .metadata("general.architecture", MetadataValue::String("llama".into()))
        .tensor_later("huge", &[32, huge_rows], Q8_0, (huge_rows * 34) as usize)
        .tensor("small", &[4], F32, pattern(7, 16));
    let mut prefix = Vec::new();
    // Only the header is written: the first tensor's bytes are refused.
    let _ = writer.write(&mut prefix, |_, _| Err(std::io::ErrorKind::Interrupted.into()));
    let data_start = prefix.len() as u64;
    let small_offset = (huge_rows * 34).next_multiple_of(32);
    let size = data_start + small_offset + 16;
    let mut file = GgufFile::from_header(&prefix, size).unwrap().unwrap();
    let small = file.tensor("small").unwrap().clone();
    assert_eq!((small.offset(), small.file_offset()), (small_offset, data_start + small_offset));
    assert!(small.file_offset() > u64::from(u32::MAX));
    file.insert_tensor_bytes("small", pattern(7, 16)).unwrap();
    assert_eq!(file.tensor_bytes(&small).unwrap(), pattern(7, 16));
    assert_eq!(file.summary().unwrap().tensor_bytes, huge_rows * 34 + 16);
}
