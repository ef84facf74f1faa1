#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generates the model profiles of the scheduling benchmark: configs/models/<name>.json.

A profile lists every parameter tensor of a real architecture (VGG-16, ResNet-50, BERT-base)
in forward order, with its exact shape and float32 byte size, grouped by layer, and gives each
layer a forward and a backward compute time derived from its FLOPs at a stated device
throughput and batch size. docs/model_profiles.md explains the method.

    python3 scripts/gen_model_profiles.py           # (re)write configs/models/*.json
    python3 scripts/gen_model_profiles.py --check   # exit 1 if the files on disk differ
    python3 scripts/gen_model_profiles.py --table   # print the summary table of the docs

Standard library only. The output is deterministic: the same script writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT_DIR = REPO / "configs" / "models"

# Assumed effective device throughput, FLOP/s: 14 TFLOP/s fp32, roughly an NVIDIA V100 (PCIe
# peak fp32 14 TFLOP/s, SXM2 15.7). Real fp32 training reaches less than that, so these compute
# times are on the short side; the benchmark can scale them (bench::scale_compute).
DEVICE_FLOPS = 1.4e13
DTYPE_BYTES = 4  # float32
DEFAULT_BATCH = 32  # images per worker (VGG-16, ResNet-50) or sequences (BERT)
DEFAULT_SEQ_LEN = 128  # BERT tokens per sequence
BACKWARD_FACTOR = 2  # backward = grad w.r.t. input + grad w.r.t. weights
FIRST_LAYER_BACKWARD_FACTOR = 1  # the layer nearest the input needs no input gradient


@dataclass
class Tensor:
    name: str
    shape: list[int]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass
class Layer:
    name: str
    flops_per_sample: int  # forward FLOPs for one image / one sequence
    tensors: list[Tensor] = field(default_factory=list)


@dataclass
class Model:
    name: str
    description: str
    method: str  # the model-specific part of the method paragraph
    batch: int
    layers: list[Layer]
    expected_parameters: int


# FLOP counting: multiply-adds x 2 (one multiply and one add each).
def conv_flops(k: int, cin: int, cout: int, hout: int, wout: int) -> int:
    return 2 * k * k * cin * cout * hout * wout


def linear_flops(n_in: int, n_out: int, rows: int = 1) -> int:
    return 2 * n_in * n_out * rows


# --------------------------------------------------------------------------------------------
# VGG-16 (configuration D of Simonyan & Zisserman 2014; torchvision.models.vgg16 without BN).


def vgg16(batch: int) -> Model:
    # (block, convs, channels); a 2x2 max pool follows each block.
    blocks = [(1, 2, 64), (2, 2, 128), (3, 3, 256), (4, 3, 512), (5, 3, 512)]
    layers: list[Layer] = []
    cin, size = 3, 224
    for block, convs, cout in blocks:
        for i in range(1, convs + 1):
            name = f"conv{block}_{i}"
            layers.append(Layer(name, conv_flops(3, cin, cout, size, size), [
                Tensor(f"{name}/weight", [cout, cin, 3, 3]),
                Tensor(f"{name}/bias", [cout]),
            ]))
            cin = cout
        size //= 2  # max pool: no parameters, its comparisons are not counted
    features = cin * size * size  # 512 x 7 x 7 = 25088
    for name, n_in, n_out in [("fc6", features, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000)]:
        layers.append(Layer(name, linear_flops(n_in, n_out), [
            Tensor(f"{name}/weight", [n_out, n_in]),
            Tensor(f"{name}/bias", [n_out]),
        ]))
    return Model(
        name="vgg16",
        description=(f"VGG-16 (configuration D, no batch norm) on ImageNet, 224x224x3 input, "
                     f"1000 classes; batch {batch} images per worker"),
        method=("Shapes from Simonyan & Zisserman 2014, configuration D (= torchvision "
                "vgg16): 13 3x3 convolutions with bias (padding 1, stride 1) in five blocks "
                "each followed by a 2x2 max pool, then fc6 25088->4096, fc7 4096->4096, "
                "fc8 4096->1000, all with bias; conv weights [out, in, kh, kw], linear weights "
                "[out, in]. One layer per conv/fc; ReLU, pooling and dropout are folded into "
                "the preceding layer at zero cost."),
        batch=batch,
        layers=layers,
        expected_parameters=138_357_544,
    )


