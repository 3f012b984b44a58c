// onnxruntime's CPU execution provider timing a model, for machines without its Python package:
// npm's onnxruntime-node (`npm install --ignore-scripts onnxruntime-node`: the CPU library is in
// the package; its install script only fetches GPU ones). Inputs are random (float) or small
// ids (int64), unknown dims 1; 2 runs to warm up, then the median of --reps runs.
//   NODE_PATH=DIR/node_modules node bench/onnxruntime_time.js MODEL.onnx [--threads N] [--reps N]
const ort = require("onnxruntime-node");

async function main() {
  const args = process.argv.slice(2);
  const option = (name, fallback) => {
    const i = args.indexOf(name);
    return i >= 0 ? Number(args[i + 1]) : fallback;
  };
  const threads = option("--threads", 1), reps = option("--reps", 5);
  const session = await ort.InferenceSession.create(args[0], {
    executionProviders: ["cpu"], intraOpNumThreads: threads, interOpNumThreads: 1});
  const feeds = {};
  for (const meta of session.inputMetadata) {
    const dims = meta.shape.map((d) => (typeof d === "number" ? d : 1));
    const count = dims.reduce((a, b) => a * b, 1);
    feeds[meta.name] = meta.type === "int64"
        ? new ort.Tensor("int64", BigInt64Array.from({length: count}, (_, i) => BigInt((i * 7919) % 50257)), dims)
        : new ort.Tensor("float32", Float32Array.from({length: count}, () => Math.random() * 2 - 1), dims);
  }
  for (let i = 0; i < 2; ++i) await session.run(feeds);
  const times = [];
  for (let i = 0; i < reps; ++i) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  times.sort((a, b) => a - b);
  console.log(`onnxruntime ${ort.env.versions.common} on cpu, ${threads} thread(s): median of ${reps} runs: ` +
              `${times[Math.floor(reps / 2)].toFixed(3)} ms`);
}
main();
