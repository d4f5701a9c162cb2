#!/usr/bin/env python3
# Seed inputs for the GGUF fuzzer (tests/fuzz/fuzz_gguf.cpp): a few small valid files written by gguf-py's
# GGUFWriter (PyPI `gguf`), an implementation independent of ours, covering every value type, nested arrays,
# several tensor dtypes and a custom alignment. scripts/run_fuzz.sh later merges what the fuzzer finds into the
# same folder (minimized), so these files may be renamed or dropped there once other inputs cover them.
#
# Regenerate (from the repository root):
#   .venv/bin/python python/make_gguf_fuzz_seeds.py
import os

import gguf
import numpy as np

OUT = "tests/fuzz/fuzz_gguf"
Q = gguf.GGMLQuantizationType


def write(name: str, build) -> None:
    path = os.path.join(OUT, name)
    w = gguf.GGUFWriter(path, arch="llama")
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


def raw_tensor(w: gguf.GGUFWriter, name: str, qtype: Q, rows: int, cols: int, seed: int) -> None:
    """A quantized tensor of `rows` x `cols` elements with random block bytes (valid shape, arbitrary values)."""
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    data = np.random.default_rng(seed).integers(0, 256, size=(rows, cols // block * type_size), dtype=np.uint8)
    w.add_tensor(name, data, raw_dtype=qtype)


def small_model(w: gguf.GGUFWriter) -> None:
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<s>", "</s>", "a", "b", "ab", "\u0120c"])
    w.add_token_types([3, 3, 1, 1, 1, 1])
    w.add_token_merges(["a b", "\u0120 c"])
    w.add_bos_token_id(0)
    w.add_add_bos_token(True)
    w.add_tensor("token_embd.weight", np.arange(6 * 8, dtype=np.float32).reshape(6, 8))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
    raw_tensor(w, "blk.0.attn_q.weight", Q.Q4_1, 4, 32, 1)
    raw_tensor(w, "blk.0.ffn_up.weight", Q.Q8_0, 4, 32, 2)
    raw_tensor(w, "blk.0.ffn_down.weight", Q.Q4_K, 2, 256, 3)


def all_types(w: gguf.GGUFWriter) -> None:
    V = gguf.GGUFValueType
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4294967295)
    w.add_int32("t.i32", -2147483648)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", -2.5e300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo \u4e16\u754c \U0001F389")
    w.add_key_value("t.a.u8", [1, 2, 3], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("t.a.i16", [-1, 2], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("t.a.u64", [2**64 - 1], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("t.a.f64", [0.5, -0.25], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("t.a.f32", [1.0, 2.0])
    w.add_array("t.a.bool", [True, False])
    w.add_array("t.a.str", ["", "x", "\u00e9"])
    w.add_array("t.a.nested", [[1, 2], [3]])
    w.add_array("t.a.deep", [[["a", "b"]], [["c"]]])
    w.add_tensor("i8.4d", np.arange(24, dtype=np.int8).reshape(2, 1, 3, 4))
    w.add_tensor("i32.1d", np.arange(5, dtype=np.int32))


def aligned(w: gguf.GGUFWriter) -> None:
    w.add_custom_alignment(64)
    w.add_name("aligned")
    w.add_tensor("a", np.zeros((3, 5), dtype=np.float32))
    raw_tensor(w, "b", Q.Q4_0, 1, 64, 4)
    w.add_tensor("c", np.arange(7, dtype=np.float64))


def metadata_only(w: gguf.GGUFWriter) -> None:
    w.add_name("no tensors")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    write("seed_small_model.gguf", small_model)
    write("seed_all_types.gguf", all_types)
    write("seed_aligned.gguf", aligned)
    write("seed_metadata_only.gguf", metadata_only)
