// kvlab/viz/past_the_ceiling.py's panels in the browser: speculative decoding and tensor
// parallelism. kvlab computed every step time on the panels' grids at build time (the
// terms); these twins only combine them, with the operations of the Python `compute` in the
// same order (tests/test_js.py checks them against it under node).
(function (KVLAB) {
  "use strict";
  const finite = (x) => x !== null && x !== undefined && isFinite(x);
  // The terms travel as one JSON string (past_the_ceiling._page_terms), parsed once per page.
  const data = (K, T) => K.tables[T.key] || (K.tables[T.key] = JSON.parse(T.data));

  // kvlab.speculative.tokens_per_verify_step: (1 - A^(K+1)) / (1 - A), K + 1 at A = 1.
  function tokensPerVerifyStep(a, k) {
    return a === 1.0 ? k + 1 : (1.0 - Math.pow(a, k + 1)) / (1.0 - a);
  }

  // speculative_panel: plain and speculative tokens/s over the batch grid.
  KVLAB.panels.speculative = function (K, terms, s) {
    const T = data(K, terms);
    const run = T.times[s.setup][String(s.context)];
    const k = s.speculative_tokens, batches = T.batches;
    const base = run.base, draft = run.draft, verify = run.verify[String(k)];
    const tau = tokensPerVerifyStep(s.acceptance, k);
    const cycle = verify.map((v, j) => v + k * draft[j]);
    const plainEach = base.map((t) => 1.0 / t);
    const specEach = cycle.map((c) => tau / c);
    const plainAll = batches.map((b, j) => b / base[j]);
    const specAll = batches.map((b, j) => b * tau / cycle[j]);
    const i = batches.indexOf(s.batch);
    const breakeven = T.breakeven[s.setup][String(s.context)][String(k)][
      T.acceptances.indexOf(s.acceptance)];
    return {
      sources: {
        curve: { batch: batches, plain_each: plainEach, spec_each: specEach,
                 plain_all: plainAll, spec_all: specAll,
                 speedup: base.map((t, j) => tau * t / cycle[j]) },
        here: { batch: [batches[i]], spec_each: [specEach[i]], spec_all: [specAll[i]] },
      },
      values: { tokens_per_verify_step: tau, verify_over_decode: verify[i] / base[i],
                draft_share: k * draft[i] / cycle[i], plain_each: plainEach[i],
                spec_each: specEach[i], plain_all: plainAll[i], spec_all: specAll[i],
                speedup: tau * base[i] / cycle[i], breakeven_batch: breakeven,
                max_batch: T.max_batch[s.setup][String(s.context)] },
    };
  };

  // tensor_parallel_panel: step time split into work and all-reduces for every degree at the
  // chosen batch, each user's speed over the batch for every degree, memory fit per GPU.
  KVLAB.panels["tensor-parallel"] = function (K, terms, s) {
    const T = data(K, terms);
    const batches = T.batches, ctx = T.context;
    const runs = T.runs[s.model][s.hardware];
    const i = batches.indexOf(s.batch), n = s.tensor_parallel, b = s.batch;
    const r = runs[String(n)], one = runs["1"];
    // The words come from the terms (past_the_ceiling.TP_KINDS, NOT_MEASURED); the Chinese
    // page's table translates them as the readout and the bars show them.
    const share = (part, whole) => (finite(part) && finite(whole)
      ? K.percent(part / whole) : T.not_measured);
    const bars = { y: [], work_s: [], allreduce_s: [] };
    for (const tp of T.degrees) {
      const run = runs[String(tp)];
      for (const [kind, step, reduce] of [[T.kinds[0], "ceiling_s", "allreduce_s"],
                                          [T.kinds[1], "measured_s", "measured_allreduce_s"]]) {
        const t = run[step][i], ar = run[reduce][i];
        bars.y.push("TP " + tp + ", " + kind);
        bars.work_s.push(finite(t) && finite(ar) ? t - ar : NaN);
        bars.allreduce_s.push(finite(t) && finite(ar) ? ar : NaN);
      }
    }
    const curve = { batch: batches }, fitBatch = [], fitTps = [];
    for (const tp of T.degrees) {
      const run = runs[String(tp)];
      curve["tp" + tp] = run.ceiling_s.map((t) => 1.0 / t);
      curve["m" + tp] = run.measured_s.map((t) => (finite(t) ? 1.0 / t : NaN));
      batches.forEach((x, j) => {
        const fits = run.weight_bytes + x * ctx * run.kv_bytes_per_token <= run.capacity_bytes;
        fitBatch.push(x);
        fitTps.push(fits ? 1.0 / run.ceiling_s[j] : NaN);
      });
    }
    const step = r.ceiling_s[i], reduce = r.allreduce_s[i], measured = r.measured_s[i];
    const speedup = one.ceiling_s[i] / step;
    const w = r.weight_bytes, kv = r.kv_bytes_per_token, cap = r.capacity_bytes;
    return {
      sources: { bars, curve, fits: { batch: fitBatch, tokens_per_s: fitTps },
                 here: { batch: [b], tokens_per_s: [1.0 / step] } },
      values: { weight_bytes: w, fits: w + b * ctx * kv <= cap,
                max_batch: Math.floor(Math.max(cap - w, 0.0) / (ctx * kv)),
                step_time_s: step, allreduce_time_s: reduce,
                allreduce_share: share(reduce, step),
                tokens_per_s_per_sequence: 1.0 / step, tokens_per_s: b / step,
                speedup, share_of_ideal: speedup / n,
                measured_step_time_s: finite(measured) ? measured : null,
                measured_allreduce_share: share(r.measured_allreduce_s[i], measured) },
    };
  };
})(window.KVLAB);
