// The GGUF reader against gguf-py on the default model: every metadata key (type, value, every array element via a
// hash) and the whole tensor table. Golden data: tests/data/gguf/smollm2_q4_1_golden.json, made by
// `.venv/bin/python python/make_gguf_golden.py`.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "test_util.h"

namespace {

using tessera::gguf::File;
using tessera::gguf::Value;
using tessera::gguf::ValueType;
using json = nlohmann::json;

// FNV-1a 64, as python/make_gguf_golden.py computes it.
struct Fnv {
  uint64_t h = 0xCBF29CE484222325ull;
  void add(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  }
  void add_u64(uint64_t v) { add(&v, 8); }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

json load_golden() {
  std::ifstream in(tessera::test::data_path("gguf/smollm2_q4_1_golden.json"));
  EXPECT_TRUE(in.good()) << "missing golden file; run .venv/bin/python python/make_gguf_golden.py";
  return json::parse(in);
}

// Element k of an array as the golden JSON holds it, and its canonical bytes fed to the hash.
json element_json(const Value& a, uint64_t k, Fnv& fnv) {
  if (a.elem_type == ValueType::STRING) {
    std::string_view s = a.strs[k];
    fnv.add_u64(s.size());
    fnv.add(s.data(), s.size());
    return std::string(s);
  }
  if (a.elem_type == ValueType::FLOAT32 || a.elem_type == ValueType::FLOAT64) {
    double d = a.number_at(k);
    fnv.add(&d, 8);
    return d;
  }
  if (a.elem_type == ValueType::UINT64) {
    uint64_t u;
    std::memcpy(&u, a.raw + 8 * k, 8);
    fnv.add_u64(u);
    return u;
  }
  int64_t i = a.int_at(k);
  fnv.add_u64(static_cast<uint64_t>(i));
  if (a.elem_type == ValueType::BOOL) return i != 0;
  return i;
}

void expect_scalar(const Value& v, const json& want, const std::string& key) {
  switch (v.type) {
    case ValueType::STRING:
      EXPECT_EQ(std::string(v.s), want.get<std::string>()) << key;
      break;
    case ValueType::BOOL:
      EXPECT_EQ(v.u != 0, want.get<bool>()) << key;
      break;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      EXPECT_EQ(v.f, want.get<double>()) << key;
      break;
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      EXPECT_EQ(v.u, want.get<uint64_t>()) << key;
      break;
    default:
      EXPECT_EQ(v.i, want.get<int64_t>()) << key;
      break;
  }
}

TEST(GgufGolden, MatchesGgufPyOnDefaultModel) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  json g = load_golden();
  File f = File::open(model);
  EXPECT_EQ(f.file_size(), g["file_size"].get<size_t>());
  EXPECT_EQ(f.version(), g["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), g["alignment"].get<uint64_t>());
  EXPECT_EQ(f.data_offset(), g["data_offset"].get<uint64_t>());

  const auto& meta = g["metadata"];
  ASSERT_EQ(f.metadata().size(), meta.size());
  for (size_t i = 0; i < meta.size(); ++i) {
    const auto& want = meta[i];
    const auto& kv = f.metadata()[i];
    std::string key = want["key"];
    ASSERT_EQ(kv.key, key) << "metadata entry " << i;
    EXPECT_EQ(f.find(key), &kv.value);
    EXPECT_EQ(tessera::gguf::value_type_name(kv.value.type), want["type"].get<std::string>()) << key;
    if (!kv.value.is_array()) {
      expect_scalar(kv.value, want["value"], key);
      continue;
    }
    const Value& a = kv.value;
    EXPECT_EQ(tessera::gguf::value_type_name(a.elem_type), want["elem_type"].get<std::string>()) << key;
    ASSERT_EQ(a.len, want["len"].get<uint64_t>()) << key;
    Fnv fnv;
    json all = json::array(), head = json::array(), tail = json::array();
    for (uint64_t k = 0; k < a.len; ++k) {
      json e = element_json(a, k, fnv);
      if (want.contains("values")) all.push_back(e);
      if (k < 4) head.push_back(e);
      if (k + 4 >= a.len) tail.push_back(e);
    }
    EXPECT_EQ(fnv.hex(), want["fnv1a64"].get<std::string>()) << key;
    if (want.contains("values")) {
      EXPECT_EQ(all, want["values"]) << key;
    } else {
      EXPECT_EQ(head, want["head"]) << key;
      EXPECT_EQ(tail, want["tail"]) << key;
    }
  }

  const auto& tensors = g["tensors"];
  ASSERT_EQ(f.tensors().size(), tensors.size());
  const uint8_t* base = f.tensors()[0].data - f.tensors()[0].offset;  // the mapped file's first byte
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& want = tensors[i];
    const tessera::TensorView& t = f.tensors()[i];
    std::string name = want["name"];
    ASSERT_EQ(t.name, name) << "tensor " << i;
    EXPECT_EQ(f.find_tensor(name), &t);
    EXPECT_EQ(static_cast<uint32_t>(t.dtype), want["ggml_type"].get<uint32_t>()) << name;
    EXPECT_EQ(tessera::dtype_name(t.dtype), want["type_name"].get<std::string>()) << name;
    EXPECT_EQ(t.shape, want["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(t.nbytes, want["n_bytes"].get<uint64_t>()) << name;
    EXPECT_EQ(t.offset, want["data_offset"].get<uint64_t>()) << name;
    EXPECT_EQ(t.data, base + t.offset) << name;
    size_t n = std::min<size_t>(64, t.nbytes);
    Fnv head, tail;
    head.add(t.data, n);
    tail.add(t.data + t.nbytes - n, n);
    EXPECT_EQ(head.hex(), want["head_fnv1a64"].get<std::string>()) << name;
    EXPECT_EQ(tail.hex(), want["tail_fnv1a64"].get<std::string>()) << name;
  }
}

// The typed getters on real keys, checked against the same golden data.
TEST(GgufGolden, TypedGettersOnDefaultModel) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  json g = load_golden();
  File f = File::open(model);
  for (const auto& want : g["metadata"]) {
    std::string key = want["key"], type = want["type"];
    if (type == "uint32") {
      EXPECT_EQ(f.get_uint(key), want["value"].get<uint64_t>()) << key;
      EXPECT_EQ(f.get_int(key), want["value"].get<int64_t>()) << key;
      EXPECT_THROW(f.get_string(key), tessera::Error) << key;
    } else if (type == "float32") {
      EXPECT_EQ(f.get_float(key), want["value"].get<double>()) << key;
      EXPECT_THROW(f.get_uint(key), tessera::Error) << key;
    } else if (type == "string") {
      EXPECT_EQ(f.get_string(key), want["value"].get<std::string>()) << key;
      EXPECT_THROW(f.get_float(key), tessera::Error) << key;
    } else if (type == "bool") {
      EXPECT_EQ(f.get_bool(key), want["value"].get<bool>()) << key;
      EXPECT_THROW(f.get_int(key), tessera::Error) << key;
    } else if (type == "array" && want["elem_type"] == "string") {
      auto strs = f.get_string_array(key);
      ASSERT_TRUE(strs.has_value()) << key;
      EXPECT_EQ(strs->size(), want["len"].get<size_t>()) << key;
      EXPECT_THROW(f.get_number_array(key), tessera::Error) << key;
    } else if (type == "array") {
      auto nums = f.get_number_array(key);
      ASSERT_TRUE(nums.has_value()) << key;
      EXPECT_EQ(nums->size(), want["len"].get<size_t>()) << key;
      EXPECT_EQ(nums->front(), want["head"][0].get<double>()) << key;
      EXPECT_THROW(f.get_string_array(key), tessera::Error) << key;
    }
  }
  EXPECT_FALSE(f.get_uint("no.such.key").has_value());
  EXPECT_EQ(f.find("no.such.key"), nullptr);
  EXPECT_EQ(f.find_tensor("no.such.tensor"), nullptr);
}

}  // namespace
