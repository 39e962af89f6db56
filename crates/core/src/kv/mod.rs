//! The paged KV cache: every layer's keys and values in fixed-size blocks of tokens, a free list
//! of blocks, and one block table per sequence.
//!
//! A [`KvCache`] owns, per layer, a K and a V tensor of f16 `[num_blocks, block_size,
//! n_kv_heads, head_dim]` (the [`KvCacheLayer`] the attention kernels read) and a [`BlockPool`]. A
//! sequence's [`KvBlockTable`] lists the blocks it uses in position order: its token at
//! position `p` lives in slot `blocks[p / block_size] * block_size + p % block_size` of every
//! layer. [`KvCache::append`] reserves slots for new tokens (taking blocks from the pool as the
//! sequence crosses block boundaries) before a forward pass writes them, and
//! [`KvCache::release`] gives a finished sequence's blocks back.
//!
//! The prefix cache: once a forward pass has written a full block, [`KvCache::cache_prefix`]
//! registers it under the hash of every token up to its end; when the sequence is released the
//! block stays *cached* rather than free, and a later sequence that starts with the same tokens
//! takes it back through [`KvCache::match_prefix`] instead of recomputing it (a chat's system
//! prompt, the earlier turns of a conversation). Cached blocks are evicted, least recently used
//! first, when a fresh block is needed; full blocks may be shared by many tables at once, and
//! since a table only ever appends after its shared blocks, nobody writes a shared block.
//!
//! The cache knows nothing of models or requests: the scheduler decides who appends and who is
//! released, the model's forward pass writes and reads the slots.
//!
//! ```no_run
//! # async fn example() -> flint_core::Result<()> {
//! use flint_core::gpu::{GpuContext, GpuOptions};
//! use flint_core::kv::{KvCache, KvCacheShape};
//!
//! let ctx = GpuContext::new(&GpuOptions::default()).await?;
//! let shape = KvCacheShape { layers: 30, kv_heads: 3, head_dim: 64 };
//! let mut cache = KvCache::new(&ctx, shape, 16, 4096)?;
//! let mut sequence = cache.new_sequence();
//! let prompt_positions = cache.append(&mut sequence, 21)?; // positions 0..21, in 2 blocks
//! assert_eq!(prompt_positions, 0..21);
//! assert_eq!(sequence.blocks().len(), 2);
//! cache.release(sequence);
//! # Ok(())
//! # }
//! ```

mod blocks;

use std::ops::Range;

pub use blocks::{BlockPool, PrefixKey};

use crate::gpu::{GpuContext, Tensor};
use crate::kernels::attention::KvCacheLayer;
use crate::{Error, Result};

/// Bytes of one cached key or value element: the cache holds f16, as llama.cpp's does by default
/// (half the memory and half the attention reads of f32).
pub const KV_ELEMENT_BYTES: usize = 2;

/// What one token's keys and values look like in every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheShape {
    /// Transformer layers, each with its own K and V.
    pub layers: usize,
    /// Key/value heads per token.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl KvCacheShape {
    /// Bytes of one token's keys (or values) in one layer: f16 elements.
    pub fn token_bytes_per_layer(&self) -> u64 {
        (self.kv_heads * self.head_dim * KV_ELEMENT_BYTES) as u64
    }

    /// The most tokens, in whole blocks of `block_size_tokens`, that a cache of this shape can
    /// hold when a layer's keys must fit one storage binding of `max_binding_bytes`.
    pub fn max_tokens(&self, max_binding_bytes: u64, block_size_tokens: usize) -> usize {
        let fitting = (max_binding_bytes / self.token_bytes_per_layer()) as usize;
        fitting / block_size_tokens * block_size_tokens
    }

    /// Bytes a [`KvCache`] of `capacity_tokens` (rounded up to whole blocks) takes from `ctx`'s
    /// memory: a K and a V tensor a layer.
    pub fn cache_bytes(&self, ctx: &GpuContext, block_size_tokens: usize, capacity_tokens: usize) -> u64 {
        let slots = capacity_tokens.next_multiple_of(block_size_tokens);
        let layer_words = slots * self.kv_heads * self.head_dim / 2;
        Tensor::allocated_bytes(ctx, layer_words) * 2 * self.layers as u64
    }
}

