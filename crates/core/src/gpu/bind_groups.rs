//! [`BindGroupCache`]: bind groups kept from one forward pass to the next.
//!
//! A decode step records the same dispatches over the same buffers step after step: the
//! weights, the KV cache, and activations and parameter blocks that the buffer pool hands out
//! again in the same order. Each dispatch needs a bind group naming its pipeline's resources;
//! made anew, it is a validated driver object per dispatch. Here a bind group is kept under
//! its pipeline and resources (buffers with their offsets and sizes, texture views) and found
//! again when a later dispatch names the same ones.
//!
//! A kept bind group holds its buffers alive. So entries not used in the last
//! [`KEPT_PASSES`] passes are dropped as each pass ends (a buffer the pool frees is idle far
//! longer), and the owner clears the cache where it lets buffers go at once: a model when it
//! makes a new KV cache, the engine when it runs out of work.

use std::hash::{BuildHasher, Hash, Hasher};
use std::num::NonZeroU64;
use std::sync::Mutex;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Passes a bind group is kept without being used: a decode step alternates between few
/// assignments of pooled buffers, and a prefill chunk between decode steps does not evict them.
const KEPT_PASSES: u64 = 4;

/// Bind groups by pipeline and resources, with the pass that last used each. A lookup hashes
/// and compares the dispatch's own resources: only a bind group made anew clones them.
#[derive(Default)]
pub struct BindGroupCache {
    state: Mutex<CacheState>,
    hasher: DefaultHashBuilder,
}

#[derive(Default)]
struct CacheState {
    entries: HashTable<Entry>,
    /// Passes ended so far.
    pass: u64,
}

struct Entry {
    hash: u64,
    pipeline: wgpu::ComputePipeline,
    resources: Vec<ResourceKey>,
    bind_group: wgpu::BindGroup,
    last_used: u64,
}

/// One binding, by the identity of what it names (the clones keep it from being reused).
enum ResourceKey {
    Buffer { buffer: wgpu::Buffer, offset: u64, size: Option<NonZeroU64> },
    TextureView(wgpu::TextureView),
}

impl ResourceKey {
    /// The key of `resource`, or None for kinds flint does not bind (never cached).
    fn of(resource: &wgpu::BindingResource<'_>) -> Option<Self> {
        match resource {
            wgpu::BindingResource::Buffer(binding) => Some(ResourceKey::Buffer {
                buffer: binding.buffer.clone(),
                offset: binding.offset,
                size: binding.size,
            }),
            wgpu::BindingResource::TextureView(view) => Some(ResourceKey::TextureView((*view).clone())),
            _ => None,
        }
    }

    /// Whether this names `resource`.
    fn names(&self, resource: &wgpu::BindingResource<'_>) -> bool {
        match (self, resource) {
            (ResourceKey::Buffer { buffer, offset, size }, wgpu::BindingResource::Buffer(binding)) => {
                buffer == binding.buffer && *offset == binding.offset && *size == binding.size
            }
            (ResourceKey::TextureView(view), wgpu::BindingResource::TextureView(other)) => view == *other,
            _ => false,
        }
    }
}

