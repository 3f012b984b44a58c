# Writes the generated seed inputs of the fuzz corpora (the safetensors seeds also include
# four small conformance cases copied from tests/data/conformance). Run from tests/fuzz/.
import gzip, json, struct


def safetensors(tensors, metadata=None):
    header, data = {}, b''
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    return struct.pack('<Q', len(h)) + h + data


def idx(code, dims, raw):  # magic 0 0 type ndims, then big-endian dims and data
    return bytes([0, 0, code, len(dims)]) + b''.join(struct.pack('>I', d) for d in dims) + raw


def write(path, data):
    with open(path, 'wb') as f:
        f.write(data)


write('corpus/safetensors/dtypes.safetensors', safetensors({
    "a": ("BF16", [2, 2], struct.pack('<4H', 0x3f80, 0x4000, 0xbf80, 0x0000)),
    "b": ("I64", [3], struct.pack('<3q', 1, -2, 3)),
    "c": ("BOOL", [2], bytes([1, 0])),
    "d": ("F16", [0, 4], b''),
    "e": ("U8", [], bytes([7])),
    "f": ("F64", [1, 1, 2], struct.pack('<2d', 0.5, -1.5)),
    "g": ("I32", [2], struct.pack('<2i', 5, -6)),
}, {"format": "pt", "note": "seed"}))
write('corpus/safetensors/empty.safetensors', safetensors({}))
checkpoint = {"format": "normcore-classifier", "model": "mlp", "epoch": "3", "option.mean": "0.286",
              "option.std": "0.353"}
write('corpus/checkpoint/metadata_only.safetensors', safetensors({}, checkpoint))
write('corpus/checkpoint/one_tensor.safetensors',
      safetensors({"model.1.weight": ("F32", [2, 2], struct.pack('<4f', 1, 2, 3, 4))},
                  {"format": "normcore-classifier", "model": "mlp-layernorm", "epoch": "1"}))
write('corpus/checkpoint/wrong_format.safetensors', safetensors({"x": ("F32", [1], struct.pack('<f', 1))}, {"format": "pt"}))
write('corpus/idx/images_u8.idx', idx(0x08, [2, 3, 3], bytes(range(18))))
write('corpus/idx/labels_u8.idx', idx(0x08, [4], bytes([0, 9, 3, 1])))
write('corpus/idx/images_u8.idx.gz', gzip.compress(idx(0x08, [2, 2, 2], bytes(range(8))), mtime=0))
write('corpus/idx/i32.idx', idx(0x0C, [3], struct.pack('>3i', 1, -2, 70000)))
write('corpus/idx/f64.idx', idx(0x0E, [2, 1], struct.pack('>2d', 0.25, -8.0)))
write('corpus/idx/f32.idx.gz', gzip.compress(idx(0x0D, [2], struct.pack('>2f', 1.5, 2.5)), mtime=0))
write('corpus/idx/i16.idx', idx(0x0B, [2], struct.pack('>2h', -3, 4)))
write('corpus/idx/i8.idx', idx(0x09, [2], struct.pack('>2b', -3, 4)))


def store_request(command, key, value=b''):  # u8 command, u32 key length, key, u32 value length, value
    return bytes([command]) + struct.pack('<I', len(key)) + key + struct.pack('<I', len(value)) + value


SET, GET, ADD, REMOVE = 1, 2, 3, 4
write('corpus/store/set_get.bin', store_request(SET, b'pg/0/1/0', bytes(range(40))) + store_request(GET, b'pg/0/1/0'))
write('corpus/store/barrier.bin', store_request(ADD, b'barrier/step/0', struct.pack('<q', 1)) +
      store_request(SET, b'barrier/step/0/done', b'1') + store_request(GET, b'barrier/step/0/done') +
      store_request(REMOVE, b'barrier/step/0'))
write('corpus/store/partial.bin', store_request(SET, b'pg/nccl-id', bytes(128)) + store_request(GET, b'pg/nccl-id')[:7])
write('corpus/store/absent_and_negative.bin', store_request(GET, b'never') + store_request(ADD, b'c', struct.pack('<q', -5)) +
      store_request(ADD, b'c', struct.pack('<q', 2**63 - 1)))


def gpt(vocab, context, layers, heads, embed, norm='layernorm', bias=True, optimizer=False):
    """A normcore GPT checkpoint (models/gpt.cpp's layout) with small f32 weights."""
    tensors = {}

    def f32(name, *shape):
        n = 1
        for d in shape:
            n *= d
        tensors[name] = ("F32", list(shape), struct.pack('<%df' % n, *[(i % 7 - 3) * 0.01 for i in range(n)]))

    def layer_norm(prefix):
        f32(prefix + '.weight', embed)
        if norm == 'layernorm' and bias:
            f32(prefix + '.bias', embed)

    def linear(prefix, out, inp):
        f32(prefix + '.weight', out, inp)
        if bias:
            f32(prefix + '.bias', out)

    f32('model.tok_emb.weight', vocab, embed)
    f32('model.pos_emb.weight', context, embed)
    for i in range(layers):
        b = 'model.blocks.%d.' % i
        layer_norm(b + 'norm1')
        linear(b + 'attn.qkv', 3 * embed, embed)
        linear(b + 'attn.proj', embed, embed)
        layer_norm(b + 'norm2')
        linear(b + 'mlp.fc', 4 * embed, embed)
        linear(b + 'mlp.proj', embed, 4 * embed)
    layer_norm('model.norm_f')
    if optimizer:
        f32('optim.step', 1)
        f32('schedule.last', 1)
    return safetensors(tensors, {"format": "normcore-gpt", "step": "3", "config.vocab_size": str(vocab),
                                 "config.context": str(context), "config.layers": str(layers),
                                 "config.heads": str(heads), "config.embed": str(embed), "config.dropout": "0",
                                 "config.norm": norm, "config.bias": "1" if bias else "0", "option.lr": "0.001"})


