/**
 * The simulated engine's step cost model (docs/configuration.md, "The simulated engine"):
 * how long one engine step takes for what it computes and reads.
 */
/** Cost model of one engine step, in simulated milliseconds. */
export interface SimTiming {
  /** Fixed cost of a step (kernel launches, sampling, scheduling). */
  stepBaseMs: number;
  /** Per prompt token computed in the step (prefill is compute-bound). */
  prefillMsPerToken: number;
  /** Per sequence decoding one token in the step. */
  decodeMsPerSeq: number;
  /** Per thousand context tokens the step's attention reads from KV memory. */
  kvReadMsPerKTokens: number;
}

/** Step costs resembling an 8B model on one H100-class GPU. */
export const DEFAULT_SIM_TIMING: Readonly<SimTiming> = {
  stepBaseMs: 4,
  prefillMsPerToken: 0.06,
  decodeMsPerSeq: 0.12,
  kvReadMsPerKTokens: 0.03,
};

/** Duration of a step that computes `prefillTokens`, decodes `decodeSeqs` and reads `contextTokens`. */
export function stepDurationMs(
  timing: SimTiming,
  prefillTokens: number,
  decodeSeqs: number,
  contextTokens: number,
): number {
  return (
    timing.stepBaseMs +
    timing.prefillMsPerToken * prefillTokens +
    timing.decodeMsPerSeq * decodeSeqs +
    (timing.kvReadMsPerKTokens * contextTokens) / 1000
  );
}
