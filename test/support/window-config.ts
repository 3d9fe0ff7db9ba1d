/** Window configurations for tests: the defaults of `settings.ts`, with fields replaced. */
import {
  type LaneConfig,
  type WindowConfig,
  windowConfigOf,
} from "../../durable-objects/batcher/settings.ts";

/** Fields to replace; lanes given in part get the defaults for the rest. */
export type WindowConfigInput = Partial<Omit<WindowConfig, "lanes" | "origins">> & {
  lanes?: Partial<LaneConfig>[];
  origins?: { id: string }[];
};

export function windowConfig(input: WindowConfigInput = {}): WindowConfig {
  const { lanes, origins, ...rest } = input;
  const ids = (origins ?? [{ id: "a" }]).map((origin) => origin.id);
  const base = windowConfigOf(
    { ...(lanes !== undefined && { lanes: lanes.map(() => ({})) }) },
    ids,
  );
  return {
    ...base,
    ...rest,
    lanes: base.lanes.map((lane, i) => ({ ...lane, ...lanes?.[i] })),
  };
}
