//! The merge loop both BPE and SentencePiece run on a word: start from one symbol per
//! character (or byte), repeatedly merge the adjacent pair the model ranks best, stop when no
//! adjacent pair can merge. This is llama.cpp's `llm_tokenizer_{bpe,spm}_session::tokenize`:
//! the same priority queue, the same tie-break (the leftmost pair), the same stale-pair check,
//! so both produce the same tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::tokenizer::TokenId;

/// A run of the word's bytes that is one symbol, linked to its neighbours.
#[derive(Clone, Debug)]
pub(crate) struct Symbol {
    /// Byte offset in the word.
    pub(crate) start: usize,
    /// Length in bytes; 0 once merged into the symbol on its left.
    pub(crate) len: usize,
    /// The token this symbol is, when it is one.
    pub(crate) id: Option<TokenId>,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Symbol {
    /// The byte range of this symbol in its word.
    pub(crate) fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// One symbol per piece: `pieces` are (start, length, token) in order and tile the word.
pub(crate) fn symbols(pieces: impl Iterator<Item = (usize, usize, Option<TokenId>)>) -> Vec<Symbol> {
    let mut symbols: Vec<Symbol> = pieces
        .enumerate()
        .map(|(index, (start, len, id))| Symbol {
            start,
            len,
            id,
            prev: index.checked_sub(1),
            next: Some(index + 1),
        })
        .collect();
    if let Some(last) = symbols.last_mut() {
        last.next = None;
    }
    symbols
}

/// A pair of adjacent symbols that may merge, and how much the model wants it.
struct Candidate<P> {
    priority: P,
    left: usize,
    right: usize,
    /// Bytes of both symbols when the candidate was made; a different sum later means one of
    /// them has merged since, and the candidate is stale.
    len: usize,
    merged: TokenId,
}

impl<P: Ord> Ord for Candidate<P> {
    fn cmp(&self, other: &Self) -> Ordering {
        // The max-heap pops the best priority first and, among equals, the leftmost pair.
        self.priority.cmp(&other.priority).then_with(|| other.left.cmp(&self.left))
    }
}

impl<P: Ord> PartialOrd for Candidate<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<P: Ord> PartialEq for Candidate<P> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<P: Ord> Eq for Candidate<P> {}

/// Merges `symbols` in place. `pair(left, right)` says whether two adjacent symbols merge,
/// with what priority (greater merges first) into which token. Afterwards the symbols with a
/// non-zero length, in order, are the word's tokens.
pub(crate) fn merge<P: Ord>(symbols: &mut [Symbol], pair: impl Fn(&Symbol, &Symbol) -> Option<(P, TokenId)>) {
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Candidate<P>>,
                symbols: &[Symbol],
                left: Option<usize>,
                right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else { return };
        if let Some((priority, merged)) = pair(&symbols[left], &symbols[right]) {
            let len = symbols[left].len + symbols[right].len;
            queue.push(Candidate { priority, left, right, len, merged });
        }
    };
    for left in 1..symbols.len() {
        push(&mut queue, symbols, Some(left - 1), Some(left));
    }
    while let Some(candidate) = queue.pop() {
        let (left, right) = (&symbols[candidate.left], &symbols[candidate.right]);
        if left.len == 0 || right.len == 0 || left.len + right.len != candidate.len {
            continue;
        }
        let after = right.next;
        symbols[candidate.right].len = 0;
        let merged = &mut symbols[candidate.left];
        merged.len = candidate.len;
        merged.id = Some(candidate.merged);
        merged.next = after;
        let before = merged.prev;
        if let Some(after) = after {
            symbols[after].prev = Some(candidate.left);
        }
        push(&mut queue, symbols, before, Some(candidate.left));
        push(&mut queue, symbols, Some(candidate.left), after);
    }
}

/// The symbols left after [`merge`], in order.
pub(crate) fn remaining(symbols: &[Symbol]) -> impl Iterator<Item = &Symbol> {
    symbols.iter().filter(|symbol| symbol.len > 0)
}
