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

// Every option the client (and the worker) reads is declared for its
// method. A static extraction from src/client.js (src/worker.js): each
// Ratchet (Worker) method's parameters, a
// destructured one by its keys, a named one by what the method reads of it
// (X.name, X?.name, `{ ... } = X`) and, passed on to a function or private
// method of the same file, by what that reads of its parameter; each is
// looked up in the declared method's parameter at the same position (an
// inline object type, an interface with what it extends, or an
// intersection of those). Its limits:
// a parameter read through another variable (`const o = X; o.name`), a
// spread (`...X` passed whole), or a computed key is not seen, and a
// helper of another module is not followed.
const clientJs = readFileSync(new URL('../src/client.js', import.meta.url), 'utf8');

// closing is the index of the bracket closing the one at open, strings and
// comments skipped.
function closing(src, open) {
  const pairs = { '(': ')', '{': '}', '[': ']' };
  const stack = [];
  for (let i = open; i < src.length; i++) {
    const c = src[i];
    if (c === '/' && src[i + 1] === '/') { i = src.indexOf('\n', i); continue; }
    if (c === '/' && src[i + 1] === '*') { i = src.indexOf('*/', i) + 1; continue; }
    if (c === "'" || c === '"' || c === '`') {
      for (i++; i < src.length && src[i] !== c; i++) if (src[i] === '\\') i++;
      continue;
    }
    if (pairs[c]) stack.push(pairs[c]);
    else if (c === ')' || c === '}' || c === ']') {
      assert.equal(c, stack.pop(), `unbalanced ${c} at ${i}`);
      if (stack.length === 0) return i;
    }
  }
  throw new Error(`no bracket closing ${open}`);
}

// topLevel splits s at its top-level commas (or ;).
function topLevel(s, sep = /[,;]/) {
  const out = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if ('({[<'.includes(c)) depth++;
    else if (')}]>'.includes(c) && !(c === '>' && s[i - 1] === '=')) depth--;
    else if (depth === 0 && sep.test(c)) { out.push(s.slice(start, i).trim()); start = i + 1; }
  }
  out.push(s.slice(start).trim());
  return out.filter(Boolean);
}

