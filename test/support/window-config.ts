/** Window configurations for tests: the defaults of `contracts/config/batching.ts`, with fields replaced. */
import {
  BatchingSettingsSchema,
  type LaneConfig,
  type WindowConfig,
} from "../../contracts/config/batching.ts";

/** The batching settings of a configuration that sets none. */
export const DEFAULT_BATCHING = BatchingSettingsSchema.parse({});

/** Fields to replace; lanes given in part get the defaults for the rest. */
export type WindowConfigInput = Partial<Omit<WindowConfig, "lanes" | "origins">> & {
  lanes?: Partial<LaneConfig>[];
  origins?: { id: string }[];
};

export function windowConfig(input: WindowConfigInput = {}): WindowConfig {
  const { lanes, origins, ...rest } = input;
  const base = BatchingSettingsSchema.parse(
    lanes === undefined ? {} : { lanes: lanes.map(() => ({})) },
  ).window;
  return {
    ...base,
    origins: origins ?? [{ id: "a" }],
    ...rest,
    lanes: base.lanes.map((lane, i) => ({ ...lane, ...lanes?.[i] })),
  };
}
