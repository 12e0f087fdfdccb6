"""`kvlab plan` side by side with Vidur-Search (Vidur's config explorer; Agrawal et al.,
"Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys'24; MIT licence,
github.com/microsoft/vidur) on one search both can express.

The search: Llama 3 8B (vidur's meta-llama/Meta-Llama-3-8B profiles, kvlab's llama-3.1-8b:
the same shapes) on 4 A100-80GB, colocated replicas at TP 1, 2 and 4 (4, 2 and 1 of
them), two schedulers (vLLM v0's prefill-first with 4,096 tokens per iteration, vidur's
`vllm`; Sarathi-Serve's chunked prefill with 512-token chunks, vidur's `sarathi`), batch
caps 64 and 128, no prefix cache, on a Poisson workload: N requests with prompts uniform
in [256, 3072] and outputs in [16, 256] tokens (kvlab's generator; vidur reads the same
lengths from a CSV and draws its own Poisson arrivals). Capacity is Vidur-Search's: the
highest rate at which the 99th percentile of the scheduling delay (arrival to first
scheduled) stays within 5 s (its defaults: --scheduling-delay-slo-quantile 0.99,
--scheduling-delay-slo-value 5); kvlab's nearest yardstick is TTFT <= 5 s for 99% of
requests (TTFT adds the prefill, so kvlab's capacity is the stricter one), TBT unbounded.
Both bisect to 2.5% and rank by capacity per GPU (the same GPUs in every design).

What each side runs: Vidur-Search's own ConfigExplorer (its job list, its bisection, its
Ray runner, `python -m vidur.main` per probe); `kvlab plan ... --efficiency measured
--json` (kernel tables) in the project's virtual environment. Vidur's run differs from
its defaults in five places, set in this process and its Ray workers (nothing is written
into vidur):
- its repository's attention profiles (attention.csv) are stored outside git and cannot
  be fetched here, so vidur's attention times come from a roofline table this script
  writes (per layer, FLOPs at the A100's 312 TFLOP/s and K/V bytes at 2.039 TB/s, for
  TP 1, 2 and 4): vidur's MLP, all-reduce and send/recv times stay its measured ones;
- its random forests are trained with one hyper-parameter point (250 trees, depth 16,
  min split 2, 3-fold) instead of a 27-point grid with 10 folds, which takes hours on two
  cores; the trained models are cached under --out, so a rerun skips the training;
- its node is a DGX A100 (`a100_dgx`: NVSwitch, the all-reduce kvlab's NVLink3 A100
  assumes) instead of its default `a100_pairwise_nvlink`, whose TP4 all-reduces cross
  PCIe (4-7x slower at 4-32 MB): --vidur-network picks it;
- its CPU assignment keeps two cores for the system (os.cpu_count() - 2): on a 2-core
  machine it has none and its runner waits forever; the workers see two more cores;
- its explorer (at commit 7d47513) passes one flag its simulator no longer accepts
  (synthetic_request_generator_config_max_tokens; the length generators' max_tokens,
  also passed, replaced it), so every probe fails: flags vidur.main refuses are dropped.

Install vidur outside the repository (its code is never copied into kvlab):

    mkdir -p /work/vidur-src && git -C <a clone of github.com/microsoft/vidur> archive HEAD \
        | tar -x -C /work/vidur-src          # commit 7d47513 was used
    python3.11 -m venv /work/vidur-venv
    /work/vidur-venv/bin/pip install numpy pandas scikit-learn wandb ddsketch \
        plotly_express matplotlib seaborn fasteners pyyaml tqdm ray==2.60.0
    echo /work/vidur-src > /work/vidur-venv/lib/python3.11/site-packages/vidur-src.pth

Run (about half an hour on 2 cores, most of it vidur's first training):

    /work/vidur-venv/bin/python bench/peers/vidur_search.py --vidur-src /work/vidur-src

It prints a table (design, vidur capacity, kvlab capacity, ratio), the best design of
each and both wall times, and writes them to --out/report.json. Without vidur it says how
to install it and exits 0; --kvlab-only runs kvlab's half alone.
"""