// functionsOf: each function of the source of class name (its methods,
// private ones by #name, and the file's top-level functions) with its
// parameters and body.
function functionsOf(src, name) {
  const fns = new Map();
  const start = src.indexOf(`export class ${name} `);
  const end = closing(src, src.indexOf('{', start));
  for (const m of src.matchAll(/^(?: {2}(?:async )?(#?\w+)|(?:async )?function (\w+))\(/gm)) {
    if (m[1] && (m.index < start || m.index > end)) continue; // another class's
    const open = m.index + m[0].length - 1;
    const close = closing(src, open);
    const bodyOpen = src.indexOf('{', close);
    fns.set(m[1] ?? m[2], { params: topLevel(src.slice(open + 1, close)), body: src.slice(bodyOpen, closing(src, bodyOpen) + 1) });
  }
  return fns;
}
const workerJs = readFileSync(new URL('../src/worker.js', import.meta.url), 'utf8');
const jsClasses = { Ratchet: functionsOf(clientJs, 'Ratchet'), Worker: functionsOf(workerJs, 'Worker') };
let jsFunctions = jsClasses.Ratchet;

// destructured is the keys of a destructuring pattern `{ a, b = 1, c: d }`.
const destructured = (pattern) => topLevel(pattern.slice(pattern.indexOf('{') + 1, pattern.lastIndexOf('}')))
  .filter((e) => !e.startsWith('...')).map((e) => e.match(/^(\w+)/)[1]);

// reads is the option names function name reads of its parameter at index.
function reads(name, index, seen = new Set()) {
  const fn = jsFunctions.get(name);
  if (!fn || seen.has(`${name}/${index}`)) return [];
  seen.add(`${name}/${index}`);
  const param = fn.params[index];
  if (param === undefined) return [];
  if (param.startsWith('{')) return destructured(param.slice(0, closing(param, 0) + 1));
  const x = param.match(/^(\w+)/)[1];
  const out = [...fn.body.matchAll(new RegExp(`\\b${x}\\??\\.(\\w+)`, 'g'))].map((m) => m[1]);
  for (const m of fn.body.matchAll(new RegExp(`(\\{[^{}]*\\})\\s*=\\s*${x}\\b`, 'g'))) out.push(...destructured(m[1]));
  for (const m of fn.body.matchAll(/(?:this\.)?(#?\w+)\(/g)) {
    if (!jsFunctions.has(m[1])) continue;
    const open = m.index + m[0].length - 1;
    const args = topLevel(fn.body.slice(open + 1, closing(fn.body, open)));
    args.forEach((a, j) => { if (a === x) out.push(...reads(m[1], j, seen)); });
  }
  return out;
}

// declaredProps is the property names of declared type text t (an
// intersection's, each part's), null for a type that is not an object's.
function declaredProps(t) {
  t = t.trim();
  const parts = topLevel(t, /&/);
  if (parts.length > 1) {
    const all = parts.map(declaredProps);
    return all.includes(null) ? null : all.flat();
  }
  if (t.startsWith('{')) {
    return topLevel(t.slice(1, closing(t, 0))).map((e) => e.replace(/^readonly /, '').match(/^(\w+)/)?.[1]).filter(Boolean);
  }
  const name = t.match(/^(\w+)/)?.[1];
  // Not an options object: its reads (tools.map, name.length) are the value's own.
  if (t.endsWith('[]') || !/^[A-Z]/.test(t) || ['Array', 'Record', 'Date'].includes(name)) return null;
  const iface = new RegExp(`^export interface ${name}(?:<[^>]*>)?(?: extends ([^{]+))? \\{`, 'm').exec(dts);
  assert.ok(iface, `no interface ${name} in the declarations`);
  const open = iface.index + iface[0].length - 1;
  const props = [...dts.slice(open, closing(dts, open)).matchAll(/^ {2}(?:readonly )?(\w+)\??:/gm)].map((m) => m[1]);
  for (const base of iface[1] ? topLevel(iface[1]) : []) props.push(...declaredProps(base));
  return props;
}

for (const cls of ['Ratchet', 'Worker']) test(`${cls}: every option it reads is declared for its method`, () => {
  jsFunctions = jsClasses[cls];
  const ratchet = body('declare class', cls);
  const missing = [];
  for (const name of Object.getOwnPropertyNames(sdk[cls].prototype)) {
    const decl = new RegExp(`^ {2}${name === 'constructor' ? 'constructor' : name}(?:<[^(]*>)?\\(`, 'm').exec(ratchet);
    if (!decl || !jsFunctions.has(name)) continue; // an undeclared method is the test above's
    const open = decl.index + decl[0].length - 1;
    const params = topLevel(ratchet.slice(open + 1, closing(ratchet, open)), /,/);
    jsFunctions.get(name).params.forEach((_, i) => {
      const read = [...new Set(reads(name, i))];
      if (read.length === 0) return;
      const type = params[i]?.slice(params[i].indexOf(':') + 1);
      const props = type ? declaredProps(type) : [];
      if (props === null) return;
      for (const r of read) if (!props.includes(r)) missing.push(`${name} parameter ${i + 1}: ${r}`);
    });
  }
  assert.deepEqual(missing, [], 'options the class reads that index.d.ts does not declare for the method');
  if (cls === 'Worker') {
    assert.ok(reads('start', 0).includes('pollIntervalMs'));
    return;
  }
  // The extraction sees each kind of read: destructured, X.name, and
  // through a helper (perCall) and a private method (#keyed).
  assert.ok(reads('listKeys', 0).includes('createdBy'));
  assert.ok(reads('begin', 0).includes('effectType'), 'begin(request): request.effectType not seen');
  assert.ok(reads('startRun', 2).includes('signal'), 'startRun(..., options): perCall(options) not followed');
  assert.ok(reads('closeCircuit', 1).includes('idempotencyKey'), 'closeCircuit(..., options): #keyed not followed');
});
