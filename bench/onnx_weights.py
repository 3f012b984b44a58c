# Moves an ONNX model between machines without its weights: `strip` keeps the graph and the
# small initializers (shapes, indices) and marks the floating ones of more than 64 values as
# random, their data left out; `fill` gives the marked ones random values of their shapes
# again (N(0, 0.02)). Speed does not depend on the weights' values, so a model exported where
# PyTorch is (the GPU machine) can be timed on another machine.
#   python3 bench/onnx_weights.py strip MODEL.onnx SKELETON.onnx
#   python3 bench/onnx_weights.py fill SKELETON.onnx MODEL.onnx
import sys

import numpy as np
import onnx
from onnx import numpy_helper

mode, source, target = sys.argv[1:4]
model = onnx.load(source)
rng = np.random.default_rng(1)
for i, init in enumerate(model.graph.initializer):
    if mode == "strip":
        count = int(np.prod(init.dims)) if len(init.dims) else 1
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and count > 64:
            marked = onnx.TensorProto(name=init.name, dims=init.dims, data_type=init.data_type, doc_string="random")
            model.graph.initializer[i].CopyFrom(marked)
    elif init.doc_string == "random":
        dtype = np.float32 if init.data_type == onnx.TensorProto.FLOAT else np.float16
        values = (rng.standard_normal(tuple(init.dims)) * 0.02).astype(dtype)
        filled = numpy_helper.from_array(values, init.name)
        model.graph.initializer[i].CopyFrom(filled)
onnx.save(model, target)
