/** Workflow entry point for the worker bundle: exports every workflow type. */
export { objectiveWorkflow } from './objective';
export { streamWorkflow } from './stream';
export { sandboxWorkflow } from './sandbox';
export { serviceSandboxWorkflow, sandboxReaperWorkflow } from './service-sandbox';
export { janitorWorkflow } from './janitor';
export { sandboxServiceCallWorkflow } from './service-call';
