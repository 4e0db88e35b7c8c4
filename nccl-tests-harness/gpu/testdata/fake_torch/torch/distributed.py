"""Fake torch.distributed with world size 1 (RANK=0, WORLD_SIZE=1)."""
import os

_state = {"init": False}


def _corrupt(t):
    if os.environ.get("FAKE_TORCH_CORRUPT") == "1" and t.numel() > 2 and t.dtype.kind != "f64":
        i = t.numel() // 2
        t.data[i] = t.data[i] + 1


def init_process_group(backend, timeout=None):
    assert backend == "nccl" and os.environ.get("WORLD_SIZE") == "1"
    assert os.environ.get("NCCL_HOSTID"), "NCCL_HOSTID must be set before init_process_group"
    _state["init"] = True


def all_reduce(t):
    assert _state["init"]
    _corrupt(t)


def all_gather_into_tensor(out, inp):
    assert _state["init"] and out.numel() == inp.numel()
    out.data = list(inp.data)
    _corrupt(out)


def barrier(device_ids=None):
    assert _state["init"]


def destroy_process_group():
    _state["init"] = False
