// GGUF writer -> reader round trips (every value type, nested and empty arrays, unicode, several dtypes and shapes,
// custom alignment), the typed getters' type and range checks, the writer's input checks, and gguf-py reading files
// our writer produced (python/dump_gguf_json.py).
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "formats/gguf.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace tessera::gguf;
using tessera::DType;
using json = nlohmann::json;

// A Value in the JSON shape python/dump_gguf_json.py prints, so ours and gguf-py's readings compare directly.
json value_json(const Value& v) {
  switch (v.type) {
    case ValueType::STRING:
      return std::string(v.s);
    case ValueType::BOOL:
      return v.u != 0;
    case ValueType::FLOAT32:
    case ValueType::FLOAT64:
      return v.f;
    case ValueType::UINT8:
    case ValueType::UINT16:
    case ValueType::UINT32:
    case ValueType::UINT64:
      return v.u;
    case ValueType::ARRAY:
      break;
    default:
      return v.i;
  }
  json values = json::array();
  for (uint64_t k = 0; k < v.len; ++k) {
    if (v.elem_type == ValueType::STRING) {
      values.push_back(std::string(v.strs[k]));
    } else if (v.elem_type == ValueType::ARRAY) {
      values.push_back(value_json(v.items[k]));
    } else if (v.elem_type == ValueType::FLOAT32 || v.elem_type == ValueType::FLOAT64) {
      values.push_back(v.number_at(k));
    } else if (v.elem_type == ValueType::BOOL) {
      values.push_back(v.int_at(k) != 0);
    } else if (v.elem_type == ValueType::UINT64) {
      uint64_t u;
      std::memcpy(&u, v.raw + 8 * k, 8);
      values.push_back(u);
    } else {
      values.push_back(v.int_at(k));
    }
  }
  return {{"elem_type", value_type_name(v.elem_type)}, {"values", values}};
}

json metadata_json(const std::vector<KeyValue>& kvs) {
  json out = json::array();
  for (const auto& kv : kvs)
    out.push_back({{"key", kv.key}, {"type", value_type_name(kv.value.type)}, {"value", value_json(kv.value)}});
  return out;
}

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Every value type, arrays of each, empty arrays, nested arrays up to the depth limit, unicode and NUL in strings.
std::vector<KeyValue> all_values() {
  std::vector<KeyValue> kv;
  kv.push_back({"general.architecture", Value::from_string("llama")});
  kv.push_back({"v.u8", Value::from_u8(200)});
  kv.push_back({"v.i8", Value::from_i8(-100)});
  kv.push_back({"v.u16", Value::from_u16(60000)});
  kv.push_back({"v.i16", Value::from_i16(-30000)});
  kv.push_back({"v.u32", Value::from_u32(4000000000u)});
  kv.push_back({"v.i32", Value::from_i32(-2000000000)});
  kv.push_back({"v.u64", Value::from_u64((uint64_t{1} << 63) + 5)});
  kv.push_back({"v.i64", Value::from_i64(-(int64_t{1} << 62) - 3)});
  kv.push_back({"v.f32", Value::from_f32(1.5e-3f)});
  kv.push_back({"v.f64", Value::from_f64(M_PI)});
  kv.push_back({"v.true", Value::from_bool(true)});
  kv.push_back({"v.false", Value::from_bool(false)});
  kv.push_back({"v.str", Value::from_string("h\u00e9llo, \u4e16\u754c \U0001F389")});
  kv.push_back({"v.str_empty", Value::from_string("")});
  kv.push_back({"v.str_nul", Value::from_string(std::string("a\0b", 3))});
  kv.push_back({"v.\u00fcnicode.key", Value::from_u32(1)});
  uint8_t u8s[] = {0, 1, 255};
  int8_t i8s[] = {-128, 0, 127};
  uint16_t u16s[] = {0, 65535, 7};
  int16_t i16s[] = {-32768, 32767, -1};
  uint32_t u32s[] = {0, 4294967295u, 12};
  uint64_t u64s[] = {0, UINT64_MAX, 1};
  int64_t i64s[] = {INT64_MIN, INT64_MAX, -1};
  double f64s[] = {-0.0, 1e300, -2.5};
  uint8_t bools[] = {1, 0, 1};
  kv.push_back({"a.u8", Value::from_array(ValueType::UINT8, u8s, 3)});
  kv.push_back({"a.i8", Value::from_array(ValueType::INT8, i8s, 3)});
  kv.push_back({"a.u16", Value::from_array(ValueType::UINT16, u16s, 3)});
  kv.push_back({"a.i16", Value::from_array(ValueType::INT16, i16s, 3)});
  kv.push_back({"a.u32", Value::from_array(ValueType::UINT32, u32s, 3)});
  kv.push_back({"a.i32", Value::from_i32s({INT32_MIN, INT32_MAX, 0, 5})});
  kv.push_back({"a.u64", Value::from_array(ValueType::UINT64, u64s, 3)});
  kv.push_back({"a.i64", Value::from_array(ValueType::INT64, i64s, 3)});
  kv.push_back({"a.f32", Value::from_f32s({0.5f, -1e-30f, 3.25e30f})});
  kv.push_back({"a.f64", Value::from_array(ValueType::FLOAT64, f64s, 3)});
  kv.push_back({"a.bool", Value::from_array(ValueType::BOOL, bools, 3)});
  kv.push_back({"a.str", Value::from_strings({"", "\u00e9t\u00e9", "\U0001F600 smile", "x"})});
  kv.push_back({"a.empty_u8", Value::from_array(ValueType::UINT8, nullptr, 0)});
  kv.push_back({"a.empty_str", Value::from_strings({})});
  kv.push_back({"a.empty_nested", Value::array_of_arrays({})});
  kv.push_back({"a.nested", Value::array_of_arrays({Value::from_i32s({1, 2, 3}), Value::from_strings({"a", "bc"}),
                                                    Value::from_f32s({}),
                                                    Value::array_of_arrays({Value::from_strings({"deep"})})})});
  Value deepest = Value::from_array(ValueType::UINT16, u16s, 2);
  for (int d = 1; d < kMaxArrayDepth; ++d) deepest = Value::array_of_arrays({deepest, Value::from_f32s({1.0f})});
  kv.push_back({"a.max_depth", deepest});
  return kv;
}

