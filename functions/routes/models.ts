/**
 * `GET /v1/models` and `GET /v1/models/{id}` in OpenAI's list shape, each model with
 * `max_model_len` (its context window, as vLLM reports it) and `pricing` (USD per 1M
 * input, cached input and output tokens): only the models the caller may use (its key's,
 * its team's and its browser token's), as its account's admission rule says in the one call
 * that checks the key is live.
 * See docs/edge.md.
 */
import { type Context, Hono } from "hono";
import type { AppEnv } from "../app-env.ts";
import { checkCaller } from "../middleware/auth.ts";
import { type ModelConfig, resolveModels } from "../../contracts/config/models.ts";
import { methodNotAllowed } from "../error-handler.ts";
import { modelNotFound } from "../../contracts/errors.ts";
import { type ModelPrice, microsToUsd } from "../../contracts/pricing.ts";

/** A model object as `GET /v1/models` returns it (OpenAI's fields plus vLLM's). */
export interface ModelObject {
  id: string;
  object: "model";
  created: number;
  owned_by: string;
  root: string;
  parent: null;
  max_model_len: number;
  pricing: PricingJson;
}

/** The `pricing` object of a model in `GET /v1/models`, in USD per 1M tokens. */
export interface PricingJson {
  input_per_mtok: number;
  cached_input_per_mtok: number;
  output_per_mtok: number;
}

function pricingJson(price: ModelPrice): PricingJson {
  return {
    input_per_mtok: microsToUsd(price.inputMicrosPerMtok),
    cached_input_per_mtok: microsToUsd(price.cachedInputMicrosPerMtok),
    output_per_mtok: microsToUsd(price.outputMicrosPerMtok),
  };
}

// Models come from configuration, which has no creation time; a fixed value keeps
// responses identical across isolates.
const CREATED = 0;

function toModelObject(model: ModelConfig): ModelObject {
  return {
    id: model.id,
    object: "model",
    created: CREATED,
    owned_by: model.ownedBy,
    root: model.id,
    parent: null,
    max_model_len: model.maxModelLen,
    pricing: pricingJson(model.price),
  };
}

/**
 * Whether the caller may use a model: checks that its key is live (and the browser Origin
 * allowed) in its account, which answers the models admission allows it (null: all).
 */
async function usable(c: Context<AppEnv>): Promise<(model: ModelConfig) => boolean> {
  const { models } = await checkCaller(c);
  return (model) => models === null || models.includes(model.id);
}

/** The models route group, mounted at `/v1/models`. */
export const models = new Hono<AppEnv>()
  .get("/", async (c) => {
    const allowed = await usable(c);
    return c.json({
      object: "list",
      data: c.var.config.models.filter(allowed).map(toModelObject),
    });
  })
  .all("/", methodNotAllowed(["GET", "HEAD"]))
  .get("/:id{.+}", async (c) => {
    const allowed = await usable(c);
    const id = c.req.param("id");
    // An alias is listed when one of the models it stands for may be used.
    const model = resolveModels(c.var.config, id).find(allowed);
    if (model === undefined) throw modelNotFound(id);
    return c.json(toModelObject(model));
  })
  .all("/:id{.+}", methodNotAllowed(["GET", "HEAD"]));
