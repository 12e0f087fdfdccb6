// kvlab/viz/what_a_hit_saves.py's panel in the browser: what a prefix hit saves (prefill FLOPs, so
// TTFT) and what it does not (the bytes of every decode step, so TPOT). The twin of the
// panel's Python `compute`, checked under node by tests/test_js.py.
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  // kvlab.viz.what_a_hit_saves.cached_tokens: the whole tokens a hit fraction matches, served by the
  // one rule of kvlab.prompt (the last prompt token is always computed).
  function cachedTokens(K, hit, promptTokens) {
    return K.servedTokens(Math.floor(hit * promptTokens), promptTokens);
  }

  KVLAB.panels.hits = function (K, T, s) {
    const base = at(T.dtypes_used, { model: s.model, hardware: s.hardware });
    const prompt = s.context;
    const prefill = (c) => K.prefill(T, at(base, { prompt_tokens: prompt, cached_tokens: c }));
    const curve = T.hits.map((h) => prefill(cachedTokens(K, h, prompt)));
    const miss = prefill(0);
    const cached = cachedTokens(K, s.hit, prompt);
    const here = prefill(cached);
    const step = K.step(T, at(base, { batch: s.batch, context: prompt }));
    return {
      sources: {
        curve: { hit: T.hits.map((h) => 100 * h), ttft_s: curve.map((r) => r.ttft_s),
                 tpot_s: T.hits.map(() => step.step_time_s) },
        here: { hit: [100 * s.hit], ttft_s: [here.ttft_s], tpot_s: [step.step_time_s] },
        work: at(T.work, { flops: [here.flops, miss.flops - here.flops],
                           bytes: [step.weight_read_bytes, step.kv_read_bytes] }),
      },
      values: { cached_tokens: cached, ttft_s: here.ttft_s, ttft_miss_s: miss.ttft_s,
                prefill_flops_saved: 1.0 - here.flops / miss.flops, step_bytes: step.step_bytes,
                step_time_s: step.step_time_s, tokens_per_s: step.tokens_per_s },
    };
  };
})(window.KVLAB);