/// The blocks of one sequence's keys and values, in position order, and how many token
/// positions have been reserved in them.
///
/// A table comes from [`KvCache::new_sequence`] and goes back with [`KvCache::release`]; a table
/// dropped without being released keeps its blocks out of the free list.
#[derive(Debug)]
pub struct KvBlockTable {
    blocks: Vec<u32>,
    tokens: usize,
    block_size_tokens: usize,
    /// The prefix keys of the first blocks, those registered in (or taken from) the prefix cache.
    keys: Vec<PrefixKey>,
}

impl KvBlockTable {
    /// The block ids, in position order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Positions reserved so far: the sequence's tokens occupy positions `0 .. tokens()`.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Tokens per block.
    pub fn block_size_tokens(&self) -> usize {
        self.block_size_tokens
    }

    /// The cache slot (`block * block_size + offset`) of the token at `position`, or `None` when
    /// the position has not been reserved.
    pub fn slot(&self, position: usize) -> Option<u32> {
        if position >= self.tokens {
            return None;
        }
        let block = self.blocks[position / self.block_size_tokens] as usize;
        u32::try_from(block * self.block_size_tokens + position % self.block_size_tokens).ok()
    }
}

/// One layer's keys and values on the GPU.
struct LayerTensors {
    k: Tensor,
    v: Tensor,
}

/// The paged KV cache of one model on one GPU (see the module documentation).
pub struct KvCache {
    shape: KvCacheShape,
    block_size_tokens: usize,
    layers: Vec<LayerTensors>,
    blocks: BlockPool,
}

