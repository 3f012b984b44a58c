# normcore's onnx-run and onnxruntime's CPU execution provider on the same models, the same
# cores and thread counts, in alternating short bursts with rests between them. The GPU
# machine's cores run AVX-512 products at up to 1.7x their sustained speed for the first
# second or so after a rest (bench/gpu_check.sh onnxexport, docs/ONNX.md): timed one after the
# other, whichever runs second is throttled. Each round times both (who goes first alternates),
# each after `--rest` seconds idle; the closing line per case is the median of the rounds'
# ratios. The models are onnx_exports.py --time's speed cases (DIR/speed/CASE/model.onnx).
# With --onnxruntime-node NODE_MODULES, onnxruntime is npm's onnxruntime-node, timed by
# bench/onnxruntime_time.js (for machines without its Python package).
#   python3 bench/onnx_cpu_race.py NORMCORE DIR [--cases resnet50_b1,gpt] [--threads 1,2]
#                                  [--rounds 3] [--reps 5] [--rest 3] [--cores 2,3]
#                                  [--onnxruntime-node DIR/node_modules]
import argparse, os, re, statistics, subprocess, time

p = argparse.ArgumentParser()
p.add_argument("normcore")
p.add_argument("root")
p.add_argument("--cases", default="resnet50_b1,gpt")
p.add_argument("--threads", default="1,2")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--rest", type=float, default=3.0)
p.add_argument("--cores", default="2,3")
p.add_argument("--onnxruntime-node")
a = p.parse_args()
if not a.onnxruntime_node:
    import numpy as np
    import onnxruntime as ort
cores = [int(c) for c in a.cores.split(",")]


def feed_for(session):
    rng = np.random.default_rng(1)
    feed = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if "int64" in i.type:
            feed[i.name] = rng.integers(0, 50257, size=shape, dtype=np.int64)
        else:
            feed[i.name] = rng.standard_normal(shape, dtype=np.float32)
    return feed


def onnxruntime_ms(session, feed):
    for _ in range(2):
        session.run(None, feed)
    times = []
    for _ in range(a.reps):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def onnxruntime_node_ms(path, threads):
    env = dict(os.environ, NODE_PATH=a.onnxruntime_node)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnxruntime_time.js")
    command = ["taskset", "-c", ",".join(map(str, cores[:threads])), "node", script, path, "--threads", str(threads),
               "--reps", str(a.reps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"median of \d+ runs: ([0-9.]+) ms", out).group(1))


def normcore_ms(path, threads):
    env = dict(os.environ, NORMCORE_NUM_THREADS=str(threads))
    command = ["taskset", "-c", ",".join(map(str, cores[:threads])), a.normcore, "onnx-run", path, "--random",
               "--device", "cpu", "--repeat", str(a.reps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"median of \d+ runs on cpu: ([0-9.]+) ms", out).group(1))


for case in a.cases.split(","):
    path = os.path.join(a.root, "speed", case, "model.onnx")
    for threads in (int(t) for t in a.threads.split(",")):
        if a.onnxruntime_node:
            ort_ms = lambda: onnxruntime_node_ms(path, threads)
        else:
            os.sched_setaffinity(0, cores[:threads])
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            feed = feed_for(session)
            ort_ms = lambda: onnxruntime_ms(session, feed)
        ratios = []
        for r in range(a.rounds):
            order = ["onnxruntime", "normcore"] if r % 2 == 0 else ["normcore", "onnxruntime"]
            ms = {}
            for who in order:
                time.sleep(a.rest)
                ms[who] = ort_ms() if who == "onnxruntime" else normcore_ms(path, threads)
            ratios.append(ms["normcore"] / ms["onnxruntime"])
            print(f"{case}, {threads} thread{'s' if threads > 1 else ''}, round {r + 1} ({order[0]} first): "
                  f"normcore {ms['normcore']:.1f} ms, onnxruntime {ms['onnxruntime']:.1f} ms, "
                  f"ratio {ratios[-1]:.2f}", flush=True)
        print(f"{case}, {threads} thread{'s' if threads > 1 else ''}: normcore / onnxruntime, median of "
              f"{a.rounds} rounds: {statistics.median(ratios):.2f}", flush=True)
