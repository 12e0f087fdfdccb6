"""Hold kvlab's serving simulator against vidur (Microsoft, MLSys'24) on one workload.

Both simulate one Llama-2-7B replica on one H100, vLLM v0's prefill-first scheduler
(whole prompts batched up to 4,096 tokens, decodes wait; at most 128 sequences; 16-token
KV blocks, the same number of them; the newest sequence preempted and recomputed when a
block runs out), no prefix cache, on the same Poisson requests (kvlab's
`poisson:rate=R,prompt=uniform(128,2048),output=uniform(32,512),requests=N,seed=0`). The
script prints TTFT and TBT (time between tokens) percentiles side by side, then the step
times each simulator charges for a few batches, which is where they differ.

It is not part of kvlab: it needs vidur, which needs pandas and scikit-learn. Run it in a
throw-away virtual environment outside the repository:

    python3.11 -m venv /work/vidur-venv && /work/vidur-venv/bin/pip install vidur==0.0.26
    /work/vidur-venv/bin/python bench/peers/vidur_compare.py --profiles DIR [--rates 4,12,20]

vidur 0.0.26 downloads its profiling tables from Hugging Face at start-up; this script
points its predictor at local CSV files instead (`--profiles`, laid out as vidur's GitHub
repository's data/profiling: compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv and
network/h100_pairwise_nvlink/*.csv; the MIT-licensed repository microsoft/vidur ships
them). Its attention table (attention.csv, ~10 MB) is missing where only the smaller
files can be fetched; then the script writes one from the roofline (`--attention
roofline`: FLOPs at the H100's 989 TFLOP/s, KV bytes at 3.35 TB/s, per layer) and says so.
Two things are patched in vidur, in this process only: its entity ids are class attributes
(reset before every run, or a second run looks for replica 0 among replicas numbered from
1), and its request restart (a recompute after preemption) forgets the per-stage progress
and trips its own assertion. kvlab runs at efficiency 1 (the ledger's ceiling) and 0.7.
Nothing of vidur's is copied into kvlab.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from kvlab import cost
from kvlab.sim import simulate
from kvlab.sim.costs import LedgerCost
from kvlab.traces import load_trace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

MODEL_KVLAB, MODEL_VIDUR = "llama-2-7b", "meta-llama/Llama-2-7b-hf"
BLOCK_TOKENS, BUDGET_TOKENS, MAX_BATCH = 16, 4096, 128  # vLLM block size, vidur's vLLM defaults
WORKLOAD = (
    "poisson:rate={rate:g},prompt=uniform(128,2048),output=uniform(32,512),"
    "requests={requests},seed=0"
)
PEAK_FLOPS, HBM_BYTES_PER_S = 989e12, 3.35e12  # H100 SXM bf16 dense, HBM3 (kvlab's catalogue)
RESTARTS = [0]  # vidur's preemptions (recomputes) in the current run
TOKENS: dict = {}  # vidur request id -> its token times in the current run


def kvlab_run(trace, efficiency: float = 1.0):
    return simulate(
        trace,
        arch="colocated",
        model=MODEL_KVLAB,
        hardware="h100-sxm",
        efficiency=efficiency,
        prefill_workers=1,
        decode_workers=0,
        scheduler="prefill-first",
        chunk_tokens=BUDGET_TOKENS,
        max_batch=MAX_BATCH,
        kv_block_tokens=BLOCK_TOKENS,
        prefix_cache="none",
        memory_fraction=0.9,
    )


def kvlab_blocks() -> int:
    room = 80e9 * 0.9 - cost.weight_bytes(MODEL_KVLAB)
    return int(room // (BLOCK_TOKENS * cost.kv_bytes_per_token(MODEL_KVLAB)))


def roofline_attention_csv(path: Path) -> None:
    """vidur's attention.csv columns, per-layer times in ms from FLOPs and bytes at peak."""
    import pandas as pd

    heads, head_dim = 32, 128
    kv_token_layer = 2 * heads * head_dim * 2  # K and V, fp16
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 96, 128):
        for kv in range(0, 4097, 128):
            t = b * max(kv, 1) * kv_token_layer / HBM_BYTES_PER_S
            rows.append((b, kv, 0, 0.0, 1e3 * t, 1e3 * b * kv_token_layer / HBM_BYTES_PER_S))
    for chunk in list(range(32, 4097, 32)):
        for kv in range(0, 4097 - chunk + 1, 256):
            flops = 4 * heads * head_dim * (chunk * kv + chunk * (chunk + 1) / 2)
            t = max(flops / PEAK_FLOPS, (kv + chunk) * kv_token_layer / HBM_BYTES_PER_S)
            rows.append(
                (1, kv, chunk, 1e3 * t, 0.0, 1e3 * chunk * kv_token_layer / HBM_BYTES_PER_S)
            )
    df = pd.DataFrame(
        rows,
        columns=[
            "batch_size",
            "kv_cache_size",
            "prefill_chunk_size",
            "time_stats.attn_prefill.median",
            "time_stats.attn_decode.median",
            "time_stats.attn_kv_cache_save.median",
        ],
    )
    df["n_embd"], df["n_q_head"], df["n_kv_head"] = 4096, heads, heads
    df["block_size"], df["num_tensor_parallel_workers"] = BLOCK_TOKENS, 1
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)


