/** Writes api/openapi.json from the zod schemas (`npm run openapi`); a test keeps it current. */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { buildOpenApiDocument } from './openapi';

export const OPENAPI_FILE = path.join(__dirname, 'openapi.json');
export const renderOpenApi = () => JSON.stringify(buildOpenApiDocument(), null, 2) + '\n';

if (require.main === module) {
  writeFileSync(OPENAPI_FILE, renderOpenApi());
  process.stdout.write(`wrote ${path.relative(process.cwd(), OPENAPI_FILE)}\n`);
}
