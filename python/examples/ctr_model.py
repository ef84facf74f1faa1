# SPDX-License-Identifier: Apache-2.0
"""A DLRM-like click model and a synthetic click log, shared by python/examples/train_ctr.py and
bench/embedding_bench.py.

ClickModel: dense features -> bottom MLP -> a vector of `dim`; each of K categorical features
(a bag of ids) -> its embedding bag -> a vector of `dim`; the pairwise dot products of those K + 1
vectors (DLRM's interaction) beside the bottom MLP's vector -> top MLP -> one logit. The bags
come from a factory, so the same model holds torch.nn.EmbeddingBag tables (torch_bags) or
psched.torch.EmbeddingBag rows on the shards (psched_bags).

ClickLog: samples generated deterministically from a seed. Dense features are N(0, 1); each
table's ids follow a Zipf law over its rows (the hot ids scattered over the table by a
multiplicative hash); the label is Bernoulli(sigmoid(teacher logit)), the teacher a fixed random
model of the same seed with embeddings of its own (one vector per id, hashed into at most
TEACHER_ROWS per table) and a tanh layer, calibrated to logits of standard deviation SHARPNESS
and a mean click probability of BASE_RATE.
"""
import math

import numpy as np
import torch

DENSE = 13  # dense features per sample, as Criteo's
TEACHER_DIM = 8
TEACHER_HIDDEN = 16
TEACHER_ROWS = 1 << 16  # the teacher's vectors per table: ids beyond share them (by id % count)
SHARPNESS = 2.0
BASE_RATE = 0.3


