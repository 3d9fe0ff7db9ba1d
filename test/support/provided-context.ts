/**
 * Values the workers project's global setup provides to its tests.
 */

/** Origins the global setup started, by id, with their region. */
export interface TestOrigin {
  id: string;
  region: string;
  url: string;
}

/** API key the test edge accepts. */
export const TEST_API_KEY = "wg-test-key-0123456789";

declare module "vitest" {
  export interface ProvidedContext {
    /** `WARMGATE_CONFIG` the edge under test runs with. */
    warmgateConfig: string;
    /** Every origin started for the run. */
    testOrigins: TestOrigin[];
  }
}
