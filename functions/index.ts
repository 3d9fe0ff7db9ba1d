/**
 * The edge Worker (docs/edge.md): the Hono app with its route groups, and the Durable
 * Object classes it exports.
 */
import { env } from "cloudflare:workers";
import { Hono } from "hono";
import { adminKeys } from "./routes/admin/keys.ts";
import { adminTeams } from "./routes/admin/teams.ts";
import { adminKeyRequests } from "./routes/admin/key-requests.ts";
import { audit } from "./routes/admin/audit.ts";
import { adminUsage } from "./routes/admin/usage.ts";
import { adminRequests } from "./routes/admin/requests.ts";
import type { AppEnv } from "./app-env.ts";
import { tokens } from "./routes/tokens.ts";
import { checkDeployment } from "./deployment.ts";
import { EdgeState } from "./edge-state.ts";
import { handleError, handleNotFound } from "./error-handler.ts";
import { authenticate } from "./middleware/auth.ts";
import { browserCors } from "./middleware/cors.ts";
import { gatewayConfig } from "./middleware/gateway-config.ts";
import { isolateState } from "./middleware/edge-state.ts";
import { requestContext } from "./middleware/request-context.ts";
import { countAnswers } from "./middleware/answer-count.ts";
import { batchers } from "./routes/admin/batchers.ts";
import { breakers } from "./routes/admin/breakers.ts";
import { canaries } from "./routes/admin/canaries.ts";
import { batches } from "./routes/batches.ts";
import { completions } from "./routes/completions.ts";
import { files } from "./routes/files.ts";
import { health } from "./routes/health.ts";
import { models } from "./routes/models.ts";
import { dashboard } from "./routes/dashboard.ts";
import { metrics, stats } from "./routes/observability.ts";
import { usage } from "./routes/usage.ts";

/** The warmgate edge Worker. */
const app = new Hono<AppEnv>();

// Module scope runs once per isolate: its one state, from the bindings (docs/edge.md).
app.use(isolateState(new EdgeState(env)));
app.use(requestContext());
app.use(countAnswers());
// The dashboard's page and files: static, and no secret needed to load them.
app.route("/", dashboard);
app.use("/v1/*", browserCors());
// Before config and key auth: the admin API, token minting and CORS preflights
// authenticate themselves and must answer even when the gateway config is broken.
app.route("/admin", adminKeys);
app.route("/admin", adminTeams);
app.route("/admin/keys", adminKeyRequests);
app.route("/admin/audit", audit);
app.route("/admin/usage", adminUsage);
app.route("/admin/requests", adminRequests);
app.route("/v1", tokens);
app.use(gatewayConfig());
app.route("/health", health);
// After the config: the route resolves batcher names from it.
app.route("/admin/batchers", batchers);
app.route("/admin/breakers", breakers);
app.route("/admin/canaries", canaries);
app.route("/admin/stats", stats);
app.route("/metrics", metrics);
// Keys are checked at the edge first (no storage call for forged ones); completions then
// make their one KeyAccount call after the body is planned (see routes/completions.ts).
app.use("/v1/*", authenticate());
// `/v1/models` checks the key in its account itself: its answer lists the key's models.
app.route("/v1/models", models);
app.route("/v1/usage", usage);
app.route("/v1/files", files);
app.route("/v1/batches", batches);
app.route("/v1", completions);
app.notFound(handleNotFound);
app.onError(handleError);

// Module scope runs when workerd loads the Worker: `wrangler dev` shows a bad config or a
// missing secret at start-up (requests then answer 500 config_error), and outside local
// runs a configuration that cannot work stops the Worker from starting or deploying.
checkDeployment(env);

export default app satisfies ExportedHandler<Env>;
export { KeyAccount } from "../durable-objects/key-account/index.ts";
export { KeyDirectory } from "../durable-objects/key-directory/index.ts";
export { TeamAccount } from "../durable-objects/team-account/index.ts";
export { Batcher } from "../durable-objects/batcher/index.ts";
export { BatcherShards } from "../durable-objects/batcher-shards/index.ts";
export { OriginBreakers } from "../durable-objects/origin-breakers/index.ts";
export { Canaries } from "../durable-objects/canaries/index.ts";
export { AnswerTally } from "../durable-objects/answer-tally/index.ts";
export { BatchRun } from "../durable-objects/batch-run/index.ts";
