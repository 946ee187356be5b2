#!/usr/bin/env node
// Demo reviewer agent (script provider): approves when the stream's helper and its test exist.
import { existsSync, readFileSync } from 'node:fs';

readFileSync(0, 'utf8'); // the prompt
const stream = process.env.SLIPWAY_STREAM;
const findings = [];
if (!existsSync(`src/${stream}.js`)) findings.push(`src/${stream}.js is missing`);
if (!existsSync(`test/${stream}.test.js`)) findings.push(`test/${stream}.test.js is missing`);
const verdict = findings.length === 0
  ? { verdict: 'approve', summary: `${stream} has an implementation and a test` }
  : { verdict: 'reject', summary: 'incomplete change', findings };
console.log(`<review>${JSON.stringify(verdict)}</review>`);
