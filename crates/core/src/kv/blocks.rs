//! The blocks of a paged KV cache: who holds each one, which are free, and which hold a
//! finished prefix that a later sequence may reuse.
//!
//! A block is in exactly one of three states:
//! - *held*: one or more sequences' block tables list it (`refs > 0`);
//! - *cached*: no table lists it, but its keys and values are those of a known token prefix
//!   (it is registered under that prefix's [`PrefixKey`]); a new sequence with the same prefix
//!   takes it back instead of recomputing it, and it is evicted, least recently used first,
//!   when a fresh block is needed and none is free;
//! - *free*: nothing useful in it.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Identifies a full block by every token up to and including its own: the hash of the previous
/// block's key and this block's tokens. Equal keys of different prefixes are told apart by the
/// tokens and parent key stored with each entry, so a hash collision costs a miss, never wrong
/// keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefixKey(u64);

impl PrefixKey {
    /// The key of the block holding `tokens`, after the block whose key is `parent` (`None` for
    /// a sequence's first block).
    pub fn new(parent: Option<PrefixKey>, tokens: &[u32]) -> Self {
        // SipHash with fixed keys: the same key on every run and every platform.
        let mut hasher = DefaultHasher::new();
        parent.map(|p| p.0).hash(&mut hasher);
        tokens.hash(&mut hasher);
        PrefixKey(hasher.finish())
    }
}

/// A registered block: what it holds, to check a lookup against.
#[derive(Clone, Debug)]
struct CachedBlock {
    block: u32,
    parent: Option<PrefixKey>,
    tokens: Box<[u32]>,
}

