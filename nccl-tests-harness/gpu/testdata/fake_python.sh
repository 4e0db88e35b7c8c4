#!/bin/bash
# Test double of python3 for ci/tests/60-gpu-scripts.sh (no torch, no GPU).
#   -m torch.distributed.run ... : prints the canned log of the transport the environment selects
#                                  (testdata/torch-ferroce-good.log or torch-socket-good.log, NCCL
#                                  and table lines only); FAKE_TORCH=fallback prints the fallback log.
#   -c CODE                      : like gpu_check.sh's version probe: "torch not usable".
d=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = -m ] && [ "${2:-}" = torch.distributed.run ]; then
    if [ "${NCCL_NET:-}" = Socket ]; then f=$d/torch-socket-good.log
    elif [ "${FAKE_TORCH:-}" = fallback ]; then f=$d/ferroce-fallback-socket.log
    else f=$d/torch-ferroce-good.log; fi
    grep -v '^#env \|^# transport\|^# command\|^# 20' "$f"
    exit 0
fi
if [ "${1:-}" = -c ]; then
    echo "python fake, torch not usable: fake_python.sh"
    exit 0
fi
echo "fake_python.sh: unsupported arguments: $*" >&2
exit 2
