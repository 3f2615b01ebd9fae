// Runs the TypeScript SDK's worker against RATCHET_RECORDER_URL
// (workerRecorder in worker_requests_test.go), which compares what it sent
// with the OpenAPI document: j1 waits for its heartbeat, j2 fails, j3
// succeeds; j2's and j3's reports queue behind j1's held one and go as one
// batch.
import { createRatchet } from '../../../sdk/typescript/src/index.js';
import { Reporter, reportTimes } from '../../../sdk/typescript/src/worker.js';

reportTimes.inFlight = 1; // j2's and j3's reports wait for j1's, then go together
const base = process.env.RATCHET_RECORDER_URL;
const until = async (done) => {
  while (!done(await (await fetch(`${base}/__state`)).json())) await new Promise((r) => setTimeout(r, 20));
};

const ratchet = createRatchet({ baseUrl: base, apiKey: 'rk_test' });
let delivered = 0;
const deliver = Reporter.prototype.deliver;
Reporter.prototype.deliver = function (...args) {
  const done = deliver.apply(this, args); // queues the report before it returns
  if (++delivered === 3) {
    // j2's and j3's reports are queued behind j1's: release it.
    fetch(`${base}/__release`, { method: 'POST' })
      .then(() => until((s) => s.reported >= 3))
      .then(() => ratchet.worker.stop({ timeoutMs: 10_000 }));
  }
  return done;
};
ratchet.registerTool({
  name: 't',
  version: '1',
  handler: async (input) => {
    if (input.job === 'j1') {
      await until((s) => s.heartbeats >= 1);
      return { ok: true };
    }
    await until((s) => s.held >= 1); // j1's report is sent, and held
    if (input.job === 'j2') throw new Error('fails');
    return { ok: true };
  },
});
await ratchet.worker.start({ concurrency: 3, pollIntervalMs: 50 });
