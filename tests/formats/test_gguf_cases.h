// Malformed GGUF files for the reader tests (tests/formats) and the CLI tests (tests/tools): a small valid file made
// by our writer, the byte offset of each of its fields, and named mutations of it, each with the substring its error
// message must contain.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formats/gguf.h"

namespace tessera::test::gguf_cases {

using Bytes = std::vector<uint8_t>;

// The valid file every case starts from. Keys test.aaa/test.bbb and tensors t.a/t.b have equal lengths so that one
// can be renamed into the other in place.
inline Bytes base_file() {
  namespace g = tessera::gguf;
  g::Writer w;
  w.set("general.architecture", g::Value::from_string("llama"));
  w.set("general.alignment", g::Value::from_u32(32));
  w.set("test.aaa", g::Value::from_u32(7));
  w.set("test.bbb", g::Value::from_i32(-1));
  w.set("test.flag", g::Value::from_bool(true));
  w.set("test.strs", g::Value::from_strings({"x", "yz"}));
  w.set("test.nums", g::Value::from_f32s({1.0f, 2.0f, 3.0f}));
  uint8_t u8s[2] = {1, 2};
  // Arrays nested exactly as deep as the reader allows: [[[[1, 2]]]].
  g::Value nest = g::Value::from_array(g::ValueType::UINT8, u8s, 2);
  for (int d = 1; d < g::kMaxArrayDepth; ++d) nest = g::Value::array_of_arrays({nest});
  w.set("test.nest", nest);
  std::vector<uint8_t> a(4 * 8 * 4), b(2 * 2 * 20), c(16);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + 5);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(200 - i);
  w.add_tensor("t.a", DType::F32, {4, 8}, a.data(), a.size());    // 128 bytes at data offset 0
  w.add_tensor("t.b", DType::Q4_1, {2, 64}, b.data(), b.size());  // 80 bytes at 128
  w.add_tensor("t.c", DType::I8, {16}, c.data(), c.size());       // 16 bytes at 224
  return w.to_bytes();
}

// Byte offsets of the base file's fields, found by walking it (it is valid, so the walk needs no checks).
struct Layout {
  struct Kv {
    size_t key_len, key, type, value;
    std::vector<size_t> array_elem_types;  // offset of each (nested) array's element type field, outermost first
  };
  struct TensorInfo {
    size_t name_len, name, n_dims, ne, type, offset;
  };
  std::vector<Kv> kvs;
  std::vector<TensorInfo> tensors;
  size_t data_offset = 0;
  size_t data_end = 0;  // end of the last tensor's bytes (the writer pads after it)
};

