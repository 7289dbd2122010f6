#!/usr/bin/env bash
# vLLM on the lent GPU machine, which has no package index: the wheels
# (benchmarks/device_wheels.py --set vllm --dest .wv, about 262 MB) travel in five parts,
# one call each to the same warm machine (a call's tree is at most 64 MiB):
#   bash benchmarks/gpu_vllm.sh stage      # in the calls carrying .wv/part1 ... .wv/part4
#   bash benchmarks/gpu_vllm.sh            # in the call carrying .wv/part5: stage, install, run
# The run: benchmarks/vllm_sleep.py (sleep/wake of real engines: the toy policy and a 7B), the
# two GRPO jobs of examples/vllm/two_jobs.py, then tests/test_vllm_engine.py. Output in $OUT.
# Their time limits (s): SLEEP_S (200), JOBS_S (220), TESTS_S (100); 0 skips that step.
# vLLM 0.24's sampler imports FlashInfer, which is not carried: VLLM_USE_FLASHINFER_SAMPLER=0.
set -uo pipefail
PARTS=/tmp/wv
mkdir -p "$PARTS"
cp .wv/part*/* "$PARTS"/ 2>/dev/null
echo "staged: $(ls "$PARTS" | wc -l) files, $(du -sm "$PARTS" | cut -f1) MB"
[ "${1:-run}" = stage ] && exit 0
for first in "$PARTS"/*.whl.000; do
  [ -e "$first" ] || continue
  wheel=${first%.000}
  cat "$wheel".[0-9][0-9][0-9] > "$wheel" && rm "$wheel".[0-9][0-9][0-9]
done
WHEELS=$PARTS source benchmarks/gpu_env.sh
export VLLM_WORKER_MULTIPROC_METHOD=spawn VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0
python3 -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
[ "${SLEEP_S:-200}" != 0 ] && timeout "${SLEEP_S:-200}" python3 benchmarks/vllm_sleep.py --models "${MODELS:-toy-106m,qwen2.5-7b}" --json "$OUT/vllm_sleep.json" > "$OUT/vllm_sleep.log" 2>&1
echo "vllm_sleep: exit $?"; grep -v " INFO \| WARNING " "$OUT/vllm_sleep.log" | tail -25
[ "${JOBS_S:-220}" != 0 ] && timeout "${JOBS_S:-220}" python3 examples/vllm/two_jobs.py --out "$OUT/two_jobs" --iterations "${ITERATIONS:-30}" \
  > "$OUT/two_jobs.log" 2>&1
echo "two_jobs: exit $?"; grep -v " INFO \| WARNING \|pid=" "$OUT/two_jobs.log" | tail -25
[ "${TESTS_S:-100}" != 0 ] && timeout "${TESTS_S:-100}" python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_vllm_engine.py -k real_engine \
  2>&1 | tail -5 | tee "$OUT/tests.log"
