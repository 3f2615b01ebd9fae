// Helpers for the tests that run the SDK against a real Ratchet server.
// RATCHET_TEST_BASE_URL names the server (lib/sdktest's TestTypeScriptSDK
// starts one over a real PostgreSQL); each test signs up a workspace of its
// own, so tests never see each other's jobs.

import { randomBytes } from 'node:crypto';
import { Ratchet } from '../src/index.js';
import './quiet.js';

export const BASE_URL = process.env.RATCHET_TEST_BASE_URL ?? '';
/** Options for a server test: skipped, and said so, without a server. */
export const needsServer = BASE_URL ? {} : { skip: 'RATCHET_TEST_BASE_URL is not set: run `go test ./lib/sdktest -run TestTypeScriptSDK`' };

export const unique = (prefix) => `${prefix}_${randomBytes(5).toString('hex')}`;

export class Workspace {
  static async create() {
    const response = await fetch(BASE_URL + '/api/v1/workspaces', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ name: unique('js') }),
    });
    const ws = new Workspace();
    ws.operatorKey = (await response.json()).key.secret;
    ws.operator = new Ratchet({ baseUrl: BASE_URL, apiKey: ws.operatorKey });
    return ws;
  }

  async key(preset, tools = null) {
    return (await this.operator.request('POST', '/keys', { name: unique(preset.toLowerCase()), preset, tools })).secret;
  }

  async client(preset, tools = null) {
    return new Ratchet({ baseUrl: BASE_URL, apiKey: await this.key(preset, tools) });
  }

  /** An endpoint whose CUSTOM schedule brings a retry due in a second. */
  fastEndpoint(name, maxAttempts = 3) {
    return this.operator.request('POST', '/endpoints', {
      name, preset: 'CUSTOM', maxAttempts, initialDelayMs: 1000, multiplier: 1, maxDelayMs: 1000, jitterPercent: 0,
    });
  }

  /** The step's durable job once it reaches status. */
  jobWhen(stepId, status) {
    return waitFor(`step ${stepId} ${status}`, async () => {
      const job = (await this.operator.getStep(stepId)).durableJob;
      return job.status === status ? job : null;
    });
  }
}

/** Collects a worker's onError calls. */
export class Errors {
  items = [];
  add = (error) => { this.items.push(error); };
  of(kind) { return this.items.filter((e) => e instanceof kind); }
}

// hangGuard answers what promise settles to, or fails saying what did not
// end once ms pass: a far bound on what must end (a stop, start()'s
// promise), so that a regression fails the test instead of hanging the
// suite, never a timing assertion; and the only clock of a test whose wait
// is set to an hour, so that only the behaviour under test can end it.
export async function hangGuard(promise, what, ms = 60_000) {
  let timer;
  try {
    return await Promise.race([promise, new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`hang guard: ${what}`)), ms);
    })]);
  } finally {
    clearTimeout(timer);
  }
}

/** Starts client's worker with a short poll interval (tests must not wait
 * 30 s for a claim) and stops it when the test ends. */
export function startWorker(t, client, concurrency = 1) {
  const errors = new Errors();
  const started = client.worker.start({ concurrency, pollIntervalMs: 100, onError: errors.add });
  t.after(() => stopWorker(client.worker, started, 10_000));
  return errors;
}

/** Stops worker (stop({ timeoutMs })) and waits for start()'s promise, each
 * under the hang guard; answers what stop() resolved to. */
export async function stopWorker(worker, started, timeoutMs) {
  const clean = await hangGuard(worker.stop({ timeoutMs }), 'stop() never ended');
  await hangGuard(started, 'start() never ended');
  return clean;
}

/** Calls probe until it answers something truthy, failing after timeoutMs. */
export async function waitFor(what, probe, timeoutMs = 60_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await probe();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} never happened; last: ${JSON.stringify(last)}`);
}

export async function waitRunEnded(client, runId) {
  return waitFor(`run ${runId} ending`, async () => {
    const run = await client.getRun(runId);
    return run.status !== 'RUNNING' ? run : null;
  });
}
