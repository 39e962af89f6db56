//! Kernel sources, the small define pass that makes their variants, and the pipeline cache.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::gpu::{Encoder, GpuContext};
use crate::{Error, Result};

/// The WGSL of one kernel variant.
///
/// The source is `parts` concatenated in order (shared block decoders first, then the kernel
/// family's file), with `#if NAME` / `#else` / `#endif` lines resolved against `defines`
/// (see [`preprocess`]) and every define prepended as `const NAME = VALUE;`. The pipeline cache
/// keys on the entry point, the parts and the defines, so each variant compiles once.
#[derive(Clone, Debug)]
pub struct KernelSource {
    /// Entry point, also the label of the pipeline.
    pub entry: &'static str,
    /// Source files, concatenated in order.
    pub parts: Vec<&'static str>,
    /// `(NAME, VALUE)` pairs: each becomes `const NAME = VALUE;` and enables `#if NAME`
    /// unless VALUE is `false` or `0`.
    pub defines: Vec<(&'static str, String)>,
}

impl KernelSource {
    /// A kernel from its entry point and source parts, with no defines yet.
    pub fn new(entry: &'static str, parts: &[&'static str]) -> Self {
        KernelSource { entry, parts: parts.to_vec(), defines: Vec::new() }
    }

    /// Adds a define.
    pub fn define(mut self, name: &'static str, value: impl ToString) -> Self {
        self.defines.push((name, value.to_string()));
        self
    }

    /// The complete WGSL text of this variant.
    pub fn wgsl(&self) -> String {
        let mut out = String::new();
        for (name, value) in &self.defines {
            out.push_str(&format!("const {name} = {value};\n"));
        }
        let enabled = |name: &str| self.defines.iter().any(|(n, v)| *n == name && v != "false" && v != "0");
        for part in &self.parts {
            out.push_str(&preprocess(part, enabled));
            out.push('\n');
        }
        out
    }

    /// The parts by identity: they are `include_str!` statics, so their addresses name them.
    fn part_ids(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.parts.iter().map(|p| (p.as_ptr() as usize, p.len()))
    }

    fn key(&self) -> PipelineKey {
        PipelineKey { entry: self.entry, parts: self.part_ids().collect(), defines: self.defines.clone() }
    }

    /// Hashes what [`PipelineKey`] holds, as its `Hash` does, without building one.
    fn hash_key(&self, hasher: &impl BuildHasher) -> u64 {
        let mut state = hasher.build_hasher();
        self.entry.hash(&mut state);
        self.parts.len().hash(&mut state);
        self.part_ids().for_each(|id| id.hash(&mut state));
        self.defines.hash(&mut state);
        state.finish()
    }

    /// Whether `key` is this source's.
    fn is_key(&self, key: &PipelineKey) -> bool {
        self.entry == key.entry
            && self.part_ids().eq(key.parts.iter().copied())
            && self.defines == key.defines
    }
}

