// Tool calling through `flint serve`, driven by the real OpenAI client for Node (the `openai`
// npm package in crates/web/node_modules), with the checks of tool-checks.mjs.
//
//   node crates/web/tests/openai-node.mjs BASE_URL MODEL_ID
//
// Run by crates/native/tests/serve.rs beside openai_tools.py (the same checks with the Python
// client). Prints one line per passed check, then "N checks passed"; exits non-zero on a failure.

import OpenAI from 'openai';
import { runToolChecks } from './tool-checks.mjs';

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300_000 });
const create = (request) => client.chat.completions.create({ model, ...request });
const fieldOf = (error) => (error instanceof OpenAI.BadRequestError ? error.param : `not a 400: ${error}`);
const passed = await runToolChecks(create, fieldOf);
for (const name of passed) console.log(`ok: ${name}`);
console.log(`${passed.length} checks passed`);
