// verifyWebhook: what it accepts and refuses, as the Go SDK's VerifyWebhook,
// and a delivery from the real server (before and after a secret rotation).

import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { test } from 'node:test';
import { NoWebhookSecretError, Ratchet, WebhookSignatureError, verifyWebhook } from '../src/index.js';
import { BASE_URL, Workspace, hangGuard, needsServer, unique, waitFor } from './support.js';

const SECRET = 'whsec_0123456789abcdef';
const PREVIOUS = 'whsec_previous';
const BODY = '{"id":"evt_1","type":"run.finished","created_at":"2030-01-01T00:00:00Z",'
  + '"workspace_id":"ws_1","subject_id":"run_1","data":{"status":"SUCCEEDED"}}';
const AT = 1893456000; // 2030-01-01T00:00:00Z, in seconds
const at = (seconds) => (AT + seconds) * 1000; // a clock `now`, in milliseconds
// The webhook vectors the server's and the three SDKs' tests share.
const VECTORS = JSON.parse(readFileSync(new URL('../../webhook_vectors.json', import.meta.url), 'utf8'));
// lib/webhooks.Sign(AT, BODY, SECRET, PREVIOUS), as the server signs a
// delivery while a rotated secret still signs: the shared vector a Go test
// holds the server's Sign to, so that these tests do not only agree with a
// signer of their own.
const GO_SIGNED = VECTORS.signed.find((v) => v.t === AT && v.body === BODY
  && v.secrets.length === 2 && v.secrets[0] === SECRET && v.secrets[1] === PREVIOUS).header;

/** A header as lib/webhooks.Sign writes it. */
function sign(t, body, ...secrets) {
  return [`t=${t}`, ...secrets.map((s) => `v1=${createHmac('sha256', s).update(`${t}.`).update(body).digest('hex')}`)].join(',');
}

/** Asserts that verifying throws a WebhookSignatureError, and returns its reason. */
function refused(secret, signature, body = BODY, options = { now: at(0) }) {
  let caught;
  assert.throws(() => verifyWebhook(secret, signature, body, options), (err) => {
    caught = err;
    return err instanceof WebhookSignatureError;
  });
  assert.ok(caught.message.startsWith('ratchet: webhook signature does not verify: '), caught.message);
  assert.ok(!caught.message.includes(SECRET), 'the secret is never echoed');
  assert.equal(caught.name, 'WebhookSignatureError');
  return caught.reason;
}

test('a delivery the server signed verifies and decodes', () => {
  assert.equal(sign(AT, BODY, SECRET, PREVIOUS), GO_SIGNED, "the test's signer is the server's");
  const event = verifyWebhook(SECRET, sign(AT, BODY, SECRET), Buffer.from(BODY), { now: at(240) });
  assert.deepEqual(event, JSON.parse(BODY));
  // A Uint8Array (a view into a larger buffer), an ArrayBuffer, the raw text, a Date clock.
  const padded = Buffer.from(`xx${BODY}yy`);
  assert.equal(verifyWebhook(SECRET, GO_SIGNED, new Uint8Array(padded.buffer, padded.byteOffset + 2, BODY.length), { now: at(0) }).id, 'evt_1');
  assert.equal(verifyWebhook(SECRET, GO_SIGNED, new Uint8Array(Buffer.from(BODY)).buffer, { now: at(0) }).id, 'evt_1');
  assert.equal(verifyWebhook(SECRET, GO_SIGNED, BODY, { now: new Date(at(240)) }).id, 'evt_1');
  assert.equal(verifyWebhook(SECRET, GO_SIGNED.replaceAll(',', ' , '), BODY, { now: at(0) }).id, 'evt_1', 'spaces around the parts');
  // Any matching v1 will do, in any place; unknown entries are ignored.
  assert.equal(verifyWebhook(SECRET, `v1=00,v0=zz,${sign(AT, BODY, SECRET)}`, BODY, { now: at(0) }).id, 'evt_1');
  const upper = sign(AT, BODY, SECRET).toUpperCase().replace('T=', 't=').replace('V1=', 'v1=');
  assert.equal(verifyWebhook(SECRET, upper, BODY, { now: at(0) }).id, 'evt_1', 'hex in either case');
  // A repeated header given as a list is joined: one verifies, two are two t.
  assert.equal(verifyWebhook(SECRET, [GO_SIGNED], BODY, { now: at(0) }).id, 'evt_1');
  assert.equal(refused(SECRET, [GO_SIGNED, GO_SIGNED]), 'malformed Ratchet-Signature');
});

