/**
 * The chat body the latency benchmarks send (docs/benchmarks.md): bench:overhead, bench:ab,
 * bench:profile, bench:auth, bench:lease and bench:tail alike.
 */
/**
 * The chat request the latency benchmarks send (deterministic, so the prefix cache warms);
 * with `promptTokens`, a prompt of that many tokens by the edge's estimate and the simulated
 * engine's count alike: three-letter words (one token each to both), from a fixed seed.
 */
export function benchChatBody(maxTokens: number, stream: boolean, promptTokens = 0): string {
  let user = "Say hello to the benchmark.";
  if (promptTokens > 0) {
    let seed = 7;
    const letter = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      return String.fromCharCode(97 + ((seed >>> 16) % 26));
    };
    // The template's tokens around the two messages come off the words.
    const words = Array.from({ length: promptTokens - 40 }, () => letter() + letter() + letter());
    user = words.join(" ");
  }
  return JSON.stringify({
    model: "warmgate-sim-8b",
    messages: [
      { role: "system", content: "You are a concise assistant." },
      { role: "user", content: user },
    ],
    max_tokens: maxTokens,
    seed: 7,
    stream,
  });
}
