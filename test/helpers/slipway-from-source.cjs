// The CLI from source through tsx, for tests: they exercise the tree as it is, built or not
// (bin/slipway.cjs runs the compiled dist/, which test/package.test.ts and cli-startup cover).
require('tsx/cjs');
const { main } = require('../../cli/main.ts');
main(process.argv).then((code) => {
  process.exitCode = code;
  setTimeout(() => process.exit(code), 100).unref();
});
