// kvlab/viz/ledger.py's panels in the browser: the batch knee and context (the ledger panel
// is js/decode_step.js).
// Each is the twin of its panel's Python `compute`, built from KVLAB.step over the grids
// Python put in the terms (tests/test_js.py checks them against `compute` under node).
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  // batch_panel: throughput and TPOT over the batch grid, and the knee (cost.batch_knee).
  KVLAB.panels.knee = function (K, T, s) {
    const batches = T.batches;
    const steps = batches.map((b) => K.step(T, at(s, { batch: b })));
    const k = K.batchKnee(steps), knee = steps[k], last = steps[steps.length - 1];
    return {
      sources: {
        curve: { batch: batches, tokens_per_s: steps.map((r) => r.tokens_per_s),
                 per_sequence: steps.map((r) => r.tokens_per_s_per_sequence),
                 tpot_s: steps.map((r) => r.step_time_s), fits: steps.map((r) => r.fits) },
        knee: { batch: [batches[k]], tokens_per_s: [knee.tokens_per_s],
                tpot_s: [knee.step_time_s] },
      },
      values: { knee_batch: batches[k], knee_tokens_per_s: knee.tokens_per_s,
                knee_tpot_s: knee.step_time_s, batch1_tokens_per_s: steps[0].tokens_per_s,
                max_tokens_per_s: last.tokens_per_s, max_batch: steps[0].max_batch },
    };
  };

  // context_panel: per-sequence speed over the context grid; where KV reads reach the weights.
  KVLAB.panels.context = function (K, T, s) {
    const contexts = T.contexts;
    const steps = contexts.map((c) => K.step(T, at(s, { context: c })));
    const near = steps[T.short].tokens_per_s_per_sequence;
    const far = steps[T.long].tokens_per_s_per_sequence;
    const w = steps[0].weight_read_bytes;  // the same at every context
    const crossover = w / (s.batch * steps[0].kv_bytes_per_token);
    return {
      sources: { curve: { context: contexts,
                          per_sequence: steps.map((r) => r.tokens_per_s_per_sequence),
                          weights: contexts.map(() => w),
                          kv_read: steps.map((r) => r.kv_read_bytes) } },
      values: { at_4k: near, at_32k: far, slowdown: near / far,
                kv_equals_weights_context: Math.floor(crossover) },
    };
  };
})(window.KVLAB);
