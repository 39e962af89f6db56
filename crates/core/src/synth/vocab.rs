//! A synthetic byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`) of an exact size: the
//! 256 byte tokens, merges of earlier tokens until the size is reached, then the special tokens.
//! Any text tokenizes with it (bytes always do), so speed depends on the size alone, as with
//! the real one.

use std::collections::HashSet;

use super::blocks::SplitMix;

/// A vocabulary: tokens in id order, each token's GGUF type, and the merge rules.
pub(crate) struct Vocab {
    pub tokens: Vec<String>,
    /// 1 for normal tokens, 3 for control tokens (GGUF `tokenizer.ggml.token_type`).
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
}

/// The longest merged token, in characters.
const LONGEST: usize = 12;

/// `size` tokens, the last two `bos` and `eos` control tokens; merges drawn from `seed`.
pub(crate) fn synthetic_vocab(size: usize, bos: &str, eos: &str, seed: u64) -> Vocab {
    assert!(size >= 258, "a byte-level vocabulary needs its 256 bytes and two special tokens");
    let bytes = byte_chars();
    let mut tokens: Vec<String> = bytes.iter().map(char::to_string).collect();
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::with_capacity(size - 258);
    let mut rng = SplitMix::new(seed);
    // Most merges join letters and a leading space ('Ġ'), as real vocabularies' do; a few join
    // any two earlier tokens.
    let common: Vec<char> = "Ġabcdefghijklmnopqrstuvwxyzetaoinsh".chars().collect();
    while tokens.len() < size - 2 {
        let left = &tokens[rng.below(tokens.len() as u64) as usize];
        let right = if rng.below(8) == 0 {
            tokens[rng.below(tokens.len() as u64) as usize].clone()
        } else {
            common[rng.below(common.len() as u64) as usize].to_string()
        };
        let merged = format!("{left}{right}");
        if merged.chars().count() > LONGEST || known.contains(&merged) {
            continue;
        }
        merges.push(format!("{left} {right}"));
        known.insert(merged.clone());
        tokens.push(merged);
    }
    let mut token_types = vec![1; tokens.len()];
    tokens.push(bos.to_string());
    tokens.push(eos.to_string());
    token_types.extend([3, 3]);
    Vocab { tokens, token_types, merges, bos: size as u32 - 2, eos: size as u32 - 1 }
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for
/// characters from U+0100 on.
fn byte_chars() -> Vec<char> {
    let printable =
        |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or('?')
            }
        })
        .collect()
}
