"""Reward checks per second: math verifier (in-process, one-at-a-time, batch) and the
synthetic tasks' exact checkers.

    python benchmarks/verifier.py                     # table
    python benchmarks/verifier.py --json out.json     # also write the rows as JSON

Workload: the reference verifier cases (gold vs. whole responses) and MATH500 golds
answered as "... $\\boxed{gold}$." (half of them wrong on purpose, the next row's gold),
cycled to --n checks. Each batch row builds a fresh MathVerifier; its start-up time
is reported apart from the checks.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import time


def _workload(data: pathlib.Path, n: int) -> tuple[list[str], list[str]]:
    golds, responses = [], []
    for line in (data / "verifier_cases.jsonl").open(encoding="utf-8"):
        row = json.loads(line)
        golds.append(row["gold"])
        responses.append(row["pred"])
    math500 = [json.loads(line)["answer"] for line in (data / "benchmarks" / "math500.jsonl").open()]
    for i, gold in enumerate(math500):
        answer = gold if i % 2 == 0 else math500[(i + 1) % len(math500)]
        golds.append(gold)
        responses.append(f"Putting it together, the answer is $\\boxed{{{answer}}}$.")
    reps = -(-n // len(golds))
    return (golds * reps)[:n], (responses * reps)[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("ADA_SHARED_DATA", "/work/shared/data"))
    parser.add_argument("--n", type=int, default=400, help="checks per row")
    parser.add_argument("--workers", default="1,2", help="comma-separated batch pool sizes")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per check")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    args = parser.parse_args()

    from ada.data.synthetic import make_dataset
    from ada.rewards import math_verifier as mv
    from ada.rewards import tasks

    golds, responses = _workload(pathlib.Path(args.data), args.n)
    rows = []

    def add(name, workers, checks, seconds, startup_s=0.0, correct=None, timeouts=0):
        rows.append({
            "mode": name, "workers": workers, "checks": checks, "seconds": round(seconds, 3),
            "checks_per_s": round(checks / seconds, 1) if seconds > 0 else None,
            "startup_s": round(startup_s, 3), "correct_frac": correct, "timeouts": timeouts,
        })

    # In-process, no time limit (the cost of the check itself).
    n_inproc = min(args.n, 200)
    for g, r in zip(golds[:20], responses[:20], strict=True):  # lazy imports, first parses
        mv.check(g, r)
    t0 = time.perf_counter()
    got = [mv.check(g, r) for g, r in zip(golds[:n_inproc], responses[:n_inproc], strict=True)]
    add("math check, in-process", 0, n_inproc, time.perf_counter() - t0,
        correct=round(sum(got) / n_inproc, 3))

    # One at a time through verify() (shared one-worker pool: IPC per check).
    t0 = time.perf_counter()
    mv.verify("1", "1", timeout_s=args.timeout)
    startup = time.perf_counter() - t0
    n_single = min(args.n, 200)
    t0 = time.perf_counter()
    got = [mv.verify(g, r, timeout_s=args.timeout) for g, r in zip(golds[:n_single], responses[:n_single], strict=True)]
    add("math verify(), one at a time", 1, n_single, time.perf_counter() - t0, startup,
        correct=round(sum(got) / n_single, 3))
    mv.close_default_verifiers()

    for workers in [int(w) for w in args.workers.split(",") if w]:
        t0 = time.perf_counter()
        with mv.MathVerifier(num_workers=workers, timeout_s=args.timeout) as verifier:
            verifier.score_pairs(["1"] * workers, ["1"] * workers)
            startup = time.perf_counter() - t0
            t0 = time.perf_counter()
            got = verifier.score_pairs(golds, responses)
            seconds = time.perf_counter() - t0
            add("math MathVerifier.score", workers, len(golds), seconds, startup,
                correct=round(float(got.mean()), 3), timeouts=verifier.stats.timeouts)

    for task, fn in (("arithmetic", tasks.arithmetic_reward), ("countdown", tasks.countdown_reward)):
        records = make_dataset(task, 500, seed=0, difficulty_mix={1: 1, 2: 1, 3: 1})
        answers = [f"= {r['answer']}" if task == "arithmetic" else f"Answer: {r['solution']}" for r in records]
        t0 = time.perf_counter()
        got = [fn(r, a) for r, a in zip(records * 4, answers * 4, strict=True)]
        add(f"{task} reward, in-process", 0, len(got), time.perf_counter() - t0,
            correct=round(sum(got) / len(got), 3))

    header = f"{'mode':32s} {'workers':>7s} {'checks':>6s} {'seconds':>8s} {'checks/s':>9s} {'startup_s':>9s} {'correct':>7s} {'timeouts':>8s}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['mode']:32s} {r['workers']:7d} {r['checks']:6d} {r['seconds']:8.2f} "
              f"{r['checks_per_s']:9.1f} {r['startup_s']:9.2f} {str(r['correct_frac']):>7s} {r['timeouts']:8d}")
    print(f"(cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "n": args.n}, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