test('the shared vectors', () => {
  // What the server signs verifies with each of its secrets, and each
  // header, body, secret, clock and tolerance is answered as the Go and
  // Python SDKs answer it.
  assert.ok(VECTORS.signed.length > 0 && VECTORS.verify.length > 0);
  for (const v of VECTORS.signed) {
    for (const secret of v.secrets) verifyWebhook(secret, v.header, Buffer.from(v.body, 'utf8'), { now: v.t * 1000 });
  }
  for (const v of VECTORS.verify) {
    let outcome = 'ok';
    try {
      const body = v.body_base64 !== undefined ? Buffer.from(v.body_base64, 'base64') : Buffer.from(v.body, 'utf8');
      const event = verifyWebhook(v.secret, v.header, body, { toleranceSeconds: v.tolerance, now: v.now * 1000 });
      assert.equal(event.id ?? '', v.id, v.name);
    } catch (err) {
      if (err instanceof NoWebhookSecretError) outcome = 'no_secret';
      else if (err instanceof WebhookSignatureError) {
        outcome = 'signature';
        assert.equal(err.reason, v.reason, v.name);
      } else if (err instanceof assert.AssertionError) throw err;
      else outcome = 'decode';
    }
    assert.equal(outcome, v.outcome, v.name);
  }
});

test('each secret of a rotation verifies', () => {
  for (const secret of [SECRET, PREVIOUS]) {
    assert.equal(verifyWebhook(secret, GO_SIGNED, BODY, { now: at(0) }).id, 'evt_1', secret);
  }
  assert.equal(refused('whsec_third', GO_SIGNED), 'no v1 signature matches');
});

test('another secret or body is refused', () => {
  assert.equal(refused('whsec_other', sign(AT, BODY, SECRET)), 'no v1 signature matches');
  assert.equal(refused(SECRET, sign(AT, BODY, SECRET), BODY.replace('SUCCEEDED', 'FAILED')), 'no v1 signature matches');
  assert.equal(refused(SECRET, sign(AT, BODY, SECRET), Buffer.from(`${BODY} `)), 'no v1 signature matches');
  // The time is part of what was signed: another t with the same v1 fails.
  assert.equal(refused(SECRET, sign(AT, BODY, SECRET).replace(`t=${AT}`, `t=${AT + 1}`)), 'no v1 signature matches');
  // Re-serialized JSON is not the bytes signed.
  assert.equal(refused(SECRET, sign(AT, BODY, SECRET), JSON.stringify(JSON.parse(BODY), null, 1)), 'no v1 signature matches');
});

test('a time out of tolerance is refused and said which way', () => {
  const sig = sign(AT, BODY, SECRET);
  assert.equal(verifyWebhook(SECRET, sig, BODY, { now: at(300) }).id, 'evt_1', '5 minutes exactly');
  assert.equal(verifyWebhook(SECRET, sig, BODY, { now: at(-300) }).id, 'evt_1');
  assert.equal(refused(SECRET, sig, BODY, { now: at(301) }), 'signed 5m1s ago, beyond 5m0s');
  assert.equal(refused(SECRET, sig, BODY, { now: at(400) }), 'signed 6m40s ago, beyond 5m0s');
  assert.equal(refused(SECRET, sig, BODY, { now: at(-400) }), 'signed 6m40s in the future, beyond 5m0s');
  assert.equal(refused(SECRET, sig, BODY, { now: at(7200.6) }), 'signed 2h0m1s ago, beyond 5m0s');
  // A tolerance of one's own; 0 or less is the default.
  assert.equal(refused(SECRET, sig, BODY, { now: at(11), toleranceSeconds: 10 }), 'signed 11s ago, beyond 10s');
  assert.equal(refused(SECRET, sig, BODY, { now: at(2), toleranceSeconds: 1.5 }), 'signed 2s ago, beyond 1.5s');
  assert.equal(verifyWebhook(SECRET, sig, BODY, { now: at(3000), toleranceSeconds: 3600 }).id, 'evt_1');
  assert.equal(verifyWebhook(SECRET, sig, BODY, { now: at(299), toleranceSeconds: 0 }).id, 'evt_1');
  assert.equal(refused(SECRET, sig, BODY, { now: at(301), toleranceSeconds: -1 }), 'signed 5m1s ago, beyond 5m0s');
  // By default the clock is now: a delivery signed now verifies, one signed in 2030 does not.
  assert.equal(verifyWebhook(SECRET, sign(Math.floor(Date.now() / 1000), BODY, SECRET), BODY).id, 'evt_1');
  assert.throws(() => verifyWebhook(SECRET, sig, BODY), WebhookSignatureError);
});

