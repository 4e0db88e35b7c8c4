"""Fake torch.nn.Embedding (weights from the global seeded generator, lookups exact)."""
import random

from . import Tensor, float32


class Embedding:
    def __init__(self, num, dim):
        self.num, self.dim = num, dim
        self.weight = Tensor([random.gauss(0.0, 1.0) for _ in range(num * dim)], float32, (num, dim))

    def to(self, device=None, dtype=None):
        if dtype is not None:
            self.weight = self.weight.to(dtype)
        return self

    def __call__(self, ids):
        d = self.dim
        rows = []
        for i in ids.data:
            rows.extend(self.weight.data[i * d:(i + 1) * d])
        return Tensor(rows, self.weight.dtype, (len(ids.data), d))
