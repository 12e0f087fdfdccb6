// kvlab/viz/metrics_and_diagnosis.py's TPOT-budget panel in the browser: TPOT against batch with
// the two limits kept apart — the largest batch within the TPOT budget, memory aside (a
// bisection, as metrics_and_diagnosis.tpot_batch), the largest batch that fits in memory — the
// batch both allow, which of the two limits it, and the knee (KVLAB.batchKnee).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  function tpotBatch(K, T, s) {
    const within = (b) => K.step(T, at(s, { batch: b })).step_time_s <= s.slo;
    if (!within(1)) return 0;
    let lo = 1, hi = T.max_batch;
    if (within(hi)) return hi;
    while (hi - lo > 1) {
      const mid = Math.floor((lo + hi) / 2);
      if (within(mid)) lo = mid; else hi = mid;
    }
    return lo;
  }

  // metrics_and_diagnosis._mark: one mark at `batch`, or none when the batch is 0.
  function mark(batch, columns) {
    const out = { batch: batch >= 1 ? [batch] : [] };
    for (const [k, v] of Object.entries(columns)) {
      out[k] = batch >= 1 ? [typeof v === "function" ? v(batch) : v] : [];
    }
    return out;
  }

  KVLAB.panels["tpot-budget"] = function (K, T, s) {
    const base = at(s, T.dtypes_used);
    const budget = tpotBatch(K, T, base);
    const grid = T.batches.map((b) => K.step(T, at(base, { batch: b })));
    const memory = grid[0].max_batch, allowed = Math.min(budget, memory);
    const marks = [budget, memory, allowed].filter((b) => b >= 1);
    const batches = Array.from(new Set(T.batches.concat(marks))).sort((a, b) => a - b);
    const steps = batches.map((b) => K.step(T, at(base, { batch: b })));
    const tpot = steps.map((r) => r.step_time_s);
    const here = new Map(batches.map((b, i) => [b, steps[i]]));
    const chosen = here.get(allowed), tps = chosen ? chosen.tokens_per_s : 0.0;
    const time = (b) => here.get(b).step_time_s;
    const limit = memory < budget ? "device memory" : (budget < memory ? "TPOT budget" : "both");
    return {
      sources: {
        curve: { batch: batches, tpot_s: tpot, tokens_per_s: steps.map((r) => r.tokens_per_s) },
        slo: { batch: [batches[0], batches[batches.length - 1]], tpot_s: [s.slo, s.slo] },
        budget: mark(budget, { tpot_s: time, budget_label: T.labels[0] }),
        memory: mark(memory, { low: Math.min(...tpot), high: Math.max(Math.max(...tpot), s.slo),
                               memory_label: T.labels[1] }),
        allowed: mark(allowed, { tpot_s: time, allowed_label: T.labels[2] }),
      },
      values: { tpot_batch: budget, max_batch: memory, allowed_batch: allowed, limited_by: limit,
                allowed_tpot_s: chosen ? chosen.step_time_s : NaN, allowed_tokens_per_s: tps,
                knee_batch: T.batches[K.batchKnee(grid)], slo_batch: allowed,
                slo_tokens_per_s: tps },
    };
  };
})(window.KVLAB);