inline uint64_t get_u64(const Bytes& b, size_t off) {
  uint64_t v;
  std::memcpy(&v, b.data() + off, 8);
  return v;
}
inline uint32_t get_u32(const Bytes& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
inline Bytes with_u64(Bytes b, size_t off, uint64_t v) {
  std::memcpy(b.data() + off, &v, 8);
  return b;
}
inline Bytes with_u32(Bytes b, size_t off, uint32_t v) {
  std::memcpy(b.data() + off, &v, 4);
  return b;
}
inline Bytes with_u8(Bytes b, size_t off, uint8_t v) {
  b[off] = v;
  return b;
}

inline size_t skip_value(const Bytes& b, size_t pos, uint32_t type, Layout::Kv& kv) {
  using VT = tessera::gguf::ValueType;
  auto t = static_cast<VT>(type);
  if (t == VT::STRING) return pos + 8 + get_u64(b, pos);
  if (t != VT::ARRAY) return pos + tessera::gguf::value_type_size(t);
  kv.array_elem_types.push_back(pos);
  uint32_t elem = get_u32(b, pos);
  uint64_t n = get_u64(b, pos + 4);
  pos += 12;
  // An element of an array of arrays is itself an element type + count + elements (no value type field).
  for (uint64_t i = 0; i < n; ++i) pos = skip_value(b, pos, elem, kv);
  return pos;
}

inline Layout layout_of(const Bytes& b) {
  Layout l;
  uint64_t n_tensors = get_u64(b, 8), n_kv = get_u64(b, 16);
  size_t pos = 24;
  for (uint64_t i = 0; i < n_kv; ++i) {
    Layout::Kv kv{};
    kv.key_len = pos;
    kv.key = pos + 8;
    pos += 8 + get_u64(b, pos);
    kv.type = pos;
    kv.value = pos + 4;
    pos = skip_value(b, pos + 4, get_u32(b, pos), kv);
    l.kvs.push_back(kv);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    Layout::TensorInfo t{};
    t.name_len = pos;
    t.name = pos + 8;
    pos += 8 + get_u64(b, pos);
    t.n_dims = pos;
    t.ne = pos + 4;
    pos += 4 + 8 * get_u32(b, pos);
    t.type = pos;
    t.offset = pos + 4;
    pos += 12;
    l.tensors.push_back(t);
  }
  l.data_offset = (pos + 31) / 32 * 32;
  l.data_end = l.data_offset + 224 + 16;  // t.c: 16 bytes at data offset 224 (see base_file)
  return l;
}

struct Case {
  std::string name;  // also the file name in the CLI test
  Bytes bytes;
  std::string expect;  // substring of the error message
};

// Every named malformed case (truncations at every offset are generated separately by the tests).
inline std::vector<Case> malformed_cases() {
  const Bytes base = base_file();
  const Layout l = layout_of(base);
  const auto& kv = l.kvs;
  const auto& ti = l.tensors;
  // kv indices in base_file(): 0 architecture, 1 alignment, 2 test.aaa, 3 test.bbb, 4 flag, 5 strs, 6 nums, 7 nest.
  // tensor indices: 0 t.a (f32 {4, 8}), 1 t.b (q4_1 {2, 64}), 2 t.c (i8 {16}).
  std::vector<Case> c;
  c.push_back({"empty_file", {}, "not a GGUF file"});
  c.push_back({"bad_magic", with_u8(base, 0, 'X'), "not a GGUF file (bad magic"});
  c.push_back({"version_0", with_u32(base, 4, 0), "unsupported GGUF version 0"});
  c.push_back({"version_1", with_u32(base, 4, 1), "GGUF version 1 is not supported"});
  c.push_back({"version_4", with_u32(base, 4, 4), "unsupported GGUF version 4"});
  c.push_back({"big_endian", with_u32(base, 4, 0x03000000), "big-endian"});
  c.push_back({"huge_tensor_count", with_u64(base, 8, uint64_t{1} << 40), "tensor count 1099511627776 cannot fit"});
  c.push_back({"huge_kv_count", with_u64(base, 16, UINT64_MAX), "metadata count 18446744073709551615 cannot fit"});
  c.push_back({"huge_key_length", with_u64(base, kv[0].key_len, uint64_t{1} << 62), "key length 4611686018427387904"});
  c.push_back({"huge_string_length", with_u64(base, kv[0].value, uint64_t{1} << 40), "string length 1099511627776"});
  c.push_back({"huge_array_length", with_u64(base, kv[5].value + 4, uint64_t{1} << 61),
               "array of 2305843009213693952 string elements"});
  c.push_back({"huge_nested_array_length", with_u64(base, kv[7].array_elem_types[2] + 4, UINT64_MAX / 2),
               "array of 9223372036854775807 array elements"});
  c.push_back({"unknown_value_type", with_u32(base, kv[2].type, 13), "unknown value type 13"});
  c.push_back({"unknown_array_elem_type", with_u32(base, kv[6].value, 99), "unknown array element type 99"});
  c.push_back({"too_deep_nesting", with_u32(base, kv[7].array_elem_types.back(), 9), "nested deeper than 4"});
  c.push_back({"invalid_bool", with_u8(base, kv[4].value, 2), "invalid bool value 2"});
  c.push_back({"empty_key", with_u64(base, kv[2].key_len, 0), "empty key"});
  c.push_back({"non_utf8_key", with_u8(base, kv[2].key + 5, 0xFF), "key is not valid UTF-8"});
  c.push_back({"overlong_utf8_key", with_u8(with_u8(base, kv[2].key + 5, 0xC0), kv[2].key + 6, 0x80),
               "key is not valid UTF-8"});
  {
    Bytes b = base;
    std::memcpy(b.data() + kv[3].key, "test.aaa", 8);
    c.push_back({"duplicate_key", b, "metadata key 'test.aaa': duplicate metadata key"});
  }
  c.push_back({"alignment_0", with_u32(base, kv[1].value, 0), "general.alignment 0 is not a nonzero power of two"});
  c.push_back({"alignment_3", with_u32(base, kv[1].value, 3), "general.alignment 3 is not a nonzero power of two"});
  c.push_back({"alignment_wrong_type", with_u32(base, kv[1].type, 5), "general.alignment has type int32"});
  c.push_back({"n_dims_0", with_u32(base, ti[0].n_dims, 0), "tensor 't.a': has 0 dimensions"});
  c.push_back({"n_dims_9", with_u32(base, ti[0].n_dims, 9), "tensor 't.a': has 9 dimensions"});
  c.push_back({"dim_zero", with_u64(base, ti[0].ne + 8, 0), "dimension 1 (innermost first) is 0"});
  c.push_back({"dim_negative", with_u64(base, ti[0].ne, static_cast<uint64_t>(-32)),
               "dimension 0 (innermost first) is negative (-32)"});
  c.push_back({"numel_overflow", with_u64(with_u64(base, ti[0].ne, uint64_t{1} << 32), ti[0].ne + 8, uint64_t{1} << 40),
               "element count of the shape overflows int64"});
  c.push_back({"bytes_overflow", with_u64(with_u64(base, ti[0].ne, uint64_t{1} << 61), ti[0].ne + 8, 2),
               "byte size of the shape overflows uint64"});
  c.push_back({"unknown_dtype_4", with_u32(base, ti[0].type, 4), "unknown ggml type id 4"});
  c.push_back({"unknown_dtype_1000", with_u32(base, ti[0].type, 1000), "unknown ggml type id 1000"});
  c.push_back({"not_block_multiple", with_u64(base, ti[1].ne, 48),
               "innermost dimension 48 is not a multiple of the q4_1 block size 32"});
  c.push_back({"misaligned_offset", with_u64(base, ti[1].offset, get_u64(base, ti[1].offset) + 4),
               "data offset 132 is not a multiple of the alignment 32"});
  c.push_back({"tensor_out_of_file", with_u64(base, ti[1].offset, uint64_t{1} << 20),
               "tensor 't.b': data (80 bytes at data offset 1048576) extends past the end of the file"});
  c.push_back({"tensor_offset_overflow", with_u64(base, ti[1].offset, UINT64_MAX - 31),
               "tensor 't.b': data (80 bytes at data offset 18446744073709551584) extends past the end"});
  c.push_back({"tensor_same_offset", with_u64(base, ti[1].offset, 0), "data overlaps tensor"});
  c.push_back({"tensor_partial_overlap", with_u64(base, ti[1].offset, 96), "tensor 't.b': data overlaps tensor 't.a'"});
  {
    Bytes b = base;
    b[ti[1].name + 2] = 'a';
    c.push_back({"duplicate_tensor_name", b, "tensor 't.a': duplicate tensor name"});
  }
  c.push_back({"empty_tensor_name", with_u64(base, ti[1].name_len, 0), "tensor info 1: empty tensor name"});
  c.push_back({"huge_tensor_name_length", with_u64(base, ti[1].name_len, uint64_t{1} << 50),
               "tensor info 1: tensor name length 1125899906842624"});
  c.push_back({"non_utf8_tensor_name", with_u8(base, ti[2].name + 1, 0x80), "name is not valid UTF-8"});
  c.push_back({"truncated_in_data", Bytes(base.begin(), base.begin() + static_cast<long>(l.data_end) - 3),
               "tensor 't.c': data (16 bytes at data offset 224) extends past the end of the file"});
  c.push_back({"truncated_in_header", Bytes(base.begin(), base.begin() + 10), "file truncated: tensor count"});
  return c;
}

}  // namespace tessera::test::gguf_cases