# --------------------------------------------------------------------------------------------
# ResNet-50 (He et al. 2015, bottleneck v1.5 as in torchvision.models.resnet50: the stride of a
# down-sampling block sits on its 3x3 conv, not on its first 1x1 conv).


def resnet50(batch: int) -> Model:
    layers: list[Layer] = []

    def conv_bn(name: str, conv: str, bn: str, k: int, cin: int, cout: int, hout: int) -> None:
        layers.append(Layer(name, conv_flops(k, cin, cout, hout, hout), [
            Tensor(f"{conv}/weight", [cout, cin, k, k]),  # no bias: BN follows
            Tensor(f"{bn}/weight", [cout]),  # gamma
            Tensor(f"{bn}/bias", [cout]),  # beta
        ]))

    # Stem: 7x7/2 conv 224 -> 112, then a 3x3/2 max pool -> 56 (not counted).
    conv_bn("conv1", "conv1", "bn1", 7, 3, 64, 112)
    cin, size = 64, 56
    # (stage, blocks, bottleneck width, stride of the first block)
    for stage, blocks, width, stride in [(1, 3, 64, 1), (2, 4, 128, 2), (3, 6, 256, 2),
                                         (4, 3, 512, 2)]:
        cout = width * 4
        for b in range(blocks):
            s = stride if b == 0 else 1
            out_size = size // s
            p = f"layer{stage}.{b}"
            conv_bn(f"{p}.conv1", f"{p}.conv1", f"{p}.bn1", 1, cin, width, size)
            conv_bn(f"{p}.conv2", f"{p}.conv2", f"{p}.bn2", 3, width, width, out_size)
            conv_bn(f"{p}.conv3", f"{p}.conv3", f"{p}.bn3", 1, width, cout, out_size)
            if b == 0:  # projection shortcut: 1x1 conv (stride s) + BN, after conv3
                conv_bn(f"{p}.downsample", f"{p}.downsample.0", f"{p}.downsample.1", 1, cin,
                        cout, out_size)
            cin, size = cout, out_size
    # Global average pool (not counted), then fc 2048 -> 1000.
    layers.append(Layer("fc", linear_flops(cin, 1000), [
        Tensor("fc/weight", [1000, cin]),
        Tensor("fc/bias", [1000]),
    ]))
    return Model(
        name="resnet50",
        description=(f"ResNet-50 (bottleneck v1.5, as torchvision resnet50) on ImageNet, "
                     f"224x224x3 input, 1000 classes; batch {batch} images per worker"),
        method=("Shapes from He et al. 2015 with the v1.5 bottleneck of torchvision resnet50 "
                "(stride on the 3x3 conv): a 7x7/2 stem conv, 3+4+6+3 bottleneck blocks "
                "(1x1, 3x3, 1x1 convs without bias, a 1x1 projection shortcut in each stage's "
                "first block), global average pool, fc 2048->1000 with bias. Every conv is one "
                "layer together with the batch norm that follows it (its gamma and beta; the "
                "running statistics are buffers, not parameters, and are not sent); a block's "
                "projection shortcut (downsample) comes after its conv3, as in torchvision's "
                "forward. Tensor names are torchvision's state_dict keys with '/' before the "
                "parameter. ReLU, BN arithmetic, residual adds and pooling are folded into the "
                "neighbouring conv at zero cost."),
        batch=batch,
        layers=layers,
        expected_parameters=25_557_032,
    )


