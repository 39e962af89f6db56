// Runs the benchmark page (crates/web/bench/index.html) in headless Chromium and prints its
// result as JSON on stdout. scripts/bench-web.sh runs it next to native `flint bench` on the same
// device.
//
//   node crates/web/tests/bench.mjs PROMPT_TOKENS GEN_TOKENS REPEATS [PROMPT_IDS]
//
// PROMPT_IDS: comma-separated token ids, cycled to PROMPT_TOKENS (the page's default otherwise).

import { launchChromium, modelPath, requireFiles, serve, webDir } from './harness.mjs';
import path from 'node:path';

const [promptTokens, genTokens, repeats, promptIds] = process.argv.slice(2);
if (!promptTokens || !genTokens || !repeats) {
  console.error('usage: node crates/web/tests/bench.mjs PROMPT_TOKENS GEN_TOKENS REPEATS [PROMPT_IDS]');
  process.exit(2);
}
requireFiles('browser benchmark', [
  ['the model', modelPath, 'run scripts/fetch-models.sh'],
  ['the package', path.join(webDir, 'pkg', 'flint_web_bg.wasm'), 'run scripts/build-web.sh'],
]);

const { origin, close: closeServer } = await serve();
const { context, close: closeBrowser } = await launchChromium();
let failed = false;
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on('console', (message) => console.error(`[page ${message.type()}] ${message.text()}`));
  const query = new URLSearchParams({ promptTokens, genTokens, repeats, autorun: '1' });
  if (promptIds) query.set('prompt', promptIds);
  await page.goto(`${origin}/bench/index.html?${query}`);
  await page.waitForFunction(() => window.benchResult !== null && window.benchResult !== undefined, null, { timeout: 0, polling: 1000 });
  const result = await page.evaluate(() => window.benchResult);
  if (result.error) {
    console.error(`browser benchmark failed: ${result.error}`);
    failed = true;
  } else {
    console.log(JSON.stringify(result));
  }
} finally {
  await closeBrowser();
  closeServer();
}
process.exit(failed ? 1 : 0);
