// The TypeScript SDK's worker with its default log, for
// TestTheSDKWorkersLogNothingUserControlled: every handler's input carries a
// mark, and each fails a way the worker logs (its report refused by the
// test's proxy, a classifier that throws with the mark, an output that is not
// JSON, its error naming the mark); then a worker whose key is refused at its
// start, and one whose claims the test's other proxy refuses.
import { createRatchet } from '../../../sdk/typescript/src/index.js';
import { failureLogTimes } from '../../../sdk/typescript/src/failurelog.js';

failureLogTimes.everyMs = 0; // every problem its line, not one a minute

const { LEAK_BASE_URL: baseUrl, LEAK_KEY: key, LEAK_BAD_KEY: bad, LEAK_TOOL: tool, LEAK_REVOKING_BASE_URL: revoking } =
  process.env;
let ran = 0;
const ratchet = createRatchet({ baseUrl, apiKey: key });
ratchet.registerTool({
  name: tool,
  version: '1',
  handler: async (input) => {
    try {
      if (input.kind === 'raise') throw new Error(input.to);
      if (input.kind === 'classify') throw new TypeError(input.to);
      return { out: { toJSON: () => { throw new Error(input.to); } } }; // not JSON
    } finally {
      if (++ran === 3) setImmediate(() => ratchet.worker.stop({ timeoutMs: 10_000 }));
    }
  },
  classifyError: (error) => {
    if (error instanceof TypeError) throw new Error(`classifier: ${error.message}`);
    return { retryable: false };
  },
});
try {
  await ratchet.worker.start({ concurrency: 3, pollIntervalMs: 100 });
} catch (e) {
  console.log('stopped:', e.name); // its text is the test's to check, not to print
}
console.log('handlers ran:', ran);

// A key refused at the start, then one refused while the worker runs.
for (const [url, apiKey] of [[baseUrl, bad], [revoking, key]]) {
  const refused = createRatchet({ baseUrl: url, apiKey });
  refused.registerTool({ name: tool, version: '1', handler: async () => ({}) });
  try {
    await refused.worker.start({ pollIntervalMs: 100 });
  } catch (e) {
    console.log('refused:', e.name); // its text is the test's to check, not to print
  }
}
