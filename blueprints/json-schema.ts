/**
 * The blueprint JSON Schema (for editors), generated from `BlueprintSchema`. Input mode:
 * fields with defaults are optional, as they are in a YAML file.
 * `scripts/blueprint-json-schema.ts` writes it to `blueprints/blueprint.schema.json`.
 */
import path from 'node:path';
import { z } from 'zod';
import { BlueprintSchema } from '../core/blueprint-schema';

export const BLUEPRINT_JSON_SCHEMA_FILE = path.join(__dirname, 'blueprint.schema.json');

export function blueprintJsonSchema(): Record<string, unknown> {
  // draft-07: the draft YAML editors (yaml-language-server) understand best.
  const schema = z.toJSONSchema(BlueprintSchema, { io: 'input', target: 'draft-7' }) as Record<string, unknown>;
  const { $schema, ...rest } = schema;
  return {
    $schema,
    title: 'Slipway blueprint',
    description: 'A state machine of steps that a Slipway workflow interprets. Generated from core/blueprint-schema.ts; do not edit.',
    ...rest,
  };
}

/** The file's text: two-space JSON with a final newline. */
export function blueprintJsonSchemaText(): string {
  return `${JSON.stringify(blueprintJsonSchema(), null, 2)}\n`;
}
