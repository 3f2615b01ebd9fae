// The declared answers (src/index.d.ts) against the server's own account of
// them: the OpenAPI document it serves (generated from its Go types). Each
// Ratchet method's declared answer, and each type inside it, must name the
// fields the route's response schema names, no more and no fewer; a field is
// `| null` (or Json, which holds null) exactly where the schema allows null,
// and optional (`?`) exactly where the schema does not require it; lists,
// maps and nested objects are compared the same way, and string literal
// unions with the schema's enum (a field, or a list's items, whose schema
// has an enum is declared a union of its literals, not string). declarations.test.js holds the exported
// names to the runtime; this holds the shapes to the server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { BASE_URL, needsServer } from './support.js';

const dts = readFileSync(new URL('../src/index.d.ts', import.meta.url), 'utf8')
  .replace(/\/\*[\s\S]*?\*\//g, '')
  .replace(/\/\/[^\n]*/g, '');

// Which route each Ratchet method calls, and where in its answer the value
// it resolves to is: the whole body, or the property named second, which
// the runtime takes from it (claim: answer.jobs; registerWorker:
// answer.workerId).
const routes = {
  startRun: ['POST /runs'],
  enqueue: ['POST /runs/{id}/steps'],
  finishRun: ['POST /runs/{id}/finish'],
  getRun: ['GET /runs/{id}'],
  listRuns: ['GET /runs'],
  listRunSteps: ['GET /runs/{id}/steps'],
  getStep: ['GET /steps/{id}'],
  listStepAttempts: ['GET /steps/{id}/attempts'],
  listStepReplays: ['GET /steps/{id}/replays'],
  cancelStep: ['POST /steps/{id}/cancel'],
  replayPreview: ['GET /steps/{id}/replay'],
  replay: ['POST /steps/{id}/replay'],
  begin: ['POST /effects/begin'],
  reportEffect: ['POST /effects/{id}/report'],
  heartbeatEffect: ['POST /effects/{id}/heartbeat'],
  getEffect: ['GET /effects/{id}'],
  resolveEffect: ['POST /effects/{id}/resolve'],
  listEffects: ['GET /effects'],
  listEffectPolicies: ['GET /policies'],
  getEffectPolicy: ['GET /policies/{effect_type}'],
  getPolicyStructuring: ['GET /policies/{effect_type}/structuring'],
  updateEffectPolicy: ['PUT /policies/{effect_type}'],
  listApprovals: ['GET /approvals'],
  getApproval: ['GET /approvals/{id}'],
  approve: ['POST /approvals/{id}/approve'],
  reject: ['POST /approvals/{id}/reject'],
  listCircuits: ['GET /circuits'],
  openCircuit: ['POST /circuits/{effect_type}/open'],
  closeCircuit: ['POST /circuits/{effect_type}/close'],
  emergencyStop: ['POST /circuits/stop'],
  getEmergencyStop: ['GET /circuits/stop'],
  releaseEmergencyStop: ['POST /circuits/release'],
  createGroup: ['POST /groups'],
  getGroup: ['GET /groups/{id}'],
  listGroupSteps: ['GET /groups/{id}/steps'],
  commitGroup: ['POST /groups/{id}/commit'],
  unwindGroup: ['POST /groups/{id}/unwind'],
  createWebhook: ['POST /webhooks'],
  listWebhooks: ['GET /webhooks'],
  getWebhook: ['GET /webhooks/{id}'],
  updateWebhook: ['PATCH /webhooks/{id}'],
  deleteWebhook: ['DELETE /webhooks/{id}'],
  listWebhookDeliveries: ['GET /webhooks/{id}/deliveries'],
  retryWebhookDeliveries: ['POST /webhooks/{id}/deliveries/retry'],
  rotateWebhookSecret: ['POST /webhooks/{id}/rotate-secret'],
  createKey: ['POST /keys'],
  listKeys: ['GET /keys'],
  currentKey: ['GET /keys/current'],
  revokeKey: ['DELETE /keys/{id}'],
  listEndpoints: ['GET /endpoints'],
  createEndpoint: ['POST /endpoints'],
  getEndpoint: ['GET /endpoints/{id}/policy'],
  updateEndpointPolicy: ['PUT /endpoints/{id}/policy'],
  pauseEndpoint: ['POST /endpoints/{id}/pause'],
  resumeEndpoint: ['POST /endpoints/{id}/resume'],
  closeEndpointCircuit: ['POST /endpoints/{id}/circuit/close'],
  listEndpointAttempts: ['GET /endpoints/{id}/attempts'],
  publishContract: ['POST /tools/{name}/contracts'],
  listContracts: ['GET /tools/{name}/contracts'],
  testTool: ['POST /tools/{name}/test'],
  reconcile: ['POST /reconcile'],
  listQueueHealth: ['GET /queue/health'],
  registerWorker: ['POST /workers/register', 'workerId'],
  claim: ['POST /workers/{workerId}/claim', 'jobs'],
  heartbeatJob: ['POST /jobs/{id}/heartbeat'],
  reportJob: ['POST /jobs/{id}/report'],
};

// The methods whose answer the SDK makes itself, and why they are not compared.
const clientSide = {
  request: 'any route: its answer is the caller\'s T',
  registerTool: 'no call: void',
  doEffect: 'EffectOutcome is made by the SDK from begin\'s answer and the action\'s result',
  reportJobs: 'each BatchJobResult is a result of POST /jobs/report with error made a RatchetError (compared below)',
};

// Fields the SDK declares that the schema it mirrors does not hold, or the
// reverse, each with its reason, keyed by type path (Type.field).
const deliberate = {
  'BatchJobResult.error': 'the RatchetError the single report would have thrown, made by the SDK from the result\'s error envelope',
};

// --- the declarations, read as text ---------------------------------------

// splitTop splits s at each sep outside brackets, braces, parentheses,
// angle brackets (an arrow's > aside) and quotes.
function splitTop(s, sep) {
  const out = [];
  let depth = 0;
  let quote = '';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (quote) {
      if (c === quote) quote = '';
    } else if (c === '\'' || c === '"') quote = c;
    else if ('{[(<'.includes(c)) depth++;
    else if ('}])'.includes(c) || (c === '>' && s[i - 1] !== '=')) depth--;
    else if (depth === 0 && c === sep) {
      out.push(s.slice(start, i));
      start = i + 1;
    }
  }
  out.push(s.slice(start));
  return out.map((p) => p.trim()).filter((p) => p !== '');
}