from __future__ import annotations

import argparse
import dataclasses as _dc
import json
import json as _json
import os
import os as _os
import subprocess
import sys
import time
from pathlib import Path

from kvlab.traces import load_trace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODEL_KVLAB, MODEL_VIDUR = "llama-3.1-8b", "meta-llama/Meta-Llama-3-8B"
GPU_KVLAB, GPU_VIDUR = "a100-80gb", "a100"
SCHEDULERS = {"vllm": "prefill-first:4096", "sarathi": "chunked:512"}  # vidur -> kvlab
VIDUR_SCHEDULERS = [{"scheduler": "vllm"}, {"scheduler": "sarathi", "chunk_size": 512}]
MAX_SEQ_TOKENS = 4096  # vidur's max_seq_len (prompt + output) and vLLM-v0 iteration budget
PROMPT, OUTPUT = (256, 3072), (16, 256)
DELAY_SLO_S, DELAY_QUANTILE = 5.0, 0.99  # Vidur-Search's defaults (config_explorer/main.py)
GRANULARITY = 0.025  # vidur: --min-search-granularity 2.5 (%)
PEAK_FLOPS, HBM_BYTES_PER_S = 312e12, 2.039e12  # A100 SXM 80GB bf16 dense, HBM2e (catalogue)
HEADS, KV_HEADS, HEAD_DIM, EMBED = 32, 8, 128, 4096  # Llama 3 8B
RF_GRID = {"num_estimators": [250], "max_depth": [16], "min_samples_split": [2]}
K_FOLDS = 3
INSTALL = (
    "vidur is not installed in this Python: see bench/peers/vidur_search.py's docstring "
    "(a venv outside the repository, e.g. /work/vidur-venv, with vidur's source on its path)"
)


def workload(requests: int, seed: int) -> str:
    return (
        f"poisson:rate=1,prompt=uniform({PROMPT[0]},{PROMPT[1]}),"
        f"output=uniform({OUTPUT[0]},{OUTPUT[1]}),requests={requests},seed={seed}"
    )


# ------------------------------------------------------------------ kvlab's half


