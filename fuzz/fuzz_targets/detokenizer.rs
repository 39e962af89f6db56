//! The incremental detokenizer on arbitrary token ids (some outside the vocabulary): every push
//! returns whole characters, an unknown id is an error that changes nothing, and the pieces
//! joined equal the whole decode of the accepted ids, byte for byte.
#![no_main]

use flint_core::tokenizer::Detokenizer;
use flint_fuzz::vocabularies;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else { return };
    let vocabulary = &vocabularies()[selector as usize % vocabularies().len()];
    let tokenizer = &vocabulary.tokenizer;
    let skip_special = selector & 0x10 != 0;
    // Ids a little past the end of the vocabulary too.
    let span = tokenizer.vocab_size() as u32 + 16;
    let ids: Vec<u32> = bytes
        .chunks_exact(4)
        .map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) % span)
        .collect();
    let mut detokenizer = Detokenizer::new(skip_special);
    let mut streamed = String::new();
    let mut accepted = Vec::new();
    for &id in &ids {
        match detokenizer.push(tokenizer, id) {
            Ok(piece) => {
                streamed.push_str(&piece);
                accepted.push(id);
            }
            Err(error) => assert!(id as usize >= tokenizer.vocab_size(), "id {id}: {error}"),
        }
    }
    streamed.push_str(&detokenizer.finish());
    let whole = tokenizer.decode(&accepted, skip_special).expect("accepted ids are inside the vocabulary");
    assert_eq!(streamed, whole, "{accepted:?}");
});
