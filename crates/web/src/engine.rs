//! The `Engine` class: a model loaded onto the browser's WebGPU device, its step loop spawned
//! on the page's (or the worker's) event loop, and requests as [`OutputStream`]s.
//!
//! Everything crosses the boundary as JSON text: the JS wrapper (`js/flint.js`) turns it into
//! objects, async iterators and promises, opens a URL, `Blob` or buffer as a [`ModelSource`]
//! the model is read from piece by piece, and connects `AbortSignal`s to
//! [`OutputStream::abort`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use flint_core::chat::ChatMessage;
use flint_core::engine::{EngineOptions, GenerateOutput, GenerationStream, LoadedModel};
use flint_core::gpu::{GpuContext, GpuOptions};
use flint_core::openai::{ChoiceStream, EmbeddingRequest, Endpoint, OpenAiRequest, Responder, Usage};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use wasm_bindgen::prelude::*;

use crate::error::{Error, Result, from_json};
use crate::openai;
use crate::params::generate_request;
use crate::source::ModelSource;

/// How to load a model: the engine's batching and cache options, in the JS wrapper's names.
#[derive(Default, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
struct LoadOptions {
    /// The model's name in responses; by default the file's `general.name`.
    model: Option<String>,
    /// Tokens the KV cache holds over all sequences (see `EngineOptions::kv_cache_tokens`).
    kv_cache_tokens: Option<usize>,
    max_running: Option<usize>,
    step_token_budget: Option<usize>,
    prefix_cache: Option<bool>,
    /// Submit each greedy decode step before reading the last one back (see
    /// `EngineOptions::overlap_steps`).
    overlap_steps: Option<bool>,
    /// Seeds the samplers of requests without a seed; by default one from `Math.random()`.
    seed: Option<u64>,
    /// A Jinja chat template used in place of the file's own (`tokenizer.chat_template`).
    chat_template: Option<String>,
}

/// A model on the GPU, serving requests. Made by `Engine.load`; `unload()` lets it go.
#[wasm_bindgen]
pub struct Engine {
    loaded: RefCell<Option<Rc<Loaded>>>,
}

struct Loaded {
    model: LoadedModel,
    /// Its name in responses.
    name: String,
    info: Value,
}

#[wasm_bindgen]
impl Engine {
    /// Loads a GGUF model from `source` (see [`ModelSource`]) onto the browser's WebGPU device,
    /// tensor by tensor, and starts the engine's step loop. `options` is a JSON object (see
    /// `LoadOptions`) or `null`; `on_progress(loaded, total)`, when given, is called with the
    /// file's bytes read and uploaded so far and its size.
    pub async fn load(
        source: ModelSource,
        options: String,
        on_progress: Option<js_sys::Function>,
    ) -> Result<Engine, JsError> {
        crate::install_panic_hook();
        Ok(Engine::load_inner(&source, &options, on_progress).await?)
    }

    /// What is loaded, as JSON: the model's name, architecture and context, and the device.
    pub fn info(&self) -> Result<String, JsError> {
        Ok(self.loaded()?.info.to_string())
    }

    /// The engine's metrics as JSON (running and waiting sequences, KV blocks used and free,
    /// tokens generated, tokens per second...).
    pub fn metrics(&self) -> Result<String, JsError> {
        let metrics = self.loaded()?.model.engine().metrics();
        Ok(serde_json::to_string(&metrics).map_err(Error::from)?)
    }

    /// Submits a request: `prompt` is a JSON string or array of token ids, `params` a JSON object
    /// of sampling parameters and request fields (see `params.rs`) or `null`. Each item of the
    /// stream is a `GenerateOutput` as JSON: with `stream`, the text and token ids since the
    /// previous item; without, one item per sequence when it ends.
    pub fn request(&self, prompt: &str, params: &str, stream: bool) -> Result<OutputStream, JsError> {
        let loaded = self.loaded()?;
        let mut request = generate_request(prompt, params, stream)?;
        let rid = request.rid.get_or_insert_with(|| next_id("web")).clone();
        Ok(OutputStream::new(loaded.model.engine(), request, rid, Shape::Outputs))
    }

    /// Submits an OpenAI chat completion request (`body`, JSON). With `stream: true` each item
    /// is a `chat.completion.chunk` object as JSON (and a last usage chunk when
    /// `stream_options.include_usage` asks for one); without, the one item is the
    /// `chat.completion` response.
    pub fn chat(&self, body: &str) -> Result<OutputStream, JsError> {
        let loaded = self.loaded()?;
        let request: OpenAiRequest = from_json(body, "request")?;
        let id = next_id("chatcmpl");
        let model = &loaded.model;
        let tool_use = request
            .tool_use(model.tool_format(), model.engine().tokenizer())
            .map_err(|error| openai::chat_error(error.into()))?;
        let encode =
            |messages: &[ChatMessage], tools: &[Value]| Ok(model.encode_chat_with_tools(messages, tools)?);
        let plan = openai::plan(request, tool_use, encode, model.max_sequence_tokens(), id.clone())?;
        let responder = Responder {
            endpoint: Endpoint::Chat,
            id: id.clone(),
            created: (js_sys::Date::now() / 1000.0) as u64,
            model: plan.model.unwrap_or_else(|| loaded.name.clone()),
            tool_format: plan.tool_format,
        };
        let n = plan.request.sampling.n;
        let shape = if plan.stream {
            Shape::ChatChunks {
                responder,
                n,
                include_usage: plan.include_usage,
                usage: Usage::default(),
                choices: HashMap::new(),
            }
        } else {
            Shape::ChatResponse { responder, n }
        };
        Ok(OutputStream::new(loaded.model.engine(), plan.request, id, shape))
    }

