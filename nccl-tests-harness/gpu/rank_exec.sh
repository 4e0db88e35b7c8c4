#!/bin/bash
# Per-rank environment for processes started by a launcher (mpirun, srun), then exec "$@":
#   NCCL_HOSTID=ferroce-gpu-rank<R>   NCCL treats every rank as its own host (network transport only)
#   SOFTROCE_ADDR=<net>.<R+1>         each process binds its own softroce address (when softroce is used)
#   NCCL_TESTS_DEVICE=<R % N>         when FERROCE_GPU_DEVICE_MOD=N is set (fewer GPUs than ranks:
#                                     nccl-tests then puts several ranks on one GPU)
# The rank comes from OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-${SLURM_PROCID:-}}}}
case $r in
    '' | *[!0-9]*)
        echo "rank_exec.sh: cannot tell this process's rank (no OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID)" >&2
        exit 2
        ;;
esac
while IFS= read -r kv; do
    export "${kv?}"
done < <(rank_env "$r")
if [ -n "${FERROCE_GPU_DEVICE_MOD:-}" ]; then
    export NCCL_TESTS_DEVICE=$((r % FERROCE_GPU_DEVICE_MOD))
fi
[ $# -gt 0 ] || { echo "rank_exec.sh: no command" >&2; exit 2; }
exec "$@"
