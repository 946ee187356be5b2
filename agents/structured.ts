/**
 * Structured output: an agent answers inside a tag (`<review>{...}</review>`); the last such
 * block is parsed as JSON and validated with zod.
 */
import { z } from 'zod';
import { StreamSchema } from '../core/objective-schema';
import { streamGraphIssues } from '../core/stream-graph';

export const ReviewVerdictSchema = z.object({
  verdict: z.enum(['approve', 'reject']),
  summary: z.string().optional(),
  findings: z.array(z.string()).default([]),
});
export type ReviewVerdict = z.infer<typeof ReviewVerdictSchema>;

export type Extracted<T> = { ok: true; value: T } | { ok: false; error: string };

export function extractTagged<T>(text: string, tag: string, schema: z.ZodType<T>): Extracted<T> {
  const pattern = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`, 'g');
  const blocks = [...text.matchAll(pattern)];
  if (blocks.length === 0) return { ok: false, error: `no <${tag}>…</${tag}> block in the output` };
  const raw = blocks[blocks.length - 1][1].trim();
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (e) {
    return { ok: false, error: `<${tag}> does not hold valid JSON: ${(e as Error).message}` };
  }
  const parsed = schema.safeParse(json);
  if (!parsed.success) {
    return { ok: false, error: `<${tag}> is invalid: ${parsed.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}` };
  }
  return { ok: true, value: parsed.data };
}

/** A planner's answer: the streams of the objective, with valid ids and dependencies, at most `MAX_STREAMS`. */
export const PlanSchema = z
  .object({ streams: z.array(StreamSchema).min(1) })
  .superRefine((plan, ctx) => {
    for (const issue of streamGraphIssues(plan.streams)) ctx.addIssue({ code: 'custom', ...issue });
  });