/// Reference counts, the free list and the prefix cache of one KV cache's blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Per block: the tables that list it.
    refs: Vec<u32>,
    /// Per block: its key while it is registered in `by_key`.
    keys: Vec<Option<PrefixKey>>,
    /// Per cached block: when it was last released (its position in `evictable`).
    released_at: Vec<u64>,
    /// Free block ids, the next one to hand out last (so a fresh pool fills from block 0).
    free: Vec<u32>,
    /// Registered blocks by key, held or cached.
    by_key: HashMap<PrefixKey, CachedBlock>,
    /// Cached blocks (registered, held by no table) by release time: the first is evicted first.
    evictable: BTreeMap<u64, u32>,
    clock: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` free blocks.
    pub fn new(num_blocks: u32) -> Self {
        let n = num_blocks as usize;
        BlockPool {
            refs: vec![0; n],
            keys: vec![None; n],
            released_at: vec![0; n],
            free: (0..num_blocks).rev().collect(),
            by_key: HashMap::new(),
            evictable: BTreeMap::new(),
            clock: 0,
        }
    }

    /// Every block, in any state.
    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that [`BlockPool::allocate`] can hand out: free ones and cached ones.
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks held by no table whose keys and values a matching prefix can reuse.
    pub fn cached_blocks(&self) -> usize {
        self.evictable.len()
    }

    /// One past the highest block id that some table holds (0 when none): every block a table
    /// lists lies below it.
    pub fn held_end(&self) -> usize {
        self.refs.iter().rposition(|&refs| refs > 0).map_or(0, |i| i + 1)
    }

    /// Blocks listed by at least one table.
    pub fn held_blocks(&self) -> usize {
        self.num_blocks() - self.available_blocks()
    }

    /// Takes a block for a table (its count becomes 1): a free one, else the least recently
    /// used cached one, which leaves the prefix cache. `None` when every block is held.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(block) => block,
            None => {
                let (_, block) = self.evictable.pop_first()?;
                self.unregister(block);
                block
            }
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// One more table lists `block`. A cached block becomes held again.
    pub fn retain(&mut self, block: u32) {
        let b = block as usize;
        if self.refs[b] == 0 {
            self.evictable.remove(&self.released_at[b]);
        }
        self.refs[b] += 1;
    }

    /// One table fewer lists `block`. When none is left, a registered block is cached and any
    /// other is freed. The block must be held.
    pub fn release(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(self.refs[b] > 0, "block {block} released more often than held");
        self.refs[b] = self.refs[b].saturating_sub(1);
        if self.refs[b] == 0 {
            if self.keys[b].is_some() {
                self.clock += 1;
                self.released_at[b] = self.clock;
                self.evictable.insert(self.clock, block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// Registers held `block` as holding `tokens` after the prefix `parent`, under `key`
    /// (`PrefixKey::new(parent, tokens)`). When another block is registered under the key
    /// already (two sequences computed the same prefix side by side), this one stays
    /// unregistered and is freed when released.
    pub fn register(&mut self, block: u32, key: PrefixKey, parent: Option<PrefixKey>, tokens: &[u32]) {
        if self.keys[block as usize].is_some() || self.by_key.contains_key(&key) {
            return;
        }
        self.keys[block as usize] = Some(key);
        self.by_key.insert(key, CachedBlock { block, parent, tokens: tokens.into() });
    }

    /// The block registered as holding `tokens` after `parent`, if any.
    pub fn lookup(&self, key: PrefixKey, parent: Option<PrefixKey>, tokens: &[u32]) -> Option<u32> {
        self.by_key
            .get(&key)
            .filter(|entry| entry.parent == parent && *entry.tokens == *tokens)
            .map(|entry| entry.block)
    }

    /// Forgets every registered prefix: cached blocks become free, held ones are freed when
    /// their last table releases them.
    pub fn flush(&mut self) {
        for (_, block) in std::mem::take(&mut self.evictable) {
            self.free.push(block);
        }
        for entry in std::mem::take(&mut self.by_key).into_values() {
            self.keys[entry.block as usize] = None;
        }
    }

    fn unregister(&mut self, block: u32) {
        if let Some(key) = self.keys[block as usize].take() {
            self.by_key.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_handed_out_from_zero_and_freed_unless_registered() {
        let mut pool = BlockPool::new(3);
        assert_eq!([pool.allocate(), pool.allocate()], [Some(0), Some(1)]);
        assert_eq!((pool.held_blocks(), pool.available_blocks()), (2, 1));
        let key = PrefixKey::new(None, &[1, 2]);
        pool.register(0, key, None, &[1, 2]);
        pool.release(0);
        pool.release(1);
        assert_eq!((pool.held_blocks(), pool.cached_blocks(), pool.available_blocks()), (0, 1, 3));
        assert_eq!(pool.lookup(key, None, &[1, 2]), Some(0));
        // Free blocks go first; the cached one only when nothing else is left.
        assert_eq!([pool.allocate(), pool.allocate()], [Some(1), Some(2)]);
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(pool.lookup(key, None, &[1, 2]), None, "evicted");
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn held_end_covers_every_held_block() {
        let mut pool = BlockPool::new(4);
        assert_eq!(pool.held_end(), 0);
        let blocks: Vec<u32> = (0..3).filter_map(|_| pool.allocate()).collect();
        assert_eq!((blocks, pool.held_end()), (vec![0, 1, 2], 3));
        pool.release(2);
        assert_eq!(pool.held_end(), 2);
        pool.release(0);
        assert_eq!(pool.held_end(), 2, "block 1 is still held");
        pool.release(1);
        assert_eq!(pool.held_end(), 0);
    }

    #[test]
    fn the_least_recently_released_cached_block_is_evicted_first() {
        let mut pool = BlockPool::new(3);
        let keys: Vec<PrefixKey> = (0..3).map(|i| PrefixKey::new(None, &[i])).collect();
        for (i, key) in keys.iter().enumerate() {
            let block = pool.allocate().unwrap();
            pool.register(block, *key, None, &[i as u32]);
        }
        for block in [2, 0, 1] {
            pool.release(block);
        }
        // Block 2 was released first; retaining block 0 takes it out of the cache.
        pool.retain(0);
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), Some(1));
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.lookup(keys[0], None, &[0]), Some(0), "held blocks stay registered");
    }

    #[test]
    fn lookups_check_tokens_and_parent_and_duplicates_are_not_registered() {
        let mut pool = BlockPool::new(4);
        let parent = PrefixKey::new(None, &[7]);
        let key = PrefixKey::new(Some(parent), &[8, 9]);
        let (a, b) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        pool.register(a, key, Some(parent), &[8, 9]);
        pool.register(b, key, Some(parent), &[8, 9]);
        assert_eq!(pool.lookup(key, Some(parent), &[8, 9]), Some(a));
        assert_eq!(pool.lookup(key, Some(parent), &[8, 10]), None);
        assert_eq!(pool.lookup(key, None, &[8, 9]), None);
        pool.release(b);
        assert_eq!(pool.cached_blocks(), 0, "the duplicate is freed, not cached");
        pool.retain(a);
        pool.release(a);
        assert_eq!(pool.held_blocks(), 1, "a is still held once");
        pool.release(a);
        assert_eq!(pool.cached_blocks(), 1);
        pool.flush();
        assert_eq!((pool.cached_blocks(), pool.available_blocks()), (0, 4));
        assert_eq!(pool.lookup(key, Some(parent), &[8, 9]), None);
    }
}
