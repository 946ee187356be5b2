#!/usr/bin/env bash
# Creates a throwaway git repository with a tiny JavaScript toolkit and its tests.
# Usage: make-repo.sh DIR   (DIR must not exist or be empty)
set -euo pipefail
dir=${1:?usage: make-repo.sh DIR}
mkdir -p "$dir"
cd "$dir"
git init -q -b main
git config user.name "Demo User"
git config user.email "demo@example.com"
mkdir -p src test
cat > package.json <<'JSON'
{ "name": "toolkit", "version": "1.0.0", "private": true, "scripts": { "test": "node --test" } }
JSON
cat > src/slug.js <<'JS'
// Turns a title into a URL slug.
function slug(text) {
  return text.toLowerCase().trim().replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '');
}
module.exports = { slug };
JS
cat > test/slug.test.js <<'JS'
const test = require('node:test');
const assert = require('node:assert');
const { slug } = require('../src/slug');
test('slug', () => assert.strictEqual(slug('  Hello, World! '), 'hello-world'));
JS
cat > README.md <<'MD'
# toolkit
Small helpers, one per file in `src/`, each with a test in `test/`.
MD
printf 'node_modules/\n.env\n' > .gitignore
git add -A
git commit -q -m "toolkit: slug helper and tests"
echo "$dir"
