/**
 * The floor for any edge: a Worker that forwards each request to one origin and
 * returns its response as is. Benchmarks compare warmgate against it.
 * See docs/benchmarks.md.
 */
interface PassthroughEnv {
  ORIGIN_URL: string;
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    return fetch(env.ORIGIN_URL + url.pathname + url.search, {
      method: request.method,
      headers: request.headers,
      body: request.body,
    });
  },
} satisfies ExportedHandler<PassthroughEnv>;