test('a timestamp in milliseconds is said to be no time near now', () => {
  const far = 'its timestamp is not a time near now (seconds since 1970)';
  assert.equal(refused(SECRET, sign(AT * 1000, BODY, SECRET)), far);
  assert.equal(refused(SECRET, sign(AT - 2 ** 32 - 1, BODY, SECRET)), far);
  assert.equal(refused(SECRET, sign(AT - 2 ** 32, BODY, SECRET)), 'signed 1193046h28m16s ago, beyond 5m0s', '2^32 seconds is still a time');
});

test('malformed headers are refused', () => {
  const sig = sign(AT, BODY, SECRET);
  const [tPart, v1Part] = sig.split(',');
  const v1 = v1Part.slice('v1='.length);
  const malformed = {
    'no header': undefined,
    'a null header': null,
    'an empty header': '',
    'no t': v1Part,
    'no v1': tPart,
    'two t': `${sig},t=${AT}`,
    'two t, the second first': `t=${AT},${sig}`,
    'an empty t': `t=,${v1Part}`,
    't not a number': `t=soon,${v1Part}`,
    't with a fraction': `t=${AT}.0,${v1Part}`,
    't with an underscore': `t=1_893_456_000,${v1Part}`,
    't in hex': `t=0x70dbd880,${v1Part}`,
    't beyond 64 bits': `t=${2n ** 63n},${v1Part}`,
    'v1 not hex': `${tPart},v1=zz`,
    'v1 of odd length': `${tPart},v1=${v1}0`,
    'v1 with a space inside': `${tPart},v1=${v1.slice(0, 10)} ${v1.slice(10)}`,
    'a part without =': `${sig},v1`,
    'an empty part': `${sig},`,
    'nine v1': sig + ',v1=00'.repeat(8),
    'over 4096 characters': `${sig},x=${'a'.repeat(4096 - sig.length - 2)}`,
    'over 4096 bytes': `${sig},x=${'é'.repeat(2048)}`,
  };
  for (const [name, header] of Object.entries(malformed)) {
    assert.equal(refused(SECRET, header), 'malformed Ratchet-Signature', name);
  }
  assert.equal(malformed['over 4096 characters'].length, 4097);
  // Parts are trimmed of what Go's strings.TrimSpace trims, and no more:
  // NBSP and NEL are space, a BOM or an information separator is not (its
  // v1 is then an unknown entry, so none is left).
  assert.equal(verifyWebhook(SECRET, `\u3000${tPart},\u00a0${v1Part}\u0085`, BODY, { now: at(0) }).id, 'evt_1');
  for (const junk of ['\ufeff', '\x1c']) {
    assert.equal(refused(SECRET, `${tPart},${junk}${v1Part}`), 'malformed Ratchet-Signature', JSON.stringify(junk));
  }
  // The limits' own edges verify: eight v1 and 4096 characters.
  assert.equal(verifyWebhook(SECRET, sig + ',v1=00'.repeat(7), BODY, { now: at(0) }).id, 'evt_1');
  const edge = `${sig},x=${'a'.repeat(4096 - sig.length - 3)}`;
  assert.equal(edge.length, 4096);
  assert.equal(verifyWebhook(SECRET, edge, BODY, { now: at(0) }).id, 'evt_1');
});

test('no secret verifies nothing', () => {
  for (const secret of ['', undefined, null]) {
    assert.throws(() => verifyWebhook(secret, sign(AT, BODY, ''), BODY, { now: at(0) }), (err) => {
      assert.ok(err instanceof NoWebhookSecretError);
      assert.ok(!(err instanceof WebhookSignatureError), 'a misconfiguration, not a forgery');
      assert.equal(err.message, 'ratchet: no webhook secret to verify with');
      return true;
    });
  }
});