std::vector<TensorSpec> all_tensors() {
  std::mt19937 rng(1234);
  auto make = [&rng](std::string name, DType t, std::vector<int64_t> shape) {
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
    size_t n = static_cast<size_t>(*tessera::dtype_row_bytes(t, shape.back()) * rows);
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return TensorSpec{std::move(name), t, std::move(shape), std::move(b)};
  };
  return {make("f32.1d", DType::F32, {7}),
          make("f16.2d", DType::F16, {3, 5}),
          make("bf16.2d", DType::BF16, {2, 3}),
          make("blk.0.attn_q.weight", DType::Q4_1, {2, 64}),
          make("q8_0.3d", DType::Q8_0, {2, 3, 32}),
          make("i8.4d", DType::I8, {2, 1, 3, 4}),
          make("q4_k", DType::Q4_K, {1, 256}),
          make("i32", DType::I32, {5}),
          make("f64", DType::F64, {3}),
          make("t\u00e9nsor.\u4e16", DType::Q6_K, {2, 256})};
}

Writer make_writer(const std::vector<KeyValue>& kvs, const std::vector<TensorSpec>& ts) {
  Writer w;
  for (const auto& kv : kvs) w.set(kv.key, kv.value);
  for (const auto& t : ts) w.add_tensor(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
  return w;
}

void expect_same_file(const File& f, const std::vector<KeyValue>& kvs, const std::vector<TensorSpec>& ts,
                      uint64_t alignment) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_offset() % alignment, 0u);
  EXPECT_EQ(metadata_json(f.metadata()), metadata_json(kvs));
  ASSERT_EQ(f.tensors().size(), ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const tessera::TensorView& t = f.tensors()[i];
    EXPECT_EQ(t.name, ts[i].name);
    EXPECT_EQ(f.find_tensor(ts[i].name), &t);
    EXPECT_EQ(t.dtype, ts[i].dtype) << t.name;
    EXPECT_EQ(t.shape, ts[i].shape) << t.name;
    ASSERT_EQ(t.nbytes, ts[i].bytes.size()) << t.name;
    EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    EXPECT_GE(t.offset, f.data_offset()) << t.name;
    EXPECT_EQ(std::memcmp(t.data, ts[i].bytes.data(), t.nbytes), 0) << t.name;
  }
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("tessera_gguf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(GgufRoundTrip, EveryValueTypeAndSeveralTensors) {
  auto kvs = all_values();
  auto ts = all_tensors();
  std::vector<uint8_t> bytes = make_writer(kvs, ts).to_bytes();
  File f = File::parse(bytes.data(), bytes.size(), "roundtrip.gguf");
  expect_same_file(f, kvs, ts, kDefaultAlignment);
  // Spot checks of the widening rules behind the getters.
  EXPECT_EQ(f.get_int("v.i8"), -100);
  EXPECT_EQ(f.get_uint("v.u64"), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(f.get_float("v.f32"), static_cast<double>(1.5e-3f));
  EXPECT_EQ(f.get_string("v.str_nul")->size(), 3u);
  EXPECT_EQ(f.find("a.nested")->items[3].items[0].strs[0], "deep");
}

TEST(GgufRoundTrip, CustomAlignment) {
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    auto kvs = all_values();
    kvs.insert(kvs.begin() + 1, KeyValue{"general.alignment", Value::from_u32(align)});
    auto ts = all_tensors();
    std::vector<uint8_t> bytes = make_writer(kvs, ts).to_bytes();
    File f = File::parse(bytes.data(), bytes.size(), "aligned.gguf");
    SCOPED_TRACE(align);
    expect_same_file(f, kvs, ts, align);
  }
}

