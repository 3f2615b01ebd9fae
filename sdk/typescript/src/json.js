// JSON written as JSON.stringify writes it, at any depth.
//
// The API takes values nested up to 10 000 levels (a job's input, an
// effect's payload and result, a step's output). JSON.parse reads them (V8's
// parser keeps its own stack), but JSON.stringify recurses once a level and
// throws RangeError (the call stack's size) near 4 500 levels on Node 20: a
// deep output was reported as not JSON, and a deep payload, result or input
// could not be sent. stringify is JSON.stringify where that answers, and on
// that RangeError the same writing done with an array for a stack: the same
// text, character for character, the same toJSON and replacer calls, the
// same TypeErrors (a cycle, a BigInt).

import { types } from 'node:util';

const STACK_EXHAUSTED = /call stack/i;

/**
 * JSON.stringify(value, replacer) at any depth; replacer is a function or
 * undefined.
 */
export function stringify(value, replacer) {
  try {
    return JSON.stringify(value, replacer);
  } catch (err) {
    // Only the call stack's own exhaustion: anything else (a replacer's or
    // a toJSON's error, a cycle, a BigInt) is the value's, thrown as it is.
    if (!(err instanceof RangeError) || !STACK_EXHAUSTED.test(err.message)) throw err;
  }
  return stringifyIteratively(value, replacer);
}

/**
 * stringify(value), refusing what JSON has no number for and JSON.stringify
 * writes as null: NaN and the infinities (a RangeError), and a Map or a Set
 * it writes as {} (a TypeError), as Go's
 * encoding/json and Python's allow_nan=False refuse them. What the SDK
 * sends is written by it: an input, a payload or a result holding NaN went
 * out as null, a value the caller never gave (and a gate result recorded
 * so, where the Go and Python SDKs record result_not_json).
 */
export function stringifyFinite(value) {
  return stringify(value, finiteOnly);
}

function finiteOnly(key, value) {
  if (typeof value === 'number' && !Number.isFinite(value)) throw new RangeError(`ratchet: ${value} is not a JSON number`);
  // A Map or a Set has no enumerable own properties: JSON.stringify writes
  // it as {}, its entries dropped unseen (one with a toJSON is written by
  // it, as it answers before this replacer is called).
  if (types.isMap(value) || types.isSet(value)) {
    throw new TypeError(`ratchet: a ${types.isMap(value) ? 'Map' : 'Set'} is not JSON (JSON.stringify writes it as {}); send an object or an array`);
  }
  return value;
}

/** JSON.stringify's algorithm (ECMA-262 SerializeJSONProperty and its
 * callers) with the arrays and objects being written on a stack. */
export function stringifyIteratively(value, replacer) {
  const out = [];
  const stack = []; // { holder, array, keys, length, index, wrote }
  const open = new Set(); // the objects being written: one met again is a cycle

  // holder[key] as it is written: its toJSON's answer, then the replacer's,
  // a Number, String, Boolean or BigInt object read as its primitive.
  const prepare = (holder, key) => {
    let v = holder[key];
    if ((typeof v === 'object' && v !== null) || typeof v === 'bigint') {
      const toJSON = v.toJSON;
      if (typeof toJSON === 'function') v = toJSON.call(v, key);
    }
    if (typeof replacer === 'function') v = replacer.call(holder, key, v);
    if (typeof v === 'object' && v !== null && types.isBoxedPrimitive(v)) {
      // By the internal slot, whatever the prototype says.
      if (types.isNumberObject(v)) v = Number(v);
      else if (types.isStringObject(v)) v = String(v);
      else if (types.isBooleanObject(v)) v = Boolean.prototype.valueOf.call(v);
      else if (types.isBigIntObject(v)) v = BigInt.prototype.valueOf.call(v);
    }
    return v;
  };
  // Whether v is written at all (undefined, a function and a symbol are not).
  const written = (v) => v === null || (typeof v !== 'undefined' && typeof v !== 'function' && typeof v !== 'symbol');
  // Writes v, a written value: a primitive whole, an array or object opened.
  const write = (v) => {
    switch (typeof v) {
      case 'bigint':
        throw new TypeError('Do not know how to serialize a BigInt');
      case 'object':
        if (v === null) break;
        if (open.has(v)) throw new TypeError('Converting circular structure to JSON');
        open.add(v);
        if (Array.isArray(v)) {
          out.push('[');
          stack.push({ holder: v, array: true, length: v.length, index: 0, wrote: false });
        } else {
          out.push('{');
          const keys = Object.keys(v);
          stack.push({ holder: v, array: false, keys, length: keys.length, index: 0, wrote: false });
        }
        return;
    }
    // null, a boolean, a string or a number: JSON.stringify's own text (a
    // number that is not finite is null).
    out.push(JSON.stringify(v));
  };

  const top = prepare({ '': value }, '');
  if (!written(top)) return undefined;
  write(top);
  while (stack.length > 0) {
    const frame = stack[stack.length - 1];
    if (frame.index >= frame.length) {
      out.push(frame.array ? ']' : '}');
      open.delete(frame.holder);
      stack.pop();
      continue;
    }
    const key = frame.array ? String(frame.index) : frame.keys[frame.index];
    frame.index++;
    const v = prepare(frame.holder, key);
    if (frame.array) {
      if (frame.wrote) out.push(',');
      frame.wrote = true;
      if (written(v)) write(v);
      else out.push('null');
    } else if (written(v)) {
      if (frame.wrote) out.push(',');
      frame.wrote = true;
      out.push(JSON.stringify(key), ':');
      write(v);
    }
  }
  return out.join('');
}
