#!/usr/bin/env bash
# The GPU checks of the state hooks, in one run (the lent device machine, or any CUDA host
# with torch, transformers and pytest installed): the CUDA tests of the state cache, the
# sharded-trainer state and the engine memory, then benchmarks/sharded_switch.py and
# benchmarks/engine_sleep.py. Logs and JSON go to $OUT (default ./gpu-out).
# torch_memory_saver comes from a wheel in .whl/ when the machine cannot reach a package index.
set -uo pipefail
source benchmarks/gpu_env.sh
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings -m 'not slow' \
  tests/test_state_cache.py tests/test_sharded_state.py tests/test_engine_memory.py 2>&1 | tee "$OUT/tests.log"
timeout 240 python3 benchmarks/sharded_switch.py --device cuda --json "$OUT/sharded.json" 2>&1 | tee "$OUT/sharded.log"
timeout 240 python3 benchmarks/engine_sleep.py --json "$OUT/engine.json" 2>&1 | tee "$OUT/engine.log"
