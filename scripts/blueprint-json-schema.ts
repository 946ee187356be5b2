/**
 * Writes blueprints/blueprint.schema.json from the zod schema. Run after changing
 * core/blueprint-schema.ts:  npx tsx scripts/blueprint-json-schema.ts
 * (test/blueprints.test.ts fails while the committed file is out of date.)
 */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { BLUEPRINT_JSON_SCHEMA_FILE, blueprintJsonSchemaText } from '../blueprints/json-schema';

writeFileSync(BLUEPRINT_JSON_SCHEMA_FILE, blueprintJsonSchemaText());
console.log(`wrote ${path.relative(process.cwd(), BLUEPRINT_JSON_SCHEMA_FILE)}`);