def zipf_ids(rows, exponent, shape, generator):
    """Ranks in [0, rows) with P(rank r) about proportional to (r + 1)^-exponent (the inverse
    CDF of the continuous law on [1, rows + 1)), so memory stays O(samples) for any `rows`."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    if exponent == 1:
        x = torch.exp(u * math.log(rows + 1))
    else:
        a = 1 - exponent
        x = (1 + u * ((rows + 1) ** a - 1)) ** (1 / a)
    return (x.floor().long() - 1).clamp_(0, rows - 1)


class ClickLog:
    """The synthetic click log of `tables` tables of `rows` ids, `ids_per_bag` ids a bag (the
    module docstring). sample(n, generator) -> dense (n, DENSE) float32, ids (tables, n,
    ids_per_bag) int64, labels (n,) float32 in {0, 1}; the same generator state gives the same
    samples."""

    def __init__(self, tables, rows, ids_per_bag, seed, zipf=1.1):
        self.tables, self.rows, self.ids_per_bag, self.zipf = tables, rows, ids_per_bag, zipf
        g = torch.Generator().manual_seed(seed)
        # Rank r of table k is id r * scatter[k] % rows: a bijection when gcd(scatter, rows) = 1.
        self.scatter = []
        for _ in range(tables):
            m = int(torch.randint(max(rows // 3, 1), max(rows, 2), (1,), generator=g))
            while math.gcd(m, rows) != 1:
                m += 1
            self.scatter.append(m)
        self.teacher_rows = min(rows, TEACHER_ROWS)
        self.teacher_embeddings = torch.randn(tables, self.teacher_rows, TEACHER_DIM, generator=g)
        width = DENSE + tables * TEACHER_DIM
        self.w1 = torch.randn(width, TEACHER_HIDDEN, generator=g) / math.sqrt(width)
        self.w2 = torch.randn(TEACHER_HIDDEN, generator=g) / math.sqrt(TEACHER_HIDDEN)
        self.scale, self.shift = 1.0, 0.0
        raw = self._logits(*self._features(4096, g))
        self.scale = SHARPNESS / raw.std().item()
        low, high = -20.0, 20.0  # the shift that makes the mean click probability BASE_RATE
        for _ in range(40):
            self.shift = (low + high) / 2
            if torch.sigmoid(self.scale * raw + self.shift).mean().item() > BASE_RATE:
                high = self.shift
            else:
                low = self.shift

    def _features(self, n, generator):
        dense = torch.randn(n, DENSE, generator=generator)
        ranks = zipf_ids(self.rows, self.zipf, (self.tables, n, self.ids_per_bag), generator)
        ids = ranks * torch.tensor(self.scatter).view(-1, 1, 1) % self.rows
        return dense, ids

    def _logits(self, dense, ids):
        bags = [self.teacher_embeddings[k][ids[k] % self.teacher_rows].sum(1)
                for k in range(self.tables)]
        z = torch.cat([dense] + [b / math.sqrt(self.ids_per_bag) for b in bags], 1)
        return self.scale * (torch.tanh(z @ self.w1) @ self.w2) + self.shift

    def sample(self, n, generator):
        dense, ids = self._features(n, generator)
        clicks = torch.bernoulli(torch.sigmoid(self._logits(dense, ids)), generator=generator)
        return dense, ids, clicks


def mlp(widths, relu_last):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if relu_last or i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class ClickModel(torch.nn.Module):
    """The DLRM-like model (the module docstring): forward(dense (B, DENSE), ids (tables, B,
    ids_per_bag)) -> logits (B,). bag(k) makes table k's embedding bag (of width `dim`)."""

    def __init__(self, tables, dim, bag, bottom=(64,), top=(64,)):
        super().__init__()
        self.bottom = mlp([DENSE, *bottom, dim], relu_last=True)
        self.bags = torch.nn.ModuleList(bag(k) for k in range(tables))
        self.upper = torch.triu_indices(tables + 1, tables + 1, 1)  # the pairs i < j
        self.top = mlp([dim + self.upper.shape[1], *top, 1], relu_last=False)

    def forward(self, dense, ids):
        x = self.bottom(dense)
        vectors = torch.stack([x] + [bag(ids[k]) for k, bag in enumerate(self.bags)], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.upper[0], self.upper[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


def init_range(rows):
    """DLRM's initial rows: uniform in +-sqrt(1 / rows)."""
    return math.sqrt(1 / rows)


def mix64(x):
    """psched's 64-bit mixer (actors/shard/table_spec.h) on a numpy uint64 array."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def psched_uniform_rows(rows, dim, low, high, seed, chunk=1 << 16):
    """The initial rows a psched table of init ("uniform", low, high) and `seed` gives, as
    float32 (actors/shard/row_table.cc): element j of row id is low + (high - low) *
    u(mix64(mix64(seed ^ mix64(id)) + j)), u taking the top 53 bits to [0, 1)."""
    out = np.empty((rows, dim), np.float32)
    columns = np.arange(dim, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, rows, chunk):
            ids = np.arange(start, min(start + chunk, rows), dtype=np.uint64)
            keys = mix64(np.uint64(seed) ^ mix64(ids))
            bits = mix64(keys[:, None] + columns[None, :])
            unit = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            out[start:start + len(ids)] = low + (high - low) * unit
    return out


def torch_bags(rows, dim, sparse=True):
    """A factory of torch.nn.EmbeddingBag tables (sum of the bag's rows) holding the initial
    rows psched_bags' tables start from (psched_uniform_rows), so that both train the same
    model from the same start."""
    def bag(k):
        table = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
        r = init_range(rows)
        with torch.no_grad():
            table.weight.copy_(torch.from_numpy(psched_uniform_rows(rows, dim, -r, r, seed=k)))
        return table
    return bag


def psched_bags(rows, dim, lr, compression=None):
    """A factory of psched.torch.EmbeddingBag tables named table0, table1, ...: rows held on
    the shards, trained there by Adagrad (torch.optim.Adagrad's formula) with `lr`, table k's
    initial rows uniform in +-init_range(rows) from seed k (torch_bags' rows). compression: a
    psched.Compression, or None for the bag's default."""
    import psched.torch
    r = init_range(rows)
    extra = {} if compression is None else {"compression": compression}

    def bag(k):
        return psched.torch.EmbeddingBag(rows, dim, mode="sum", name=f"table{k}",
                                         optimizer="adagrad", lr=lr, init=("uniform", -r, r),
                                         seed=k, **extra)
    return bag


def logloss_and_auc(logits, labels):
    """Mean binary cross-entropy of `logits` against `labels`, and the ROC AUC (the
    Mann-Whitney statistic, ties counted half)."""
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    _, inverse, counts = torch.unique(logits, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    ranks = (ends - (counts - 1) / 2)[inverse]  # 1-based, ties share their mean rank
    positives = labels.sum().item()
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return logloss, float("nan")
    auc = (ranks[labels > 0.5].sum().item() - positives * (positives + 1) / 2) / (
        positives * negatives)
    return logloss, auc