write('corpus/gpt_checkpoint/layernorm.safetensors', gpt(3, 4, 1, 2, 4))
write('corpus/gpt_checkpoint/rmsnorm_no_bias.safetensors', gpt(2, 3, 2, 1, 2, 'rmsnorm', False, optimizer=True))
write('corpus/gpt_checkpoint/layernorm_no_bias.safetensors', gpt(2, 2, 1, 2, 2, 'layernorm', False))


def token_shard(tokens, magic=20240520, version=1, count=None, choices=(0, 0, 0)):
    """An llm.c token shard; choices are the u16 at header byte 12 and bytes 14 and 15, which
    the fuzz target reads as the vocabulary, context and stride."""
    vocab_cut, context, stride = choices
    header = struct.pack('<3iHBB', magic, version, len(tokens) if count is None else count, vocab_cut, context, stride)
    return header + bytes(1024 - len(header)) + struct.pack('<%dH' % len(tokens), *tokens)


gpt2_ids = [15496, 11, 995, 0, 50256, 464, 2068, 7586, 21831, 18045, 625, 262]
write('corpus/token_shard/gpt2.bin', token_shard(gpt2_ids, choices=(65536 - 50257, 3, 3)))
write('corpus/token_shard/every_window.bin', token_shard(list(range(20)), choices=(65536 - 20, 4, 0)))
write('corpus/token_shard/empty.bin', token_shard([]))
write('corpus/token_shard/past_vocabulary.bin', token_shard([1, 2, 50300], choices=(65536 - 50257, 0, 0)))
write('corpus/token_shard/bad_magic.bin', token_shard([1, 2], magic=20240522))
write('corpus/token_shard/version_2.bin', token_shard([1, 2], version=2))
write('corpus/token_shard/truncated.bin', token_shard([1, 2, 3])[:-1])
write('corpus/token_shard/trailing.bin', token_shard([1, 2, 3]) + b'\0')
write('corpus/token_shard/huge_count.bin', token_shard([1, 2], count=2**31 - 1))


