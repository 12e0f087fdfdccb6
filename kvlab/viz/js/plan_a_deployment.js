// kvlab/viz/plan_a_deployment.py's plan panel in the browser: the searches kvlab ran when the book
// was built (T.searches: each design's row of the planner's table), ranked here as
// kvlab.plan.rank ranks them (most requests/s per GPU first, then fewer GPUs, then the
// design's key), each architecture's best taken at every TBT target, the best design and
// the runner-up put in words. The twin of plan_state, checked under node by tests/test_js.py.
(function (KVLAB) {
  "use strict";
  const ROW = ["key", "arch", "tensor_parallel", "prefill_workers", "decode_workers",
               "scheduler", "chunk_tokens", "gpus", "requests_per_s_per_gpu",
               "saturation_requests_per_s", "ttft_s", "tbt_s", "binds"];
  const id = (model, traffic, tbt) => model + "|" + traffic + "|" + String(tbt);

  function rows(T, model, traffic, tbt) {
    const found = T.searches[id(model, traffic, tbt)];
    const out = found.rows.map((r) => Object.fromEntries(ROW.map((c, i) => [c, r[i]])));
    // kvlab.plan.rank.ranked: -metric, then GPUs, then key (plain code-point order)
    out.sort((a, b) => (b.requests_per_s_per_gpu - a.requests_per_s_per_gpu) ||
      (a.gpus - b.gpus) || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return [out, found.pruned];
  }

  // plan_a_deployment.describe (the Python twin)
  function describe(K, T, r) {
    const label = T.arch_labels[T.archs.indexOf(r.arch)];
    if (r.arch === "colocated") {
      const how = r.scheduler === "chunked" ?
        "chunked (" + K.fixed(r.chunk_tokens, 0) + " tokens per step)" : r.scheduler;
      return "colocated, " + r.prefill_workers + " × TP" + r.tensor_parallel + ", " + how;
    }
    return label + ", " + r.prefill_workers + "P:" + r.decode_workers + "D × TP" +
      r.tensor_parallel;
  }

  // plan_a_deployment.front (the Python twin)
  function front(T, model, traffic) {
    const out = { target_ms: T.targets_s.map((t) => 1e3 * t) };
    for (const arch of T.archs) {
      out[arch.replace("-", "_")] = T.targets_s.map((t) => {
        const mine = rows(T, model, traffic, t)[0].filter((r) => r.arch === arch);
        return mine.length ? Math.max(...mine.map((r) => r.requests_per_s_per_gpu)) : 0.0;
      });
    }
    return out;
  }

  KVLAB.panels.plan = function (K, T, s) {
    const [ranked, pruned] = rows(T, s.model, s.traffic, s.tbt_s);
    const words = ranked.map((r) => describe(K, T, r));
    const label = (arch) => T.arch_labels[T.archs.indexOf(arch)];
    const color = (arch) => T.arch_colors[T.archs.indexOf(arch)];
    const binds = Object.fromEntries(T.binds_labels.map(([k, v]) => [String(k), v]));
    const bars = {
      rank: ranked.map((r, i) => i + 1),
      per_gpu: ranked.map((r) => r.requests_per_s_per_gpu),
      design: words,
      arch: ranked.map((r) => label(r.arch)),
      color: ranked.map((r) => color(r.arch)),
      ttft_s: ranked.map((r) => r.ttft_s),
      tbt_s: ranked.map((r) => r.tbt_s),
    };
    const best = ranked[0], second = ranked.length > 1 ? ranked[1] : null;
    const met = best.requests_per_s_per_gpu > 0;
    const gap = (met && second !== null) ?
      1.0 - second.requests_per_s_per_gpu / best.requests_per_s_per_gpu : 0.0;
    const line = front(T, s.model, s.traffic);
    const i = T.targets_s.indexOf(s.tbt_s);
    return {
      sources: { bars, front: line,
                 here: { target_ms: [line.target_ms[i]], per_gpu: [best.requests_per_s_per_gpu] } },
      values: {
        best: met ? words[0] : T.none_meets,
        best_per_gpu: best.requests_per_s_per_gpu,
        best_requests_per_s: best.saturation_requests_per_s,
        gpus: best.gpus,
        best_ttft_s: best.ttft_s,
        best_tbt_s: best.tbt_s,
        binds: met ? binds[String(best.binds)] : T.none_meets,
        runner_up: second !== null ? words[1] : "-",
        gap,
        designs: ranked.length,
        pruned,
      },
    };
  };
})(window.KVLAB);
