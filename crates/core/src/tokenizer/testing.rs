//! Tokenizers for the unit tests of what runs on token ids (grammars, tool calls): a byte-level
//! vocabulary in which any text can be spelled one byte token at a time.

use super::{Tokenizer, TokenizerSpec};

/// Control tokens from id 0 (`<unk>` among them, as an unknown-token type), then the 256 byte
/// tokens `<0xNN>`, then `words` as normal tokens. `bos` and `eos` are ids of the control tokens.
pub(crate) fn byte_level(controls: &[&str], words: &[&str], bos: Option<u32>, eos: u32) -> Tokenizer {
    let mut tokens: Vec<String> = controls.iter().map(|text| text.to_string()).collect();
    let mut types: Vec<i32> = controls.iter().map(|&text| if text == "<unk>" { 2 } else { 3 }).collect();
    tokens.extend((0..=255u8).map(|byte| format!("<0x{byte:02X}>")));
    types.extend([6; 256]);
    tokens.extend(words.iter().map(|word| word.to_string()));
    types.extend(words.iter().map(|_| 1));
    let unknown = controls.iter().position(|&text| text == "<unk>").map(|at| at as u32);
    Tokenizer::from_spec(TokenizerSpec {
        model: "llama",
        pre: None,
        tokens: &tokens,
        token_types: Some(&types),
        scores: None,
        merges: None,
        bos,
        eos: Some(eos),
        eot: None,
        eom: None,
        unknown,
        add_bos: Some(bos.is_some()),
        add_eos: Some(false),
        add_space_prefix: Some(false),
    })
    .expect("a valid test vocabulary")
}