def kvlab_plan(args, python: str) -> tuple[dict, float, list]:
    cmd = [
        python,
        "-m",
        "kvlab",
        "plan",
        workload(args.requests, args.seed),
        "--model",
        MODEL_KVLAB,
        "--gpus",
        f"{GPU_KVLAB}:{args.gpus}",
        "--ttft-slo",
        str(DELAY_SLO_S),
        "--tbt-slo",
        "1e6",
        "--attainment",
        str(DELAY_QUANTILE),
        "--requests",
        str(args.requests),
        "--arch",
        "colocated",
        "--tensor-parallel",
        ",".join(str(t) for t in args.tp),
        "--scheduler",
        ",".join(SCHEDULERS.values()),
        "--max-batch",
        ",".join(str(b) for b in args.batch_caps),
        "--prefix-cache",
        "none",
        "--efficiency",
        args.kvlab_efficiency,
        "--tolerance",
        str(GRANULARITY),
        "--json",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"kvlab plan failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout), wall, cmd


def kvlab_key(row: dict) -> tuple:
    sched = {"prefill-first": "vllm", "chunked": "sarathi"}[row["scheduler"]]
    return row["tensor_parallel"], sched, row["max_batch"]


# ------------------------------------------------------------------ vidur's half


def write_lengths(path: Path, requests: int, seed: int) -> None:
    """The workload's (prompt, output) lengths as vidur's trace length generator reads them."""

    trace = load_trace(workload(requests, seed))
    lines = ["num_prefill_tokens,num_decode_tokens"]
    lines += [f"{p},{o}" for p, o in zip(trace.input_tokens, trace.output_tokens, strict=True)]
    path.write_text("\n".join(lines) + "\n")


def write_roofline_attention(path: Path, tps) -> None:
    """vidur's attention.csv columns: per-layer times (ms) of decode attention over a batch
    and of a prefill chunk over its cached prefix, from FLOPs and K/V bytes at peak."""
    rows = [
        "batch_size,kv_cache_size,prefill_chunk_size,time_stats.attn_prefill.median,"
        "time_stats.attn_decode.median,time_stats.attn_kv_cache_save.median,n_embd,n_q_head,"
        "n_kv_head,block_size,num_tensor_parallel_workers"
    ]
    for tp in tps:
        q, kv = HEADS // tp, KV_HEADS // tp
        kv_token = 2 * kv * HEAD_DIM * 2  # K and V of one token in one layer, fp16, per GPU
        tail = f"{EMBED},{HEADS},{KV_HEADS},16,{tp}"
        for b in (1, 2, 4, 8, 16, 32, 64, 96, 128):
            for ctx in range(0, MAX_SEQ_TOKENS + 1, 128):
                flops = 4 * b * max(ctx, 1) * q * HEAD_DIM
                t = max(b * max(ctx, 1) * kv_token / HBM_BYTES_PER_S, flops / PEAK_FLOPS)
                save = b * kv_token / HBM_BYTES_PER_S
                rows.append(f"{b},{ctx},0,0,{1e3 * t:.6g},{1e3 * save:.6g},{tail}")
        for chunk in range(32, MAX_SEQ_TOKENS + 1, 32):
            for ctx in range(0, MAX_SEQ_TOKENS - chunk + 1, 256):
                flops = 4 * q * HEAD_DIM * (chunk * ctx + chunk * (chunk + 1) / 2)
                t = max(flops / PEAK_FLOPS, (ctx + chunk) * kv_token / HBM_BYTES_PER_S)
                save = chunk * kv_token / HBM_BYTES_PER_S
                rows.append(f"1,{ctx},{chunk},{1e3 * t:.6g},0,{1e3 * save:.6g},{tail}")
    path.write_text("\n".join(rows) + "\n")


def vidur_extra_flags(src: Path, attention: Path, network: str) -> dict:
    """Flags added to every `python -m vidur.main` the explorer starts (see the docstring)."""
    prefix = "random_forrest_execution_time_predictor_config_"
    profiles = src / "data" / "profiling"
    flags = {
        "replica_config_network_device": network,
        prefix + "compute_input_file": f"{profiles}/compute/{{DEVICE}}/{{MODEL}}/mlp.csv",
        prefix + "attention_input_file": str(attention),
        prefix + "all_reduce_input_file": f"{profiles}/network/{{NETWORK_DEVICE}}/all_reduce.csv",
        prefix + "send_recv_input_file": f"{profiles}/network/{{NETWORK_DEVICE}}/send_recv.csv",
        prefix + "k_fold_cv_splits": K_FOLDS,
    }
    for name, values in RF_GRID.items():
        flags[prefix + name] = " ".join(str(v) for v in values)
    return flags


EXTRA_ENV = "KVLAB_VIDUR_EXTRA_FLAGS"


def _patch_vidur() -> None:
    """Runs in the driver and in every Ray worker (worker_process_setup_hook); the flags
    come in the environment (Ray's runtime_env env_vars)."""

    extra = _json.loads(_os.environ[EXTRA_ENV])
    real = _os.cpu_count
    _os.cpu_count = lambda: (real() or 1) + 2  # vidur keeps two cores aside
    from vidur.config_optimizer.config_explorer.config import config as explorer_config

    original = explorer_config.SimulationConfig.to_config_dict
    if getattr(original, "_kvlab_patched", False):
        return

    from vidur.config import SimulationConfig as _Sim
    from vidur.config.flat_dataclass import create_flat_dataclass

    known = {f.name for f in _dc.fields(create_flat_dataclass(_Sim))}

    def to_config_dict(self):
        # the explorer at HEAD still passes synthetic_request_generator_config_max_tokens,
        # which vidur.main no longer accepts (its max_tokens moved to the length generators,
        # which the explorer also sets): every probe would fail. Drop what vidur.main refuses.
        flags = {
            k: v
            for k, v in original(self).items()
            if (k[3:] if k.startswith("no-") else k) in known
        }
        return {**flags, **extra}

    to_config_dict._kvlab_patched = True
    explorer_config.SimulationConfig.to_config_dict = to_config_dict


def vidur_search(args, out: Path) -> tuple[list, float]:
    import ray
    import yaml
    from vidur.config_optimizer.config_explorer.config_explorer import ConfigExplorer

    lengths, attention = out / "lengths.csv", out / "attention-roofline.csv"
    write_lengths(lengths, args.requests, args.seed)
    write_roofline_attention(attention, args.tp)
    config = {
        "clusters": [{"device": GPU_VIDUR, "num_gpus": args.gpus, "gpus_per_node": 4}],
        "schedulers": VIDUR_SCHEDULERS,
        "traces": [
            {
                "name": "kvlab-poisson",
                "trace_file": str(lengths),
                "max_seq_len": MAX_SEQ_TOKENS,
                "num_requests": args.requests,
                "start_qps": args.start_qps,
            }
        ],
        "batch_sizes": list(args.batch_caps),
        "tp_dimensions": list(args.tp),
        "pp_dimensions": [1],
        "models": [{"name": "llama-3-8b", "identifier": MODEL_VIDUR}],
    }
    (out / "vidur-config.yml").write_text(yaml.safe_dump(config))
    explorer_args = argparse.Namespace(
        num_threads=max((os.cpu_count() or 1), 1),
        min_search_granularity=100 * GRANULARITY,
        output_dir=str(out / "vidur-search"),
        cache_dir=str(out / "vidur-cache"),
        config_path=str(out / "vidur-config.yml"),
        scheduling_delay_slo_value=DELAY_SLO_S,
        scheduling_delay_slo_quantile=DELAY_QUANTILE,
        max_iterations=20,
        time_limit=30,
        debug=False,
        skip_cache_warmup=False,
    )
    os.makedirs(explorer_args.output_dir, exist_ok=True)
    # the explorer runs `python -m vidur.main`: this venv's python, from vidur's folder
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    os.chdir(args.vidur_src)
    extra = json.dumps(vidur_extra_flags(args.vidur_src, attention, args.vidur_network))
    os.environ[EXTRA_ENV] = extra
    _patch_vidur()
    ray.init(
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {EXTRA_ENV: extra}, "worker_process_setup_hook": _patch_vidur},
    )
    start = time.perf_counter()
    try:
        results = ConfigExplorer(explorer_args, config).run()
    finally:
        ray.shutdown()
        os.chdir(REPO)
    return results, time.perf_counter() - start