def byte_alphabet():
    """GPT-2's bytes_to_unicode: byte -> the character that spells it in a vocabulary file."""
    printable = list(range(ord('!'), ord('~') + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 256
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(extra)
            extra += 1
    return chars


def bpe_vocab(extra):
    vocab = {c: b for b, c in byte_alphabet().items()}
    for i, token in enumerate(extra):
        vocab[token] = 256 + i
    return vocab


def bpe_seed(vocab, merges):  # the fuzz target's input: vocab.json, a NUL, merges.txt
    return json.dumps(vocab, ensure_ascii=False).encode() + b'\0' + merges.encode()


small = bpe_vocab(['ab', '\u0120x', '\u0120xy', '<|endoftext|>'])
write('corpus/bpe/small.bin', bpe_seed(small, '#version: 0.2\na b\n\u0120 x\n\u0120x y\n'))
write('corpus/bpe/no_version_line.bin', bpe_seed(small, 'a b\n\u0120 x'))
write('corpus/bpe/unknown_token.bin', bpe_seed(small, 'a b\nab q\n'))
write('corpus/bpe/one_token_line.bin', bpe_seed(small, 'a b\nab\n'))
write('corpus/bpe/missing_byte.bin', bpe_seed({k: v for k, v in small.items() if k != 'A'}, ''))
write('corpus/bpe/malformed.bin', b'{"a": 0,\n"b" 1}\0a b\n')
write('corpus/bpe/tokenizer.json', json.dumps({
    "added_tokens": [{"id": 259, "content": "<|endoftext|>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": small,
              "merges": ["a b", ["\u0120", "x"], "\u0120x y"]}}, ensure_ascii=False).encode())

# read_color_image: binary and plain color and gray maps, 16-bit samples, a header claiming
# more pixels than follow, and a PNG (the Fashion-MNIST test image).
write('corpus/color_image/rgb.ppm', b'P6\n# comment\n2 2 255\n' + bytes(range(12)))
write('corpus/color_image/plain.ppm', b'P3 2 1 15\n15 0 0 0 7 15\n')
write('corpus/color_image/gray16.pgm', b'P5 1 2 65535\n' + struct.pack('>2H', 0, 65535))
write('corpus/color_image/plain.pgm', b'P2 3 1 9 0 4 9\n')
write('corpus/color_image/short.ppm', b'P6 100 100 255\n' + bytes(30))
with open('../data/images/t10k-4-shirt.png', 'rb') as f:
    write('corpus/color_image/shirt.png', f.read())

# onnx_model and onnx_tensor: protobuf written by hand (varints and length-delimited fields), a
# valid model and tensor and the defects the importer must refuse before allocating: a
# truncated file, an initializer whose dims claim far more than its bytes, dims that overflow
# 64 bits, negative dims, a cycle, an unknown op, an opset past 17, another element type.
def varint(v):
    v &= (1 << 64) - 1
    out = b''
    while True:
        byte = v & 0x7f
        v >>= 7
        if v:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field(number, value):  # an int (varint) or bytes (length-delimited)
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def tensor_proto(name, dims, elem_type=1, raw=None, floats=None):  # TensorProto: dims 1, data_type 2, float_data 4, name 8, raw_data 9
    out = b''.join(field(1, d) for d in dims) + field(2, elem_type) + field(8, name.encode())
    if floats is not None:
        out += field(4, b''.join(struct.pack('<f', v) for v in floats))
    if raw is not None:
        out += field(9, raw)
    return out


def value_info(name, dims, elem_type=1):  # ValueInfoProto: name 1, type 2 (tensor_type 1: elem_type 1, shape 2 (dim 1: dim_value 1))
    shape = b''.join(field(1, field(1, d)) for d in dims)
    return field(1, name.encode()) + field(2, field(1, field(1, elem_type) + field(2, shape)))


def node(op, inputs, outputs):  # NodeProto: input 1, output 2, op_type 4
    return b''.join(field(1, i.encode()) for i in inputs) + b''.join(field(2, o.encode()) for o in outputs) + \
        field(4, op.encode())


def model(nodes, inputs, outputs, initializers=(), opset=13):  # ModelProto: ir_version 1, graph 7, opset_import 8
    graph = b''.join(field(1, n) for n in nodes) + field(2, b'g') + b''.join(field(5, t) for t in initializers) + \
        b''.join(field(11, v) for v in inputs) + b''.join(field(12, v) for v in outputs)
    return field(1, 8) + field(7, graph) + field(8, field(2, opset))


add = model([node('Add', ['x', 'w'], ['y'])], [value_info('x', [2, 2])], [value_info('y', [2, 2])],
            [tensor_proto('w', [2, 2], raw=struct.pack('<4f', 1, 2, 3, 4))])
write('corpus/onnx_model/add.onnx', add)
write('corpus/onnx_model/truncated.onnx', add[:len(add) // 2])
write('corpus/onnx_model/initializer_claims_more.onnx', model(
    [node('Add', ['x', 'w'], ['y'])], [value_info('x', [2, 2])], [value_info('y', [2, 2])],
    [tensor_proto('w', [1 << 30, 1 << 30], raw=struct.pack('<f', 1))]))
write('corpus/onnx_model/dims_overflow.onnx', model(
    [node('Add', ['x', 'w'], ['y'])], [value_info('x', [2, 2])], [value_info('y', [2, 2])],
    [tensor_proto('w', [1 << 62, 1 << 62, 16], floats=[1.0])]))
write('corpus/onnx_model/negative_dims.onnx', model(
    [node('Add', ['x', 'w'], ['y'])], [value_info('x', [2, 2])], [value_info('y', [2, 2])],
    [tensor_proto('w', [-1, 2], floats=[1.0, 2.0])]))
write('corpus/onnx_model/cycle.onnx', model(
    [node('Relu', ['b'], ['a']), node('Relu', ['a'], ['b'])], [value_info('x', [1])], [value_info('b', [1])]))
write('corpus/onnx_model/unknown_op.onnx', model(
    [node('NoSuchOp', ['x'], ['y'])], [value_info('x', [1])], [value_info('y', [1])]))
write('corpus/onnx_model/opset_99.onnx', model(
    [node('Relu', ['x'], ['y'])], [value_info('x', [1])], [value_info('y', [1])], opset=99))
write('corpus/onnx_model/string_input.onnx', model(
    [node('Identity', ['x'], ['y'])], [value_info('x', [1], elem_type=8)], [value_info('y', [1], elem_type=8)]))
write('corpus/onnx_tensor/f32.pb', tensor_proto('t', [2, 3], raw=struct.pack('<6f', *range(6))))
write('corpus/onnx_tensor/float_data.pb', tensor_proto('t', [3], floats=[0.5, -1.0, 2.0]))
write('corpus/onnx_tensor/i64.pb', tensor_proto('t', [2], elem_type=7, raw=struct.pack('<2q', -5, 7)))
write('corpus/onnx_tensor/truncated.pb', tensor_proto('t', [2, 3], raw=struct.pack('<6f', *range(6)))[:20])
write('corpus/onnx_tensor/claims_more.pb', tensor_proto('t', [1 << 31, 1 << 31], raw=bytes(8)))
write('corpus/onnx_tensor/dims_overflow.pb', tensor_proto('t', [1 << 62, 8], floats=[1.0]))
write('corpus/onnx_tensor/undefined_type.pb', tensor_proto('t', [1], elem_type=0, raw=bytes(4)))
