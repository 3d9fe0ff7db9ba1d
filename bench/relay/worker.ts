/**
 * Three ways for a Durable Object to stream bytes to the client of another Worker, as the
 * Batcher streams each caller's tokens (bench/relay.ts measures them):
 *
 * - `/read`: the object returns a ReadableStream over RPC and the Worker reads it chunk by
 *   chunk into its response (how the edge relayed the Batcher's frames before);
 * - `/handoff`: the Worker hands the object the writable side of its response body, and
 *   the runtime carries each write to the client without the Worker running per chunk;
 * - `/pass`: the object returns a ReadableStream over RPC and the Worker makes it its
 *   response body as it is (how the edge takes a Batcher's body stream now: unlike a handed
 *   writable, a returned stream is errored by the runtime when the object goes away).
 *
 * The object writes `n` SSE-sized chunks, each once the last one was taken (as tokens come).
 */
import { DurableObject } from "cloudflare:workers";

interface RelayEnv {
  SOURCE: DurableObjectNamespace<Source>;
}

const encoder = new TextEncoder();
const token = (i: number) =>
  encoder.encode(
    `data: {"choices":[{"index":0,"delta":{"content":"token ${i}"},"finish_reason":null}]}\n\n`,
  );

async function writeTokens(writable: WritableStream<Uint8Array>, n: number): Promise<void> {
  const writer = writable.getWriter();
  try {
    for (let i = 0; i < n; i++) await writer.write(token(i));
    await writer.close();
  } catch {
    // The client went away.
  }
}

export class Source extends DurableObject<RelayEnv> {
  read(n: number): ReadableStream<Uint8Array> {
    const { readable, writable } = new IdentityTransformStream();
    this.ctx.waitUntil(writeTokens(writable, n));
    return readable;
  }

  handoff(n: number, body: WritableStream<Uint8Array>): void {
    this.ctx.waitUntil(writeTokens(body, n));
  }
}

const SSE = { "content-type": "text/event-stream" };

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const n = Number(url.searchParams.get("n") ?? "16");
    const source = env.SOURCE.getByName("source");
    if (url.pathname === "/read") {
      const reader = (await source.read(n)).getReader();
      const body = new ReadableStream<Uint8Array>(
        {
          async pull(controller) {
            const { done, value } = await reader.read();
            if (done) controller.close();
            else controller.enqueue(value);
          },
        },
        { highWaterMark: 0 },
      );
      return new Response(body, { headers: SSE });
    }
    if (url.pathname === "/pass") {
      return new Response(await source.read(n), { headers: SSE });
    }
    if (url.pathname === "/handoff") {
      const { readable, writable } = new IdentityTransformStream();
      await source.handoff(n, writable);
      return new Response(readable, { headers: SSE });
    }
    return new Response("ok");
  },
} satisfies ExportedHandler<RelayEnv>;
