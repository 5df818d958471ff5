"""An ONNX classifier as a torch module, so ONNX takes the PyTorch route (one route, one Python).

onnx2torch would do this, but it imports torchvision at import time, and no torchvision wheel
on PyPI runs beside the CPU build of torch 2.13.0 the converter pins. Image classifiers use a
small, well-defined set of ONNX operators; each is written below as the torch function with the
same semantics (operator docs: onnx.ai/onnx/operators). Anything else is refused by name, never
approximated. The module runs the nodes in graph order, so `torch.export` traces it into the same
aten graph a hand-written model gives.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from converter.quantize import QuantizeError


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _pads(pads, rank: int):
    """ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end] -> F.pad order (last dim first)."""
    begins, ends = pads[:rank], pads[rank:]
    out = []
    for b, e in zip(reversed(begins), reversed(ends)):
        out += [int(b), int(e)]
    return out


def _conv(t, x, w, b=None, *, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1, auto_pad="NOTSET",
          **_):
    import torch.nn.functional as F

    if auto_pad not in ("NOTSET", b"NOTSET"):
        raise QuantizeError(f"Conv auto_pad={auto_pad!r} is not supported here: export with explicit pads")
    begins, ends = pads[:2], pads[2:]
    if list(begins) == list(ends):
        return F.conv2d(x, w, b, tuple(strides), tuple(int(p) for p in begins), tuple(dilations), group)
    return F.conv2d(F.pad(x, _pads(pads, 2)), w, b, tuple(strides), 0, tuple(dilations), group)


def _pool(kind):
    def pool(t, x, *, kernel_shape, strides=None, pads=(0, 0, 0, 0), ceil_mode=0, count_include_pad=0, **_):
        import torch.nn.functional as F

        strides = tuple(strides or kernel_shape)
        begins, ends = list(pads[:2]), list(pads[2:])
        if begins != ends:
            raise QuantizeError(f"{kind} with asymmetric pads {list(pads)} is not supported")
        if kind == "MaxPool":
            return F.max_pool2d(x, tuple(kernel_shape), strides, tuple(begins), ceil_mode=bool(ceil_mode))
        return F.avg_pool2d(x, tuple(kernel_shape), strides, tuple(begins), ceil_mode=bool(ceil_mode),
                            count_include_pad=bool(count_include_pad))
    return pool


def _gemm(t, a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, **_):
    a = a.t() if transA else a
    b = b.t() if transB else b
    y = alpha * (a @ b) if alpha != 1.0 else a @ b
    if c is not None:
        y = y + (beta * c if beta != 1.0 else c)
    return y


def _batch_norm(t, x, scale, bias, mean, var, *, epsilon=1e-5, **_):
    import torch.nn.functional as F

    return F.batch_norm(x, mean, var, scale, bias, training=False, eps=epsilon)


def _clip(t, x, lo=None, hi=None, *, min=None, max=None, **_):  # noqa: A002 - ONNX attribute names (opset < 11)
    lo = min if lo is None else float(lo)
    hi = max if hi is None else float(hi)
    return t.clamp(x, lo, hi)


def _reduce_mean(t, x, axes=None, *, keepdims=1, **attrs):
    axes = attrs.get("axes", axes)
    axes = [int(a) for a in (axes.tolist() if hasattr(axes, "tolist") else axes)]
    return t.mean(x, dim=axes, keepdim=bool(keepdims))


def _reshape(t, x, shape, **_):
    shape = [int(s) for s in shape.tolist()]
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]  # 0 copies the input's dimension
    return t.reshape(x, shape)


def _flatten(t, x, *, axis=1, **_):
    return t.flatten(x, axis) if axis == 1 else t.reshape(x, (int(np.prod(x.shape[:axis])), -1))


def _squeeze(t, x, axes=None, **attrs):
    axes = attrs.get("axes", axes)
    if axes is None:
        return t.squeeze(x)
    for a in sorted((int(a) % x.dim() for a in (axes.tolist() if hasattr(axes, "tolist") else axes)), reverse=True):
        x = t.squeeze(x, a)
    return x


def _softmax(t, x, *, axis=-1, **_):
    return t.softmax(x, axis)


def _hard_sigmoid(t, x, *, alpha=0.2, beta=0.5, **_):
    return t.clamp(alpha * x + beta, 0.0, 1.0)


def _concat(t, *xs, axis, **_):
    return t.cat(xs, axis)


def _pad(t, x, pads, value=None, axes=None, *, mode="constant", **_):
    import torch.nn.functional as F

    if mode not in ("constant", b"constant"):
        raise QuantizeError(f"Pad mode {mode!r} is not supported (constant only)")
    return F.pad(x, _pads([int(p) for p in pads.tolist()], x.dim()), value=0.0 if value is None else float(value))


def _ops(t):
    import torch.nn.functional as F

    return {
        "Conv": _conv, "BatchNormalization": _batch_norm, "Gemm": _gemm, "MatMul": lambda t, a, b, **_: a @ b,
        "Relu": lambda t, x, **_: F.relu(x), "Clip": _clip, "Sigmoid": lambda t, x, **_: t.sigmoid(x),
        "HardSigmoid": _hard_sigmoid, "HardSwish": lambda t, x, **_: F.hardswish(x),
        "LeakyRelu": lambda t, x, alpha=0.01, **_: F.leaky_relu(x, alpha),
        "Add": lambda t, a, b, **_: a + b, "Sub": lambda t, a, b, **_: a - b,
        "Mul": lambda t, a, b, **_: a * b, "Div": lambda t, a, b, **_: a / b,
        "GlobalAveragePool": lambda t, x, **_: t.mean(x, dim=(2, 3), keepdim=True),
        "GlobalMaxPool": lambda t, x, **_: t.amax(x, dim=(2, 3), keepdim=True),
        "MaxPool": _pool("MaxPool"), "AveragePool": _pool("AveragePool"),
        "ReduceMean": _reduce_mean, "Flatten": _flatten, "Reshape": _reshape, "Squeeze": _squeeze,
        "Softmax": _softmax, "Concat": _concat, "Pad": _pad, "Identity": lambda t, x, **_: x,
        "Dropout": lambda t, x, *rest, **_: x,
    }


SUPPORTED = tuple(sorted(_ops(None)))


def module_from_onnx(path: Path):
    """Load path and return a torch.nn.Module computing its single output from its single image input."""
    import onnx
    import torch
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path))
    except Exception as e:  # noqa: BLE001 - protobuf decode errors have several types
        raise QuantizeError(f"{path} is not a readable ONNX model: {e}") from None
    graph = model.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    nodes = []
    for node in graph.node:
        if node.op_type == "Constant":
            (attr,) = node.attribute
            constants[node.output[0]] = numpy_helper.to_array(attr.t) if attr.name == "value" else np.asarray(
                onnx.helper.get_attribute_value(attr))
        else:
            nodes.append(node)
    ops = _ops(torch)
    unknown = sorted({n.op_type for n in nodes if n.op_type not in ops or n.domain not in ("", "ai.onnx")})
    if unknown:
        raise QuantizeError(f"{path} uses ONNX operators this converter does not take: {', '.join(unknown)} "
                            f"(supported: {', '.join(SUPPORTED)}); export the PyTorch model as .pt2 instead")
    inputs = [i.name for i in graph.input if i.name not in constants]
    if len(inputs) != 1 or len(graph.output) != 1:
        raise QuantizeError(f"{path}: expected one image input and one output, got inputs {inputs} and "
                            f"{len(graph.output)} outputs")
    # integer constants (shapes, axes, pads) stay numpy; float ones become buffers of the module
    shape_like = {name for n in nodes for i, name in enumerate(n.input)
                  if (n.op_type, i) in {("Reshape", 1), ("ReduceMean", 1), ("Squeeze", 1), ("Pad", 1), ("Pad", 2),
                                         ("Pad", 3), ("Clip", 1), ("Clip", 2)}}

    class OnnxModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = {}
            for i, (name, value) in enumerate(constants.items()):
                if name in shape_like or value.dtype.kind not in "f":
                    continue
                self.register_buffer(f"c{i}", torch.from_numpy(np.array(value, np.float32)))
                self.names[name] = f"c{i}"

        def forward(self, x):
            values = {inputs[0]: x}
            for node in nodes:
                args = []
                for name in node.input:
                    if not name:
                        args.append(None)
                    elif name in values:
                        args.append(values[name])
                    elif name in self.names:
                        args.append(getattr(self, self.names[name]))
                    else:
                        args.append(constants[name])
                out = ops[node.op_type](torch, *args, **_attrs(node))
                values[node.output[0]] = out
            return values[graph.output[0].name]

    return OnnxModule().eval()
