#!/usr/bin/env node
// Demo builder agent (script provider). Reads the prompt on stdin, writes the helper its
// stream asks for and commits it. The `clamp` stream writes a bug on its first iteration,
// which the test gate catches; with the gate output as feedback it writes the fix.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';

const prompt = readFileSync(0, 'utf8');
const stream = process.env.SLIPWAY_STREAM;
const fixing = process.env.SLIPWAY_FEEDBACK_KIND !== '';
console.log(`builder: stream ${stream}, iteration ${process.env.SLIPWAY_ITERATION}, prompt of ${prompt.length} chars`);

const helpers = {
  greet: {
    code: `function greet(name) {\n  return \`Hello, \${name}!\`;\n}\nmodule.exports = { greet };\n`,
    test: `assert.strictEqual(greet('Ada'), 'Hello, Ada!');`,
  },
  sum: {
    code: `function sum(values) {\n  return values.reduce((total, v) => total + v, 0);\n}\nmodule.exports = { sum };\n`,
    test: `assert.strictEqual(sum([1, 2, 3]), 6);\n  assert.strictEqual(sum([]), 0);`,
  },
  clamp: {
    code: fixing
      ? `function clamp(value, low, high) {\n  return Math.min(Math.max(value, low), high);\n}\nmodule.exports = { clamp };\n`
      : `function clamp(value, low, high) {\n  return Math.max(value, low); // forgot the upper bound\n}\nmodule.exports = { clamp };\n`,
    test: `assert.strictEqual(clamp(5, 0, 10), 5);\n  assert.strictEqual(clamp(-1, 0, 10), 0);\n  assert.strictEqual(clamp(11, 0, 10), 10);`,
  },
};

const helper = helpers[stream];
if (!helper) {
  console.error(`builder: no plan for stream "${stream}"`);
  process.exit(3);
}
mkdirSync('src', { recursive: true });
mkdirSync('test', { recursive: true });
writeFileSync(`src/${stream}.js`, `// ${process.env.SLIPWAY_TASK}\n${helper.code}`);
writeFileSync(
  `test/${stream}.test.js`,
  `const test = require('node:test');\nconst assert = require('node:assert');\nconst { ${stream} } = require('../src/${stream}');\ntest('${stream}', () => {\n  ${helper.test}\n});\n`,
);
execFileSync('git', ['add', '-A']);
execFileSync('git', ['commit', '-q', '-m', `${stream}: ${fixing ? 'fix after gate failure' : 'add helper and test'}`]);
console.log(`builder: committed src/${stream}.js`);