test('signatures are compared in constant time', () => {
  const source = readFileSync(new URL('../src/webhooks.js', import.meta.url), 'utf8');
  assert.match(source, /timingSafeEqual\(mac, want\)/);
  assert.doesNotMatch(source, /\bmac\s*[!=]==?\s*want\b|\bwant\s*[!=]==?\s*mac\b|\.equals\(|Buffer\.compare\(/);
});

test('a body must be what was received', () => {
  assert.throws(() => verifyWebhook(SECRET, sign(AT, BODY, SECRET), JSON.parse(BODY), { now: at(0) }), TypeError);
  assert.throws(() => verifyWebhook(SECRET, sign(AT, BODY, SECRET), undefined, { now: at(0) }), TypeError);
  assert.throws(() => verifyWebhook(SECRET, 42, BODY, { now: at(0) }), TypeError);
});

test('a verified body that is no event is not a signature error', () => {
  const bodies = ['not json', '[1, 2]', 'null', '"evt_1"', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"id":"evt_1"}')])];
  for (const body of bodies) {
    assert.throws(() => verifyWebhook(SECRET, sign(AT, body, SECRET), body, { now: at(0) }), (err) => {
      assert.ok(!(err instanceof WebhookSignatureError), String(body));
      assert.match(err.message, /^ratchet: decode webhook event: /);
      return true;
    });
  }
  // Bytes that are not UTF-8, even in a string, are refused, by the three
  // SDKs alike (they read them as U+FFFD before; the shared vectors hold the
  // rest of the rules).
  const odd = Buffer.concat([Buffer.from('{"id":"evt_'), Buffer.from([0xff]), Buffer.from('"}')]);
  assert.throws(() => verifyWebhook(SECRET, sign(AT, odd, SECRET), odd, { now: at(0) }),
    /^Error: ratchet: decode webhook event: The encoded data was not valid for encoding utf-8$/);
  // Unverified, it is a signature error first: nothing is decoded before a match.
  assert.equal(refused('whsec_other', sign(AT, 'not json', SECRET), 'not json'), 'no v1 signature matches');
});

// sweep runs one pass of the server's sweeper (its cron route), which sends
// due webhook deliveries.
async function sweep() {
  const res = await fetch(`${BASE_URL}/api/cron/sweep`, {
    method: 'POST', headers: { Authorization: `Bearer ${process.env.RATCHET_TEST_CRON_SECRET}` },
  });
  assert.equal(res.status, 200, await res.text());
}

test('a delivery from the server verifies with each secret of a rotation', needsServer, async (t) => {
  assert.ok(process.env.RATCHET_TEST_CRON_SECRET, 'RATCHET_TEST_CRON_SECRET is not set: run `go test ./lib/sdktest -run TestTypeScriptSDK`');
  const ws = await Workspace.create();
  const received = []; // { headers, body } of each delivery, the body as the bytes received
  const receiver = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      received.push({ headers: req.headers, body: Buffer.concat(chunks) });
      res.statusCode = 204;
      res.end();
    });
  });
  await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
  t.after(() => hangGuard(new Promise((ok) => { receiver.closeAllConnections(); receiver.close(ok); }), 'the receiver never closed'));
  const url = `http://127.0.0.1:${receiver.address().port}/ratchet`;
  const hook = await ws.operator.request('POST', '/webhooks', { url, events: ['circuit.tripped'] }, { idempotencyKey: unique('hook') });
  t.after(() => ws.operator.request('DELETE', `/webhooks/${hook.id}`));
  const secret = hook.secret;
  assert.match(secret, /^whsec_/);

  // Opens effectType's circuit (a circuit.tripped event) and sweeps until
  // the receiver has its delivery (another server's pass over the same
  // database may send it first: either way it reaches this receiver).
  const deliver = async (effectType) => {
    const seen = received.length;
    await ws.operator.request('POST', `/circuits/${effectType}/open`, { action: 'deny' });
    await waitFor(`the delivery of ${effectType}'s circuit.tripped`, async () => {
      await sweep();
      return received.length > seen;
    });
    assert.equal(received.length, seen + 1, 'one delivery per event');
    return received[seen];
  };

  const firstType = unique('js.hook').replace('_', '.');
  let { headers, body } = await deliver(firstType);
  let signature = headers['ratchet-signature'];
  assert.equal(signature.match(/v1=/g).length, 1, signature);
  let event = verifyWebhook(secret, signature, body);
  assert.equal(event.id, headers['ratchet-event-id']);
  assert.equal(event.type, 'circuit.tripped');
  assert.equal(event.subject_id, firstType);
  assert.equal(verifyWebhook(secret, signature, body.toString('utf8')).id, event.id, 'the raw text verifies too');
  assert.throws(() => verifyWebhook(`${secret}x`, signature, body), WebhookSignatureError);
  assert.throws(() => verifyWebhook(secret, signature, Buffer.concat([body, Buffer.from('\n')])), WebhookSignatureError);

  const rotated = await ws.operator.request('POST', `/webhooks/${hook.id}/rotate-secret`, {}, { idempotencyKey: unique('rotate') });
  assert.notEqual(rotated.secret, secret);
  assert.ok(rotated.previous_secret_expires_at, 'the previous secret still signs');

  const secondType = unique('js.hook').replace('_', '.');
  ({ headers, body } = await deliver(secondType));
  signature = headers['ratchet-signature'];
  assert.equal(signature.match(/v1=/g).length, 2, signature);
  for (const which of [rotated.secret, secret]) {
    event = verifyWebhook(which, signature, body);
    assert.deepEqual([event.id, event.subject_id], [headers['ratchet-event-id'], secondType]);
  }
  assert.throws(() => verifyWebhook('whsec_neither', signature, body), WebhookSignatureError);
  // Each v1 is its own secret's: the new one's first, as the server sends them.
  const [tPart, newV1, previousV1] = signature.split(',');
  verifyWebhook(rotated.secret, `${tPart},${newV1}`, body);
  verifyWebhook(secret, `${tPart},${previousV1}`, body);
  assert.throws(() => verifyWebhook(secret, `${tPart},${newV1}`, body), WebhookSignatureError);
});