    /// Answers an OpenAI embeddings request (`body`, JSON: `input` a text, texts, token ids or
    /// lists of them; `encoding_format` float or base64) with the response as JSON: one
    /// unit-length vector per input, pooled as the model's file says.
    pub async fn embed(&self, body: String) -> Result<String, JsError> {
        let loaded = self.loaded()?;
        let request: EmbeddingRequest = from_json(&body, "request")?;
        let engine = loaded.model.engine();
        let inputs =
            request.token_inputs(engine.tokenizer()).map_err(|error| openai::chat_error(error.into()))?;
        let embeddings = engine.embed(inputs).await.map_err(|error| openai::chat_error(error.into()))?;
        let model = request.model.clone().unwrap_or_else(|| loaded.name.clone());
        Ok(request.response(&model, &embeddings).map_err(Error::from)?.to_string())
    }

    /// Lets the model go: later calls fail, and once the requests still streaming end (the JS
    /// wrapper aborts them) the step loop ends and the model's GPU buffers are freed.
    pub fn unload(&self) {
        self.loaded.borrow_mut().take();
    }
}

impl Engine {
    async fn load_inner(
        source: &ModelSource,
        options: &str,
        on_progress: Option<js_sys::Function>,
    ) -> Result<Engine> {
        let options: Option<LoadOptions> = from_json(options, "options")?;
        let options = options.unwrap_or_default();
        let file = source.open().await?;
        let ctx = GpuContext::new(&GpuOptions::default()).await?;
        let defaults = EngineOptions::default();
        let engine_options = EngineOptions {
            max_running: options.max_running.unwrap_or(defaults.max_running),
            step_token_budget: options.step_token_budget.unwrap_or(defaults.step_token_budget),
            kv_cache_tokens: options.kv_cache_tokens,
            prefix_cache: options.prefix_cache.unwrap_or(defaults.prefix_cache),
            overlap_steps: options.overlap_steps,
            // The core has no entropy of its own in the browser.
            seed: options.seed.unwrap_or_else(|| (js_sys::Math::random() * 2f64.powi(53)) as u64),
        };
        let mut upload = LoadedModel::begin_load(
            ctx.clone(),
            &file,
            engine_options,
            "the model",
            options.chat_template.as_deref(),
        )?;
        let progress = |loaded: u64, total: u64| {
            if let Some(callback) = &on_progress {
                // A throwing callback does not stop the load.
                let _ = callback.call2(&JsValue::NULL, &(loaded as f64).into(), &(total as f64).into());
            }
        };
        source.upload(&ctx, &mut upload, progress).await?;
        let (model, step_loop) = upload.finish()?;
        wasm_bindgen_futures::spawn_local(step_loop.run());

        let name = match options.model {
            Some(name) => name,
            None => file.metadata().optional::<&str>("general.name")?.unwrap_or("flint").to_string(),
        };
        let config = model.config();
        let info = json!({
            "model": name,
            "architecture": format!("{:?}", config.architecture),
            "context_length": config.context_length,
            "max_sequence_tokens": model.max_sequence_tokens(),
            "vocab_size": config.vocab_size,
            "chat_template": model.chat_template().is_ok(),
            "device": ctx.describe(),
        });
        let loaded = Loaded { model, name, info };
        Ok(Engine { loaded: RefCell::new(Some(Rc::new(loaded))) })
    }

    fn loaded(&self) -> Result<Rc<Loaded>> {
        self.loaded.borrow().clone().ok_or(Error::Unloaded)
    }
}

/// A new id with `prefix`, unique in this page (or worker).
fn next_id(prefix: &str) -> String {
    thread_local!(static NEXT: Cell<u64> = const { Cell::new(0) });
    let count = NEXT.with(|next| next.replace(next.get() + 1));
    format!("{prefix}-{}-{count}", js_sys::Date::now() as u64)
}

/// What the items of an [`OutputStream`] are.
enum Shape {
    /// The engine's `GenerateOutput`s.
    Outputs,
    /// OpenAI chat chunks; `choices` holds what each choice said so far.
    ChatChunks {
        responder: Responder,
        n: usize,
        include_usage: bool,
        usage: Usage,
        choices: HashMap<usize, ChoiceStream>,
    },
    /// One OpenAI chat response, from all the outputs.
    ChatResponse { responder: Responder, n: usize },
}

