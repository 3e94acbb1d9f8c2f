"""Each weights method's exported model: size on disk (dense, compact) against the dense fp16 model, and its quality.

    python benchmarks/export_sizes.py [--pipeline pipelines/export_smollm2.yaml] [--home DIR] [--out export_sizes.json]

Runs the pipeline's study (resumable; one trial per method), exports every complete trial with
`paretolab export` (which re-applies it and compares its perplexity with the recorded one), and
reports per method: the trial's size_bytes, the dense safetensors on disk, the dense model in fp16
(2 bytes per parameter), the compact form on disk (if the method has one) and the largest logit
difference of the compact model from the trial's. A refused export (no export path) is listed with
its reason. On smollm2-135m the base is a Q4_1 GGUF dequantized to fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent / "paretolab"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default=str(ROOT / "pipelines" / "export_smollm2.yaml"))
    parser.add_argument("--home", default=".paretolab", help="the stores (as --home)")
    parser.add_argument("--out", default="export_sizes.json")
    args = parser.parse_args()
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    subprocess.run([str(BIN), "run", args.pipeline, "--resume", "--home", args.home, "--no-progress"], check=True, env=env)
    name = _name(args.pipeline)
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{Path(args.home).resolve() / 'optuna.db'}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="paretolab-export-") as tmp:
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            method = trial.params.get("stage0.method", "?")
            out = Path(tmp) / f"t{trial.number}"
            proc = subprocess.run([str(BIN), "export", name, str(trial.number), "--out", str(out), "--home", args.home],
                                  capture_output=True, text=True, env=env)
            if proc.returncode == 2:
                rows.append({"method": method, "trial": trial.number, "refused": proc.stderr.strip()})
                continue
            info = json.loads((out / "paretolab.json").read_text())
            rows.append({"method": method, "trial": trial.number, **info["sizes_bytes"], "compact": sorted(set(info["compact"].values())),
                         "logit_gap": info["logit_gap"], **{f"ppl_{k}": v for k, v in info["reproduced"].items() if k != "metric"}})
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{'method':16s} {'trial size':>11s} {'dense disk':>11s} {'fp16 dense':>11s} {'compact disk':>12s} {'÷ fp16':>7s}  format   ppl recorded → re-applied")
    for r in rows:
        if "refused" in r:
            print(f"{r['method']:16s} refused: {r['refused']}")
            continue
        mib = lambda k: f"{r[k] / 2**20:9.1f}Mi" if k in r else f"{'-':>11s}"  # noqa: E731
        best = r.get("compact on disk", r["dense on disk"])
        print(f"{r['method']:16s} {mib('trial size_bytes')} {mib('dense on disk')} {mib('dense fp16')} {mib('compact on disk'):>12s} "
              f"{best / r['dense fp16']:7.3f}  {','.join(r['compact']) or 'dense':8s} {r['ppl_recorded']:.4g} → {r['ppl_reapplied']:.4g}"
              f"{'' if r['ppl_within'] else ' (DIFFERS)'}")


def _name(pipeline: str) -> str:
    import yaml

    return str(yaml.safe_load(Path(pipeline).read_text())["name"])


if __name__ == "__main__":
    main()
