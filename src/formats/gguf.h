// GGUF v2/v3 reader (mmap, zero-copy, fully validated) and writer.
//
// Every value read from the file is checked before use: magic, version, counts, string lengths, offsets and sizes
// inside the file, known dtypes, shape products that overflow, duplicate names, alignment. A violation throws
// tessera::Error with one sentence naming the file and the problem; nothing is read out of bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/mapped_file.h"
#include "formats/tensor_view.h"

namespace tessera::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

// One metadata value. Scalars are widened into u/i/f; strings and arrays point into the mapped file (reader) or into
// `owned` storage (values built for the writer), so reading a 50k-entry vocabulary allocates one vector, not 50k.
struct Value {
  ValueType type = ValueType::UINT32;
  uint64_t u = 0;      // unsigned integers and BOOL (0/1); also set for signed values >= 0
  int64_t i = 0;       // signed integers; also set for unsigned values that fit
  double f = 0;        // FLOAT32/64; also set for every integer type
  std::string_view s;  // STRING

  // ARRAY
  ValueType elem_type = ValueType::UINT8;
  uint64_t len = 0;                    // number of elements
  const uint8_t* raw = nullptr;        // scalar elements, little-endian, packed (elem_type's size each)
  std::vector<std::string_view> strs;  // elem_type STRING
  std::vector<Value> items;            // elem_type ARRAY (nested arrays)
  std::shared_ptr<void> owned;         // backing store of writer-built strings and arrays

  bool is_array() const { return type == ValueType::ARRAY; }
  bool is_integer() const;
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  // Element i of a scalar array, converted (Error when out of range or not a scalar array).
  double number_at(uint64_t i) const;
  int64_t int_at(uint64_t i) const;

  // Builders for the writer.
  static Value from_u32(uint32_t v);
  static Value from_i32(int32_t v);
  static Value from_u64(uint64_t v);
  static Value from_f32(float v);
  static Value from_bool(bool v);
  static Value from_string(std::string v);
  static Value from_strings(const std::vector<std::string>& v);
  static Value from_f32s(const std::vector<float>& v);
  static Value from_i32s(const std::vector<int32_t>& v);
  static Value array_of_arrays(std::vector<Value> items);  // nested arrays
};

struct KeyValue {
  std::string key;
  Value value;
};

class File {
 public:
  // Maps and validates `path`. Throws tessera::Error on any violation.
  static File open(const std::string& path);
  // Parses a buffer held by the caller (used by the fuzzer and tests); `name` is used in error messages.
  static File parse(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  size_t file_size() const { return size_; }
  const std::string& path() const { return name_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;  // nullptr when absent

  // Typed getters: nullopt when absent; Error when present with an incompatible type or out of range.
  std::optional<uint64_t> get_uint(std::string_view key) const;   // any integer type >= 0
  std::optional<int64_t> get_int(std::string_view key) const;     // any integer type
  std::optional<double> get_float(std::string_view key) const;    // any float or integer type
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  // Arrays: Error if the key holds something else. Empty optional when absent.
  std::optional<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_number_array(std::string_view key) const;

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(std::string_view name) const;

 private:
  std::shared_ptr<MappedFile> map_;  // null when parsing a caller-held buffer
  std::string name_;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
  friend class Parser;
};

// Writes GGUF v3: metadata in insertion order, tensors aligned to `general.alignment` (default 32).
class Writer {
 public:
  void set(std::string key, Value v);  // replaces an existing key
  // `shape` row-major (outermost first); `data` holds exactly the dtype's bytes for that shape (copied).
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  // Writes to `path` atomically (temporary file + rename); Error naming the path on I/O failure.
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<KeyValue> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tessera::gguf
