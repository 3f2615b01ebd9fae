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
