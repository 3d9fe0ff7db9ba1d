/**
 * How `npm run bench` loads its endpoints (docs/benchmarks.md, "Any endpoint"): each one
 * gets its own `concurrency` clients, all running at the same time, so a slower endpoint
 * never takes clients from a faster one and each is measured at the load asked for.
 */

/** What {@link loadEndpoints} runs. */
export interface EndpointLoad<S> {
  endpoints: number;
  /** Clients per endpoint, each sending its next request once its last one ended. */
  concurrency: number;
  /** Requests per endpoint; null to run until `deadline`. */
  requests: number | null;
  /** `performance.now()` after which no client starts another request. */
  deadline: number;
  /** Sends the endpoint's `i`-th request (0, 1, … per endpoint) and measures it. */
  send: (endpoint: number, i: number) => Promise<S>;
  /** Told of every sample as it comes. */
  onSample?: (endpoint: number, sample: S) => void;
}

/** Each endpoint's samples, and the seconds from the start to its last request's end. */
export interface EndpointRuns<S> {
  samples: S[][];
  seconds: number[];
}

/** Runs `concurrency` clients per endpoint at once until each has sent its requests. */
export async function loadEndpoints<S>(load: EndpointLoad<S>): Promise<EndpointRuns<S>> {
  const samples: S[][] = Array.from({ length: load.endpoints }, () => []);
  const seconds: number[] = Array.from({ length: load.endpoints }, () => 0);
  const started = performance.now();
  const endpoint = async (index: number) => {
    let next = 0;
    const client = async () => {
      for (;;) {
        if (performance.now() >= load.deadline) return;
        const i = next++;
        if (load.requests !== null && i >= load.requests) return;
        const sample = await load.send(index, i);
        samples[index]?.push(sample);
        load.onSample?.(index, sample);
      }
    };
    await Promise.all(Array.from({ length: load.concurrency }, client));
    seconds[index] = (performance.now() - started) / 1000;
  };
  await Promise.all(Array.from({ length: load.endpoints }, (_, index) => endpoint(index)));
  return { samples, seconds };
}