TEST(GgufRoundTrip, WriteIsAtomicAndOpens) {
  fs::path dir = temp_dir("write");
  std::string path = (dir / "model.gguf").string();
  { std::ofstream(path) << "old contents"; }
  auto kvs = all_values();
  auto ts = all_tensors();
  Writer w = make_writer(kvs, ts);
  w.write(path);
  std::vector<fs::path> entries(fs::directory_iterator(dir), fs::directory_iterator{});
  EXPECT_EQ(entries.size(), 1u) << "temporary file left behind";
  File f = File::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.file_size(), w.to_bytes().size());
  expect_same_file(f, kvs, ts, kDefaultAlignment);
  EXPECT_THROW(w.write((dir / "no_such_dir" / "x.gguf").string()), tessera::Error);
  try {
    File::open((dir / "missing.gguf").string());
    ADD_FAILURE() << "opened a missing file";
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.gguf"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Values read from a file are writable as they are (what `tessera quantize` does with a model's metadata).
TEST(GgufRoundTrip, RewritingAReadFileIsByteIdentical) {
  auto kvs = all_values();
  kvs.insert(kvs.begin(), KeyValue{"general.alignment", Value::from_u32(128)});
  std::vector<uint8_t> bytes = make_writer(kvs, all_tensors()).to_bytes();
  File f = File::parse(bytes.data(), bytes.size(), "in.gguf");
  Writer w;
  for (const auto& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const auto& t : f.tensors()) w.add_tensor_ref(t.name, t.dtype, t.shape, t.data, t.nbytes);
  EXPECT_EQ(w.to_bytes(), bytes);
}

TEST(GgufRoundTrip, Version2IsAccepted) {
  std::vector<uint8_t> bytes = make_writer(all_values(), all_tensors()).to_bytes();
  bytes[4] = 2;
  File f = File::parse(bytes.data(), bytes.size(), "v2.gguf");
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), all_tensors().size());
}

TEST(GgufRoundTrip, EmptyFileWithoutTensorsOrMetadata) {
  std::vector<uint8_t> bytes = Writer().to_bytes();
  File f = File::parse(bytes.data(), bytes.size(), "empty.gguf");
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.data_offset(), 32u);
}

TEST(GgufWriter, SetReplacesInPlaceAndKeepsInsertionOrder) {
  Writer w;
  w.set("z.first", Value::from_u32(1));
  w.set("a.second", Value::from_u32(2));
  w.set("z.first", Value::from_string("replaced"));
  std::vector<uint8_t> bytes = w.to_bytes();
  File f = File::parse(bytes.data(), bytes.size(), "order.gguf");
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].key, "z.first");
  EXPECT_EQ(f.get_string("z.first"), "replaced");
  EXPECT_EQ(f.metadata()[1].key, "a.second");
}

