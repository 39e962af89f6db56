//! flint's OpenAI-compatible HTTP server (axum) in front of one [`LLM`]: `flint serve` runs it
//! on tokio, and the fuzz targets reach its request parser ([`openai`]) through this library.
//!
//! Every request becomes an engine request; the engine batches all of them together. Request
//! futures and response streams run on the host's tokio runtime and hold the engine's stream of
//! outputs: when a client goes away, hyper drops them, which aborts the request at the engine's
//! next step. The step loop itself runs on the `LLM`'s thread.

mod api_error;
pub mod openai;
mod prometheus;

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use flint_core::engine::GenerationStream;
use flint_core::openai::{ChoiceStream, EmbeddingRequest, Endpoint, Responder, Usage};
use futures::StreamExt;
use serde_json::json;

use crate::{GenerateOutput, LLM};
pub use api_error::ApiError;
use openai::{Plan, parse_request};

/// One served model, and what every handler shares.
pub struct Server {
    llm: LLM,
    /// The model's name in `/v1/models` and in every answer.
    model_id: String,
    /// More names `/v1/models` lists for it, after `model_id`.
    aliases: Vec<String>,
    /// When the server started, in Unix seconds (`created` of the model).
    started: u64,
    next_request: AtomicU64,
    /// The largest request body accepted.
    max_body_bytes: usize,
}

impl Server {
    /// A server of `llm` under the name `model_id`, listed in `/v1/models` under each of
    /// `aliases` too (a name given twice, or the same as `model_id`, is listed once), refusing
    /// request bodies larger than `max_body_bytes` with 413. A request naming any model is
    /// served by `llm`.
    pub fn new(llm: LLM, model_id: String, aliases: Vec<String>, max_body_bytes: usize) -> Arc<Self> {
        let mut listed: Vec<String> = Vec::with_capacity(aliases.len());
        for alias in aliases {
            if alias != model_id && !listed.contains(&alias) {
                listed.push(alias);
            }
        }
        Arc::new(Server {
            llm,
            model_id,
            aliases: listed,
            started: unix_now(),
            next_request: AtomicU64::new(0),
            max_body_bytes,
        })
    }

    /// The routes: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models`, `/health` and
    /// `/metrics` (Prometheus); anything else is OpenAI's 404.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/completions", post(completions))
            .route("/v1/embeddings", post(embeddings))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
            .layer(DefaultBodyLimit::max(self.max_body_bytes))
            .with_state(Arc::clone(self))
    }

    /// The served model's name.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The model it serves.
    pub fn llm(&self) -> &LLM {
        &self.llm
    }
}

