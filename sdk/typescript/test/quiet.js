// A worker started without onError writes its default failure log to
// console.warn ('ratchet worker...'), which printed into the tests' output.
// Importing this module drops those lines and passes every other warning on;
// the tests of that log mock console.warn over it and assert its lines.

const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === 'string' && args[0].startsWith('ratchet worker')) return;
  warn(...args);
};
