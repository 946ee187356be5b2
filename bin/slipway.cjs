#!/usr/bin/env node
// Runs the compiled CLI (dist/, built by `npm run build`; scripts/setup.sh builds it in a checkout).
let main;
try {
  ({ main } = require('../dist/cli/main.js'));
} catch (e) {
  if (e && e.code === 'MODULE_NOT_FOUND' && String(e.message).includes('dist/cli/main.js')) {
    process.stderr.write('slipway: the compiled CLI (dist/) is missing: run `npm run build` in this checkout\n');
    process.exit(1);
  }
  throw e;
}
main(process.argv).then((code) => {
  process.exitCode = code;
  setTimeout(() => process.exit(code), 100).unref();
});