def vidur_config(trace_csv: Path, out: Path, blocks: int):
    from vidur import config as vc

    replica = vc.ReplicaConfig(
        model_name=MODEL_VIDUR,
        num_pipeline_stages=1,
        tensor_parallel_size=1,
        device="h100",
        network_device="h100_pairwise_nvlink",
    )
    cluster = vc.ClusterConfig(
        num_replicas=1,
        replica_config=replica,
        cache_config=vc.CacheConfig(block_size=BLOCK_TOKENS, num_blocks=blocks),
        replica_scheduler_config=vc.VllmSchedulerConfig(
            batch_size_cap=MAX_BATCH, max_tokens_in_batch=BUDGET_TOKENS
        ),
    )
    requests = vc.TraceRequestGeneratorConfig(
        trace_file=str(trace_csv),
        date="kvlab",
        prefill_scale_factor=1,
        decode_scale_factor=1,
        time_scale_factor=1,
        max_tokens=4096,
    )
    predictor = vc.RandomForrestExecutionTimePredictorConfig(
        cache_dir=str(out / "cache"),
        prediction_max_tokens_per_request=4096,
        prediction_max_batch_size=MAX_BATCH,
    )
    metrics = vc.MetricsConfig(
        write_metrics=False, output_dir=str(out / "vidur-out"), store_plots=False
    )
    return vc.SimulationConfig(
        seed=0,
        cluster_config=cluster,
        request_generator_config=requests,
        execution_time_predictor_config=predictor,
        metrics_config=metrics,
    )


def patch_vidur(profiles: Path, attention: Path) -> None:
    """Local profiling files instead of Hugging Face; every token's time recorded."""
    from vidur.entities.request import Request
    from vidur.execution_time_predictor.sklearn_execution_time_predictor import (
        SklearnExecutionTimePredictor,
    )

    compute = profiles / "compute" / "h100" / MODEL_VIDUR
    network = profiles / "network" / "h100_pairwise_nvlink"
    SklearnExecutionTimePredictor._get_input_files = lambda self: (
        str(compute / "mlp.csv"),
        str(attention),
        str(network / "all_reduce.csv"),
        str(network / "send_recv.csv"),
    )
    original, restart = Request.on_batch_end, Request.restart

    def on_batch_end(self, time, num_tokens_processed):
        original(self, time, num_tokens_processed)
        # each vLLM-v0 iteration gives a request one token
        TOKENS.setdefault(self.id, []).append(time)

    def counted_restart(self):
        RESTARTS[0] += 1
        restart(self)
        # vidur 0.0.26 forgets the per-stage progress on a restart, so the recomputed prefill
        # trips its own assertion (num_stage_processed_tokens <= total_tokens): reset it too
        self._num_stage_processed_tokens = 0
        self._is_prefill_stage_complete = False

    Request.on_batch_end, Request.restart = on_batch_end, counted_restart


def _reset_entity_ids() -> None:
    """vidur numbers replicas, requests and batches with class attributes: a second run in
    one process would look for replica 0 among replicas numbered from 1. Start again at 0."""
    from vidur.entities.base_entity import BaseEntity

    todo = [BaseEntity]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if "_id" in vars(cls):
            cls._id = -1


def vidur_run(trace, out: Path, blocks: int):
    import pandas as pd
    from vidur.simulator import Simulator

    trace_csv = out / f"trace-{len(trace)}-{trace.name.split(',')[0].split('=')[1]}.csv"
    pd.DataFrame(
        {
            "Date": "kvlab",
            "Time": trace.arrival_s,
            "PromptTokenCount": trace.input_tokens,
            "CompletionTokenCount": trace.output_tokens,
        }
    ).to_csv(trace_csv, index=False)
    TOKENS.clear()
    RESTARTS[0] = 0
    _reset_entity_ids()
    sim = Simulator(vidur_config(trace_csv, out, blocks))
    sim.run()
    first = min(TOKENS)
    return [np.array(TOKENS[first + i]) for i in range(len(trace))], sim


