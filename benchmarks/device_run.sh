#!/usr/bin/env bash
# benchmarks/device_run.sh: xlapy's CPU backend against XLA:CPU on a many-core machine, with
# no network access: one prepared run that first checks that xlapy reads the HLO the
# machine's JAX prints (jax_version_probe.py: only programs that are not ok are shown), then
# prints the cpu_vs_xla.py table (every program, at all the cores the machine gives) and then the scaling table over 1, 2, 4, 8 and 16 threads
# on one or two programs per family of issue 17. Budget: under 8 minutes on 16 cores (each
# stage has its own timeout; a stage that runs out prints what it has and the next starts).
#
#   bash benchmarks/device_run.sh                 # from the repository root
#   RUNS=10 SCALING="1,4,16" bash benchmarks/device_run.sh
#   SMOKE=1 bash benchmarks/device_run.sh         # tiny shapes, 2 runs: checks the script
#
# Python: the repository's .venv when present (it must hold jax, jaxlib, numpy, scipy,
# llvmlite and ml_dtypes: nothing is installed here), else python3 on PATH. xlapy's pool
# follows XLAPY_NUM_THREADS (kernel.pool_size()); XLA:CPU's follows the cores the process may
# use, so the scaling runs pin each run with `taskset -c 0-(T-1)` and set XLAPY_NUM_THREADS=T.
set -u
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export JAX_PLATFORMS=cpu
RUNS="${RUNS:-5}"
SCALING="${SCALING:-1,2,4,8,16}"
SIZES=()
if [ "${SMOKE:-0}" = 1 ]; then RUNS=2; SIZES=(--small); fi
# scaling: each side's own speedup per program is printed too, from the best run (--stat min)
SUBSET=(-p cumsum_reverse -p cumlogsumexp -p fori_dynamic -p lstm_bptt -p svd
        -p fft_complex -p maxpool_grad -p conv2d_3x3 -p threefry -p f16_arith -p int_bit_ops
        -p softmax -p transformer_forward -p batched_matmul_big -p argsort)

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== date: $(date -u '+%Y-%m-%d %H:%M UTC'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== python: $PY ($($PY -c 'import jax; print("jax", jax.__version__)' 2>&1 | tail -1))"
if ! $PY -c 'import jax, llvmlite, numpy, scipy' 2>/dev/null; then
  echo "missing packages for $PY: needs jax, llvmlite, numpy, scipy" >&2
  exit 2
fi

# ducc0 (the CPU backend's FFT library) from a wheel brought along in wheels/ (docs/cpu_backend.md):
# installed into .deps/, not into the environment; without it fft runs on scipy.fft
if ! $PY -c 'import ducc0' 2>/dev/null && ls wheels/ducc0-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --find-links wheels --no-deps --target .deps ducc0 2>&1 | tail -2
  export PYTHONPATH="$PWD/.deps:$PYTHONPATH"
fi
echo "== fft: $($PY -c 'import ducc0; print("ducc0", ducc0.__version__)' 2>/dev/null \
  || echo 'scipy.fft (ducc0 not importable)')"

echo "== does xlapy read this JAX's HLO? (benchmarks/jax_version_probe.py, timeout 60 s)"
timeout 60 "$PY" benchmarks/jax_version_probe.py 2>&1 | grep -v "^[a-z_0-9]* *ok$"
echo "== every program, all cores (timeout 270 s)"
timeout 270 "$PY" benchmarks/cpu_vs_xla.py --runs "$RUNS" --warmup 1 ${SIZES[@]+"${SIZES[@]}"}
echo "== scaling over $SCALING threads, family subset (timeout 180 s)"
timeout 180 "$PY" benchmarks/cpu_vs_xla.py --runs "$RUNS" --warmup 1 "${SUBSET[@]}" \
  ${SIZES[@]+"${SIZES[@]}"} --stat min --threads "$SCALING" 2>/dev/null | sed -n '/^scaling:/,$p'
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