def vidur_key(row: dict) -> tuple:
    return (
        row["replica_config_tensor_parallel_size"],
        row["replica_scheduler_config_type"],
        row["vllm_scheduler_config_batch_size_cap"],
    )


# ------------------------------------------------------------------ the table


def table(vidur_rows: list, kvlab_out: dict, gpus: int) -> list[dict]:
    ours = {kvlab_key(r): r for r in kvlab_out["designs"]}
    rows = []
    for v in sorted(vidur_rows, key=vidur_key):
        k = ours.get(vidur_key(v))
        theirs = v["max_qps_under_sla"]
        mine = k["saturation_requests_per_s"] if k else None
        tp, sched, cap = vidur_key(v)
        rows.append(
            {
                "design": f"TP{tp} x{gpus // tp} {sched} batch {cap}",
                "vidur_requests_per_s": theirs,
                "kvlab_requests_per_s": mine,
                "ratio_kvlab_over_vidur": mine / theirs if theirs and mine is not None else None,
            }
        )
    return rows


def render(rows: list[dict]) -> str:
    head = f"{'design':<28} {'vidur req/s':>11} {'kvlab req/s':>11} {'kvlab/vidur':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:

        def f(x, fmt="{:.3g}"):
            return "n/a" if x is None else fmt.format(x)

        lines.append(
            f"{r['design']:<28} {f(r['vidur_requests_per_s']):>11} "
            f"{f(r['kvlab_requests_per_s']):>11} {f(r['ratio_kvlab_over_vidur'], '{:.2f}'):>11}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vidur-src", type=Path, default=Path("/work/vidur-src"))
    parser.add_argument("--out", type=Path, default=Path("/tmp/kvlab-vidur-search"))
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--tp", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument(
        "--batch-caps", type=lambda s: [int(x) for x in s.split(",")], default=[64, 128]
    )
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-qps", type=float, default=8.0, help="vidur's first probe / 2")
    parser.add_argument(
        "--kvlab-efficiency", default="measured", help="kvlab's speed: measured or a fraction"
    )
    parser.add_argument(
        "--kvlab-python",
        default=str(REPO / ".venv" / "bin" / "python"),
        help="the Python that runs kvlab (default: the project's .venv)",
    )
    parser.add_argument(
        "--vidur-network",
        default="a100_dgx",
        help="vidur's node (its all-reduce and send/recv profiles): a100_dgx, NVSwitch as "
        "kvlab's a100-80gb (NVLink3) assumes; vidur's own default is a100_pairwise_nvlink",
    )
    parser.add_argument("--kvlab-only", action="store_true", help="skip vidur")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    python = args.kvlab_python if Path(args.kvlab_python).exists() else sys.executable
    if not args.kvlab_only:
        try:
            import vidur.main  # noqa: F401
        except ImportError:
            print(f"skipped: {INSTALL}")
            return 0
    report = {
        "requests": args.requests,
        "gpus": args.gpus,
        "workload": workload(args.requests, args.seed),
    }
    kvlab_out, kvlab_wall, cmd = kvlab_plan(args, python)
    report.update(
        kvlab_wall_s=kvlab_wall, kvlab_command=" ".join(cmd), kvlab_best=kvlab_out["best"]["key"]
    )
    report["kvlab"] = [
        {
            k: r[k]
            for k in ("key", "saturation_requests_per_s", "requests_per_s_per_gpu", "simulations")
        }
        for r in kvlab_out["designs"]
    ]
    print(f"kvlab plan: {kvlab_wall:.1f} s, best {kvlab_out['best']['key']}", flush=True)
    if not args.kvlab_only:
        vidur_rows, vidur_wall = vidur_search(args, args.out)
        report["vidur_wall_s"] = vidur_wall
        report["vidur"] = [
            {
                **dict(zip(("tp", "scheduler", "batch_cap"), vidur_key(v), strict=True)),
                "max_qps_under_sla": v["max_qps_under_sla"],
            }
            for v in vidur_rows
        ]
        rows = table(vidur_rows, kvlab_out, args.gpus)
        report["table"] = rows
        failed = [r["design"] for r in rows if r["vidur_requests_per_s"] is None]
        if failed:  # vidur's search returns None when its runs fail: say so, never rank it
            print(f"vidur found no capacity for {', '.join(failed)} (see {args.out}/vidur-search)")
        best_v = max(rows, key=lambda r: (r["vidur_requests_per_s"] or 0, r["design"]))
        best_k = max(rows, key=lambda r: (r["kvlab_requests_per_s"] or 0, r["design"]))
        report["vidur_best"], report["kvlab_best_design"] = best_v["design"], best_k["design"]
        ratios = [r["ratio_kvlab_over_vidur"] for r in rows if r["ratio_kvlab_over_vidur"]]
        report["within_25_percent"] = sum(abs(x - 1) <= 0.25 for x in ratios)
        print(render(rows))
        print(
            f"best: vidur {best_v['design']}, kvlab {best_k['design']}; "
            f"{report['within_25_percent']} of {len(rows)} capacities within 25%"
        )
        print(f"wall time: vidur-search {vidur_wall:.1f} s, kvlab plan {kvlab_wall:.1f} s")
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
