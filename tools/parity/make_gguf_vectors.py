"""GGUF files written by gguf-py (llama.cpp's Python package) and their dequantized
values from gguf-py, for tests/test_gguf.c.

Run from the repository root with the tools virtualenv (make tools-venv):
    tools/venv/bin/python tools/parity/make_gguf_vectors.py
Writes tests/data/gguf/:
  types.gguf          -- one tensor of every type difflet dequantizes (F32 F16 BF16 Q8_0
                         Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K), 2-D [3, 512]; legacy quants
                         twice (quantized from random data with gguf.quants.quantize, and
                         random raw blocks "<type>.raw" [2, 64] that reach every bit
                         pattern); K-quants (gguf-py cannot quantize them) as random raw
                         blocks with finite f16 scales; a 1-D and two 3-D tensors; metadata
                         of every value type.
  vectors.safetensors -- for each tensor of types.gguf, gguf.quants.dequantize of its
                         bytes as read back by gguf.GGUFReader: f32, same name, torch order.
  small.gguf          -- a small file (alignment 64, every metadata value type including
                         nested arrays, an F32 and a Q8_0 tensor) that the C test truncates
                         at every length and patches into malformed variants.
  unsupported.gguf    -- IQ2_XS and Q2_K tensors (random raw blocks) beside an F32 one:
                         opens, and reading the first two is refused by name.
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

OUT = os.path.join("tests", "data", "gguf")
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(1234)

# where each type keeps its f16 scale fields inside a block (bytes): random bytes there
# could be NaN or infinity, so they are redrawn as finite f16 values
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def finite_f16_bits(n):
    """Random f16 bit patterns over the whole finite range (subnormals included)."""
    b = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    exp = (b >> 10) & 0x1F
    b = np.where(exp == 0x1F, b & ~np.uint32(0x4000), b)  # exponent 31 -> 15
    return b.astype(np.uint16)


def raw_blocks(qtype, rows, cols):
    """Random but valid blocks for a [rows, cols] tensor of qtype (uint8, byte shape)."""
    blk, size = GGML_QUANT_SIZES[qtype]
    nblk = rows * cols // blk
    b = rng.integers(0, 256, size=(nblk, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        b[:, off:off + 2] = finite_f16_bits(nblk).view(np.uint8).reshape(nblk, 2)
    return b.reshape(rows, cols // blk * size)


def non_nan_bits(n, exp_bits, mant_bits):
    """Random 16-bit float patterns (f16 or bf16) with NaNs turned into infinities."""
    b = rng.integers(0, 1 << 16, size=n, dtype=np.uint32)
    exp_mask = ((1 << exp_bits) - 1) << mant_bits
    nan = ((b & exp_mask) == exp_mask) & ((b & ((1 << mant_bits) - 1)) != 0)
    b = np.where(nan, b & ~np.uint32((1 << mant_bits) - 1), b)
    return b.astype(np.uint16)


def write(path, tensors, meta=None, alignment=None):
    w = GGUFWriter(path, "difflet-test")
    if alignment:
        w.add_custom_alignment(alignment)
    for fn, key, val in meta or []:
        getattr(w, fn)(key, val)
    for name, arr, qtype in tensors:
        if qtype is None:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


META = [
    ("add_string", "general.name", "difflet gguf test"),
    ("add_string", "test.unicode", "Grüße, 世界"),
    ("add_uint8", "test.u8", 200), ("add_int8", "test.i8", -100),
    ("add_uint16", "test.u16", 60000), ("add_int16", "test.i16", -30000),
    ("add_uint32", "test.u32", 4000000000), ("add_int32", "test.i32", -2000000000),
    ("add_float32", "test.f32", 1.5), ("add_bool", "test.bool", True),
    ("add_uint64", "test.u64", 1 << 60), ("add_int64", "test.i64", -(1 << 60)),
    ("add_float64", "test.f64", -2.25),
    ("add_array", "test.ints", [1, 2, 3]),
    ("add_array", "test.strings", ["a", "bc", ""]),
    ("add_array", "test.floats", [0.5, -1.0]),
    ("add_array", "test.nested", [[1, 2], [3], [[4.0], [5.0, 6.0]]]),
    ("add_array", "test.nested_str", [["x", "yz"], ["w"]]),
]


def main():
    tensors = []
    x = rng.standard_normal((3, 512)).astype(np.float32)
    tensors.append(("f32", x, None))
    tensors.append(("f32.1d", rng.standard_normal(37).astype(np.float32), None))
    tensors.append(("f32.3d", rng.standard_normal((2, 3, 5)).astype(np.float32), None))
    tensors.append(("f16", non_nan_bits(3 * 512, 5, 10).view(np.float16).reshape(3, 512), None))
    tensors.append(("bf16", non_nan_bits(3 * 512, 8, 7).view(np.uint8).reshape(3, 1024), T.BF16))
    for q in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        tensors.append((q.name.lower(), quantize(x, q), q))
        tensors.append((q.name.lower() + ".raw", raw_blocks(q, 2, 64), q))
    for q in (T.Q4_K, T.Q5_K, T.Q6_K):
        tensors.append((q.name.lower(), raw_blocks(q, 3, 512), q))
    tensors.append(("q4_k.3d", raw_blocks(T.Q4_K, 4, 256).reshape(2, 2, 144), T.Q4_K))
    write(os.path.join(OUT, "types.gguf"), tensors, META)

    # the reference: gguf-py's own reader and dequantizer on the file just written
    ref = {}
    for t in GGUFReader(os.path.join(OUT, "types.gguf")).tensors:
        ref[t.name] = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    want_shapes = {"f32": (3, 512), "f32.1d": (37,), "f32.3d": (2, 3, 5), "q4_k.3d": (2, 2, 256)}
    for name, shape in want_shapes.items():
        assert ref[name].shape == shape, (name, ref[name].shape)
    save_file(ref, os.path.join(OUT, "vectors.safetensors"), metadata={"source": "gguf-py dequantize"})

    write(os.path.join(OUT, "small.gguf"),
          [("t.a", np.arange(6, dtype=np.float32).reshape(2, 3), None),
           ("t.b", quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), T.Q8_0), T.Q8_0)],
          META, alignment=64)

    write(os.path.join(OUT, "unsupported.gguf"),
          [("iq2_xs", rng.integers(0, 256, size=(1, GGML_QUANT_SIZES[T.IQ2_XS][1]), dtype=np.uint8), T.IQ2_XS),
           ("q2_k", rng.integers(0, 256, size=(1, GGML_QUANT_SIZES[T.Q2_K][1]), dtype=np.uint8), T.Q2_K),
           ("ok", np.ones(4, dtype=np.float32), None)])
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))


if __name__ == "__main__":
    main()
