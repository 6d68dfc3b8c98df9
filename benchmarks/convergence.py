"""Convergence benchmark: ddp, diloco, noloco and local under the same seed, data and
compute (R replicas × S stages, same microbatches per inner step), in the simulator.

    python -m benchmarks.convergence --out benchmarks/results [--steps 2000 --replicas 8 --jobs 2]

Writes OUT/convergence.md (the table), OUT/convergence.json (every evaluation of every
method) and OUT/convergence.png (validation loss and spread against step).
The paper's claims it checks: noloco's perplexity is at most diloco's (up to 4% lower),
both close to ddp, and noloco's spread follows the learning rate (Pearson 0.91-0.97).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

METHODS = ("ddp", "diloco", "noloco", "local")


def pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    vx = sum((x - mx) ** 2 for x in xs)
    vy = sum((y - my) ** 2 for y in ys)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else float("nan")


def run_method(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from noloco_rt.algo.simulator import records_as_dicts, run_simulation
    from noloco_rt.config import load_config

    torch.set_num_threads(job["threads"])
    cfg = load_config(environ={}, overrides=[{
        "outer": {"method": job["method"]},
        "pipeline": {"stages": job["stages"], "replicas": job["replicas"]},
        "run": {"steps": job["steps"], "eval_every": job["eval_every"], "seed": job["seed"], "eval_batches": 8},
        "model": {"preset": job["preset"]},
        "optim": {"warmup_steps": job["warmup_steps"]},
    }])
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        records = run_simulation(cfg, Path(tmp))
    return {"method": job["method"], "outer": cfg.outer.resolved().__dict__, "wall_s": time.monotonic() - started,
            "records": records_as_dicts(records)}


def summarise(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    ddp_ppl = results["ddp"]["records"][-1]["val_ppl"] if "ddp" in results else float("nan")
    rows = []
    for method, result in results.items():
        records = result["records"]
        final = records[-1]
        trained = [r for r in records if r["step"] > 0]
        rows.append({
            "method": method,
            "h": result["outer"]["h"] if method != "ddp" else "-",
            "final_val_loss": final["val_loss"],
            "final_val_ppl": final["val_ppl"],
            "ppl_ratio_to_ddp": final["val_ppl"] / ddp_ppl,
            "final_spread": final["spread"],
            "spread_lr_pearson": pearson([r["spread"] for r in trained], [r["lr"] for r in trained]),
            "wall_s": result["wall_s"],
        })
    return rows


def table(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| method | H | final val loss (nats) | final val ppl | ppl / ddp | final spread | Pearson(spread, lr) | wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pear = "n/a (spread 0)" if math.isnan(r["spread_lr_pearson"]) else f"{r['spread_lr_pearson']:.3f}"
        lines.append(f"| {r['method']} | {r['h']} | {r['final_val_loss']:.4f} | {r['final_val_ppl']:.3f} | "
                     f"{r['ppl_ratio_to_ddp']:.4f} | {r['final_spread']:.3e} | {pear} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--jobs", type=int, default=2, help="methods run in parallel, one torch thread each")
    args = parser.parse_args()

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    jobs = [{"method": m, "steps": args.steps, "replicas": args.replicas, "stages": args.stages,
             "preset": args.preset, "seed": args.seed, "eval_every": args.eval_every,
             "warmup_steps": args.warmup_steps, "threads": 1 if args.jobs > 1 else 2} for m in methods]
    print(f"convergence: {', '.join(methods)}; {args.stages} stages x {args.replicas} replicas, "
          f"{args.preset}, {args.steps} steps, {args.jobs} in parallel", flush=True)
    results: dict[str, dict[str, Any]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        for result in pool.imap_unordered(run_method, jobs):
            final = result["records"][-1]
            print(f"  {result['method']:>7}: val_loss {final['val_loss']:.4f}  spread {final['spread']:.3e}  "
                  f"({result['wall_s']:.0f} s)", flush=True)
            results[result["method"]] = result
    results = {m: results[m] for m in methods}

    rows = summarise(results)
    header = (f"Convergence, {args.stages} stages x {args.replicas} replicas, preset {args.preset}, "
              f"{args.steps} inner steps, seed {args.seed} "
              f"(`python -m benchmarks.convergence --steps {args.steps} --replicas {args.replicas}`)")
    text = table(rows, header)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "convergence.md").write_text(text)
    (args.out / "convergence.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=1))

    from noloco_rt.plots import plot_methods

    plot_methods({m: r["records"] for m, r in results.items()}, args.out / "convergence.png",
                 title=f"{args.stages} stages × {args.replicas} replicas, {args.preset}, {args.steps} steps")


if __name__ == "__main__":
    main()
