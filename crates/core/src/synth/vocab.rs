//! A synthetic byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`) of an exact size: the
//! 256 byte tokens, merges of earlier tokens until the size is reached, then the special tokens.
//! Any text tokenizes with it (bytes always do), so speed depends on the size alone, as with
//! the real one.

use std::collections::HashSet;

use super::blocks::SplitMix;

/// A vocabulary: tokens in id order, each token's GGUF type, the merge rules (byte-level BPE)
/// or the scores (SentencePiece).
pub(crate) struct Vocab {
    pub tokens: Vec<String>,
    /// GGUF `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 6 byte.
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub scores: Vec<f32>,
    pub bos: u32,
    pub eos: u32,
}

/// The longest merged token, in characters.
const LONGEST: usize = 12;

/// Grows `tokens` to `size` with concatenations of two earlier tokens (most often an earlier
/// token and a letter or word start `space`), calling `merged(left, right)` for each.
fn grow(
    tokens: &mut Vec<String>,
    size: usize,
    space: char,
    rng: &mut SplitMix,
    mut merged: impl FnMut(&str, &str),
) {
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let common: Vec<String> = std::iter::once(space)
        .chain("abcdefghijklmnopqrstuvwxyzetaoinsh".chars())
        .map(String::from)
        .collect();
    while tokens.len() < size {
        let left = &tokens[rng.below(tokens.len() as u64) as usize];
        let right = if rng.below(8) == 0 {
            &tokens[rng.below(tokens.len() as u64) as usize]
        } else {
            &common[rng.below(common.len() as u64) as usize]
        };
        let joined = format!("{left}{right}");
        if joined.chars().count() > LONGEST || known.contains(&joined) {
            continue;
        }
        merged(left, right);
        known.insert(joined.clone());
        tokens.push(joined);
    }
}

/// A byte-level BPE vocabulary (`gpt2`) of `size` tokens: the 256 byte tokens, merges, then
/// `bos` and `eos` as control tokens.
pub(crate) fn bpe_vocab(size: usize, bos: &str, eos: &str, seed: u64) -> Vocab {
    assert!(size >= 258, "a byte-level vocabulary needs its 256 bytes and two special tokens");
    let mut tokens: Vec<String> = byte_chars().iter().map(char::to_string).collect();
    let mut merges = Vec::with_capacity(size - 258);
    grow(&mut tokens, size - 2, 'Ġ', &mut SplitMix::new(seed), |left, right| {
        merges.push(format!("{left} {right}"));
    });
    let mut token_types = vec![1; tokens.len()];
    tokens.extend([bos.to_string(), eos.to_string()]);
    token_types.extend([3, 3]);
    Vocab { tokens, token_types, merges, scores: Vec::new(), bos: size as u32 - 2, eos: size as u32 - 1 }
}

/// A SentencePiece vocabulary (`llama`) of `size` tokens laid out as Gemma's: `<pad>`,
/// `<eos>`, `<bos>`, `<unk>`, the 256 byte-fallback tokens, the word start and printable ASCII
/// characters, then merged pieces, each scored below the ones before it.
pub(crate) fn spm_vocab(size: usize, seed: u64) -> Vocab {
    let specials = ["<pad>", "<eos>", "<bos>", "<unk>"];
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    let mut token_types = vec![3, 3, 3, 2];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    token_types.extend([6; 256]);
    let first_piece = tokens.len();
    tokens.push("▁".into());
    tokens.extend((0x21u8..0x7F).map(|b| char::from(b).to_string()));
    let mut pieces = tokens.split_off(first_piece);
    grow(&mut pieces, size - first_piece, '▁', &mut SplitMix::new(seed), |_, _| {});
    token_types.extend(std::iter::repeat_n(1, pieces.len()));
    tokens.extend(pieces);
    let scores =
        (0..tokens.len()).map(|i| if i < first_piece { 0.0 } else { -((i - first_piece) as f32) }).collect();
    Vocab { tokens, token_types, merges: Vec::new(), scores, bos: 2, eos: 1 }
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