# --------------------------------------------------------------------------------------------
# BERT-base encoder (Devlin et al. 2018; HuggingFace BertModel, bert-base-uncased config).


def bert_base(batch: int, seq_len: int) -> Model:
    hidden, heads, layers_n, ffn = 768, 12, 12, 3072
    vocab, max_pos, type_vocab = 30522, 512, 2
    if seq_len > max_pos:
        raise SystemExit(f"sequence length {seq_len} exceeds the {max_pos} position embeddings")
    S = seq_len

    def dense(path: str, n_in: int, n_out: int) -> list[Tensor]:
        return [Tensor(f"{path}/weight", [n_out, n_in]), Tensor(f"{path}/bias", [n_out])]

    def layer_norm(path: str) -> list[Tensor]:
        return [Tensor(f"{path}/weight", [hidden]), Tensor(f"{path}/bias", [hidden])]

    layers: list[Layer] = [
        # Embedding look-ups and their sum: no multiply-adds.
        Layer("embeddings", 0, [
            Tensor("embeddings.word_embeddings/weight", [vocab, hidden]),
            Tensor("embeddings.position_embeddings/weight", [max_pos, hidden]),
            Tensor("embeddings.token_type_embeddings/weight", [type_vocab, hidden]),
            *layer_norm("embeddings.LayerNorm"),
        ]),
    ]
    for i in range(layers_n):
        p = f"encoder.layer.{i}"
        # Q, K, V projections, then per head Q K^T (S x S x d_head) and softmax(.) V
        # (S x S x d_head); over all heads each is 2 * S * S * hidden FLOPs.
        attention = 3 * linear_flops(hidden, hidden, S) + 2 * (2 * S * S * hidden)
        layers.append(Layer(f"{p}.attention.self", attention, [
            *dense(f"{p}.attention.self.query", hidden, hidden),
            *dense(f"{p}.attention.self.key", hidden, hidden),
            *dense(f"{p}.attention.self.value", hidden, hidden),
        ]))
        layers.append(Layer(f"{p}.attention.output", linear_flops(hidden, hidden, S), [
            *dense(f"{p}.attention.output.dense", hidden, hidden),
            *layer_norm(f"{p}.attention.output.LayerNorm"),
        ]))
        layers.append(Layer(f"{p}.intermediate", linear_flops(hidden, ffn, S),
                            dense(f"{p}.intermediate.dense", hidden, ffn)))
        layers.append(Layer(f"{p}.output", linear_flops(ffn, hidden, S), [
            *dense(f"{p}.output.dense", ffn, hidden),
            *layer_norm(f"{p}.output.LayerNorm"),
        ]))
    # Pooler: dense + tanh on the first ([CLS]) token of each sequence only.
    layers.append(Layer("pooler", linear_flops(hidden, hidden, 1),
                        dense("pooler.dense", hidden, hidden)))
    assert heads * (hidden // heads) == hidden
    return Model(
        name="transformer",
        description=(f"BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, vocab "
                     f"30522, 512 positions, 2 token types) with embeddings, LayerNorms and "
                     f"the pooler, no pre-training heads; batch {batch} sequences of {S} "
                     f"tokens per worker"),
        method=(f"Shapes from Devlin et al. 2018, BERT-base, as HuggingFace BertModel "
                f"(bert-base-uncased): embeddings (word 30522x768, position 512x768, token "
                f"type 2x768, LayerNorm), 12 encoder layers, pooler 768->768 on the [CLS] "
                f"token; linear weights [out, in]. Tensor names are BertModel's state_dict "
                f"keys with '/' before the parameter. Each encoder layer is four profile "
                f"layers, as BertModel's modules: attention.self (Q, K, V; its FLOPs include "
                f"the attention scores Q K^T and the weighted sum of V, each 2*S*S*768 per "
                f"sequence with S = {S}), attention.output (dense + LayerNorm), intermediate "
                f"(dense 768->3072 + GELU) and output (dense 3072->768 + LayerNorm); linear "
                f"FLOPs are 2*in*out per token ({S} tokens per sequence; the pooler sees one). "
                f"The embedding look-ups, softmax, GELU, LayerNorm, dropout and residual adds "
                f"are not counted, so the embeddings layer has zero compute time."),
        batch=batch,
        layers=layers,
        expected_parameters=109_482_240,
    )


# --------------------------------------------------------------------------------------------


def build_models(batch: int | None, seq_len: int) -> list[Model]:
    b = batch or DEFAULT_BATCH
    return [vgg16(b), resnet50(b), bert_base(b, seq_len)]


def validate(model: Model) -> None:
    total = sum(t.elements for layer in model.layers for t in layer.tensors)
    assert total == model.expected_parameters, (
        f"{model.name}: {total} parameters, expected {model.expected_parameters}")
    names = [layer.name for layer in model.layers]
    assert len(set(names)) == len(names), f"{model.name}: duplicate layer names"
    tensor_names = [t.name for layer in model.layers for t in layer.tensors]
    assert len(set(tensor_names)) == len(tensor_names), f"{model.name}: duplicate tensor names"
    for layer in model.layers:
        assert layer.tensors, f"{model.name}: layer {layer.name} has no tensors"
        assert layer.flops_per_sample >= 0
        for t in layer.tensors:
            assert t.shape and all(isinstance(d, int) and d > 0 for d in t.shape), t


# Published per-sample forward costs in multiply-adds (torchvision's model tables: VGG-16 15.47
# GMACs, ResNet-50 4.09 GMACs), to catch a wrong spatial size or stride.
SANITY_GMACS = {"vgg16": 15.47, "resnet50": 4.09}


def sanity_check(model: Model) -> None:
    expected = SANITY_GMACS.get(model.name)
    if expected is None:
        return
    gmacs = sum(layer.flops_per_sample for layer in model.layers) / 2e9
    assert abs(gmacs - expected) < 0.01, f"{model.name}: {gmacs:.3f} GMACs, expected {expected}"


def method_paragraph(model: Model, device_flops: float, seq_len: int) -> str:
    unit = f"sequences of {seq_len} tokens" if model.name == "transformer" else "images"
    return (
        f"{model.method} FLOPs are multiply-adds x 2 for every conv, linear and attention "
        f"matmul (conv: 2*K*K*Cin*Cout*Hout*Wout per sample; linear: 2*in*out per sample or "
        f"token); element-wise ops are not counted. forward_flops is per iteration: per-sample "
        f"FLOPs x batch {model.batch} ({unit}). backward_flops = 2 x forward_flops (gradient "
        f"w.r.t. the input and w.r.t. the weights), except the first layer, which needs no "
        f"input gradient: 1 x. Times are FLOPs / device_flops, an assumed effective throughput "
        f"of {device_flops / 1e12:g} TFLOP/s fp32 (roughly an NVIDIA V100); "
        f"compute_forward_s and compute_backward_s are the sums over layers. Generated by "
        f"scripts/gen_model_profiles.py; see docs/model_profiles.md."
    )


def profile(model: Model, device_flops: float, seq_len: int) -> dict:
    layers = []
    for index, layer in enumerate(model.layers):
        forward = layer.flops_per_sample * model.batch
        factor = FIRST_LAYER_BACKWARD_FACTOR if index == 0 else BACKWARD_FACTOR
        backward = factor * forward
        layers.append({
            "name": layer.name,
            "forward_flops": forward,
            "backward_flops": backward,
            "forward_s": forward / device_flops,
            "backward_s": backward / device_flops,
            "tensors": [{"name": t.name, "shape": list(t.shape),
                         "bytes": t.elements * DTYPE_BYTES} for t in layer.tensors],
        })
    parameters = sum(t.elements for layer in model.layers for t in layer.tensors)
    return {
        "model": model.name,
        "description": model.description,
        "method": method_paragraph(model, device_flops, seq_len),
        "batch": model.batch,
        "device_flops": device_flops,
        "dtype": "float32",
        "total_parameters": parameters,
        "total_bytes": parameters * DTYPE_BYTES,
        "compute_forward_s": math.fsum(layer["forward_s"] for layer in layers),
        "compute_backward_s": math.fsum(layer["backward_s"] for layer in layers),
        "layers": layers,
    }


def render(doc: dict) -> str:
    """JSON with one layer header and one tensor per line (diff-friendly, still plain JSON)."""
    d = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    lines = ["{"]
    for key, value in doc.items():
        if key != "layers":
            lines.append(f"  {d(key)}: {d(value)},")
    lines.append('  "layers": [')
    for li, layer in enumerate(doc["layers"]):
        head = ", ".join(f"{d(k)}: {d(v)}" for k, v in layer.items() if k != "tensors")
        lines.append(f"    {{{head},")
        lines.append('     "tensors": [')
        for ti, t in enumerate(layer["tensors"]):
            comma = "," if ti + 1 < len(layer["tensors"]) else ""
            lines.append(f"       {d(t)}{comma}")
        comma = "," if li + 1 < len(doc["layers"]) else ""
        lines.append(f"     ]}}{comma}")
    lines.append("  ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == doc  # the custom layout is exactly the document
    return text


def table(docs: list[dict]) -> str:
    rows = [
        "| model | parameters | bytes (float32) | layers | tensors | forward GFLOP/sample "
        "| forward s/iter | backward s/iter |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for doc in docs:
        tensors = sum(len(layer["tensors"]) for layer in doc["layers"])
        per_sample = sum(layer["forward_flops"] for layer in doc["layers"]) / doc["batch"] / 1e9
        rows.append(
            f"| {doc['model']} | {doc['total_parameters']:,} | {doc['total_bytes']:,} "
            f"| {len(doc['layers'])} | {tensors} | {per_sample:.2f} "
            f"| {doc['compute_forward_s']:.4f} | {doc['compute_backward_s']:.4f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="regenerate in memory; exit 1 if any file on disk differs")
    parser.add_argument("--table", action="store_true",
                        help="print the summary table (markdown) instead of writing files")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help=f"output folder (default {DEFAULT_OUT_DIR.relative_to(REPO)})")
    parser.add_argument("--batch", type=int, default=None,
                        help=f"batch per worker for every model (default {DEFAULT_BATCH})")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN,
                        help=f"BERT sequence length (default {DEFAULT_SEQ_LEN})")
    parser.add_argument("--device-flops", type=float, default=DEVICE_FLOPS,
                        help=f"effective device throughput in FLOP/s (default {DEVICE_FLOPS:g})")
    args = parser.parse_args(argv)
    if (args.batch is not None and args.batch < 1) or args.seq_len < 1 or args.device_flops <= 0:
        parser.error("--batch, --seq-len and --device-flops must be positive")

    docs = []
    outputs: dict[Path, str] = {}
    for model in build_models(args.batch, args.seq_len):
        validate(model)
        sanity_check(model)
        doc = profile(model, args.device_flops, args.seq_len)
        docs.append(doc)
        outputs[args.out_dir / f"{model.name}.json"] = render(doc)

    if args.table:
        print(table(docs))
        return 0
    if args.check:
        stale = []
        for path, text in outputs.items():
            try:
                if path.read_text(encoding="utf-8") != text:
                    stale.append((path, "out of date"))
            except FileNotFoundError:
                stale.append((path, "missing"))
        for path, why in stale:
            print(f"{path}: {why} (run python3 scripts/gen_model_profiles.py)", file=sys.stderr)
        if not stale:
            print(f"{len(outputs)} model profiles up to date")
        return 1 if stale else 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
