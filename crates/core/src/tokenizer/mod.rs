//! Tokenizers built from a GGUF file's vocabulary, giving the token ids llama.cpp gives.
//!
//! `tokenizer.ggml.model` names one of two kinds:
//! - `"gpt2"`: byte-level BPE (`bpe.rs`): words cut by the pre-tokenizer regexes that
//!   `tokenizer.ggml.pre` names (`pre_tokenizer.rs`), merged by `tokenizer.ggml.merges` rank.
//! - `"llama"`: SentencePiece (`spm.rs`): spaces as `▁`, pairs merged by the score of the token
//!   they form, byte-fallback tokens `<0xXX>` for what no token covers (gemma3's 262144-token
//!   vocabulary is of this kind).
//!
//! Both start by finding the special tokens written in the text (`special.rs`) and share one
//! merge loop (`merge.rs`). Every step mirrors llama.cpp's `llama-vocab.cpp`, the reference
//! this engine is tested against, down to its tie-breaks.
//!
//! Why not the `tokenizers` crate: built programmatically from the same GGUF vocabularies, it
//! matches llama.cpp on SmolLM2 (byte-level BPE), but its SentencePiece model (unigram
//! Viterbi) gives other ids for 9 of the 11 reference texts of gemma3. Matching needs a BPE
//! model with merges synthesized from the scores (what `transformers` does): 513,511 merges
//! that took 0.8 s to build (release build, 2-core machine; this module builds gemma3's
//! tokenizer in about 40 ms), and it still finds special tokens leftmost-longest where
//! llama.cpp finds the longest first. The merge loop llama.cpp runs is small and serves both
//! kinds, and flint-core stays clear of the crate's 70-odd dependencies.
//!
//! ```no_run
//! # fn main() -> flint_core::Result<()> {
//! use flint_core::gguf::GgufFile;
//! use flint_core::tokenizer::{Detokenizer, Tokenizer};
//!
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tokenizer = Tokenizer::from_gguf(&file)?;
//! let ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>", true, true);
//! assert_eq!(tokenizer.decode(&ids, false)?, "<|im_start|>user\nHi<|im_end|>");
//!
//! // Streaming: each push returns only whole characters.
//! let mut detokenizer = Detokenizer::new(true);
//! let mut text = String::new();
//! for &id in &ids {
//!     text += &detokenizer.push(&tokenizer, id)?;
//! }
//! text += &detokenizer.finish();
//! assert_eq!(text, tokenizer.decode(&ids, true)?);
//! # Ok(())
//! # }
//! ```

mod bpe;
mod detokenizer;
mod merge;
mod pre_tokenizer;
mod special;
mod spm;
mod vocabulary;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

pub use detokenizer::Detokenizer;

use crate::gguf::{GgufFile, Metadata, MetadataArray, MetadataValue};
use crate::{Error, Result};
use bpe::BytePairEncoding;
use pre_tokenizer::PreTokenizer;
use special::{Fragment, SpecialTokens};
use spm::SentencePiece;
use vocabulary::Vocabulary;

/// A token's id: its index in the vocabulary.
pub type TokenId = u32;

/// What a token is, from `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// Type 0, or a type number GGUF does not define: never produced, decodes to nothing.
    Undefined,
    /// Type 1: ordinary text.
    Normal,
    /// Type 2: the unknown token.
    Unknown,
    /// Type 3: BOS, EOS, chat-turn markers: found in text only when special tokens are parsed,
    /// skipped when decoding with `skip_special`.
    Control,
    /// Type 4: always found in text as a whole token (gemma3's whitespace runs, HTML tags), and
    /// always decoded as its text.
    UserDefined,
    /// Type 5: reserved, never produced, decodes to nothing.
    Unused,
    /// Type 6: one byte, spelled `<0xXX>` (SentencePiece byte fallback).
    Byte,
}

