#!/usr/bin/env bash
# The CUDA backend's checks on a lent GPU (docs/cuda.md), meant for the `device` tool:
#   scripts/gpu-check.sh            # in the repository root on the GPU machine
# It builds build-cuda/ with DIFFLET_CUDA=ON when the machine can (cmake, the Debian
# dependencies and the CUDA toolkit), else runs a build-cuda/ carried from a machine of
# the same kind, then runs the GPU kernel tests and the host-side checks and prints the
# device. A test that finds no device reports "skipped", which this script counts as
# a failure: on the GPU machine every GPU test must run.
# Not covered yet (the backend is not wired into the models): FLUX parity on the GPU,
# difflet-tiny's eval, `bench flux-step --device cuda` against diffusers.
set -u
cd "$(dirname "$0")/.."
b=build-cuda
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "gpu-check: nvidia-smi did not answer"
if command -v cmake >/dev/null && command -v nvcc >/dev/null; then
  cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DDIFFLET_CUDA=ON >/dev/null || { echo "gpu-check: configure failed"; exit 1; }
  cmake --build "$b" -j"$(nproc)" --target test_cuda_gpu test_cuda_host || { echo "gpu-check: build failed"; exit 1; }
elif [ ! -x "$b/test_cuda_gpu" ]; then
  echo "gpu-check: no cmake/nvcc here and no carried $b/test_cuda_gpu"; exit 1
fi
rc=0
"$b/test_cuda_host" || rc=1
"$b/test_cuda_gpu"; r=$?
if [ $r = 77 ]; then echo "gpu-check: the GPU tests found no device (skipped): a failure here"; rc=1; elif [ $r != 0 ]; then rc=1; fi
echo "gpu-check: $([ $rc = 0 ] && echo passed || echo FAILED)"
exit $rc