/// Whether every resource is of a kind the cache keeps.
fn cacheable(resources: &[wgpu::BindingResource<'_>]) -> bool {
    resources.iter().all(|resource| {
        matches!(resource, wgpu::BindingResource::Buffer(_) | wgpu::BindingResource::TextureView(_))
    })
}

impl BindGroupCache {
    /// The bind group of `pipeline` over `resources` (binding `i` is `resources[i]`): the kept
    /// one, or one made now by `create` and kept.
    pub(crate) fn get_or_create(
        &self,
        pipeline: &wgpu::ComputePipeline,
        resources: &[wgpu::BindingResource<'_>],
        create: impl FnOnce() -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        if !cacheable(resources) {
            return create();
        }
        let hash = self.hash(pipeline, resources);
        let mut state = self.lock();
        let pass = state.pass;
        let found = state.entries.find_mut(hash, |entry| {
            entry.pipeline == *pipeline
                && entry.resources.len() == resources.len()
                && entry.resources.iter().zip(resources).all(|(key, resource)| key.names(resource))
        });
        if let Some(entry) = found {
            entry.last_used = pass;
            return entry.bind_group.clone();
        }
        let bind_group = create();
        let entry = Entry {
            hash,
            pipeline: pipeline.clone(),
            resources: resources.iter().filter_map(ResourceKey::of).collect(),
            bind_group: bind_group.clone(),
            last_used: pass,
        };
        state.entries.insert_unique(hash, entry, |entry| entry.hash);
        bind_group
    }

    /// The hash of a bind group's key, from the dispatch's own resources.
    fn hash(&self, pipeline: &wgpu::ComputePipeline, resources: &[wgpu::BindingResource<'_>]) -> u64 {
        let mut state = self.hasher.build_hasher();
        pipeline.hash(&mut state);
        for resource in resources {
            match resource {
                wgpu::BindingResource::Buffer(binding) => {
                    binding.buffer.hash(&mut state);
                    (binding.offset, binding.size).hash(&mut state);
                }
                wgpu::BindingResource::TextureView(view) => view.hash(&mut state),
                _ => {}
            }
        }
        state.finish()
    }

    /// Ends a pass: drops the bind groups no dispatch of the last [`KEPT_PASSES`] passes used.
    pub(crate) fn end_pass(&self) {
        let mut state = self.lock();
        let pass = state.pass;
        state.entries.retain(|entry| pass - entry.last_used < KEPT_PASSES);
        state.pass += 1;
    }

    /// Drops every kept bind group, and with them what they held alive.
    pub fn clear(&self) {
        self.lock().entries.clear();
    }

    /// Bind groups kept now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // Every change is one insert or retain: the state stays consistent through a panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::gpu::Tensor;
    use crate::kernels::copy::copy;
    use crate::kernels::testing::gpu;

    /// Copies `src` into `dst` in one pass of an encoder that keeps its bind groups in `cache`.
    fn copy_pass(cache: &Arc<BindGroupCache>, src: &Tensor, dst: &Tensor) {
        let ctx = gpu();
        let mut encoder = ctx.encoder("test");
        encoder.keep_bind_groups(Arc::clone(cache));
        copy(ctx, &mut encoder, src, dst).unwrap();
        ctx.submit(encoder).unwrap();
    }

    #[test]
    fn kept_bind_groups_are_found_again_and_dropped_when_unused() {
        let ctx = gpu();
        let cache = Arc::new(BindGroupCache::default());
        let values = |first: f32| (0..8).map(|i| first + i as f32).collect::<Vec<f32>>();
        let a = Tensor::from_slice(ctx, "a", &[8], &values(1.0)).unwrap();
        let b = Tensor::from_slice(ctx, "b", &[8], &values(100.0)).unwrap();
        let out = Tensor::empty(ctx, "out", &[8]).unwrap();
        let read = |t: &Tensor| pollster::block_on(t.to_f32(ctx)).unwrap();

        copy_pass(&cache, &a, &out);
        assert_eq!(read(&out), values(1.0));
        // The same pipeline and buffers: the kept bind group, still binding what it did.
        copy_pass(&cache, &a, &out);
        assert_eq!(cache.len(), 1);
        // Another source is another bind group; the kept one goes on reading `a`.
        copy_pass(&cache, &b, &out);
        assert_eq!((cache.len(), read(&out)), (2, values(100.0)));
        copy_pass(&cache, &a, &out);
        assert_eq!((cache.len(), read(&out)), (2, values(1.0)));

        // Unused for KEPT_PASSES passes, a bind group is dropped; used ones stay.
        for _ in 0..KEPT_PASSES {
            copy_pass(&cache, &a, &out);
        }
        assert_eq!(cache.len(), 1);
        cache.clear();
        assert!(cache.is_empty());
        // An encoder without a cache keeps nothing.
        let mut encoder = ctx.encoder("test");
        copy(ctx, &mut encoder, &b, &out).unwrap();
        ctx.submit(encoder).unwrap();
        assert!(cache.is_empty() && read(&out) == values(100.0));
    }
}
