// kvlab/viz/diagnosis_panels.py's TPOT-budget panel in the browser: TPOT over the batch
// grid, the largest batch that fits within the budget, and the knee (KVLAB.batchKnee).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  KVLAB.panels["tpot-budget"] = function (K, T, s) {
    const batches = T.batches, last = batches.length - 1;
    const steps = batches.map((b) => K.step(T, at(at(s, T.dtypes_used), { batch: b })));
    let k = -1;  // the last batch within the budget that fits; -1: none
    steps.forEach((r, i) => { if (r.step_time_s <= s.slo && r.fits) k = i; });
    const knee = K.batchKnee(steps), pick = Math.max(k, 0);
    return {
      sources: { curve: { batch: batches, tpot_s: steps.map((r) => r.step_time_s),
                          tokens_per_s: steps.map((r) => r.tokens_per_s) },
                 slo: { batch: [batches[0], batches[last]], tpot_s: [s.slo, s.slo] },
                 pick: { batch: [batches[pick]], tpot_s: [steps[pick].step_time_s] } },
      values: { slo_batch: k >= 0 ? batches[k] : 0,
                slo_tokens_per_s: k >= 0 ? steps[k].tokens_per_s : 0,
                knee_batch: batches[knee], max_batch: steps[0].max_batch },
    };
  };
})(window.KVLAB);