TEST(GgufWriter, RejectsInvalidInput) {
  std::vector<uint8_t> q(2 * 20), f32(16);
  auto expect_error = [](auto fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << what;
    } catch (const tessera::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Writer w;
  expect_error([&] { w.set("", Value::from_u32(1)); }, "key is empty");
  expect_error([&] { w.set("bad\xff", Value::from_u32(1)); }, "not valid UTF-8");
  expect_error([&] { w.set("general.alignment", Value::from_u32(0)); }, "not a nonzero power of two");
  expect_error([&] { w.set("general.alignment", Value::from_u32(48)); }, "not a nonzero power of two");
  expect_error([&] { w.set("general.alignment", Value::from_u64(64)); }, "expected uint32");
  Value deep = Value::from_f32s({1});
  for (int d = 0; d < kMaxArrayDepth; ++d) deep = Value::array_of_arrays({deep});
  expect_error([&] { w.set("deep", deep); }, "deeper than 4");
  expect_error([&] { Value::array_of_arrays({Value::from_u32(1)}); }, "cannot hold a uint32");
  uint8_t two = 2;
  expect_error([&] { Value::from_array(ValueType::BOOL, &two, 1); }, "not 0 or 1");
  expect_error([&] { Value::from_array(ValueType::STRING, &two, 1); }, "scalar element type");
  expect_error([&] { w.add_tensor("", DType::F32, {4}, f32.data(), 16); }, "tensor name is empty");
  expect_error([&] { w.add_tensor("t", DType::F32, {}, f32.data(), 4); }, "0 dimensions");
  expect_error([&] { w.add_tensor("t", DType::F32, {1, 1, 1, 1, 1, 1, 1, 1, 4}, f32.data(), 16); }, "9 dimensions");
  expect_error([&] { w.add_tensor("t", DType::F32, {0, 4}, f32.data(), 0); }, "dimension 0 <= 0");
  expect_error([&] { w.add_tensor("t", DType::F32, {4}, f32.data(), 12); }, "needs 16 bytes of f32, got 12");
  expect_error([&] { w.add_tensor("t", DType::Q4_1, {2, 48}, q.data(), q.size()); }, "not a multiple of the q4_1");
  expect_error([&] { w.add_tensor("t", static_cast<DType>(4), {4}, f32.data(), 16); }, "unknown dtype 4");
  w.add_tensor("t", DType::Q4_1, {2, 32}, q.data(), q.size());
  expect_error([&] { w.add_tensor("t", DType::F32, {4}, f32.data(), 16); }, "duplicate tensor name 't'");
}

TEST(GgufGetters, TypeAndRangeChecks) {
  Writer w;
  w.set("neg", Value::from_i8(-1));
  w.set("big", Value::from_u64(UINT64_MAX));
  w.set("u16", Value::from_u16(65535));
  w.set("f", Value::from_f64(2.5));
  w.set("b", Value::from_bool(true));
  w.set("s", Value::from_string("text"));
  w.set("ints", Value::from_i32s({-1, 2}));
  w.set("floats", Value::from_f32s({0.5f}));
  w.set("strs", Value::from_strings({"a"}));
  uint64_t huge = UINT64_MAX;
  w.set("u64s", Value::from_array(ValueType::UINT64, &huge, 1));
  std::vector<uint8_t> bytes = w.to_bytes();
  File f = File::parse(bytes.data(), bytes.size(), "getters.gguf");
  auto expect_error = [](auto fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << what;
    } catch (const tessera::Error& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.rfind("getters.gguf: ", 0), 0u) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  expect_error([&] { f.get_uint("neg"); }, "metadata key 'neg' is negative (-1)");
  EXPECT_EQ(f.get_int("neg"), -1);
  EXPECT_EQ(f.get_float("neg"), -1.0);
  EXPECT_EQ(f.get_uint("big"), UINT64_MAX);
  expect_error([&] { f.get_int("big"); }, "does not fit in int64");
  EXPECT_EQ(f.get_uint("u16"), 65535u);
  EXPECT_EQ(f.get_int("u16"), 65535);
  expect_error([&] { f.get_uint("f"); }, "'f' has type float64, expected an unsigned integer");
  expect_error([&] { f.get_int("b"); }, "'b' has type bool, expected an integer");
  expect_error([&] { f.get_bool("u16"); }, "expected a bool");
  EXPECT_EQ(f.get_bool("b"), true);
  expect_error([&] { f.get_float("s"); }, "expected a number");
  expect_error([&] { f.get_string("strs"); }, "'strs' is an array of string, expected a string");
  expect_error([&] { f.get_string_array("ints"); }, "'ints' is an array of int32, expected an array of strings");
  expect_error([&] { f.get_string_array("s"); }, "'s' has type string, expected an array of strings");
  expect_error([&] { f.get_number_array("strs"); }, "expected an array of numbers");
  EXPECT_EQ(f.get_number_array("ints"), (std::vector<double>{-1, 2}));
  EXPECT_EQ(f.get_number_array("floats"), (std::vector<double>{0.5}));
  EXPECT_EQ(f.get_string_array("strs"), (std::vector<std::string_view>{"a"}));
  EXPECT_FALSE(f.get_string("absent").has_value());
  EXPECT_FALSE(f.get_number_array("absent").has_value());

  const Value& ints = *f.find("ints");
  EXPECT_EQ(ints.int_at(0), -1);
  EXPECT_THROW(ints.int_at(2), tessera::Error);
  EXPECT_THROW(ints.number_at(2), tessera::Error);
  EXPECT_THROW(f.find("floats")->int_at(0), tessera::Error);
  EXPECT_THROW(f.find("strs")->number_at(0), tessera::Error);
  EXPECT_THROW(f.find("s")->number_at(0), tessera::Error);
  EXPECT_THROW(f.find("u64s")->int_at(0), tessera::Error);
  EXPECT_EQ(f.find("u64s")->number_at(0), static_cast<double>(UINT64_MAX));
}

// gguf-py reads what our writer wrote: an independent check of the writer (and of our reading of the same bytes).
TEST(GgufRoundTrip, ReadByGgufPy) {
  std::string py = std::string(TESSERA_SOURCE_DIR) + "/.venv/bin/python";
  if (!fs::exists(py)) {
    if (std::getenv("CI") != nullptr) FAIL() << py << " missing (scripts/setup.sh creates it)";
    GTEST_SKIP() << py << " missing (run scripts/setup.sh)";
  }
  fs::path dir = temp_dir("gguf_py");
  for (uint32_t align : {32u, 256u}) {
    SCOPED_TRACE(align);
    auto kvs = all_values();
    kvs.insert(kvs.begin(), KeyValue{"general.alignment", Value::from_u32(align)});
    auto ts = all_tensors();
    std::string path = (dir / ("align" + std::to_string(align) + ".gguf")).string();
    make_writer(kvs, ts).write(path);
    std::string out;
    int rc = tessera::test::run_command(
        py + " " + std::string(TESSERA_SOURCE_DIR) + "/python/dump_gguf_json.py " + path + " 2>/dev/null", &out);
    ASSERT_EQ(rc, 0) << out;
    json got = json::parse(out);
    File f = File::open(path);
    EXPECT_EQ(got["version"], 3);
    EXPECT_EQ(got["alignment"], align);
    EXPECT_EQ(got["data_offset"], f.data_offset());
    EXPECT_EQ(got["metadata"], metadata_json(kvs));
    ASSERT_EQ(got["tensors"].size(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) {
      const json& t = got["tensors"][i];
      EXPECT_EQ(t["name"], ts[i].name);
      EXPECT_EQ(t["ggml_type"], static_cast<uint32_t>(ts[i].dtype));
      EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), ts[i].shape);
      EXPECT_EQ(t["n_bytes"], ts[i].bytes.size());
      EXPECT_EQ(t["data_offset"], f.tensors()[i].offset);
      std::string hex;
      for (uint8_t b : ts[i].bytes) hex += fmt::format("{:02x}", b);
      EXPECT_EQ(t["data_hex"], hex) << ts[i].name;
    }
  }
  fs::remove_all(dir);
}

}  // namespace