impl KvCache {
    /// A cache for `shape` with room for `capacity_tokens` tokens (rounded up to whole blocks of
    /// `block_size_tokens`) across all sequences.
    ///
    /// Each layer's K and V must fit one storage binding (the attention kernels bind a layer
    /// whole): an error says how many tokens would fit on this device.
    pub fn new(
        ctx: &GpuContext,
        shape: KvCacheShape,
        block_size_tokens: usize,
        capacity_tokens: usize,
    ) -> Result<Self> {
        let invalid = |reason: String| Error::KernelArguments { kernel: "KvCache::new", reason };
        if shape.layers == 0 || shape.kv_heads == 0 || shape.head_dim == 0 {
            return Err(invalid(format!("the shape {shape:?} has an empty dimension")));
        }
        if !shape.head_dim.is_multiple_of(2) {
            return Err(invalid(format!(
                "head_dim {} is odd: the cache packs two f16 per word",
                shape.head_dim
            )));
        }
        if block_size_tokens == 0 || capacity_tokens == 0 {
            return Err(invalid(format!(
                "blocks of {block_size_tokens} tokens and a capacity of {capacity_tokens} tokens: both must \
                 be at least 1"
            )));
        }
        let num_blocks = capacity_tokens.div_ceil(block_size_tokens);
        let layer_bytes = (num_blocks * block_size_tokens) as u64 * shape.token_bytes_per_layer();
        let max_bytes = ctx.max_binding_bytes();
        if layer_bytes > max_bytes {
            let fitting_tokens = max_bytes / shape.token_bytes_per_layer();
            return Err(Error::TooLarge {
                name: "KV cache layer".into(),
                bytes: layer_bytes,
                reason: format!(
                    "a layer's keys must fit one storage binding of {max_bytes} bytes, which holds {fitting_tokens} \
                     tokens of {} bytes: ask for a smaller token budget",
                    shape.token_bytes_per_layer()
                ),
            });
        }
        let num_blocks = u32::try_from(num_blocks)
            .map_err(|_| invalid(format!("{num_blocks} blocks overflow u32 block ids")))?;
        // u32 words of two f16 each (the layout of KvCacheLayer).
        let dims = [num_blocks as usize, block_size_tokens, shape.kv_heads, shape.head_dim / 2];
        let layers = (0..shape.layers)
            .map(|layer| {
                Ok(LayerTensors {
                    k: Tensor::empty(ctx, &format!("kv cache layer {layer} keys"), &dims)?,
                    v: Tensor::empty(ctx, &format!("kv cache layer {layer} values"), &dims)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { shape, block_size_tokens, layers, blocks: BlockPool::new(num_blocks) })
    }

    /// The shape of a token's keys and values.
    pub fn shape(&self) -> KvCacheShape {
        self.shape
    }

    /// Tokens per block.
    pub fn block_size_tokens(&self) -> usize {
        self.block_size_tokens
    }

    /// Every block, in use or not.
    pub fn num_blocks(&self) -> usize {
        self.blocks.num_blocks()
    }

    /// Blocks no sequence uses, which [`KvCache::append`] can take: free ones and those of the
    /// prefix cache.
    pub fn free_blocks(&self) -> usize {
        self.blocks.available_blocks()
    }

    /// Blocks no sequence uses that hold a cached prefix.
    pub fn cached_blocks(&self) -> usize {
        self.blocks.cached_blocks()
    }

    /// Blocks listed by at least one sequence's table.
    pub fn used_blocks(&self) -> usize {
        self.blocks.held_blocks()
    }

    /// Tokens the whole cache holds.
    pub fn capacity_tokens(&self) -> usize {
        self.num_blocks() * self.block_size_tokens
    }

    /// Layer `layer`'s K and V, as the attention kernels take them.
    ///
    /// # Panics
    /// When `layer` is not below [`KvCacheShape::layers`].
    pub fn layer(&self, layer: usize) -> KvCacheLayer<'_> {
        let tensors = &self.layers[layer];
        KvCacheLayer { k: &tensors.k, v: &tensors.v, blocks_in_use: self.blocks.held_end() }
    }

    /// An empty block table for a new sequence.
    pub fn new_sequence(&self) -> KvBlockTable {
        KvBlockTable {
            blocks: Vec::new(),
            tokens: 0,
            block_size_tokens: self.block_size_tokens,
            keys: Vec::new(),
        }
    }

    /// A table for a new sequence of `tokens` that starts with the longest run of whole blocks
    /// found in the prefix cache: their positions are reserved and hold their keys and values
    /// already, so the sequence's forward passes start at `table.tokens()`. At most `max_tokens`
    /// tokens are matched (a caller that needs the logits of the prompt's last token passes
    /// `tokens.len() - 1`, so that token is computed).
    pub fn match_prefix(&mut self, tokens: &[u32], max_tokens: usize) -> KvBlockTable {
        let mut table = self.new_sequence();
        let limit = max_tokens.min(tokens.len());
        for block_tokens in tokens[..limit].chunks_exact(self.block_size_tokens) {
            let parent = table.keys.last().copied();
            let key = PrefixKey::new(parent, block_tokens);
            let Some(block) = self.blocks.lookup(key, parent, block_tokens) else { break };
            self.blocks.retain(block);
            table.blocks.push(block);
            table.keys.push(key);
            table.tokens += self.block_size_tokens;
        }
        table
    }

    /// Registers in the prefix cache every full block of `table` not registered yet whose keys
    /// and values have been computed: `computed` are the sequence's tokens from position 0 up
    /// to where a finished forward pass has written (at most `table.tokens()` of them).
    pub fn cache_prefix(&mut self, table: &mut KvBlockTable, computed: &[u32]) {
        let block_size = self.block_size_tokens;
        let full_blocks = computed.len().min(table.tokens) / block_size;
        for index in table.keys.len()..full_blocks {
            let block_tokens = &computed[index * block_size..(index + 1) * block_size];
            let parent = table.keys.last().copied();
            let key = PrefixKey::new(parent, block_tokens);
            self.blocks.register(table.blocks[index], key, parent, block_tokens);
            table.keys.push(key);
        }
    }

    /// Forgets every cached prefix: blocks no sequence uses become free, and blocks in use are
    /// no longer offered to new sequences.
    pub fn flush_prefix_cache(&mut self) {
        self.blocks.flush();
    }

    /// Reserves the next `tokens` positions of `table`'s sequence, taking blocks from the free
    /// list as needed; returns the new positions. When too few blocks are free it fails with
    /// [`Error::KvCacheFull`] and changes nothing.
    pub fn append(&mut self, table: &mut KvBlockTable, tokens: usize) -> Result<Range<usize>> {
        if table.block_size_tokens != self.block_size_tokens {
            return Err(Error::InvalidBatch(format!(
                "the block table has blocks of {} tokens but this cache's are {}: it belongs to another cache",
                table.block_size_tokens, self.block_size_tokens
            )));
        }
        let end = table.tokens + tokens;
        let needed_blocks = end.div_ceil(self.block_size_tokens).saturating_sub(table.blocks.len());
        if needed_blocks > self.blocks.available_blocks() {
            return Err(Error::KvCacheFull {
                needed_blocks,
                free_blocks: self.blocks.available_blocks(),
                block_size_tokens: self.block_size_tokens,
            });
        }
        for _ in 0..needed_blocks {
            // Cannot fail: there were enough free blocks.
            table.blocks.extend(self.blocks.allocate());
        }
        let positions = table.tokens..end;
        table.tokens = end;
        Ok(positions)
    }

    /// Gives back the blocks of a finished (or aborted) sequence: those no other sequence uses
    /// become free, or cached when they hold a registered prefix.
    pub fn release(&mut self, table: KvBlockTable) {
        // Last block first: a cached prefix is evicted from its end, so what stays cached is
        // still reachable from the start.
        for block in table.blocks.into_iter().rev() {
            self.blocks.release(block);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::gpu;

    const SHAPE: KvCacheShape = KvCacheShape { layers: 2, kv_heads: 3, head_dim: 8 };

    #[test]
    fn appends_take_blocks_at_block_boundaries_and_release_returns_them() {
        let mut cache = KvCache::new(gpu(), SHAPE, 4, 21).unwrap();
        assert_eq!((cache.num_blocks(), cache.capacity_tokens()), (6, 24));
        let (mut a, mut b) = (cache.new_sequence(), cache.new_sequence());
        assert_eq!(cache.append(&mut a, 3).unwrap(), 0..3);
        assert_eq!(a.blocks(), [0]);
        assert_eq!(cache.append(&mut b, 5).unwrap(), 0..5);
        assert_eq!(b.blocks(), [1, 2]);
        assert_eq!(cache.append(&mut a, 1).unwrap(), 3..4);
        assert_eq!(a.blocks(), [0], "position 3 is the last of block 0");
        assert_eq!(cache.append(&mut a, 2).unwrap(), 4..6);
        assert_eq!(a.blocks(), [0, 3]);
        assert_eq!(cache.free_blocks(), 2);

        assert_eq!(a.slot(0), Some(0));
        assert_eq!(a.slot(5), Some(3 * 4 + 1));
        assert_eq!(b.slot(4), Some(2 * 4));
        assert_eq!(a.slot(6), None, "not reserved");

        cache.release(b);
        assert_eq!(cache.free_blocks(), 4);
        let mut c = cache.new_sequence();
        cache.append(&mut c, 16).unwrap();
        assert_eq!(c.blocks().len(), 4);
        assert_eq!(cache.free_blocks(), 0);
    }

    #[test]
    fn a_full_cache_is_an_error_that_changes_nothing() {
        let mut cache = KvCache::new(gpu(), SHAPE, 4, 8).unwrap();
        let mut a = cache.new_sequence();
        cache.append(&mut a, 6).unwrap();
        let mut b = cache.new_sequence();
        let err = cache.append(&mut b, 5).unwrap_err();
        assert!(
            matches!(err, Error::KvCacheFull { needed_blocks: 2, free_blocks: 0, block_size_tokens: 4 }),
            "{err}"
        );
        assert!(b.blocks().is_empty() && b.tokens() == 0);
        // Two more tokens still fit a's second block.
        assert_eq!(cache.append(&mut a, 2).unwrap(), 6..8);
        assert!(cache.append(&mut a, 1).is_err());
        assert_eq!(a.tokens(), 8);
    }

    #[test]
    fn released_prefixes_are_matched_shared_and_evicted_last() {
        let mut cache = KvCache::new(gpu(), SHAPE, 4, 24).unwrap();
        let prompt: Vec<u32> = (100..111).collect(); // 11 tokens: 2 full blocks and 3 more
        let mut a = cache.new_sequence();
        cache.append(&mut a, prompt.len()).unwrap();
        // Only what a forward pass has computed is registered: 6 tokens, 1 full block.
        cache.cache_prefix(&mut a, &prompt[..6]);
        cache.cache_prefix(&mut a, &prompt);
        let a_blocks = a.blocks().to_vec();
        cache.release(a);
        assert_eq!((cache.cached_blocks(), cache.used_blocks(), cache.free_blocks()), (2, 0, 6));

        let mut b = cache.match_prefix(&prompt, prompt.len() - 1);
        assert_eq!((b.tokens(), b.blocks()), (8, &a_blocks[..2]));
        let mut c = cache.match_prefix(&prompt[..9], 8);
        assert_eq!(c.blocks(), &a_blocks[..2], "shared by two tables at once");
        assert_eq!((cache.cached_blocks(), cache.used_blocks()), (0, 2));
        let short = cache.match_prefix(&prompt, 7);
        assert_eq!(short.tokens(), 4, "at most max_tokens");
        cache.release(short);
        let other: Vec<u32> = [100, 101, 102, 999].into();
        assert_eq!(cache.match_prefix(&other, 4).tokens(), 0, "a different block misses");

        // Appends after a match take fresh blocks; a matched table keeps the chain going.
        assert_eq!(cache.append(&mut b, 3).unwrap(), 8..11);
        cache.cache_prefix(&mut b, &prompt);
        cache.append(&mut c, 1).unwrap();
        cache.release(c);
        cache.release(b);
        cache.flush_prefix_cache();
        assert_eq!((cache.cached_blocks(), cache.free_blocks()), (0, cache.num_blocks()));
        assert_eq!(cache.match_prefix(&prompt, 10).tokens(), 0, "flushed");
    }

    #[test]
    fn eviction_takes_a_cached_prefix_from_its_end() {
        let mut cache = KvCache::new(gpu(), SHAPE, 4, 12).unwrap(); // 3 blocks
        let prompt: Vec<u32> = (0..8).collect();
        let mut a = cache.new_sequence();
        cache.append(&mut a, prompt.len()).unwrap();
        cache.cache_prefix(&mut a, &prompt);
        cache.release(a);
        // Two fresh blocks: the free one, then the cached prefix's last block.
        let mut b = cache.new_sequence();
        cache.append(&mut b, 8).unwrap();
        assert_eq!(cache.cached_blocks(), 1);
        let matched = cache.match_prefix(&prompt, prompt.len());
        assert_eq!(matched.tokens(), 4, "the prefix's first block is still reachable");
        cache.release(matched);
        cache.release(b);
    }

    #[test]
    fn tables_of_another_cache_are_refused() {
        let mut small_blocks = KvCache::new(gpu(), SHAPE, 4, 8).unwrap();
        let other = KvCache::new(gpu(), SHAPE, 16, 32).unwrap();
        let mut table = other.new_sequence();
        assert!(small_blocks.append(&mut table, 1).is_err());
    }

    #[test]
    fn layers_have_the_kernels_shape_and_oversized_caches_are_errors() {
        let cache = KvCache::new(gpu(), SHAPE, 4, 9).unwrap();
        // Heads of 8 f16 in 4 words.
        assert_eq!(cache.layer(1).k.shape(), [3, 4, 3, 4]);
        assert_eq!(cache.layer(0).v.shape(), [3, 4, 3, 4]);
        assert!(KvCache::new(gpu(), KvCacheShape { head_dim: 7, ..SHAPE }, 4, 9).is_err());
        let huge = KvCacheShape { layers: 1, kv_heads: 8, head_dim: 128 };
        let tokens = (gpu().max_binding_bytes() / huge.token_bytes_per_layer()) as usize + 1;
        let err = KvCache::new(gpu(), huge, 16, tokens).err().unwrap();
        assert!(err.to_string().contains("smaller token budget"), "{err}");
        assert!(KvCache::new(gpu(), SHAPE, 0, 8).is_err());
    }
}