/// Resolves `#if NAME`, `#else` and `#endif` lines (nestable); lines inside a false branch are
/// dropped. `#if !NAME` negates.
pub fn preprocess(source: &str, enabled: impl Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(source.len());
    // One entry per open `#if`: (this branch is taken, some enclosing branch is not taken).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &[(bool, bool)]| stack.last().is_none_or(|&(taken, outer_off)| taken && !outer_off);
    for line in source.lines() {
        let trimmed = line.trim_start();
        if let Some(cond) = trimmed.strip_prefix("#if ") {
            let cond = cond.trim();
            let value = match cond.strip_prefix('!') {
                Some(name) => !enabled(name.trim()),
                None => enabled(cond),
            };
            let outer_off = !active(&stack);
            stack.push((value, outer_off));
        } else if trimmed.starts_with("#else") {
            if let Some(top) = stack.last_mut() {
                top.0 = !top.0;
            }
        } else if trimmed.starts_with("#endif") {
            stack.pop();
        } else if active(&stack) {
            out.push_str(line);
            out.push('\n');
        } else {
            // Keep line numbers of naga's error messages equal to the source file's.
            out.push('\n');
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct PipelineKey {
    entry: &'static str,
    parts: Vec<(usize, usize)>,
    defines: Vec<(&'static str, String)>,
}

/// Compiled pipelines by variant: a kernel is compiled the first time it is used, never again.
/// Looked up once per dispatch, from the source's fields: nothing is cloned to find a pipeline.
/// Kernels whose sources take long to build (the matmul's ~25 defines) look theirs up by a
/// recipe of their own instead ([`GpuContext::pipeline_by_recipe`]).
#[derive(Default)]
pub(crate) struct PipelineCache {
    pipelines: Mutex<HashTable<CachedPipeline>>,
    hasher: DefaultHashBuilder,
    /// Per recipe type, a `HashMap<Recipe, Compiled>`.
    by_recipe: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
}

/// A compiled kernel: its pipeline and its entry point (the label of its dispatches).
#[derive(Clone)]
pub struct Compiled {
    /// The kernel's entry point.
    pub entry: &'static str,
    /// Its pipeline.
    pub pipeline: Arc<wgpu::ComputePipeline>,
}

struct CachedPipeline {
    hash: u64,
    key: PipelineKey,
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl GpuContext {
    /// The compiled pipeline of `source`, compiled now if this is its first use.
    pub fn pipeline(&self, source: &KernelSource) -> Result<Arc<wgpu::ComputePipeline>> {
        let hash = source.hash_key(&self.pipelines.hasher);
        let mut pipelines =
            self.pipelines.pipelines.lock().map_err(|_| Error::Gpu("pipeline cache poisoned".into()))?;
        if let Some(cached) = pipelines.find(hash, |cached| source.is_key(&cached.key)) {
            return Ok(Arc::clone(&cached.pipeline));
        }
        self.created_pipelines.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let module = self.device().create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(source.entry),
            source: wgpu::ShaderSource::Wgsl(source.wgsl().into()),
        });
        let pipeline = self.device().create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(source.entry),
            layout: None,
            module: &module,
            entry_point: Some(source.entry),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        // A shader that does not compile is a bug in flint, reported here and not at submit.
        self.check_errors().map_err(|e| Error::Gpu(format!("compiling kernel '{}': {e}", source.entry)))?;
        let pipeline = Arc::new(pipeline);
        let cached = CachedPipeline { hash, key: source.key(), pipeline: Arc::clone(&pipeline) };
        pipelines.insert_unique(hash, cached, |cached| cached.hash);
        Ok(pipeline)
    }

    /// The compiled kernel of `recipe`, a kernel's own description of a variant (its type tells
    /// kernels apart): found without building the source, which `source` builds the first time.
    /// Two recipes of one type must be equal exactly when their sources are.
    pub(crate) fn pipeline_by_recipe<R: Hash + Eq + Send + 'static>(
        &self,
        recipe: R,
        source: impl FnOnce() -> KernelSource,
    ) -> Result<Compiled> {
        let lookup = |by_recipe: &mut HashMap<TypeId, Box<dyn Any + Send>>| {
            by_recipe
                .get(&TypeId::of::<R>())
                .and_then(|map| map.downcast_ref::<HashMap<R, Compiled>>())
                .and_then(|map| map.get(&recipe).cloned())
        };
        let poisoned = || Error::Gpu("pipeline cache poisoned".into());
        if let Some(compiled) = lookup(&mut *self.pipelines.by_recipe.lock().map_err(|_| poisoned())?) {
            return Ok(compiled);
        }
        // Compiled with the recipe cache unlocked: `pipeline` takes the other lock.
        let source = source();
        let compiled = Compiled { entry: source.entry, pipeline: self.pipeline(&source)? };
        let mut by_recipe = self.pipelines.by_recipe.lock().map_err(|_| poisoned())?;
        let map =
            by_recipe.entry(TypeId::of::<R>()).or_insert_with(|| Box::new(HashMap::<R, Compiled>::new()));
        if let Some(map) = map.downcast_mut::<HashMap<R, Compiled>>() {
            map.insert(recipe, compiled.clone());
        }
        Ok(compiled)
    }

    /// Records one dispatch of `source` with `resources` bound in order to `@binding(0..)` of
    /// `@group(0)`: into the encoder's open pass, or into a timed pass of its own while a
    /// profile is open.
    pub fn dispatch(
        &self,
        encoder: &mut Encoder,
        source: &KernelSource,
        resources: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let compiled = Compiled { entry: source.entry, pipeline: self.pipeline(source)? };
        self.dispatch_compiled(encoder, &compiled, resources, workgroups)
    }

    /// [`GpuContext::dispatch`] of a kernel already compiled.
    pub(crate) fn dispatch_compiled(
        &self,
        encoder: &mut Encoder,
        compiled: &Compiled,
        resources: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) -> Result<()> {
        let (pipeline, entry) = (&compiled.pipeline, compiled.entry);
        let create = || {
            let entries: Vec<wgpu::BindGroupEntry<'_>> = resources
                .iter()
                .enumerate()
                .map(|(i, resource)| wgpu::BindGroupEntry { binding: i as u32, resource: resource.clone() })
                .collect();
            self.created_bind_groups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.device().create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(entry),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        };
        let bind_group = match encoder.bind_groups() {
            Some(cache) => cache.get_or_create(pipeline, resources, create),
            None => create(),
        };
        let record = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        };
        let mut profile = self.lock_profile()?;
        match profile.as_mut() {
            Some(profile) => record(&mut encoder.timed_pass(entry, profile.next_pass(entry))),
            None => record(encoder.shared_pass()),
        }
        self.dispatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Workgroup counts for `groups` workgroups in total, spread over x and y when `groups`
    /// exceeds the per-dimension limit (65535 on most devices). Kernels recover the linear index
    /// as `wg.x + wg.y * num_workgroups.x` and must ignore indices past the end.
    pub fn grid(&self, groups: u32) -> [u32; 3] {
        let max = self.limits().max_compute_workgroups_per_dimension.max(1);
        if groups <= max { [groups.max(1), 1, 1] } else { [max, groups.div_ceil(max), 1] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_resolves_nested_branches() {
        let src = "a\n#if X\nb\n#if Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\n#if !Y\nf\n#endif\ng";
        let on = |set: &'static [&'static str]| move |n: &str| set.contains(&n);
        let lines = |s: String| s.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>().join("");
        assert_eq!(lines(preprocess(src, on(&["X", "Y"]))), "abcg");
        assert_eq!(lines(preprocess(src, on(&["X"]))), "abdfg");
        assert_eq!(lines(preprocess(src, on(&[]))), "aefg");
        assert_eq!(lines(preprocess(src, on(&["Y"]))), "aeg");
    }

    #[test]
    fn defines_become_consts_and_false_disables() {
        let src = KernelSource::new("main", &["#if FAST\nfast\n#else\nslow\n#endif"])
            .define("FAST", false)
            .define("WG", 64);
        let wgsl = src.wgsl();
        assert!(wgsl.contains("const FAST = false;"));
        assert!(wgsl.contains("const WG = 64;"));
        assert!(wgsl.contains("slow") && !wgsl.contains("fast\n"));
    }
}
