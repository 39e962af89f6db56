// Types of flint's JS API (flint.js). Field names of requests and outputs are those of the
// engine's request contract (ARCHITECTURE.md, "The request contract") and of OpenAI's chat API.

/** Loads the wasm module once (Engine.load does); pass where the .wasm file is if it is not beside pkg/flint_web.js. */
export function init(moduleOrPath?: string | URL | Request | Response | BufferSource | WebAssembly.Module): Promise<unknown>;

/** A model source: a URL to fetch, the file's bytes, or a Blob/File. The wasm side reads it a tensor at a time; the page never holds the whole file (a URL is downloaded into the Cache API or a Blob first). */
export type ModelSource = string | URL | ArrayBuffer | ArrayBufferView | Blob;

/** What a load is doing: 'download' while a URL's bytes arrive (only when they are not in the browser's cache), then 'upload' while the model's tensors are read and uploaded to the GPU. */
export type LoadStage = 'download' | 'upload';

/**
 * Called as a model loads. Each stage counts bytes from 0 to its own `total` and ends with a call where `loaded === total`;
 * `total` is null while a download's size is unknown (the server did not say, or the response is compressed).
 * A single bar: show `loaded / total` and name the stage, or give 'download' the first part of the bar when there is one.
 */
export type ProgressCallback = (loaded: number, total: number | null, stage: LoadStage) => void;

export interface LoadOptions {
  onProgress?: ProgressCallback;
  /** Download a model from a URL into the browser's Cache API and read it from there, now and next time (true); false downloads it into a temporary file of the origin's private file system (a Blob where there is none), deleted once loaded. */
  cache?: boolean;
  /** The model's name in responses; by default the file's general.name. */
  model?: string;
  /** Tokens the KV cache holds over all sequences; by default as many as the memory plan finds room for, up to the model's context; a browser does not say how much GPU memory there is, so at most 2 GiB of cache (16k tokens of a Llama-3.1-8B, 64k of a Llama-3.2-1B). A size that cannot fit fails the load before any upload. */
  kvCacheTokens?: number;
  /** Sequences in the running batch at most (32). */
  maxRunning?: number;
  /** Tokens per forward pass at most (256). */
  stepTokenBudget?: number;
  /** Reuse the KV blocks of shared prompt prefixes (true). */
  prefixCache?: boolean;
  /** Submit each greedy decode step before reading the one before it back, so the GPU does not wait for the page (true on GPUs, false on CPU devices); outputs are the same either way. */
  overlapSteps?: boolean;
  /** Seeds the samplers of requests without a seed; by default a random one. */
  seed?: number;
  /** A Jinja chat template used in place of the model file's own, for a file without one or with one that does not render tools; one that does not compile fails the load. */
  chatTemplate?: string;
}

/** Sampling parameters and request fields of `generate` and `stream`. Out-of-range values reject with an Error naming the field. */
export interface GenerateParams {
  max_new_tokens?: number;
  min_new_tokens?: number;
  /** 0 is greedy. */
  temperature?: number;
  top_p?: number;
  /** -1 is off. */
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
  stop?: string[];
  stop_token_ids?: number[];
  ignore_eos?: boolean;
  skip_special_tokens?: boolean;
  seed?: number;
  /** Parallel samples sharing the prompt's KV blocks. */
  n?: number;
  logit_bias?: Record<string, number>;
  /** The output is JSON valid against this JSON Schema. */
  json_schema?: object | string;
  /** The whole output matches this regular expression. */
  regex?: string;
  /** The output follows this Lark grammar. */
  grammar?: string;
  return_logprob?: boolean;
  top_logprobs_num?: number;
  logprob_start_len?: number;
  /** The request's id; one is made up when absent. */
  rid?: string;
  /** Aborting it ends the request with finish_reason {type: "abort"} and frees its KV blocks. */
  signal?: AbortSignal;
}

export type FinishReason =
  | { type: 'stop'; matched: number | string }
  | { type: 'length'; length: number }
  | { type: 'abort' };

export interface TokenLogprob {
  token_id: number;
  logprob: number;
}

export interface Logprobs {
  tokens: TokenLogprob[];
  top: TokenLogprob[][];
}

export interface MetaInfo {
  id: string;
  prompt_tokens: number;
  completion_tokens: number;
  cached_tokens: number;
  /** null while the sequence runs. */
  finish_reason: FinishReason | null;
  /** Seconds from submission to this item. */
  e2e_latency: number;
  output_logprobs?: Logprobs;
  input_logprobs?: Logprobs;
}

/** One output; in a stream, the text and token ids since the previous item. */
export interface GenerateOutput {
  index: number;
  text: string;
  output_ids: number[];
  meta_info: MetaInfo;
}

/** A call to a tool, as an assistant's message carries it. `arguments` is JSON text. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool' | (string & {});
  content: string | null | { type: 'text'; text: string }[];
  name?: string;
  /** An assistant's calls, as a response gave them. */
  tool_calls?: ToolCall[];
  /** A `tool` message: the id of the call it answers. */
  tool_call_id?: string;
}

/** A function the model may call; its arguments are held to `parameters` (a JSON Schema). */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: object; strict?: boolean };
}