/// The outputs of one request, one `next()` at a time (the JS wrapper makes an async iterator
/// of it). `abort()` ends the request with `finish_reason` abort (a last item still comes);
/// `close()` drops it, which aborts it too, with no more items. Either frees its KV blocks at
/// the engine's next step.
#[wasm_bindgen]
pub struct OutputStream {
    state: Rc<RefCell<StreamState>>,
    engine: flint_core::engine::Engine,
    rid: String,
}

struct StreamState {
    /// `None` once the request's stream ended or was closed, and while a `next()` awaits it.
    items: Option<GenerationStream>,
    /// A `next()` is awaiting `items`.
    busy: bool,
    /// `close()` was called: the stream is dropped as soon as no `next()` holds it.
    closed: bool,
    shape: Shape,
    /// A chat usage chunk to give after the last output.
    pending_usage: Option<String>,
}

#[wasm_bindgen]
impl OutputStream {
    /// The request's id (its `rid`; for chat, the response's `id`).
    #[wasm_bindgen(getter)]
    pub fn rid(&self) -> String {
        self.rid.clone()
    }

    /// A promise of the next item as JSON, or `undefined` after the last one. Rejects with an
    /// `Error` when the request failed (a parameter out of range names it), or when called
    /// before the previous `next()` settled.
    pub fn next(&self) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            match next_item(&state).await {
                Ok(Some(json)) => Ok(JsValue::from_str(&json)),
                Ok(None) => Ok(JsValue::UNDEFINED),
                Err(error) => Err(JsError::from(error).into()),
            }
        })
    }

    /// Aborts the request: it ends with `finish_reason` abort at the engine's next step, and
    /// its KV blocks are freed.
    pub fn abort(&self) {
        self.engine.abort(&self.rid);
    }

    /// Drops the request's stream (aborting it if it runs): no more items.
    pub fn close(&self) {
        let mut state = self.state.borrow_mut();
        state.closed = true;
        state.items = None;
        state.pending_usage = None;
    }
}

impl OutputStream {
    fn new(
        engine: &flint_core::engine::Engine,
        request: flint_core::engine::GenerateRequest,
        rid: String,
        shape: Shape,
    ) -> OutputStream {
        let items = engine.generate(request);
        let state =
            StreamState { items: Some(items), busy: false, closed: false, shape, pending_usage: None };
        OutputStream { state: Rc::new(RefCell::new(state)), engine: engine.clone(), rid }
    }
}

/// The next raw output of the request, with the stream put back for the next call.
async fn next_output(state: &RefCell<StreamState>) -> Result<Option<GenerateOutput>> {
    let mut items = {
        let mut state = state.borrow_mut();
        if state.busy {
            return Err(Error::ConcurrentNext);
        }
        match state.items.take() {
            Some(items) => items,
            None => return Ok(None),
        }
    };
    state.borrow_mut().busy = true;
    let item = items.next().await;
    let mut state = state.borrow_mut();
    state.busy = false;
    if item.is_some() && !state.closed {
        state.items = Some(items);
    }
    Ok(item.transpose()?)
}

/// The next item in the stream's shape, as JSON; for a chat, an error names the parameter as
/// the request named it.
async fn next_item(state: &RefCell<StreamState>) -> Result<Option<String>> {
    let chat = !matches!(state.borrow().shape, Shape::Outputs);
    let item = next_shaped_item(state).await;
    if chat { item.map_err(openai::chat_error) } else { item }
}

async fn next_shaped_item(state: &RefCell<StreamState>) -> Result<Option<String>> {
    let response = matches!(state.borrow().shape, Shape::ChatResponse { .. });
    if response {
        let mut outputs = Vec::new();
        while let Some(output) = next_output(state).await? {
            outputs.push(output);
        }
        if outputs.is_empty() {
            return Ok(None);
        }
        outputs.sort_by_key(|output| output.index);
        let state = state.borrow();
        let Shape::ChatResponse { responder, n } = &state.shape else { return Ok(None) };
        let mut usage = Usage::default();
        for output in &outputs {
            usage.add(output, *n);
        }
        // No choice has logprobs: the browser refuses them (`openai::plan`).
        return Ok(Some(responder.response(&outputs, &usage, |_| Value::Null).to_string()));
    }
    loop {
        let Some(output) = next_output(state).await? else {
            return Ok(state.borrow_mut().pending_usage.take());
        };
        let mut state = state.borrow_mut();
        let state = &mut *state;
        let json = match &mut state.shape {
            Shape::Outputs | Shape::ChatResponse { .. } => Some(serde_json::to_string(&output)?),
            Shape::ChatChunks { responder, n, include_usage, usage, choices } => {
                if output.meta_info.finish_reason.is_some() {
                    usage.add(&output, *n);
                    if *include_usage {
                        state.pending_usage = Some(responder.usage_chunk(usage).to_string());
                    }
                }
                let choice = choices.entry(output.index).or_insert_with(|| responder.choice_stream());
                // A chunk that would say nothing yet (text that may open a tool call) waits.
                responder.chunk(choice, &output, Value::Null).map(|chunk| chunk.to_string())
            }
        };
        if json.is_some() {
            return Ok(json);
        }
    }
}