// braced is the text between the { at open and its closing }.
function braced(text, open) {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === '{') depth++;
    else if (text[i] === '}' && --depth === 0) return text.slice(open + 1, i);
  }
  throw new Error(`unclosed { at ${open}`);
}

// parseMembers reads an object type's body: name → { optional, type }.
function parseMembers(body) {
  const members = new Map();
  for (const member of splitTop(body, ';')) {
    if (/^\w+\??\s*[(<]/.test(member)) continue; // a method (AbortSignalLike's): no answer's
    const m = member.match(/^(?:readonly\s+)?(\w+)(\??)\s*:\s*([\s\S]+)$/);
    assert.ok(m, `cannot read the member ${JSON.stringify(member)}`);
    members.set(m[1], { optional: m[2] === '?', type: m[3].trim() });
  }
  return members;
}

const interfaces = new Map(); // name → { params, bases, members }
for (const m of dts.matchAll(/^export interface (\w+)(?:<([^>]*)>)?\s*(?:extends ([^{]+))?\{/gm)) {
  interfaces.set(m[1], {
    params: m[2] ? splitTop(m[2], ',').map((p) => p.split(/\s*=\s*/)[0]) : [],
    bases: m[3] ? splitTop(m[3], ',') : [],
    members: parseMembers(braced(dts, m.index + m[0].length - 1)),
  });
}
const aliases = new Map(); // name → type text, to its ; outside braces
for (const m of dts.matchAll(/^export type (\w+)\s*=/gm)) {
  const rest = dts.slice(m.index + m[0].length);
  aliases.set(m[1], splitTop(rest, ';')[0]);
}

// substitute replaces each type parameter in type by its argument.
function substitute(type, params, args) {
  return params.reduce((t, p, i) => t.replace(new RegExp(`\\b${p}\\b`, 'g'), args[i]), type);
}

// generic splits 'Name<A, B>' into ['Name', ['A', 'B']] (no arguments: []).
function generic(type) {
  const m = type.match(/^(\w+)(?:<([\s\S]*)>)?$/);
  return m ? [m[1], m[2] ? splitTop(m[2], ',') : []] : null;
}

// objectMembers is the members of an object type (an inline { }, an
// interface with its bases, a Pick, Partial or Omit of one, an
// intersection), or null for any other type.
function objectMembers(type) {
  type = type.trim();
  if (type.startsWith('{') && type.endsWith('}')) return parseMembers(type.slice(1, -1));
  const parts = splitTop(type, '&');
  if (parts.length > 1) {
    const all = parts.map(objectMembers);
    return all.includes(null) ? null : new Map(all.flatMap((m) => [...m]));
  }
  const g = generic(type);
  if (!g) return null;
  const [name, args] = g;
  const of = (i) => objectMembers(args[i]);
  const literals = (i) => splitTop(args[i], '|').map((l) => l.replace(/^'|'$/g, ''));
  switch (name) {
    case 'Partial':
      return new Map([...of(0)].map(([n, f]) => [n, { ...f, optional: true }]));
    case 'Pick':
      return new Map([...of(0)].filter(([n]) => literals(1).includes(n)));
    case 'Omit':
      return new Map([...of(0)].filter(([n]) => !literals(1).includes(n)));
  }
  if (aliases.has(name)) return objectMembers(aliases.get(name));
  const decl = interfaces.get(name);
  if (!decl) return null;
  const members = new Map();
  for (const base of decl.bases) {
    const inherited = objectMembers(substitute(base, decl.params, args));
    assert.ok(inherited, `${name} extends ${base}, which is no object type`);
    for (const [n, f] of inherited) members.set(n, f);
  }
  for (const [n, f] of decl.members) members.set(n, { ...f, type: substitute(f.type, decl.params, args) });
  return members;
}

// The Ratchet class's methods: name → the type its promise resolves to.
const methods = new Map();
{
  const start = dts.indexOf('export declare class Ratchet ');
  for (const m of braced(dts, dts.indexOf('{', start)).matchAll(/^ {2}(\w+)(?:<[^>]*>)?\(.*\): (.+);$/gm)) {
    const promised = m[2].match(/^Promise<([\s\S]+)>$/);
    methods.set(m[1], promised ? promised[1] : m[2]);
  }
}

// --- the comparison -------------------------------------------------------

const ANY = new Set(['Json', 'any', 'unknown']);

// schemaNullable is true when the schema admits null.
function schemaNullable(s) {
  if (s === true || (typeof s === 'object' && !s.type && !s.enum && !s.anyOf && !s.oneOf && !s.$ref)) return true;
  if (Array.isArray(s.type) && s.type.includes('null')) return true;
  if (s.type === 'null' || (s.enum && s.enum.includes(null))) return true;
  return (s.anyOf || s.oneOf || []).some(schemaNullable);
}

function schemaTypes(s) {
  if (s === true) return [];
  return (Array.isArray(s.type) ? s.type : s.type ? [s.type] : []).filter((t) => t !== 'null');
}

// compare adds to problems each way type differs from schema s; at names
// the place (Type.field...).
function compare(type, s, at, problems, seen = new Set()) {
  // A named union (JobStatus, EffectState...) is its members, beside any null.
  const alternatives = splitTop(type.trim().replace(/^\((.*)\)$/s, '$1'), '|')
    .flatMap((a) => (aliases.has(a) && !ANY.has(a) && !objectMembers(a) ? splitTop(aliases.get(a), '|') : [a]));
  const declaredNull = alternatives.some((a) => a === 'null' || ANY.has(a));
  const rest = alternatives.filter((a) => a !== 'null' && a !== 'undefined');
  if (s.$ref) s = resolveRef(s.$ref);
  if (declaredNull !== schemaNullable(s)) {
    problems.push(`${at}: declared ${declaredNull ? 'nullable' : 'not nullable'} (${type}), the schema ${declaredNull ? 'never null' : 'allows null'}`);
  }
  if (rest.length === 0 || rest.some((a) => ANY.has(a))) return;
  const types = schemaTypes(s);
  if (rest.every((a) => /^'.*'$/.test(a))) {
    const declared = rest.map((a) => a.slice(1, -1)).sort();
    const documented = (s.enum || []).filter((v) => v !== null).sort();
    if (!types.includes('string')) problems.push(`${at}: declared string literals, the schema says ${JSON.stringify(types)}`);
    else if (s.enum && JSON.stringify(declared) !== JSON.stringify(documented)) {
      problems.push(`${at}: declared ${declared.join('|')}, the schema's enum is ${documented.join('|')}`);
    }
    return;
  }
  if (rest.length > 1) {
    problems.push(`${at}: declared the union ${type}, which this test cannot compare`);
    return;
  }
  const [one] = rest;
  const primitive = { string: ['string'], number: ['integer', 'number'], boolean: ['boolean'], true: ['boolean'] }[one];
  if (primitive) {
    if (!types.some((t) => primitive.includes(t))) problems.push(`${at}: declared ${one}, the schema says ${JSON.stringify(types)}`);
    else if (one === 'string' && (s.enum || []).some((v) => v !== null)) {
      problems.push(`${at}: declared string, the schema's enum is ${(s.enum).filter((v) => v !== null).sort().join('|')}: declare its literals`);
    }
    return;
  }
  const list = one.match(/^(?:readonly )?(\w+)\[\]$/) || one.match(/^(?:Readonly)?Array<([\s\S]+)>$/);
  if (list) {
    if (!types.includes('array')) problems.push(`${at}: declared a list, the schema says ${JSON.stringify(types)}`);
    else compare(list[1], s.items ?? true, `${at}[]`, problems, seen);
    return;
  }
  const map = one.match(/^Record<string, ([\s\S]+)>$/) || one.match(/^\{\s*\[\w+: string\]: ([\s\S]+?);?\s*\}$/);
  if (map) {
    // An object without properties named: any names, each value as
    // additionalProperties says (any value when it says nothing).
    if (!types.includes('object') || s.properties) problems.push(`${at}: declared a map, the schema says ${JSON.stringify(s).slice(0, 200)}`);
    else compare(map[1], s.additionalProperties ?? true, `${at}{}`, problems, seen);
    return;
  }
  const g = generic(one);
  if (g && aliases.has(g[0]) && !objectMembers(one)) {
    compare(aliases.get(g[0]), s, at, problems, seen);
    return;
  }
  const members = objectMembers(one);
  if (!members) {
    problems.push(`${at}: cannot compare the type ${one}`);
    return;
  }
  // A named type is reported under its own name (Page<Step>), once for
  // each schema.
  const name = g && (interfaces.has(g[0]) || aliases.has(g[0])) ? one.replace(/\s+/g, ' ') : at;
  const key = `${name} ${JSON.stringify(s)}`;
  if (seen.has(key)) return;
  seen.add(key);
  compareMembers(members, s, name, problems, seen);
}

function compareMembers(members, s, name, problems, seen) {
  if (!schemaTypes(s).includes('object') || !s.properties) {
    problems.push(`${name}: declared an object, the schema says ${JSON.stringify(s).slice(0, 200)}`);
    return;
  }
  const required = new Set(s.required || []);
  for (const [field, f] of members) {
    const at = `${name}.${field}`;
    const p = s.properties[field];
    if (deliberate[at]) continue;
    if (!p) {
      problems.push(`${at}: declared, not in the schema`);
      continue;
    }
    if (f.optional === required.has(field)) {
      problems.push(`${at}: declared ${f.optional ? 'optional' : 'always there'}, the schema ${required.has(field) ? 'requires it' : 'does not require it'}`);
    }
    compare(f.type, p, at, problems, seen);
  }
  for (const field of Object.keys(s.properties)) {
    if (!members.has(field) && !deliberate[`${name}.${field}`]) problems.push(`${name}.${field}: in the schema, not declared`);
  }
}

// --- the document -----------------------------------------------------------

let doc;
async function openapi() {
  if (!doc) {
    const response = await fetch(BASE_URL + '/api/v1/openapi.json');
    assert.equal(response.status, 200);
    doc = await response.json();
  }
  return doc;
}

function resolveRef(ref) {
  assert.match(ref, /^#\/components\/schemas\/\w+$/);
  return doc.components.schemas[ref.split('/').pop()];
}

// answer is the schema of route's success (its 2xx JSON answer).
function answer(route) {
  const [method, path] = route.split(' ');
  const op = doc.paths['/api/v1' + path]?.[method.toLowerCase()];
  assert.ok(op, `no ${route} in the OpenAPI document`);
  const ok = Object.keys(op.responses).filter((st) => /^2/.test(st)).sort();
  const schemas = ok.map((st) => op.responses[st].content?.['application/json']?.schema).filter(Boolean);
  assert.ok(schemas.length > 0, `${route} answers no JSON`);
  for (const other of schemas) assert.deepEqual(other, schemas[0], `${route}'s success answers differ`);
  return schemas[0];
}

// The schema begin's answer mirrors: its 200 decision, with the 403
// denial's error beside the decision fields (optional: only a denial has it).
function beginAnswer() {
  const decision = answer('POST /effects/begin');
  const denial = doc.paths['/api/v1/effects/begin'].post.responses['403'].content['application/json'].schema.anyOf
    .find((s) => !s.$ref);
  assert.ok(denial?.properties?.error, 'no denial body beside the error envelope of begin\'s 403');
  return { ...decision, properties: { ...decision.properties, error: denial.properties.error } };
}

// --- the tests --------------------------------------------------------------

test('every Ratchet method that answers is mapped to its route, or said to be made by the SDK', () => {
  assert.ok(methods.size > 60, `only ${methods.size} methods found`);
  for (const [name, type] of methods) {
    if (type === 'void') continue;
    assert.ok(routes[name] || clientSide[name], `${name} (${type}) has no route in this test`);
  }
  for (const name of [...Object.keys(routes), ...Object.keys(clientSide)]) assert.ok(methods.has(name), `${name} is not declared`);
});

test("every method's declared answer is what its route's schema says", needsServer, async () => {
  await openapi();
  const problems = [];
  const seen = new Set();
  for (const [name, [route, at]] of Object.entries(routes)) {
    let schema = name === 'begin' ? beginAnswer() : answer(route);
    if (at) {
      assert.ok(schema.properties?.[at], `${route} answers no ${at}`);
      assert.ok(schema.required?.includes(at), `${route} may leave out ${at}`);
      schema = schema.properties[at];
    }
    compare(methods.get(name), schema, `${name}()`, problems, seen);
  }
  assert.deepEqual(problems, []);
});

test("a batch report's results are reportJob's, with the SDK's error", needsServer, async () => {
  await openapi();
  const result = answer('POST /jobs/report');
  const items = result.properties?.results?.items;
  assert.ok(items, 'POST /jobs/report answers no results list');
  const problems = [];
  // Each result the server answers is its report's JobReportResult, with the
  // error envelope of a report refused; the SDK makes that a RatchetError.
  compare('BatchJobResult', items, 'reportJobs()', problems);
  assert.deepEqual(problems, []);
});

test('a webhook delivery is the WebhookEvent the document states', needsServer, async () => {
  await openapi();
  const problems = [];
  compare('WebhookEvent', doc.components.schemas.WebhookEvent, 'verifyWebhook()', problems);
  assert.deepEqual(problems, []);
});

test('the comparison asks for the literals of an enum, and exactly them', () => {
  const enumOf = { type: 'string', enum: ['on', 'off', null] };
  const problems = [];
  compare('string | null', enumOf, 'a', problems);
  compare("'on' | null", enumOf, 'b', problems);
  compare("'on' | 'off' | null", enumOf, 'c', problems);
  compare('string[]', { type: 'array', items: { type: 'string', enum: ['x'] } }, 'd', problems);
  compare('string', { type: 'string' }, 'e', problems);
  assert.deepEqual(problems, [
    "a: declared string, the schema's enum is off|on: declare its literals",
    "b: declared on, the schema's enum is off|on",
    "d[]: declared string, the schema's enum is x: declare its literals",
  ]);
});

test('every deliberate difference names a declared field', () => {
  // A reason left after its difference went would excuse the next one.
  for (const at of Object.keys(deliberate)) {
    const [type, field] = at.split('.');
    assert.ok(objectMembers(type)?.has(field), `${at} is not declared`);
  }
});