async fn chat_completions(
    State(server): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(server, Endpoint::Chat, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(server): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(server, Endpoint::Completion, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn embeddings(State(server): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    embed(server, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// Parses and runs an embeddings request.
async fn embed(server: Arc<Server>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let request: EmbeddingRequest = parse_request(&read_body(&server, body)?)?;
    let inputs = request.token_inputs(server.llm.tokenizer()).map_err(openai::invalid_parameter)?;
    let embeddings = server.llm.engine()?.embed(inputs).await.map_err(openai::invalid_parameter)?;
    let response = request.response(&server.model_id, &embeddings).map_err(openai::invalid_parameter)?;
    Ok(Json(response).into_response())
}

/// A request's body, or the 413 (or other 4xx) of one that could not be read.
fn read_body(server: &Server, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            let message = format!(
                "the request body is larger than this server's limit of {} bytes (flint serve --max-body-bytes)",
                server.max_body_bytes
            );
            ApiError::invalid(message, None).with_status(status).with_code("request_too_large")
        } else {
            ApiError::invalid(rejection.body_text(), None).with_status(status)
        }
    })
}

/// Parses, checks and runs a request of either endpoint.
async fn generate(
    server: Arc<Server>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request = parse_request(&read_body(&server, body)?)?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    let id = format!("{prefix}-{}-{}", server.started, server.next_request.fetch_add(1, Ordering::Relaxed));
    let mut plan = openai::plan(request, endpoint, &server.llm, id.clone())?;
    let mut stream = server.llm.engine()?.generate(std::mem::take(&mut plan.request));
    // The first item comes after the prompt's prefill: an invalid request fails here with its
    // 400, before a streamed response commits to 200.
    let first = match stream.next().await {
        Some(item) => item?,
        None => return Err(server.llm.health().err().map_or_else(no_output, ApiError::from)),
    };
    let responder = Responder {
        endpoint,
        id,
        created: unix_now(),
        model: server.model_id.clone(),
        tool_format: plan.tool_format,
    };
    let answer = Answer { server, responder, plan };
    if answer.plan.stream { Ok(answer.stream(first, stream)) } else { answer.whole(first, stream).await }
}

fn no_output() -> ApiError {
    ApiError::from(flint_core::Error::EngineStopped("it ended the request without an output".into()))
}

/// One request on its way to the client.
struct Answer {
    server: Arc<Server>,
    /// Its objects, with one `id` and `created` for all the chunks of a stream.
    responder: Responder,
    plan: Plan,
}

impl Answer {
    /// An output's logprobs as the endpoint shows them; `text_offset` as [`openai::logprobs`].
    fn logprobs(&self, output: &GenerateOutput, text_offset: &mut usize) -> serde_json::Value {
        openai::logprobs(self.responder.endpoint, self.server.llm.tokenizer(), output, text_offset)
    }

    /// The whole answer as one JSON object.
    async fn whole(self, first: GenerateOutput, mut stream: GenerationStream) -> Result<Response, ApiError> {
        let mut outputs = vec![first];
        while let Some(item) = stream.next().await {
            outputs.push(item?);
        }
        if outputs.len() < self.plan.outputs {
            // The engine stopped before every sequence ended.
            return Err(self.server.llm.health().err().map_or_else(no_output, ApiError::from));
        }
        outputs.sort_by_key(|output| output.index);
        let mut usage = Usage::default();
        for output in &outputs {
            usage.add(output, self.plan.n);
        }
        let response = self.responder.response(&outputs, &usage, |output| self.logprobs(output, &mut 0));
        Ok(Json(response).into_response())
    }

    /// The answer as server-sent events: one chunk per output item, then `data: [DONE]`.
    fn stream(self, first: GenerateOutput, stream: GenerationStream) -> Response {
        let state = Streaming {
            answer: self,
            first: Some(first),
            stream,
            pending: VecDeque::new(),
            choices: HashMap::new(),
            offsets: Vec::new(),
            usage: Usage::default(),
            ended: 0,
            done: false,
        };
        let events = futures::stream::unfold(state, |mut state| async move {
            let event = state.next_event().await?;
            Some((Ok::<_, Infallible>(event), state))
        });
        let mut response = Sse::new(events).keep_alive(KeepAlive::default()).into_response();
        // Proxies must pass each event on as it comes.
        response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
        response
    }
}

/// The state of a streamed answer: the engine's stream, and the events made but not yet sent.
struct Streaming {
    answer: Answer,
    first: Option<GenerateOutput>,
    stream: GenerationStream,
    pending: VecDeque<Event>,
    /// What each choice has said so far: its first delta carries the role, and its tool calls
    /// are read as they come.
    choices: HashMap<usize, ChoiceStream>,
    /// Per choice, the length of its text so far (completions' logprobs `text_offset`).
    offsets: Vec<usize>,
    usage: Usage,
    /// Sequences whose last item was sent.
    ended: usize,
    done: bool,
}

impl Streaming {
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let item = match self.first.take() {
                Some(first) => Some(Ok(first)),
                None => self.stream.next().await,
            };
            match item {
                Some(Ok(output)) => self.push_output(output),
                Some(Err(error)) => self.push_end(Some(ApiError::from(error))),
                None if self.ended < self.answer.plan.outputs => {
                    let error = self.answer.server.llm.health().err().map_or_else(no_output, ApiError::from);
                    self.push_end(Some(error));
                }
                None => self.push_end(None),
            }
        }
    }

    fn push_output(&mut self, output: GenerateOutput) {
        if output.meta_info.finish_reason.is_some() {
            self.usage.add(&output, self.answer.plan.n);
            self.ended += 1;
        }
        if self.offsets.len() <= output.index {
            self.offsets.resize(output.index + 1, 0);
        }
        let logprobs = self.answer.logprobs(&output, &mut self.offsets[output.index]);
        let responder = &self.answer.responder;
        let choice = self.choices.entry(output.index).or_insert_with(|| responder.choice_stream());
        // A chunk that would say nothing yet (text that may open a tool call) waits.
        if let Some(chunk) = responder.chunk(choice, &output, logprobs) {
            self.pending.push_back(Event::default().data(chunk.to_string()));
        }
    }

    /// The stream's end: an error event if it failed, the usage chunk if asked, `[DONE]`.
    fn push_end(&mut self, error: Option<ApiError>) {
        if let Some(error) = error {
            self.pending.push_back(Event::default().data(error.body().to_string()));
        } else if self.answer.plan.include_usage {
            let chunk = self.answer.responder.usage_chunk(&self.usage);
            self.pending.push_back(Event::default().data(chunk.to_string()));
        }
        self.pending.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

/// The served model's id, then its aliases: one model under several names.
async fn models(State(server): State<Arc<Server>>) -> Json<serde_json::Value> {
    let data: Vec<serde_json::Value> = std::iter::once(&server.model_id)
        .chain(&server.aliases)
        .map(|id| json!({ "id": id, "object": "model", "created": server.started, "owned_by": "flint" }))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

async fn health(State(server): State<Arc<Server>>) -> Response {
    match server.llm.health() {
        Ok(()) => Json(json!({ "status": "ok" })).into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}

async fn metrics(State(server): State<Arc<Server>>) -> Response {
    match server.llm.metrics() {
        Ok(metrics) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            prometheus::exposition(&metrics),
        )
            .into_response(),
        Err(error) => ApiError::from(error).into_response(),
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
