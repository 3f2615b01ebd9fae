// The TypeScript declarations (src/index.d.ts) name what the package
// exports and what its classes offer, no more and no less. tsc checks the
// types by hand (README); this keeps the names in step in every test run,
// which needs no compiler.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import * as sdk from '../src/index.js';

const dts = readFileSync(new URL('../src/index.d.ts', import.meta.url), 'utf8');

test('the declarations name every value the package exports, and no other', () => {
  const declared = [...dts.matchAll(/^export declare (?:const|function|class) (\w+)/gm)].map((m) => m[1]).sort();
  assert.deepEqual(declared, Object.keys(sdk).sort());
});

// members is a declared class's methods and properties, by name.
function members(name) {
  const start = dts.indexOf(`export declare class ${name} `);
  assert.notEqual(start, -1, `no class ${name} in the declarations`);
  const body = dts.slice(dts.indexOf('{', start) + 1, dts.indexOf('\n}', start));
  return [...body.matchAll(/^ {2}(?:readonly |static |get )?(\w+)\s*[<(:?]/gm)]
    .map((m) => m[1])
    .filter((n) => n !== 'constructor')
    .sort();
}

// Methods the runtime has that users are not meant to call.
const internal = { Worker: ['addTool'] };

for (const name of ['Ratchet', 'Worker']) {
  test(`${name}: the declarations list what it offers`, () => {
    const proto = Object.getOwnPropertyNames(sdk[name].prototype).filter((n) => n !== 'constructor');
    const offered = proto.filter((n) => !(internal[name] || []).includes(n));
    const declared = members(name);
    // A declared property may be set in the constructor instead (workerId).
    const instance = name === 'Ratchet' ? new sdk.Ratchet({ apiKey: 'rk_test', baseUrl: 'http://127.0.0.1:9' }) : null;
    for (const m of declared) {
      assert.ok(proto.includes(m) || (instance && m in instance) || (name === 'Worker' && m === 'workerId'), `${name}.${m} is declared but not there`);
    }
    for (const m of offered) {
      assert.ok(declared.includes(m), `${name}.${m} is there but not declared`);
    }
  });
}

// body is the text of the declared interface or class name, between its braces.
function body(kind, name) {
  const start = dts.indexOf(`export ${kind} ${name} `);
  assert.notEqual(start, -1, `no ${kind} ${name} in the declarations`);
  return dts.slice(dts.indexOf('{', start) + 1, dts.indexOf('\n}', start));
}

// The runtime reads an option given as undefined as one left out (its
// destructuring defaults, defined(), query()), so under tsc's
// exactOptionalPropertyTypes each optional option admits undefined: without
// it `createRatchet({ baseUrl: process.env.RATCHET_BASE_URL, ... })`, the
// README's first line, did not compile.
test('every optional option admits undefined', () => {
  const options = ['RatchetOptions', 'RequestOptions', 'RunOptions', 'EnqueueOptions', 'ReplayOptions', 'StartOptions', 'BeginRequest',
    'ResolveRequest', 'ListQuery', 'WebhookUpdate', 'KeySpec', 'ContractSpec', 'ReconcileRecord', 'ReconcileRequest',
    'VerifyWebhookOptions'];
  const fields = options.flatMap((name) => [...body('interface', name).matchAll(/^ {2}(\w+)\?: (.+);$/gm)]
    .map((m) => [`${name}.${m[1]}`, m[2]]));
  // The option objects the methods take inline: { name?: type; ... }.
  for (const name of ['Ratchet', 'Worker']) {
    for (const m of body('declare class', name).matchAll(/(?<=[{;] )(\w+)\?: ([^;{}()]+?)(?= ?[;}])/g)) {
      fields.push([`${name} option ${m[1]}`, m[2]]);
    }
  }
  assert.ok(fields.length > 80, `only ${fields.length} options found`);
  for (const [field, type] of fields) assert.match(type, /\| undefined$/, `${field} does not admit undefined`);
});

test("updateEffectPolicy's update is what a PUT takes", () => {
  const start = dts.indexOf('export type EffectPolicyUpdate ');
  assert.notEqual(start, -1, 'no type EffectPolicyUpdate in the declarations');
  const update = dts.slice(start, dts.indexOf('};', start));
  // Read-only fields: the server refuses a body naming one.
  for (const field of ['effect_type', 'version', 'updated_at', 'last_reconciled_at']) {
    assert.ok(update.includes(`'${field}'`), `the update may name ${field}`);
  }
  // null clears these, as any nullable field.
  assert.match(update, /required_dimensions\?: string\[\] \| null \| undefined;/);
  // A limit sent may leave out (or null) either field, not both, as the
  // server takes it (lib/gate decodeDimensionLimit): the update's own type,
  // not the answer's DimensionLimit, whose two fields are always there.
  assert.match(update, /dimension_limits\?: Record<string, DimensionLimitUpdate> \| null \| undefined;/);
  assert.match(body('declare class', 'Ratchet'), /updateEffectPolicy\(effectType: string, update: EffectPolicyUpdate,/);
});

test('a dimension limit sent needs one field, not both', () => {
  const start = dts.indexOf('export type DimensionLimitUpdate =');
  assert.notEqual(start, -1, 'no type DimensionLimitUpdate in the declarations');
  const union = dts.slice(start, dts.indexOf(';\n', dts.indexOf('daily_count: number }', start)) + 1);
  assert.equal(union.replace(/\s+/g, ' '), 'export type DimensionLimitUpdate = '
    + '| { daily_micros: number; daily_count?: number | null | undefined } '
    + '| { daily_micros?: number | null | undefined; daily_count: number };');
});

// The declarations compile without @types/node and without the DOM lib
// (checked by hand with tsc --strict, with and without both): a
// `/// <reference types="node" />` failed a program without @types/node
// (TS2688), and `typeof fetch`, AbortSignal or Buffer are not names ES
// declares. fetch and AbortSignal are the program's own where it declares
// them, through typeof globalThis, else structural stand-ins.
test('the declarations need no @types/node and no DOM lib', () => {
  assert.doesNotMatch(dts, /\/\/\/ *<reference/);
  assert.doesNotMatch(dts, /\bimport\(|^import |\bNodeJS\.|\bBuffer\b|\bReadableStream\b|\bHeaders\b|\bResponse\b|\bRequestInit\b/m);
  assert.doesNotMatch(dts, /typeof fetch\b/);
  assert.match(dts, /^export type AbortSignal = typeof globalThis extends \{ AbortSignal: \{ prototype: infer S \} \} \? S : AbortSignalLike;$/m);
  assert.match(dts, /^export type FetchFunction = typeof globalThis extends \{ fetch: infer F \} \? F$/m);
  assert.match(body('interface', 'RatchetOptions'), /^ {2}fetch\?: FetchFunction \| undefined;$/m);
});

// Every method that calls the API takes a RequestOptions last (README,
// "Per-call timeout and cancellation"); request takes it in its options.
test('every Ratchet method that calls the API is declared with a trailing RequestOptions', () => {
  const methods = [...body('declare class', 'Ratchet').matchAll(/^ {2}(\w+)(?:<[^>]*>)?\((.*)\): [^;]+;$/gm)];
  assert.ok(methods.length > 60, `only ${methods.length} methods found`);
  for (const [, name, params] of methods) {
    if (['registerTool', 'doEffect'].includes(name)) continue;
    if (name === 'request') {
      assert.match(params, /options\?: RequestOptions & \{/);
      continue;
    }
    if (name === 'revokeKey') {
      // A request's options and includeMinted (RevokeKeyOptions extends RequestOptions).
      assert.match(params, /, requestOptions\?: RevokeKeyOptions$/);
      assert.match(dts, /export interface RevokeKeyOptions extends RequestOptions \{/);
      continue;
    }
    if (keyedActions.includes(name)) {
      // A request's options and the caller's Idempotency-Key
      // (KeyedRequestOptions extends RequestOptions).
      assert.match(params, /(?:^|, )requestOptions\?: KeyedRequestOptions$/, name);
      continue;
    }
    assert.match(params, /(?:^|, )requestOptions\?: RequestOptions$/, `${name} takes no trailing RequestOptions`);
  }
  assert.match(dts, /export interface KeyedRequestOptions extends RequestOptions \{/);
});

// The calls sent under an Idempotency-Key of their own that take the
// caller's in its place (requestOptions.idempotencyKey).
const keyedActions = ['cancelStep', 'updateEffectPolicy', 'openCircuit', 'closeCircuit', 'emergencyStop',
  'releaseEmergencyStop', 'updateWebhook', 'pauseEndpoint', 'resumeEndpoint', 'closeEndpointCircuit'];