impl TokenKind {
    /// The kind a `tokenizer.ggml.token_type` number stands for.
    pub fn from_gguf(token_type: i32) -> TokenKind {
        match token_type {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }
}

/// The texts llama.cpp takes for an end-of-turn token when `tokenizer.ggml.eot_token_id` is
/// absent, in the order flint prefers them (llama.cpp takes whichever its hash map yields first).
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// The texts of tokens that end generation, besides EOS, end-of-turn and end-of-message
/// (llama.cpp's `special_eog_ids`).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// The two models a GGUF vocabulary can have.
enum Model {
    BytePair(BytePairEncoding),
    SentencePiece(SentencePiece),
}

/// A tokenizer: text to token ids and back, built from a GGUF file's `tokenizer.ggml.*`.
pub struct Tokenizer {
    vocabulary: Vocabulary,
    model: Model,
    special_tokens: SpecialTokens,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    end_of_generation: Vec<TokenId>,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece: a space is written before text that starts the input or follows a
    /// special token. Both kinds: decoding drops the first token's leading space.
    add_space_prefix: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let model = match self.model {
            Model::BytePair(_) => "byte-level BPE",
            Model::SentencePiece(_) => "SentencePiece",
        };
        f.debug_struct("Tokenizer")
            .field("model", &model)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish()
    }
}

