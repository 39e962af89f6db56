//! Incremental detokenization for streams: one token in, the new text out, never half a
//! character.
//!
//! A token can end inside a UTF-8 character (byte-fallback tokens carry one byte each; a
//! byte-level BPE token can hold the first bytes of an emoji). The bytes of an unfinished
//! character are held back until the character is complete. Bytes that can never become a
//! character become U+FFFD as soon as that is certain, exactly as [`String::from_utf8_lossy`]
//! replaces them, so the concatenation of all pushes and [`finish`](Detokenizer::finish) equals
//! [`Tokenizer::decode`] of the same ids.

use crate::Result;
use crate::tokenizer::{TokenId, Tokenizer};

/// The decoding state of one stream of tokens.
#[derive(Clone, Debug)]
pub struct Detokenizer {
    skip_special: bool,
    /// Bytes not yet returned: the start of a character whose end has not arrived.
    pending: Vec<u8>,
    tokens_seen: usize,
}

impl Detokenizer {
    /// A detokenizer for a new stream; `skip_special` as in [`Tokenizer::decode`].
    pub fn new(skip_special: bool) -> Self {
        Detokenizer { skip_special, pending: Vec::new(), tokens_seen: 0 }
    }

    /// A detokenizer for the tokens generated after a prompt: a continuation keeps the leading
    /// space that the first token of a text loses.
    pub fn after_prompt(skip_special: bool) -> Self {
        Detokenizer { skip_special, pending: Vec::new(), tokens_seen: 1 }
    }

    /// Decodes the next token of the stream and returns the text it completes (possibly
    /// empty). Use the same tokenizer for every token of a stream. An id outside the
    /// vocabulary is an error and leaves the state unchanged.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: TokenId) -> Result<String> {
        tokenizer.append_piece(id, self.skip_special, self.tokens_seen == 0, &mut self.pending)?;
        self.tokens_seen += 1;
        let mut text = String::new();
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(valid) => {
                    text.push_str(valid);
                    consumed = self.pending.len();
                    break;
                }
                Err(error) => {
                    let valid_up_to = consumed + error.valid_up_to();
                    // The bytes up to `valid_up_to` were just checked to be valid UTF-8.
                    text.push_str(&String::from_utf8_lossy(&self.pending[consumed..valid_up_to]));
                    match error.error_len() {
                        // Bytes that no continuation can complete: one U+FFFD, as in
                        // `from_utf8_lossy`, then go on after them.
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            consumed = valid_up_to + invalid;
                        }
                        // The start of a character whose end is yet to come: hold it back.
                        None => {
                            consumed = valid_up_to;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        Ok(text)
    }

    /// Ends the stream: the held-back bytes of an unfinished character, as U+FFFD (empty when
    /// none). The detokenizer can then start a new stream.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.tokens_seen = 0;
        rest
    }
}
