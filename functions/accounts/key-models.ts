/**
 * A key's model allowlist checked against the configuration when the key is created or
 * changed: an unknown model, or an alias (which requests resolve to model ids before the
 * allowlist is read), is refused with the ids the gateway serves.
 * See docs/key-account.md.
 */
import { ApiError, clipped, configError } from "../../contracts/errors.ts";
import { ConfigError, type ResolvedConfig, loadConfig } from "../../contracts/config/gateway.ts";
import { resolveModels } from "../../contracts/config/models.ts";

function configOf(text: string | undefined): ResolvedConfig {
  try {
    return loadConfig(text);
  } catch (error) {
    if (error instanceof ConfigError) throw configError(error.message);
    throw error;
  }
}

/**
 * Throws OpenAI's 400 for the first entry of `models` that is not a configured model id,
 * naming it as `param(i)` (default `models[i]`).
 */
export function checkKeyModels(
  configText: string | undefined,
  models: readonly string[],
  param: (i: number) => string = (i) => `models[${i}]`,
): void {
  const config = configOf(configText);
  const ids = config.models.map((m) => m.id);
  models.forEach((name, i) => {
    if (ids.includes(name)) return;
    const named = resolveModels(config, name).map((m) => m.id);
    const message =
      named.length > 0
        ? `'${clipped(name)}' is an alias; list the models it names instead: ${named.join(", ")}.`
        : `Unknown model '${clipped(name)}': this gateway serves ${ids.join(", ")}.`;
    throw new ApiError(400, message, {
      type: "invalid_request_error",
      param: param(i),
      code: "model_not_found",
    });
  });
}
