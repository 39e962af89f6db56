//! The GGUF reader on arbitrary bytes (whole, and its header from a prefix), then everything built from a file's metadata before the
//! GPU is involved: summary, model configuration, tokenizer, chat template. Each gives a value
//! or an error, never a panic, and allocates no more than the file's size justifies (libFuzzer's
//! `-rss_limit_mb` and `-malloc_limit_mb` catch a claimed length that is believed).
#![no_main]

use flint_core::chat::ChatTemplate;
use flint_core::gguf::GgufFile;
use flint_core::model::ModelConfig;
use flint_core::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A streaming load's first read: the header from a prefix of the file.
    let _ = GgufFile::from_header(&data[..data.len() / 2], data.len() as u64);
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else { return };
    let header =
        GgufFile::from_header(data, data.len() as u64).expect("the whole file parses as a header too");
    assert_eq!(header.expect("the whole file is never too short").tensors(), file.tensors());
    for tensor in file.tensors() {
        assert_eq!(
            file.tensor_bytes(tensor).map(<[u8]>::len).ok(),
            Some(tensor.bytes()),
            "{}",
            tensor.name()
        );
    }
    let _ = file.summary();
    let _ = ModelConfig::from_gguf(&file);
    let Ok(tokenizer) = Tokenizer::from_gguf(&file) else { return };
    let ids = tokenizer.encode("Hello, world! <|im_start|>user 12345 <start_of_turn>", true, true);
    assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()), "{ids:?}");
    tokenizer.decode(&ids, false).expect("ids from encode are inside the vocabulary");
    // Compiled only: rendering a hostile template is bounded by fuel, not by the input's size.
    let _ = ChatTemplate::from_gguf(&file, &tokenizer);
});