/// What a tokenizer is built from: the `tokenizer.ggml.*` metadata, read and typed.
pub(crate) struct TokenizerSpec<'a> {
    /// `tokenizer.ggml.model`.
    pub(crate) model: &'a str,
    /// `tokenizer.ggml.pre`.
    pub(crate) pre: Option<&'a str>,
    /// `tokenizer.ggml.tokens`.
    pub(crate) tokens: &'a [String],
    /// `tokenizer.ggml.token_type`; all normal when absent.
    pub(crate) token_types: Option<&'a [i32]>,
    /// `tokenizer.ggml.scores`; all 0 when absent.
    pub(crate) scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`.
    pub(crate) merges: Option<&'a [String]>,
    /// `tokenizer.ggml.{bos,eos,eot,eom,unknown}_token_id`.
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unknown: Option<u32>,
    /// `tokenizer.ggml.{add_bos_token,add_eos_token,add_space_prefix}`.
    pub(crate) add_bos: Option<bool>,
    pub(crate) add_eos: Option<bool>,
    pub(crate) add_space_prefix: Option<bool>,
}

impl<'a> TokenizerSpec<'a> {
    /// Reads the tokenizer keys of `metadata`.
    pub(crate) fn read(metadata: &'a Metadata) -> Result<Self> {
        let id = |key: &str| metadata.optional::<u32>(&format!("tokenizer.ggml.{key}_token_id"));
        let flag = |key: &str| metadata.optional::<bool>(&format!("tokenizer.ggml.{key}"));
        // llama.cpp accepts scores as f32 or i32.
        let scores = match metadata.get("tokenizer.ggml.scores") {
            None => None,
            Some(MetadataValue::Array(MetadataArray::F32(scores))) => Some(scores.clone()),
            Some(MetadataValue::Array(MetadataArray::I32(scores))) => {
                Some(scores.iter().map(|&score| score as f32).collect())
            }
            Some(other) => {
                return Err(key_error(
                    "tokenizer.ggml.scores",
                    format!("expected an array of f32 or i32, found {}", other.type_name()),
                ));
            }
        };
        Ok(TokenizerSpec {
            model: metadata.get_str("tokenizer.ggml.model")?,
            pre: metadata.optional("tokenizer.ggml.pre")?,
            tokens: metadata.require("tokenizer.ggml.tokens")?,
            token_types: metadata.optional("tokenizer.ggml.token_type")?,
            scores,
            merges: metadata.optional("tokenizer.ggml.merges")?,
            bos: id("bos")?,
            eos: id("eos")?,
            eot: id("eot")?,
            eom: id("eom")?,
            unknown: id("unknown")?,
            add_bos: flag("add_bos_token")?,
            add_eos: flag("add_eos_token")?,
            add_space_prefix: flag("add_space_prefix")?,
        })
    }
}

fn key_error(key: &str, reason: String) -> Error {
    Error::Gguf { context: format!("metadata key '{key}'"), reason }
}

impl Tokenizer {
    /// The tokenizer of a GGUF model.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_metadata(file.metadata())
    }

    /// The tokenizer described by `tokenizer.ggml.*` keys of `metadata`.
    pub fn from_metadata(metadata: &Metadata) -> Result<Self> {
        Self::from_spec(TokenizerSpec::read(metadata)?)
    }

    pub(crate) fn from_spec(spec: TokenizerSpec) -> Result<Self> {
        let token_count = spec.tokens.len();
        let kinds = match spec.token_types {
            None => vec![TokenKind::Normal; token_count],
            Some(types) if types.len() < token_count => {
                return Err(key_error(
                    "tokenizer.ggml.token_type",
                    format!("{} token types for {token_count} tokens", types.len()),
                ));
            }
            Some(types) => {
                types[..token_count].iter().map(|&token_type| TokenKind::from_gguf(token_type)).collect()
            }
        };
        let mut vocabulary = Vocabulary::new(spec.tokens.to_vec(), kinds)?;
        let in_vocabulary = |id: &u32| (*id as usize) < token_count;

        // Defaults llama.cpp assumes for each kind; ids in the file override them where they
        // lie inside the vocabulary.
        let is_sentence_piece = match spec.model {
            "llama" => true,
            "gpt2" => false,
            other => {
                return Err(key_error(
                    "tokenizer.ggml.model",
                    format!(
                        "tokenizer '{other}' is not supported: flint reads 'gpt2' (byte-level BPE) and 'llama' \
                         (SentencePiece) vocabularies"
                    ),
                ));
            }
        };
        let (default_bos, default_eos, default_unknown) =
            if is_sentence_piece { (Some(1), Some(2), Some(0)) } else { (Some(11), Some(11), None) };
        let pick = |from_file: Option<u32>, default: Option<u32>| {
            from_file.filter(in_vocabulary).or(default.filter(in_vocabulary))
        };
        let bos = pick(spec.bos, default_bos);
        let eos = pick(spec.eos, default_eos);
        let unknown = pick(spec.unknown, default_unknown);
        // End-of-turn and end-of-message tokens found by their text, and every token whose text
        // says it ends generation, become control tokens, as llama.cpp makes them: then they are
        // not matched in plain text.
        let by_text = |texts: &[&str]| texts.iter().find_map(|text| vocabulary.id(text));
        let eot_by_text = pick(spec.eot, None).is_none().then(|| by_text(END_OF_TURN_TEXTS)).flatten();
        let eom_by_text = pick(spec.eom, None).is_none().then(|| by_text(&["<|eom_id|>"])).flatten();
        let eot = pick(spec.eot, None).or(eot_by_text);
        let eom = pick(spec.eom, None).or(eom_by_text);
        let mut end_of_generation: Vec<TokenId> =
            END_OF_GENERATION_TEXTS.iter().filter_map(|text| vocabulary.id(text)).collect();
        for &id in end_of_generation.iter().chain(&eot_by_text).chain(&eom_by_text) {
            vocabulary.set_kind(id, TokenKind::Control);
        }
        end_of_generation.extend([eos, eot, eom].into_iter().flatten());
        end_of_generation.sort_unstable();
        end_of_generation.dedup();

        let (model, add_bos_by_default) = if is_sentence_piece {
            let scores = match spec.scores {
                None => vec![0.0; token_count],
                Some(scores) if scores.len() < token_count => {
                    return Err(key_error(
                        "tokenizer.ggml.scores",
                        format!("{} scores for {token_count} tokens", scores.len()),
                    ));
                }
                Some(mut scores) => {
                    scores.truncate(token_count);
                    scores
                }
            };
            (Model::SentencePiece(SentencePiece::new(&vocabulary, scores, unknown)), true)
        } else {
            let merges = spec.merges.ok_or_else(|| {
                key_error("tokenizer.ggml.merges", "missing: a 'gpt2' tokenizer needs its merge rules".into())
            })?;
            let bpe = BytePairEncoding::new(&vocabulary, merges, PreTokenizer::named(spec.pre)?);
            let add_bos = bpe.add_bos_by_default();
            (Model::BytePair(bpe), add_bos)
        };
        let add_bos = spec.add_bos.unwrap_or(add_bos_by_default);
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(key_error(
                "tokenizer.ggml.add_bos_token",
                "is true, but there is no BOS token (tokenizer.ggml.bos_token_id)".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(key_error(
                "tokenizer.ggml.add_eos_token",
                "is true, but there is no EOS token (tokenizer.ggml.eos_token_id)".into(),
            ));
        }

        let special_tokens = SpecialTokens::new(&vocabulary);
        Ok(Tokenizer {
            vocabulary,
            model,
            special_tokens,
            bos,
            eos,
            eot,
            end_of_generation,
            add_bos,
            add_eos,
            add_space_prefix: spec.add_space_prefix.unwrap_or(is_sentence_piece),
        })
    }

    /// Number of tokens in the vocabulary; every id is below it.
    pub fn vocab_size(&self) -> usize {
        self.vocabulary.len()
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }

    /// The end-of-turn token of chat models (`<|im_end|>`, `<end_of_turn>`...).
    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }

    /// Whether [`encode`](Self::encode) with `add_special` starts with the BOS token.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`encode`](Self::encode) with `add_special` ends with the EOS token.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The tokens that end generation: EOS, end-of-turn, and the others the vocabulary has,
    /// in id order.
    pub fn end_of_generation(&self) -> &[TokenId] {
        &self.end_of_generation
    }

    /// Whether generating `id` ends generation.
    pub fn is_end_of_generation(&self, id: TokenId) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// The text of token `id` as the vocabulary spells it (`▁` for spaces in SentencePiece,
    /// GPT-2's byte stand-ins in BPE).
    pub fn token_text(&self, id: TokenId) -> Option<&str> {
        self.vocabulary.text(id)
    }

    /// The kind of token `id`.
    pub fn token_kind(&self, id: TokenId) -> Option<TokenKind> {
        self.vocabulary.kind(id)
    }

    /// The token spelled exactly `text` in the vocabulary.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.vocabulary.id(text)
    }

    /// The token ids of `text`.
    ///
    /// `add_special` adds BOS (and EOS) where the model's metadata says to. `parse_special`
    /// makes control tokens written in the text (`<|im_start|>`, `<start_of_turn>`) count as
    /// those tokens; without it they are plain text. User-defined tokens are always found.
    /// This is llama.cpp's `llama_tokenize(text, add_special, parse_special)`; a rendered chat
    /// template is encoded with `parse_special`, a user's raw text without.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        let fragments = self.special_tokens.partition(text, &self.vocabulary, parse_special);
        match &self.model {
            Model::BytePair(bpe) => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => bpe.encode(&text[range], &self.vocabulary, &mut ids),
                        Fragment::Token(id) => ids.push(id),
                    }
                }
            }
            Model::SentencePiece(spm) => {
                let mut escaped = String::new();
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(range) => {
                            escaped.clear();
                            if self.add_space_prefix && after_special {
                                escaped.push('▁');
                            }
                            escaped.extend(text[range].chars().map(|c| if c == ' ' { '▁' } else { c }));
                            spm.encode(&escaped, &self.vocabulary, &mut ids);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            ids.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            ids.extend(self.eos);
        }
        ids
    }

    /// The text of `ids`. `skip_special` leaves control tokens (BOS, EOS, turn markers) out.
    /// Bytes that are not valid UTF-8 (a model can generate half a character) become U+FFFD.
    /// An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[TokenId], skip_special: bool) -> Result<String> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for (position, &id) in ids.iter().enumerate() {
            self.append_piece(id, skip_special, position == 0, &mut bytes)?;
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Appends the bytes token `id` stands for to `out`, as llama.cpp's `token_to_piece`:
    /// `first` is whether it is the first token of the text (which then loses one leading space
    /// when the vocabulary adds a space prefix).
    pub(crate) fn append_piece(
        &self,
        id: TokenId,
        skip_special: bool,
        first: bool,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let (Some(kind), Some(text)) = (self.vocabulary.kind(id), self.vocabulary.text(id)) else {
            return Err(Error::TokenOutOfVocabulary { id, vocab_size: self.vocab_size() });
        };
        let start = out.len();
        match kind {
            TokenKind::Control | TokenKind::Unknown if skip_special => {}
            TokenKind::Control | TokenKind::Unknown | TokenKind::UserDefined => {
                out.extend_from_slice(text.as_bytes())
            }
            TokenKind::Normal => match self.model {
                Model::SentencePiece(_) => {
                    for character in text.chars() {
                        let character = if character == '▁' { ' ' } else { character };
                        out.extend_from_slice(character.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
                Model::BytePair(_) => {
                    for character in text.chars() {
                        match bpe::char_byte(character) {
                            Some(byte) => out.push(byte),
                            // Not a byte stand-in: kept as the character itself (llama.cpp writes
                            // "[UNK_BYTE_0x...]" there).
                            None => out.extend_from_slice(character.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
            },
            TokenKind::Byte => out.extend(byte_token_value(text)),
            TokenKind::Unused | TokenKind::Undefined => {}
        }
        if first && self.add_space_prefix && out.get(start) == Some(&b' ') {
            out.remove(start);
        }
        Ok(())
    }
}

/// The byte of a byte-fallback token `<0xXX>`.
fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}
