//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): GPT-2's scheme as llama.cpp runs it.
//!
//! Text is cut into words by the pre-tokenizer; each byte of a word is one initial symbol (the
//! vocabulary spells byte `b` as GPT-2's printable stand-in character, `Ġ` for a space); then
//! the adjacent pair with the lowest merge rank (`tokenizer.ggml.merges`, line order) merges,
//! leftmost first, until no pair has a rank.

use hashbrown::HashMap;

use crate::tokenizer::TokenId;
use crate::tokenizer::merge::{self, Symbol};
use crate::tokenizer::pre_tokenizer::PreTokenizer;
use crate::tokenizer::vocabulary::Vocabulary;

/// What a merge rule makes of a pair of tokens.
#[derive(Clone, Copy, Debug)]
struct Merge {
    /// Line of the rule in `tokenizer.ggml.merges`: lower merges first.
    rank: u32,
    /// The token the pair becomes.
    merged: TokenId,
}

/// A byte-level BPE model: merge rules and the pre-tokenizer.
pub(crate) struct BytePairEncoding {
    pre_tokenizer: PreTokenizer,
    /// (left, right) -> merge. A rule whose parts are not tokens can never apply here (every
    /// merged symbol is a token). A rule whose result is not a token is left out too: llama.cpp
    /// would merge and then write the result as single-byte tokens, but converted vocabularies
    /// hold every merge's result.
    merges: HashMap<(TokenId, TokenId), Merge>,
    /// The token of each byte's stand-in character.
    byte_tokens: [Option<TokenId>; 256],
}

impl BytePairEncoding {
    /// Builds the model from the vocabulary and the merge rules ("left right" per line).
    pub(crate) fn new(vocabulary: &Vocabulary, merge_rules: &[String], pre_tokenizer: PreTokenizer) -> Self {
        let mut merges = HashMap::with_capacity(merge_rules.len());
        let mut merged_text = String::new();
        for (rank, rule) in merge_rules.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte, so a rule may merge a
            // token that starts with a space.
            let Some(split) = rule.as_bytes().iter().skip(1).position(|&byte| byte == b' ').map(|at| at + 1)
            else {
                continue;
            };
            let (left, right) = (&rule[..split], &rule[split + 1..]);
            merged_text.clear();
            merged_text.push_str(left);
            merged_text.push_str(right);
            let (Some(left), Some(right), Some(merged), Ok(rank)) =
                (vocabulary.id(left), vocabulary.id(right), vocabulary.id(&merged_text), u32::try_from(rank))
            else {
                continue;
            };
            // A pair listed twice keeps its first (lowest) rank, as llama.cpp's map does.
            merges.entry((left, right)).or_insert(Merge { rank, merged });
        }
        let byte_tokens =
            std::array::from_fn(|byte| vocabulary.id(byte_char(byte as u8).encode_utf8(&mut [0; 4])));
        BytePairEncoding { pre_tokenizer, merges, byte_tokens }
    }

    /// Whether a BOS token is added when the metadata does not say.
    pub(crate) fn add_bos_by_default(&self) -> bool {
        self.pre_tokenizer.add_bos
    }

    /// Appends the tokens of `text` (no special tokens in it) to `out`.
    pub(crate) fn encode(&self, text: &str, vocabulary: &Vocabulary, out: &mut Vec<TokenId>) {
        let mut word_chars = String::new();
        for word_range in self.pre_tokenizer.split(text) {
            let word = &text.as_bytes()[word_range];
            if self.pre_tokenizer.ignore_merges {
                word_chars.clear();
                word_chars.extend(word.iter().map(|&byte| byte_char(byte)));
                if let Some(id) = vocabulary.id(&word_chars) {
                    out.push(id);
                    continue;
                }
            }
            let mut symbols = merge::symbols(
                word.iter().enumerate().map(|(at, &byte)| (at, 1, self.byte_tokens[byte as usize])),
            );
            merge::merge(&mut symbols, |left: &Symbol, right: &Symbol| {
                let found = self.merges.get(&(left.id?, right.id?))?;
                Some((std::cmp::Reverse(found.rank), found.merged))
            });
            // A byte whose stand-in is not in the vocabulary yields no token, as in llama.cpp
            // (it looks the stand-in's single bytes up and finds nothing).
            out.extend(merge::remaining(&symbols).filter_map(|symbol| symbol.id));
        }
    }
}

/// GPT-2's printable stand-in for `byte`: printable Latin-1 bytes stand for themselves, the
/// other 68 bytes (controls, space, DEL, NBSP, soft hyphen) for U+0100 upwards, in byte order.
pub(crate) fn byte_char(byte: u8) -> char {
    BYTE_CHARS[byte as usize]
}

/// The byte a stand-in character of [`byte_char`] stands for.
pub(crate) fn char_byte(stand_in: char) -> Option<u8> {
    let code = u32::from(stand_in);
    match u8::try_from(code) {
        Ok(byte) => is_printable(byte).then_some(byte),
        Err(_) => code.checked_sub(256).and_then(|shifted| SHIFTED_BYTES.get(shifted as usize)).copied(),
    }
}

/// The bytes that are not printable, in order: the one at index `i` stands as U+0100 + `i`.
const SHIFTED_BYTES: [u8; 68] = {
    let mut table = [0; 68];
    let (mut byte, mut shifted) = (0, 0);
    while byte < 256 {
        if !is_printable(byte as u8) {
            table[shifted] = byte as u8;
            shifted += 1;
        }
        byte += 1;
    }
    table
};

const BYTE_CHARS: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = byte as u8 as char;
        byte += 1;
    }
    let mut shifted = 0;
    while shifted < SHIFTED_BYTES.len() {
        table[SHIFTED_BYTES[shifted] as usize] = match char::from_u32(256 + shifted as u32) {
            Some(stand_in) => stand_in,
            None => panic!("U+0100 to U+0143 are chars"),
        };
        shifted += 1;
    }
    table
};

const fn is_printable(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}
