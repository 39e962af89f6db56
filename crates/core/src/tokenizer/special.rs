//! Special tokens written in the text: found before the model sees the text, as llama.cpp's
//! `tokenizer_st_partition` finds them.
//!
//! The special tokens are the control, user-defined and unknown ones. Longer tokens are found
//! first, each everywhere in what is still text (leftmost, non-overlapping), before shorter
//! ones; the text between them goes to the model. User-defined tokens (gemma3's whitespace
//! runs and HTML tags) are always found; control and unknown tokens only when the caller asks
//! to parse special tokens, otherwise `<|im_start|>` in a user's text is just text.

use std::ops::Range;

use aho_corasick::AhoCorasick;

use crate::tokenizer::vocabulary::Vocabulary;
use crate::tokenizer::{TokenId, TokenKind};

/// A piece of the text after partitioning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Bytes of the text for the model.
    Text(Range<usize>),
    /// A special token found in the text.
    Token(TokenId),
}

/// The special tokens of a vocabulary, in the order they are looked for.
pub(crate) struct SpecialTokens {
    /// Longest text first; among equal lengths, lower id first.
    ids: Vec<TokenId>,
    /// Finds every occurrence of every special token in one pass, so that only the tokens a
    /// text contains are looked for one by one (gemma3 has 6414 special tokens).
    finder: Option<AhoCorasick>,
}

impl SpecialTokens {
    pub(crate) fn new(vocabulary: &Vocabulary) -> Self {
        let mut ids: Vec<TokenId> = vocabulary
            .iter()
            .filter(|&(_, _, kind)| {
                matches!(kind, TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown)
            })
            .map(|(id, _, _)| id)
            .collect();
        let text_len = |id: TokenId| vocabulary.text(id).map_or(0, str::len);
        ids.sort_by(|&a, &b| text_len(b).cmp(&text_len(a)).then(a.cmp(&b)));
        // Building can only fail for automata too large for its limits; the one-by-one search
        // below then runs for every token instead.
        let finder = AhoCorasick::new(ids.iter().map(|&id| vocabulary.text(id).unwrap_or_default())).ok();
        SpecialTokens { ids, finder }
    }

    /// Cuts `text` into text and special-token fragments, in order.
    pub(crate) fn partition(
        &self,
        text: &str,
        vocabulary: &Vocabulary,
        parse_special: bool,
    ) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        let present = self.present(text);
        for (position, &id) in self.ids.iter().enumerate() {
            if present.as_ref().is_some_and(|present| !present[position]) {
                continue;
            }
            let kind = vocabulary.kind(id).unwrap_or(TokenKind::Normal);
            if !parse_special && matches!(kind, TokenKind::Control | TokenKind::Unknown) {
                continue;
            }
            let Some(token_text) = vocabulary.text(id) else { continue };
            fragments = fragments
                .into_iter()
                .flat_map(|fragment| match fragment {
                    Fragment::Text(range) => split_at_token(text, range, token_text, id),
                    token => vec![token],
                })
                .collect();
        }
        fragments
    }

    /// Which special tokens (by position in `ids`) occur anywhere in `text`, overlaps included.
    fn present(&self, text: &str) -> Option<Vec<bool>> {
        let finder = self.finder.as_ref()?;
        let mut present = vec![false; self.ids.len()];
        for found in finder.find_overlapping_iter(text) {
            present[found.pattern().as_usize()] = true;
        }
        Some(present)
    }
}

/// Splits `text[range]` at every leftmost, non-overlapping occurrence of `token_text`.
fn split_at_token(text: &str, range: Range<usize>, token_text: &str, id: TokenId) -> Vec<Fragment> {
    let mut out = Vec::new();
    let mut done = range.start;
    for (at, _) in text[range.clone()].match_indices(token_text) {
        let at = range.start + at;
        if at > done {
            out.push(Fragment::Text(done..at));
        }
        out.push(Fragment::Token(id));
        done = at + token_text.len();
    }
    if done < range.end {
        out.push(Fragment::Text(done..range.end));
    }
    out
}