def latency_table(arrival_s, token_times) -> dict:
    ttft = np.array([t[0] - a for a, t in zip(arrival_s, token_times, strict=True)])
    gaps = np.concatenate([np.diff(t) for t in token_times])
    tpot = np.array([np.diff(t).mean() for t in token_times if t.size > 1])
    out = {f"ttft_p{q}_s": float(np.percentile(ttft, q)) for q in (50, 90, 99)}
    out.update({f"tbt_p{q}_s": float(np.percentile(gaps, q)) for q in (50, 90, 99)})
    out["tbt_max_s"] = float(gaps.max())
    out["tpot_p50_s"] = float(np.median(tpot))
    out["tokens"] = int(sum(t.size for t in token_times))
    return out


def step_times(sim) -> list[dict]:
    """Seconds each simulator charges for a few iterations (vidur: its trained predictor)."""
    from vidur.entities import Batch
    from vidur.entities.request import Request

    lc = LedgerCost(MODEL_KVLAB, "h100-sxm", max_batch=MAX_BATCH)
    etp = next(iter(sim.scheduler._replica_schedulers.values()))._execution_time_predictor
    rows = []
    for kind, b, ctx in (
        ("decode", 1, 1024),
        ("decode", 32, 1024),
        ("decode", 128, 1024),
        ("decode", 64, 3072),
        ("prefill", 1, 512),
        ("prefill", 1, 2048),
        ("prefill", 4, 1024),
    ):
        reqs = [Request(0.0, ctx, 8) for _ in range(b)]
        if kind == "decode":
            batch = Batch(0, reqs, [1] * b, [ctx + 1] * b)
            mine = float(lc.decode_times_s(b, ctx))
        else:
            batch = Batch(0, reqs, [ctx] * b, [ctx] * b)
            mine = lc.iteration_time_s(0, 0.0, [(ctx, 0)] * b)
        theirs = etp.get_execution_time(batch, 0).total_time  # seconds per iteration (all layers)
        rows.append(
            {
                "iteration": f"{kind} batch {b} x {ctx} tokens",
                "vidur_s": float(theirs),
                "kvlab_s": mine,
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--profiles", type=Path, required=True, help="vidur's data/profiling folder (local copy)"
    )
    parser.add_argument(
        "--attention",
        default="roofline",
        help="vidur attention.csv to use, or 'roofline' to write one from peak FLOP/s and bytes/s",
    )
    parser.add_argument("--rates", default="4,12,20", help="request rates to compare (requests/s)")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument(
        "--kvlab-efficiency",
        default="1,0.7",
        help="kvlab runs at these shares of peak FLOP/s and bandwidth (1 = the ledger's ceiling)",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/kvlab-vidur"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # fail fast instead of waiting on the network
    args.out.mkdir(parents=True, exist_ok=True)
    attention = (
        args.out / "attention-roofline.csv"
        if args.attention == "roofline"
        else Path(args.attention)
    )
    if args.attention == "roofline":
        roofline_attention_csv(attention)
        print(
            f"vidur's attention times: a roofline table ({attention}), not measurements",
            file=sys.stderr,
        )

    patch_vidur(args.profiles, attention)
    blocks = kvlab_blocks()
    report = {"blocks": blocks, "attention": args.attention, "rates": []}
    sim = None
    for rate in (float(r) for r in args.rates.split(",")):
        trace = load_trace(WORKLOAD.format(rate=rate, requests=args.requests))
        their_tokens, sim = vidur_run(trace, args.out, blocks)
        row = {"rate_per_s": rate, "vidur": latency_table(trace.arrival_s, their_tokens)}
        row["vidur"]["preemptions"] = RESTARTS[0]
        for efficiency in (float(e) for e in args.kvlab_efficiency.split(",")):
            ours = kvlab_run(trace, efficiency)
            tokens = [ours.tokens(i) for i in range(len(trace))]
            key = f"kvlab_efficiency_{efficiency:g}"
            row[key] = latency_table(trace.arrival_s, tokens)
            row[key]["preemptions"] = ours.summary()["preemptions"]
        report["rates"].append(row)
        print(json.dumps(row), flush=True)
    report["step_times"] = step_times(sim)
    print(json.dumps(report["step_times"], indent=1))
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
