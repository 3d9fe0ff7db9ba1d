/**
 * The contract of `Canaries` (docs/failover.md, "Canaries"): one object per canary, named
 * by `canaryName` (its model and pool), holding that canary's rollout.
 */
export type { ArmReport, CanaryAction, CanaryArm, CanaryView } from "../../contracts/canary.ts";
export type { CanarySpec } from "../../contracts/config/canaries.ts";
