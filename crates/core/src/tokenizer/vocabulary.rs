//! The vocabulary: each token's text and kind, and the index from text back to id.

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

use crate::tokenizer::{TokenId, TokenKind};
use crate::{Error, Result};

/// Token texts and kinds, indexed by id, with a text -> id lookup.
///
/// The index holds ids and hashes the texts where they already live, so gemma3's 262144
/// token strings are stored once.
pub(crate) struct Vocabulary {
    texts: Vec<String>,
    kinds: Vec<TokenKind>,
    index: HashTable<TokenId>,
    hasher: DefaultHashBuilder,
}

impl Vocabulary {
    /// Builds the vocabulary. Like llama.cpp, an empty token becomes `[EMPTY_<id>]` (so it
    /// can be neither matched nor confused with another) and a text given twice is an error.
    pub(crate) fn new(mut texts: Vec<String>, kinds: Vec<TokenKind>) -> Result<Self> {
        debug_assert_eq!(texts.len(), kinds.len());
        if u32::try_from(texts.len()).is_err() {
            return Err(vocabulary_error(format!("{} tokens do not fit 32-bit token ids", texts.len())));
        }
        for (id, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{id}]");
            }
        }
        let hasher = DefaultHashBuilder::default();
        let mut index = HashTable::with_capacity(texts.len());
        for (id, text) in texts.iter().enumerate() {
            let hash = hasher.hash_one(text.as_str());
            let entry = index.entry(
                hash,
                |&other: &TokenId| texts[other as usize] == *text,
                |&other: &TokenId| hasher.hash_one(texts[other as usize].as_str()),
            );
            match entry {
                hashbrown::hash_table::Entry::Occupied(first) => {
                    return Err(vocabulary_error(format!(
                        "token {text:?} appears twice (ids {} and {id}); the vocabulary is corrupt",
                        first.get()
                    )));
                }
                hashbrown::hash_table::Entry::Vacant(slot) => {
                    // Cannot truncate: the length was checked against u32 above.
                    slot.insert(id as TokenId);
                }
            }
        }
        Ok(Vocabulary { texts, kinds, index, hasher })
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    /// The id of the token whose text is exactly `text`.
    pub(crate) fn id(&self, text: &str) -> Option<TokenId> {
        let hash = self.hasher.hash_one(text);
        self.index.find(hash, |&id| self.texts[id as usize] == text).copied()
    }

    /// The text of token `id`, as stored in the vocabulary (`▁` for spaces in SentencePiece,
    /// byte-level characters in BPE).
    pub(crate) fn text(&self, id: TokenId) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The kind of token `id`.
    pub(crate) fn kind(&self, id: TokenId) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Changes the kind of token `id` (llama.cpp forces end-of-generation tokens to control).
    pub(crate) fn set_kind(&mut self, id: TokenId, kind: TokenKind) {
        self.kinds[id as usize] = kind;
    }

    /// Every token id with its text and kind, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TokenId, &str, TokenKind)> {
        // Ids fit in u32: checked when the vocabulary was built.
        self.texts
            .iter()
            .zip(&self.kinds)
            .enumerate()
            .map(|(id, (text, &kind))| (id as TokenId, text.as_str(), kind))
    }
}

/// The error for a vocabulary llama.cpp would also refuse.
pub(crate) fn vocabulary_error(reason: String) -> Error {
    Error::Gguf { context: "metadata key 'tokenizer.ggml.tokens'".into(), reason }
}
