//! Both real tokenizers on arbitrary text: encoding gives ids inside the vocabulary, and
//! decoding them gives back the text, character by character as each character alone would
//! (special tokens are parsed only when asked, so plain text round-trips; the BOS that
//! `add_special` puts first decodes to nothing when skipped). Character by character, not
//! exactly: a byte the vocabulary has no token for is dropped, as llama.cpp drops it (SmolLM2
//! has none for 0x04, 0xF2 and a few more), and SentencePiece (gemma3) writes spaces as `▁`, so
//! a `▁` in the text comes back as a space.
#![no_main]

use flint_fuzz::vocabularies;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else { return };
    let vocabulary = &vocabularies()[selector as usize % vocabularies().len()];
    let tokenizer = &vocabulary.tokenizer;
    let add_special = selector & 0x10 != 0;
    let parse_special = selector & 0x20 != 0;
    let text = String::from_utf8_lossy(bytes);
    let ids = tokenizer.encode(&text, add_special, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()), "{ids:?}");
    let decoded = tokenizer.decode(&ids, true).expect("ids from encode are inside the vocabulary");
    if !parse_special {
        let alone = |c: char| tokenizer.decode(&tokenizer.encode(&c.to_string(), false, false), true);
        let expected = text.chars().map(alone).collect::<Result<String, _>>().expect("ids from encode");
        assert_eq!(decoded, expected, "{}: {ids:?}", vocabulary.model.file_name);
    }
});