/** OpenAI's chat completion request (the subset flint implements; other fields are an Error). */
export interface ChatCompletionRequest {
  messages: ChatMessage[];
  model?: string;
  stream?: boolean;
  stream_options?: { include_usage?: boolean };
  max_tokens?: number;
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  n?: number;
  stop?: string | string[];
  seed?: number;
  frequency_penalty?: number;
  presence_penalty?: number;
  logit_bias?: Record<string, number>;
  response_format?:
    | { type: 'text' }
    | { type: 'json_object' }
    | { type: 'json_schema'; json_schema: { name: string; description?: string; schema?: object; strict?: boolean } };
  /** Functions the model may call. The model's chat template must render tools (one that does
   * not is an Error unless `tool_choice` is 'none'); calls are constrained to be valid. */
  tools?: ChatTool[];
  tool_choice?: 'none' | 'auto' | 'required' | { type: 'function'; function: { name: string } };
  parallel_tool_calls?: boolean;
  user?: string;
  store?: boolean;
  metadata?: Record<string, string>;
  service_tier?: string;
  top_k?: number;
  min_p?: number;
  repetition_penalty?: number;
  min_tokens?: number;
  ignore_eos?: boolean;
  signal?: AbortSignal;
}

export type ChatFinishReason = 'stop' | 'length' | 'abort' | 'tool_calls';

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: {
    index: number;
    /** `content` is null when the answer is calls alone. */
    message: { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] };
    logprobs: null;
    finish_reason: ChatFinishReason | null;
  }[];
  usage: Usage;
}

export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: {
    index: number;
    /** A call's first delta has its `id`, `type` and name; later ones more of its arguments. */
    delta: {
      role?: 'assistant';
      content?: string;
      tool_calls?: { index: number; id?: string; type?: 'function'; function: { name?: string; arguments: string } }[];
    };
    logprobs: null;
    finish_reason: ChatFinishReason | null;
  }[];
  usage?: Usage;
}

/** OpenAI's embeddings request: texts, or token ids, to embed. */
export interface EmbeddingRequest {
  input: string | string[] | number[] | number[][];
  model?: string;
  /** 'float' (the default), or 'base64': each vector's little-endian f32 bytes. */
  encoding_format?: 'float' | 'base64';
  user?: string;
}

/** One unit-length vector per input, pooled as the model's file says (the mean unless it says otherwise, e.g. last token for Qwen3-Embedding). */
export interface EmbeddingResponse {
  object: 'list';
  data: { object: 'embedding'; index: number; embedding: number[] | string }[];
  model: string;
  usage: { prompt_tokens: number; total_tokens: number };
}

export interface EngineInfo {
  model: string;
  architecture: string;
  context_length: number;
  max_sequence_tokens: number;
  vocab_size: number;
  chat_template: boolean;
  device: Record<string, unknown>;
}

export interface EngineMetrics {
  running_sequences: number;
  waiting_sequences: number;
  kv_blocks_total: number;
  kv_blocks_used: number;
  kv_blocks_cached: number;
  kv_blocks_free: number;
  kv_block_tokens: number;
  prompt_tokens: number;
  cached_prompt_tokens: number;
  prefix_cache_hit_rate: number;
  generated_tokens: number;
  generation_tokens_per_second: number;
  steps: number;
  overlapped_steps: number;
  preemptions: number;
  healthy: boolean;
}

export class Engine {
  private constructor();
  /** Loads a GGUF model onto the browser's WebGPU device. */
  static load(source: ModelSource, options?: LoadOptions): Promise<Engine>;
  info(): EngineInfo;
  metrics(): EngineMetrics;
  /** One output, or one per sequence when `n` > 1. */
  generate(prompt: string | number[], params?: GenerateParams): Promise<GenerateOutput | GenerateOutput[]>;
  stream(prompt: string | number[], params?: GenerateParams): AsyncGenerator<GenerateOutput, void, undefined>;
  readonly chat: {
    completions: {
      create(body: ChatCompletionRequest & { stream: true }): Promise<AsyncGenerator<ChatCompletionChunk, void, undefined>>;
      create(body: ChatCompletionRequest & { stream?: false }): Promise<ChatCompletion>;
    };
  };
  readonly embeddings: {
    create(body: EmbeddingRequest): Promise<EmbeddingResponse>;
  };
  /** Aborts running requests and lets the model go; later calls throw. */
  unload(): void;
}

export interface WorkerLoadOptions extends LoadOptions {
  /** A Worker running worker.js to use, instead of a new one. */
  worker?: Worker;
}

/** The Engine API from the page while the engine runs in a Web Worker (worker.js). */
export class WorkerEngine {
  private constructor();
  /** Starts a worker and loads the model there; a URL is fetched in the worker, a Blob/File is handed over without copying its bytes, an ArrayBuffer is transferred, a typed array is copied into a Blob. */
  static load(source: ModelSource, options?: WorkerLoadOptions): Promise<WorkerEngine>;
  info(): Promise<EngineInfo>;
  metrics(): Promise<EngineMetrics>;
  generate(prompt: string | number[], params?: GenerateParams): Promise<GenerateOutput | GenerateOutput[]>;
  stream(prompt: string | number[], params?: GenerateParams): AsyncGenerator<GenerateOutput, void, undefined>;
  readonly chat: Engine['chat'];
  readonly embeddings: Engine['embeddings'];
  /** Aborts running requests, unloads the model and ends the worker. */
  unload(): Promise<void>;
}

/** The URLs of the models in the browser's cache. */
export function cachedModels(): Promise<string[]>;
/** Deletes a model from the browser's cache; resolves with whether it was there. */
export function deleteCachedModel(url: string | URL): Promise<boolean>;

export function gpuInfo(probeBytes?: number): Promise<Record<string, unknown>>;
/** A GGUF file's summary from its header; a URL is downloaded whole first, into the Cache API unless `cache` is false. */
export function inspectGguf(source: ModelSource, options?: { onProgress?: ProgressCallback; cache?: boolean }): Promise<Record<string, unknown>>;
