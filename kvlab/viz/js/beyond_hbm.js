// kvlab/viz/beyond_hbm.py's footprint panel in the browser (the chapter's other panels are
// lookup panels): KV bytes of a batch against context beside the room the weights leave,
// with the fit of kvlab.cost.memory_fit (KVLAB.memoryFit), sliding windows included; where
// the weights leave no room, the room line is absent rather than zero on a log axis.
(function (KVLAB) {
  "use strict";
  const at = (s, change) => Object.assign({}, s, change);

  KVLAB.panels.footprint = function (K, T, s) {
    const base = at(s, T.dtypes_used);
    const steps = T.contexts.map((c) => K.step(T, at(base, { context: c })));
    const request = at(base, { context: T.request_tokens });
    const r = K.step(T, request), fit = K.memoryFit(T, request);
    const room = Math.max(r.capacity_bytes - r.weight_bytes, 0.0);
    const shown = room > 0 ? T.contexts : [];  // no room: no line (and no legend entry)
    return {
      sources: { kv: { context: T.contexts, kv: steps.map((x) => x.kv_cache_bytes) },
                 room: { context: shown, room: shown.map(() => room),
                         room_label: shown.map(() => T.room_label) } },
      values: { kv_bytes_per_token: r.kv_bytes_per_token,
                request_4k_bytes: T.request_tokens * r.kv_bytes_per_token,
                batch_4k_bytes: r.kv_cache_bytes, weight_bytes: r.weight_bytes,
                weights_fit: r.weight_bytes <= r.capacity_bytes, room_bytes: room,
                max_batch_4k: fit.max_batch, max_context: fit.max_context },
    };
  };
})(window.KVLAB);
