"""`cistern train` against its PyTorch peer (`benches/train_pytorch.py`),
in turns: each round runs Cistern's release binary, then the peer, each
alone on the machine, their outputs captured and parsed only after both
ran. Prints one JSON line per round (both steps/s and the ratio) and a
summary line (the median ratio and whether every round reached the
target).

    cargo build --release -p cistern-cli
    ~/torch/bin/python3 benches/train_turns.py [--rounds 8] [--dataset digits] [--target 10]

A process started beside a run this short (about 25 ms on two cores)
takes a core from it: piping Cistern's output into a Python parser that
starts while it trains cost 20-50 % of its steps per second in an
earlier measurement. Nothing here runs beside either side.
"""
import json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def arg(name, default):
    if name in sys.argv:
        return sys.argv[sys.argv.index(name) + 1]
    return default


def last_json_line(text, what):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"train_turns: {what} printed no JSON line")
    return json.loads(lines[-1])


def main():
    rounds = int(arg("--rounds", "8"))
    target = float(arg("--target", "10"))
    dataset = arg("--dataset", None)
    cistern = arg("--cistern", os.path.join(ROOT, "target", "release", "cistern"))
    if not os.path.exists(cistern):
        sys.exit(f"train_turns: no {cistern}: run `cargo build --release -p cistern-cli` first")
    extra = ["--dataset", dataset] if dataset else []
    ratios = []
    for round_ in range(1, rounds + 1):
        ours = subprocess.run([cistern, "train", "--json", *extra], capture_output=True,
                              text=True, check=True, cwd=ROOT)
        peer = subprocess.run([sys.executable, os.path.join(HERE, "train_pytorch.py"), *extra],
                              capture_output=True, text=True, check=True, cwd=ROOT)
        ours, peer = last_json_line(ours.stdout, "cistern"), last_json_line(peer.stdout, "the peer")
        ratio = ours["steps_per_s"] / peer["steps_per_s"]
        ratios.append(ratio)
        print(json.dumps({"bench": "train_turns", "round": round_, "dataset": dataset or "winequality",
                          "cistern_steps_per_s": round(ours["steps_per_s"]),
                          "pytorch_steps_per_s": round(peer["steps_per_s"]),
                          "ratio": round(ratio, 2), "steps": ours["steps"]}), flush=True)
    print(json.dumps({"bench": "train_turns", "summary": True, "rounds": rounds,
                      "median_ratio": round(statistics.median(ratios), 2),
                      "min_ratio": round(min(ratios), 2), "max_ratio": round(max(ratios), 2),
                      "target": target, "every_round_met": min(ratios) >= target}))


if __name__ == "__main__":
    main()
