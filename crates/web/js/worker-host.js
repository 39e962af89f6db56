// flint in a Web Worker: `WorkerEngine` has the API of `Engine` (flint.js) from the page while
// the engine runs in a worker (worker.js), so that neither loading nor generating ever holds
// up the page. Stream items cross the worker's message channel as they come. `info()` and
// `metrics()` return promises here, since the answer comes from the worker.

/** An engine running in a Web Worker. */
export class WorkerEngine {
  #worker;
  #nextId = 0;
  /** Handlers of the requests awaiting answers, by id. */
  #pending = new Map();

  constructor(worker) {
    this.#worker = worker;
    worker.onmessage = ({ data }) => this.#pending.get(data.id)?.(data);
    worker.onerror = (event) => {
      const message = `the flint worker failed: ${event.message ?? 'an error without a message'}`;
      for (const handler of this.#pending.values()) {
        handler({ type: 'error', message });
      }
    };
    /** OpenAI's chat completions: `engine.chat.completions.create({messages, stream, ...})`. */
    this.chat = { completions: { create: (body) => this.#chat(body) } };
    /** OpenAI's embeddings: `engine.embeddings.create({input, encoding_format})`. */
    this.embeddings = { create: (body) => this.#call({ op: 'embed', body }) };
  }

  /**
   * Starts a worker and loads a model in it. `source` is a URL (fetched in the worker, relative
   * to the page), a Blob or File (the worker gets a handle, not a copy of its bytes), an
   * ArrayBuffer (transferred: it is detached here afterwards) or a typed array (copied into a
   * Blob, since cloning it would copy its whole buffer into the worker). `onProgress` gets the
   * calls of `Engine.load`'s, stage included. `options.worker` is a Worker to use instead of a
   * new one on worker.js.
   */
  static async load(source, options = {}) {
    const { onProgress, worker, ...engineOptions } = options ?? {};
    const engine = new WorkerEngine(worker ?? new Worker(new URL('./worker.js', import.meta.url), { type: 'module' }));
    let transfer = [];
    if (typeof source === 'string' || source instanceof URL) {
      source = new URL(source, globalThis.location?.href).href;
    } else if (source instanceof ArrayBuffer) {
      transfer = [source];
    } else if (ArrayBuffer.isView(source)) {
      source = new Blob([source]);
    }
    try {
      await engine.#call({ op: 'load', source, options: engineOptions }, { transfer, onProgress });
    } catch (error) {
      engine.#worker.terminate();
      throw error;
    }
    return engine;
  }

  /** The model's name, architecture and context, and the WebGPU device. */
  info() {
    return this.#call({ op: 'info' });
  }

  /** The engine's metrics. */
  metrics() {
    return this.#call({ op: 'metrics' });
  }

  /** As `Engine.generate`: the whole output, once it is complete. */
  generate(prompt, params = {}) {
    const { signal, ...rest } = params ?? {};
    return this.#call({ op: 'generate', prompt, params: rest }, { signal });
  }

  /** As `Engine.stream`: an async iterator of items, as the worker sends them. */
  stream(prompt, params = {}) {
    const { signal, ...rest } = params ?? {};
    return this.#stream({ op: 'stream', prompt, params: rest }, signal);
  }

  /** Aborts the running requests, unloads the model and ends the worker. */
  async unload() {
    await this.#call({ op: 'unload' });
    this.#worker.terminate();
  }

  async #chat(body) {
    const { signal, ...rest } = body ?? {};
    if (rest.stream) {
      return this.#stream({ op: 'chat', body: rest }, signal);
    }
    return this.#call({ op: 'chat', body: rest }, { signal });
  }

  /** Sends `message` and resolves with its result; `onItem` gets stream items. */
  #call(message, { transfer = [], onProgress, onItem, signal, onId } = {}) {
    const id = this.#nextId++;
    onId?.(id);
    return new Promise((resolve, reject) => {
      const abort = () => this.#worker.postMessage({ id: this.#nextId++, op: 'abort', target: id });
      const done = () => {
        this.#pending.delete(id);
        signal?.removeEventListener('abort', abort);
      };
      this.#pending.set(id, (reply) => {
        switch (reply.type) {
          case 'progress':
            onProgress?.(reply.loaded, reply.total, reply.stage);
            break;
          case 'item':
            onItem?.(reply.value);
            break;
          case 'result':
            done();
            resolve(reply.value);
            break;
          default:
            done();
            reject(new Error(reply.message));
        }
      });
      this.#worker.postMessage({ ...message, id }, transfer);
      signal?.addEventListener('abort', abort);
      if (signal?.aborted) {
        abort();
      }
    });
  }

  /** A request whose items come one message at a time, as an async iterator. */
  async *#stream(message, signal) {
    const items = [];
    let wake = null;
    let finished = false;
    let failure = null;
    let id;
    const settled = this.#call(message, {
      signal,
      onId: (requestId) => {
        id = requestId;
      },
      onItem: (item) => {
        items.push(item);
        wake?.();
      },
    }).then(
      () => {
        finished = true;
        wake?.();
      },
      (error) => {
        failure = error;
        wake?.();
      },
    );
    try {
      for (;;) {
        if (items.length > 0) {
          yield items.shift();
        } else if (failure !== null) {
          throw failure;
        } else if (finished) {
          return;
        } else {
          await new Promise((resolve) => {
            wake = resolve;
          });
          wake = null;
        }
      }
    } finally {
      if (!finished && failure === null) {
        // The loop broke off: stop the request in the worker.
        this.#worker.postMessage({ id: this.#nextId++, op: 'close', target: id });
      }
      await settled;
    }
  }
}
