/**
 * The library entry of the `slipway` package (`import ... from 'slipway'`, built to
 * dist/index.js with its .d.ts). The typed client API is added here; for now it exposes the
 * objective file's loader and the types a caller needs to read its results.
 */
export { loadObjectiveFile, ObjectiveFileError } from './config/objective-file';
export type { ObjectiveInput, ObjectiveResult, ObjectiveStatus } from './core/types';
