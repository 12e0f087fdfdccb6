// Runs kvlab's browser code under node for tests/test_js.py: loads the script the book
// ships (argv[2]), reads a JSON list of jobs on stdin, writes one JSON list of results.
//   {"panel": name, "terms": T, "states": [s, ...]}   -> KVLAB.panels[name](K, T, s) for each s
//   {"library": fn, "terms": T|null, "args": [[...], ...]} -> KVLAB[fn](T, ...args) (T if given;
//                                                            fn may be dotted: "FORMATS.bytes")
//   {"keys": name}                                      -> Object.keys(KVLAB[name])
// A call that throws gives {"error": message}. JSON.stringify writes Infinity and NaN as
// null, as kvlab.jsonsafe does on the Python side.
"use strict";
const fs = require("fs");
const vm = require("vm");

globalThis.window = globalThis;
vm.runInThisContext(fs.readFileSync(process.argv[2], "utf8"), { filename: "kvlab.js" });
const K = globalThis.KVLAB;

function attempt(call) {
  try {
    return call();
  } catch (err) {
    return { error: String(err && err.stack || err) };
  }
}

const resolve = (name) => name.split(".").reduce((obj, key) => obj[key], K);

function run(job) {
  if (job.keys !== undefined) return Object.keys(resolve(job.keys));
  if (job.panel !== undefined) {
    const fn = K.panels[job.panel];
    if (typeof fn !== "function") return [{ error: `no KVLAB.panels["${job.panel}"]` }];
    return job.states.map((s) => attempt(() => fn(K, job.terms, s)));
  }
  const fn = resolve(job.library);
  return job.args.map((a) => attempt(() => (job.terms ? fn(job.terms, ...a) : fn(...a))));
}

const jobs = JSON.parse(fs.readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(jobs.map(run)));