test('updateWebhook sends what it is given and is repeated after a lost answer', async (t) => {
  const seen = [];
  const answer = { id: 'whk_1', url: 'https://example.com/h', events: ['run.finished'], disabled: true, disabled_at: '2030-01-01T00:00:00Z' };
  const server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => { raw += c; });
    req.on('end', () => {
      seen.push([req.method, req.url, JSON.parse(raw), req.headers['idempotency-key']]);
      const failed = seen.length === 1; // the first answer is a 500: the call is sent again
      const out = JSON.stringify(failed ? { error: { code: 'internal_error', message: 'x', detail: {} } } : answer);
      res.writeHead(failed ? 500 : 200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(out) });
      res.end(out);
    });
  });
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
  t.after(() => new Promise((ok) => { server.closeAllConnections(); server.close(ok); }));
  const c = new Ratchet({ baseUrl: `http://127.0.0.1:${server.address().port}`, apiKey: 'rk_test', timeoutMs: 5000 });
  assert.deepEqual(await c.updateWebhook('whk/1', { disabled: true }), answer);
  await c.updateWebhook('whk_1', { disabled: false, url: null });
  await c.updateWebhook('whk_1', { url: 'https://example.com/h', events: ['run.finished'] });
  await c.updateWebhook('whk_1', { events: [] });
  assert.deepEqual(seen.map(([method, path, body]) => [method, path, body]), [
    ['PATCH', '/api/v1/webhooks/whk%2F1', { disabled: true }],
    ['PATCH', '/api/v1/webhooks/whk%2F1', { disabled: true }],
    ['PATCH', '/api/v1/webhooks/whk_1', { disabled: false }],
    ['PATCH', '/api/v1/webhooks/whk_1', { url: 'https://example.com/h', events: ['run.finished'] }],
    ['PATCH', '/api/v1/webhooks/whk_1', { events: [] }],
  ]);
  // One Idempotency-Key of the call's own spans its retry, so a retry never
  // undoes another update made since; the next call has another.
  const keys = seen.map(([, , , key]) => key);
  assert.ok(keys.every((k) => /^[0-9a-f]{32}$/.test(k ?? '')), keys.join());
  assert.equal(keys[1], keys[0]);
  assert.equal(new Set(keys).size, 4);
});
