# The CPU backend against PyTorch at the same thread counts: the MLP training epoch
# (bench/mlp_epoch, bench/mlp_epoch_torch.py) and the CNN forward and one-image latency
# (bench/infer, bench/infer_torch.py), each in a fresh process, the two alternating for
# --rounds rounds (shared machines are noisy), medians and ranges printed as a table.
#   python3 bench/cpu_threads.py BUILD_DIR [--threads 1,2] [--rounds 3] [--torch-python /usr/bin/python3]
import argparse, json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--torch-python", default="/usr/bin/python3")
    p.add_argument("--model", default="cnn-bn")
    a = p.parse_args()
    results = {}  # (case, impl, threads) -> [values]

    def add(case, impl, threads, value):
        results.setdefault((case, impl, threads), []).append(value)

    for r in range(a.rounds):
        for t in [int(x) for x in a.threads.split(",")]:
            env = dict(os.environ, NORMCORE_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t))
            ours = run([f"{a.build}/bench/infer", "--model", a.model, "--threads", str(t)], env)
            theirs = run([a.torch_python, f"{HERE}/infer_torch.py", "--model", a.model, "--threads", str(t)], env)
            for impl, res in (("normcore", ours), ("torch", theirs)):
                add(f"{a.model} forward, batch 128 (ms)", impl, t, res["batch_forward_ms"])
                add(f"{a.model} one image (us)", impl, t, res["one_image_us"])
            ours = run([f"{a.build}/bench/mlp_epoch", "--device", "cpu"], env)
            theirs = run([a.torch_python, f"{HERE}/mlp_epoch_torch.py", "--device", "cpu", "--threads", str(t)], env)
            add("mlp epoch (s)", "normcore", t, ours["epoch_s"])
            add("mlp epoch (s)", "torch", t, theirs["epoch_s"])
            print(f"round {r + 1}, {t} thread(s) done", file=sys.stderr, flush=True)

    print("| case | threads | normcore (median, range) | PyTorch (median, range) | PyTorch / normcore |")
    print("|---|---|---|---|---|")
    for case in sorted({k[0] for k in results}):
        for t in sorted({k[2] for k in results}):
            ours, theirs = results[(case, "normcore", t)], results[(case, "torch", t)]
            mo, mt = statistics.median(ours), statistics.median(theirs)
            print(f"| {case} | {t} | {mo:.4g} ({min(ours):.4g}-{max(ours):.4g}) | {mt:.4g} ({min(theirs):.4g}-{max(theirs):.4g}) "
                  f"| {mt / mo:.2f}x |")


if __name__ == "__main__":
    main()
