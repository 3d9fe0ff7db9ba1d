/**
 * Values the workers project's global setup provides to its tests.
 */

/** Origins the global setup started, by id, with their region. */
export interface TestOrigin {
  id: string;
  region: string;
  url: string;
}

/** Signing secret of the workers project's edge (`TOKEN_SIGNING_SECRET`). */
export const TEST_SIGNING_SECRET = "test-token-signing-secret";

/** Signing secret of the workers project's soft-budget alerts (`ALERT_SIGNING_SECRET`). */
export const TEST_ALERT_SECRET = "test-alert-signing-secret";

/** Admin token of the workers project's edge (`ADMIN_TOKEN`). */
export const TEST_ADMIN_TOKEN = "test-admin-token";

/** The access token of the test origin that demands one (`credential-1`). */
export const CREDENTIAL_ORIGIN_TOKEN = "credential-origin-token";

/** Id of the API key every workers test file may use (see test/support/test-key.ts). */
export const TEST_KEY_ID = "warmgatetestkey2";

/**
 * The API key of {@link TEST_KEY_ID}: a real key, minted once under
 * {@link TEST_SIGNING_SECRET}, whose KeyAccount the workers setup creates.
 */
export const TEST_API_KEY = "wg_warmgatetestkey2_testsecretfortheworkerststxwx6a2bg";

declare module "vitest" {
  export interface ProvidedContext {
    /** `WARMGATE_CONFIG` the edge under test runs with. */
    warmgateConfig: string;
    /** Every origin started for the run. */
    testOrigins: TestOrigin[];
    /** Base URL of the soft-budget alert receiver (test/support/alert-receiver.ts). */
    alertReceiver: string;
  }
}
