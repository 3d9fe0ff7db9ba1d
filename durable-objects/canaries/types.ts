/**
 * The contract of `Canaries` (docs/failover.md, "Canaries"): one object per canary, named
 * by `canaryName` (its model and pool), holding that canary's rollout.
 */
export type {
  ArmReport,
  CanaryAction,
  CanaryArm,
  CanarySpec,
  CanaryView,
} from "../../contracts/canary.ts";
