/**
 * Shards for `npm test`'s lanes (docs/edge.md, "Running the checks"): every `count`-th file
 * of the projects' files in path order, so that each lane gets its share of every folder's
 * files (end-to-end stacks, workers files, pure cores) rather than a hash's draw.
 */
import { relative } from "node:path";
import { BaseSequencer, type TestSpecification } from "vitest/node";

export default class LaneSequencer extends BaseSequencer {
  override async shard(files: TestSpecification[]): Promise<TestSpecification[]> {
    const { shard, root } = this.ctx.config;
    if (shard === undefined) return files;
    const key = (spec: TestSpecification) =>
      `${spec.project.name}:${relative(root, spec.moduleId)}`;
    const sorted = [...files].sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
    return sorted.filter((_, i) => i % shard.count === shard.index - 1);
  }
}
