# Sourced by the GPU scripts (gpu_checks.sh, gpu_trl_jobs.sh, gpu_vllm.sh) from the repository root:
# makes $OUT (default ./gpu-out), sets the environment, installs the wheels in $WHEELS (default .whl; a
# machine that cannot reach a package index) into /tmp/site ahead of src on PYTHONPATH,
# and writes the GPU's name, memory and driver to $OUT/gpu.txt and the machine's own packages
# (what the next wheel set need not carry: pip freeze before /tmp/site) to $OUT/machine-packages.txt.
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 GLOO_SOCKET_IFNAME=lo
WHEELS=${WHEELS:-.whl}
PYTHONPATH= python3 -m pip list --format=freeze > "$OUT/machine-packages.txt" 2>/dev/null
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:src
else
  export PYTHONPATH=src
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
