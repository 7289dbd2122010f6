#!/usr/bin/env bash
# Two TRL GRPO jobs with SmolLM2-135M-shaped policies (106M parameters) on one GPU under
# RollMux, then each job alone (the baseline), then the comparison: together vs one after
# the other, and whether each job's logged rewards and losses are the same value for value.
# First four quick tests of tests/test_trl_integration.py (one checks CUDA memory). Run from the repository root
# on a CUDA machine with torch and transformers; wheels in .whl/ (benchmarks/device_wheels.py)
# are installed first when the machine cannot reach a package index. Output goes to $OUT.
set -uo pipefail
STEPS=${STEPS:-60}
source benchmarks/gpu_env.sh
python3 -c "import torch, transformers, trl, ray; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__, 'ray', ray.__version__)" | tee -a "$OUT/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_trl_integration.py \
  -k "device_memory or smollm2 or refused or compare" 2>&1 | tee "$OUT/tests.log"
for run in together trl-copy trl-next; do
  alone=(); [ "$run" = together ] || alone=(--alone "$run")
  timeout 300 python3 examples/trl/two_jobs.py --out "$OUT/$run" --device cuda --policy smollm2-135m \
    --steps "$STEPS" "${alone[@]}" > "$OUT/$run.full.log" 2>&1
  rc=$?
  grep -v "pid=" "$OUT/$run.full.log" | tee "$OUT/$run.log"   # without the actors' TRL logs
  [ "$rc" = 0 ] || { echo "$run: exit status $rc (the actors' logs: $OUT/$run.full.log)"; exit "$rc"; }
done
python3 - "$OUT" <<'PY' | tee "$OUT/compare.txt"
import json, sys
from pathlib import Path
from rollmux.integrations.trl_jobs import compare_alone
out = Path(sys.argv[1])
c = compare_alone(json.loads((out / "together/summary.json").read_text()),
                  [json.loads((out / f"{j}/summary.json").read_text()) for j in ("trl-copy", "trl-next")])
print(f"together {c['together_s']:.1f} s, alone one after the other {c['alone_s']:.1f} s: {c['speedup']:.2f}x; "
      f"same rewards {c['same_rewards']}, same losses {c['same_losses']}")
PY
