"""A tiny pure-Python stand-in for the parts of torch that torch_allreduce.py uses, so that
ci/tests/60-gpu-scripts.sh can run the script's whole flow on a CPU host without torch, with one
rank (torch.distributed with world size 1). Not torch: only enough semantics for that script
(flat lists, 1-D and 2-D shapes, float32/bfloat16/float16 rounding). FAKE_TORCH_CORRUPT=1 makes
all_reduce and all_gather_into_tensor damage one element, to show the script's checks catch it."""

import random as _random
import struct as _struct

__version__ = "0.0+fake"


class version:  # noqa: N801 - mirrors torch.version
    cuda = "fake"


class dtype:  # noqa: N801
    def __init__(self, name, size, mx, kind):
        self.name, self.size, self.max, self.kind = name, size, mx, kind

    def __repr__(self):
        return "torch." + self.name


float32 = dtype("float32", 4, 3.4028234663852886e38, "f32")
float64 = dtype("float64", 8, 1.7976931348623157e308, "f64")
bfloat16 = dtype("bfloat16", 2, 3.3895313892515355e38, "bf16")
float16 = dtype("float16", 2, 65504.0, "f16")
int32 = dtype("int32", 4, 2 ** 31 - 1, "int")
int64 = dtype("int64", 8, 2 ** 63 - 1, "int")
bool_ = dtype("bool", 1, 1, "int")


class finfo:  # noqa: N801
    def __init__(self, dt):
        self.max = dt.max


class device:  # noqa: N801
    def __init__(self, kind, index=None):
        self.kind, self.index = kind, index


def _round(v, dt):
    if dt.kind == "int":
        return int(v)
    v = float(v)
    if dt.kind == "f64" or v != v:
        return v
    if dt.kind == "f16":
        try:
            return _struct.unpack("<e", _struct.pack("<e", v))[0]
        except OverflowError:
            return float("inf") if v > 0 else float("-inf")
    try:
        b = _struct.unpack("<I", _struct.pack("<f", v))[0]
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")
    if dt.kind == "bf16":
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return _struct.unpack("<f", _struct.pack("<I", b & 0xFFFFFFFF))[0]


class Tensor:
    def __init__(self, data, dt, shape=None):
        self.dtype = dt
        self.data = [_round(v, dt) for v in data]
        self.shape = tuple(shape) if shape is not None else (len(self.data),)

    # -- conversions --
    def to(self, *args, **kw):
        dt = kw.get("dtype")
        for a in args:
            if isinstance(a, dtype):
                dt = a
        return Tensor(self.data, dt or self.dtype, self.shape) if dt else self

    def contiguous(self):
        return self

    def numel(self):
        return len(self.data)

    def element_size(self):
        return self.dtype.size

    def item(self):
        return self.data[0]

    def tolist(self):
        return list(self.data)

    def flatten(self):
        return Tensor(self.data, self.dtype)

    # -- arithmetic (elementwise, with a scalar or a same-size tensor) --
    def _bin(self, o, f):
        if isinstance(o, Tensor):
            return Tensor([f(a, b) for a, b in zip(self.data, o.data)], self.dtype, self.shape)
        dt = self.dtype
        if dt.kind == "int" and isinstance(o, float):
            dt = float32
        return Tensor([f(a, o) for a in self.data], dt, self.shape)

    def __add__(self, o):
        return self._bin(o, lambda a, b: a + b)

    __radd__ = __add__

    def __mul__(self, o):
        return self._bin(o, lambda a, b: a * b)

    __rmul__ = __mul__

    def __mod__(self, o):
        return self._bin(o, lambda a, b: a % b)

    # -- in place --
    def copy_(self, o):
        self.data = [_round(v, self.dtype) for v in o.data]
        return self

    def fill_(self, v):
        self.data = [_round(v, self.dtype)] * len(self.data)
        return self

    # -- reductions / indexing --
    def sum(self):
        return Tensor([sum(self.data)], int64)

    def any(self, dim):
        assert dim == 1 and len(self.shape) == 2
        c = self.shape[1]
        return Tensor([1 if any(self.data[r * c:(r + 1) * c]) else 0 for r in range(self.shape[0])], bool_)

    def nonzero(self):
        idx = [i for i, v in enumerate(self.data) if v]
        return Tensor(idx, int64, (len(idx), 1))

    def __getitem__(self, k):
        if isinstance(k, slice) and len(self.shape) == 1:
            d = self.data[k]
            return Tensor(d, self.dtype, (len(d),))
        if isinstance(k, int) and len(self.shape) == 1:
            return Tensor([self.data[k]], self.dtype, (1,))
        raise NotImplementedError("fake torch: indexing %r" % (k,))


def arange(n, device=None, dtype=int64):
    return Tensor(range(n), dtype)


def tensor(values, dtype=float32, device=None):
    return Tensor(values, dtype)


def empty(shape, dtype=float32, device=None):
    n = 1
    for s in shape:
        n *= s
    return Tensor([0] * n, dtype, shape)


def ne(a, b):
    return Tensor([0 if x == y else 1 for x, y in zip(a.data, b.data)], bool_, a.shape)


def manual_seed(s):
    _random.seed(s)


class Generator:
    def __init__(self):
        self.r = _random.Random(0)

    def manual_seed(self, s):
        self.r.seed(s)
        return self


def randint(lo, hi, shape, generator=None):
    r = generator.r if generator else _random
    return Tensor([r.randrange(lo, hi) for _ in range(shape[0])], int64)


class no_grad:  # noqa: N801
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


from . import cuda, distributed, nn  # noqa: E402,F401
