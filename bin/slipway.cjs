#!/usr/bin/env node
// Runs the TypeScript CLI through tsx, resolved relative to this file so it works from any folder.
require('tsx/cjs');
const { main } = require('../cli/main.ts');
main(process.argv).then((code) => {
  process.exitCode = code;
  setTimeout(() => process.exit(code), 100).unref();
});
