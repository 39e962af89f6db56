//! SentencePiece (`tokenizer.ggml.model = "llama"`) as llama.cpp runs it: the text (spaces
//! already written as `▁`) starts as one symbol per character; the adjacent pair whose
//! concatenation is the token with the highest score (`tokenizer.ggml.scores`) merges, leftmost
//! first, until no concatenation is a token. A character that never became part of a token is
//! written as its UTF-8 bytes in byte-fallback tokens `<0xXX>`.
//!
//! This is BPE ranked by the merged token's score, not SentencePiece's unigram Viterbi search:
//! the two disagree on gemma3's vocabulary (see the module documentation of `tokenizer`).

use crate::tokenizer::TokenId;
use crate::tokenizer::merge::{self, Symbol};
use crate::tokenizer::vocabulary::Vocabulary;

/// Scores and byte-fallback tokens of a SentencePiece vocabulary.
pub(crate) struct SentencePiece {
    scores: Vec<f32>,
    /// The token of each byte: `<0xXX>`, else the byte itself as a one-character token, else
    /// the unknown token (llama.cpp stops with an error there; a missing byte token should not
    /// make a prompt fail).
    byte_tokens: [Option<TokenId>; 256],
}

/// A score ordered by [`f32::total_cmp`], so a NaN in the file cannot break the queue.
#[derive(Clone, Copy, Debug)]
struct Score(f32);

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Score {}

impl SentencePiece {
    /// `scores[id]` for every token (0 where the file has none, as in llama.cpp).
    pub(crate) fn new(vocabulary: &Vocabulary, scores: Vec<f32>, unknown: Option<TokenId>) -> Self {
        debug_assert_eq!(scores.len(), vocabulary.len());
        let byte_tokens = std::array::from_fn(|byte| {
            let byte = byte as u8;
            vocabulary
                .id(&format!("<0x{byte:02X}>"))
                .or_else(|| {
                    byte.is_ascii()
                        .then(|| vocabulary.id(char::from(byte).encode_utf8(&mut [0; 4])))
                        .flatten()
                })
                .or(unknown)
        });
        SentencePiece { scores, byte_tokens }
    }

    /// Appends the tokens of `text` to `out`; `text` has its spaces escaped as `▁` already.
    pub(crate) fn encode(&self, text: &str, vocabulary: &Vocabulary, out: &mut Vec<TokenId>) {
        let mut symbols = merge::symbols(text.char_indices().map(|(at, character)| {
            let len = character.len_utf8();
            (at, len, vocabulary.id(&text[at..at + len]))
        }));
        merge::merge(&mut symbols, |left: &Symbol, right: &Symbol| {
            // Any token counts, control tokens included, as in llama.cpp's `try_add_bigram`.
            let merged = vocabulary.id(&text[left.start..right.start + right.len])?;
            Some((Score(self.scores[merged as usize]), merged))
        });
        // Only a single character can be left that is not a token (a pair merges only into a
        // token), so llama.cpp's `resegment`, which would also undo merges, comes down to
        // this byte fallback.
        for symbol in merge::remaining(&symbols) {
            match symbol.id {
                Some(id) => out.push(id),
                None => out.extend(
                    text.as_bytes()[symbol.range()]
                        .iter()
                        .filter_map(|&byte| self.byte_tokens[byte as usize]),
                ),
            }
        }
    }
}
