// Runs the TypeScript SDK's worker against BUDGET_BASE_URL (budgetProxy in
// batch_budget_test.go), which holds report requests until released: the
// first job's report is held (one delivery in flight), and the two others,
// costly successes, queue behind it and go as one batch once released,
// which the service refuses whole; the worker must send them report by
// report.
import { createRatchet } from '../../../sdk/typescript/src/index.js';
import { Reporter, reportTimes } from '../../../sdk/typescript/src/worker.js';

reportTimes.inFlight = 1; // the costly reports wait for the first, then go together
const base = process.env.BUDGET_BASE_URL;
const jobs = Number(process.env.BUDGET_JOBS);
const items = Number(process.env.BUDGET_ITEMS);
const until = async (done) => {
  while (!done(await (await fetch(`${base}/__state`)).json())) await new Promise((r) => setTimeout(r, 20));
};

const ratchet = createRatchet({ baseUrl: base, apiKey: process.env.BUDGET_KEY });
let delivered = 0;
const deliver = Reporter.prototype.deliver;
Reporter.prototype.deliver = function (...args) {
  const done = deliver.apply(this, args); // queues the report before it returns
  if (++delivered === jobs) {
    // The costly reports are queued behind the first: release it.
    fetch(`${base}/__release`, { method: 'POST' })
      .then(() => until((s) => s.recorded >= jobs))
      .then(() => ratchet.worker.stop({ timeoutMs: 10_000 }));
  }
  return done;
};
let calls = 0;
ratchet.registerTool({
  name: process.env.BUDGET_TOOL,
  version: '1',
  handler: async () => {
    if (++calls === 1) return [];
    await until((s) => s.held >= 1); // the first report is sent, and held
    return new Array(items).fill(0);
  },
});
await ratchet.worker.start({
  concurrency: jobs,
  pollIntervalMs: 50,
  onError: (err) => console.log('onError:', err.name, err.message),
});
