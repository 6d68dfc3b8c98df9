"""Final loss after a stage's extinction, against fault-free runs, over seeds.

Each seed trains 2 stages x 2 replicas of the tiny model twice on this machine, one run
after the other: fault-free, and with every stage-1 replica SIGKILLed once the store holds
a stage-1 checkpoint of outer step 4, two new replicas started with empty disks (they
resume from the durable store). The figure is the validation loss of stage 0 of a0 and
stage 1 of the replica that ran to the end (fault-free: b0; extinction: the one that
resumed from the store).

    python -m benchmarks.stage_extinction --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import signal
import tempfile
from pathlib import Path

from benchmarks.seed_stats import seed_range
from noloco_rt.checkpoints.worker import load_checkpoint
from noloco_rt.store.backend import RunStore
from noloco_rt.store.stage_checkpoints import StageCheckpoints
from workers.cluster.local_cluster import LocalCluster, tiny_val_loss

KILL_AT_OUTER_STEP = 4


def run_once(tmp: Path, *, seed: int, steps: int, extinction: bool) -> float:
    cluster = LocalCluster(tmp, settings={"store.url": str(tmp / "store"), "store.every": 2, "run.seed": seed,
                                          "worker.exchange_timeout_s": 4.0})
    checkpoints = StageCheckpoints(RunStore(str(tmp / "store")), "default")
    try:
        first = [cluster.start_worker(0, f"a{r}", steps=steps) for r in range(2)]
        last = [cluster.start_worker(1, f"b{r}") for r in range(2)]
        final_stage_1 = tmp / "checkpoints" / "b0.pt"
        if extinction:
            cluster.wait_for(lambda: checkpoints.newest_step(1) >= KILL_AT_OUTER_STEP, timeout_s=300,
                             what="a stage-1 checkpoint in the store")
            for worker in last:
                cluster.stop(worker, signal.SIGKILL)
            last = [cluster.start_worker(1, f"c{r}", **{"paths.checkpoint_dir": str(tmp / "fresh")})
                    for r in range(2)]
            resumed_by = cluster.wait_for(lambda: next((w for w in last if w.events("resumed_from_store")), None),
                                          timeout_s=120, what="a replacement to resume from the store")
            final_stage_1 = tmp / "fresh" / f"{resumed_by.name}.pt"
        for worker in first:
            cluster.wait_event(worker, "steps_done", timeout_s=600)
            worker.process.wait(30)
        for worker in last:
            cluster.stop(worker)
    finally:
        cluster.close()
    final = ((0, tmp / "checkpoints" / "a0.pt"), (1, final_stage_1))
    return tiny_val_loss([load_checkpoint(path, run_id="default", stage=s)["fast"] for s, path in final])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=60, help="inner steps of stage 0")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        losses = {}
        for extinction in (False, True):
            with tempfile.TemporaryDirectory(prefix="noloco-extinction-") as tmp:
                losses[extinction] = run_once(Path(tmp), seed=seed, steps=args.steps, extinction=extinction)
        rows.append((seed, losses[False], losses[True]))
        print(f"seed {seed}: fault-free {losses[False]:.4f}  extinction {losses[True]:.4f}  "
              f"ratio {losses[True] / losses[False]:.4f}", flush=True)
    clean = seed_range([r[1] for r in rows])
    killed = seed_range([r[2] for r in rows])
    ratio = seed_range([r[2] / r[1] for r in rows])
    print(f"\n| {len(rows)} seeds, {args.steps} steps | val loss mean | min–max |")
    print("|---|---|---|")
    print(f"| fault-free (baseline) | {clean.mean:.4f} | {clean.lo:.4f}–{clean.hi:.4f} |")
    print(f"| stage 1 extinct at outer step {KILL_AT_OUTER_STEP}, resumed from the store | {killed.mean:.4f} | "
          f"{killed.lo:.4f}–{killed.hi:.4f} |")
    print(f"| ratio extinction / fault-free, seed by seed | {ratio.mean:.4f} | {ratio.lo:.4f}–{ratio.hi:.4f} |")


if __name__ == "__main__":
    main()
