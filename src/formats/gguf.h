// GGUF v2/v3 reader (mmap, zero-copy, fully validated) and writer.
//
// Every value read from the file is checked before use: magic, version, counts, string lengths, offsets and sizes
// inside the file, known dtypes, shape products that overflow, duplicate names, alignment. A violation throws
// tessera::Error with one sentence naming the file and the problem; nothing is read out of bounds.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count × {string key, u32 type,
// value}, tensor_count × {string name, u32 n_dims, u64 ne[n_dims] (innermost first), u32 ggml type, u64 offset},
// padding to general.alignment, then the data section (tensor offsets are relative to its start).
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
#include "tessera/error.h"

namespace tessera::gguf {

inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr int kMaxArrayDepth = 4;  // an array may hold arrays nested this many levels deep in total
inline constexpr uint32_t kMaxDims = 8;   // GGML uses at most 4; more is certainly a corrupt file

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
// "uint8", "int32", "float32", "bool", "string", "array", ... ("unknown" for ids outside the enum).
std::string_view value_type_name(ValueType t);
// Bytes of one scalar element; 0 for STRING, ARRAY and unknown ids.
size_t value_type_size(ValueType t);

// One metadata value. Scalars are widened into u/i/f; strings and arrays point into the mapped file (reader) or into
// `owned` storage (values built for the writer), so reading a 50k-entry vocabulary allocates one vector, not 50k.
// A Value read from a File is valid while that File (or a copy of it) lives.
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
  std::vector<Value> items;            // elem_type ARRAY (nested arrays, each of type ARRAY)
  std::shared_ptr<void> owned;         // backing store of writer-built strings and arrays

  bool is_array() const { return type == ValueType::ARRAY; }
  bool is_integer() const;  // the eight integer types (not BOOL)
  bool is_float() const { return type == ValueType::FLOAT32 || type == ValueType::FLOAT64; }
  // Element i of a scalar array (integers, floats, bools as 0/1), converted. Error when i is out of range or the
  // array holds strings or arrays; int_at also rejects float elements and uint64 values above INT64_MAX.
  double number_at(uint64_t i) const;
  int64_t int_at(uint64_t i) const;

  // Builders for the writer (they own their storage).
  static Value from_u8(uint8_t v);
  static Value from_i8(int8_t v);
  static Value from_u16(uint16_t v);
  static Value from_i16(int16_t v);
  static Value from_u32(uint32_t v);
  static Value from_i32(int32_t v);
  static Value from_u64(uint64_t v);
  static Value from_i64(int64_t v);
  static Value from_f32(float v);
  static Value from_f64(double v);
  static Value from_bool(bool v);
  static Value from_string(std::string v);
  static Value from_strings(const std::vector<std::string>& v);
  static Value from_f32s(const std::vector<float>& v);
  static Value from_i32s(const std::vector<int32_t>& v);
  // A scalar array of `n` elements of `elem` (any type but STRING/ARRAY), copied from packed little-endian `data`.
  static Value from_array(ValueType elem, const void* data, uint64_t n);
  static Value array_of_arrays(std::vector<Value> items);  // nested arrays; each item must be an ARRAY
};

struct KeyValue {
  std::string key;
  Value value;
};

class File {
 public:
  // Maps and validates `path`. Throws tessera::Error on any violation.
  static File open(const std::string& path);
  // Parses a buffer held by the caller (used by the fuzzer and tests); `name` is used in error messages. The buffer
  // must outlive the File: strings, arrays and tensor data point into it.
  static File parse(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
  size_t file_size() const { return size_; }
  const std::string& path() const { return name_; }
  const std::string& name() const { return name_; }  // the path, or the name given to parse()

  const std::vector<KeyValue>& metadata() const { return kv_; }  // in file order
  const Value* find(std::string_view key) const;                 // nullptr when absent

  // Typed getters: nullopt when absent; Error when present with an incompatible type or out of range.
  std::optional<uint64_t> get_uint(std::string_view key) const;            // any integer type >= 0
  std::optional<int64_t> get_int(std::string_view key) const;              // any integer type <= INT64_MAX
  std::optional<double> get_float(std::string_view key) const;             // any float or integer type
  std::optional<bool> get_bool(std::string_view key) const;                // BOOL only
  std::optional<std::string_view> get_string(std::string_view key) const;  // STRING only
  // Arrays: Error if the key holds something else. Empty optional when absent.
  std::optional<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  std::optional<std::vector<double>> get_number_array(std::string_view key) const;  // scalar arrays

  // In file order; shape row-major (ne reversed), offset absolute in the file, data inside the buffer (but bitnet.cpp's
  // I2_S tensors, ggml type 36, are converted at load to TQ2_0 or F32 (quant/i2s.h): their data is the File's own).
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find_tensor(std::string_view name) const;

 private:
  std::shared_ptr<MappedFile> map_;  // null when parsing a caller-held buffer
  std::string name_;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  // Index keys view the key bytes inside the buffer (stable), never kv_[i].key (small strings move with the vector).
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<TensorView> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
  // Tensors converted at load (bitnet.cpp's I2_S, quant/i2s.h) point here instead of into the file.
  std::vector<std::shared_ptr<const std::vector<uint8_t>>> converted_;
  friend class Parser;
};

// Writes GGUF v3: metadata in insertion order, tensors in insertion order, each aligned to `general.alignment`
// (default 32; when set it must be a uint32 power of two). Inputs are validated as strictly as the reader does, so
// everything the writer produces reads back.
class Writer {
 public:
  void set(std::string key, Value v);  // replaces an existing key in place
  // `shape` row-major (outermost first); `data` holds exactly the dtype's bytes for that shape (copied).
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  // As add_tensor, without the copy: `data` must stay valid until the last write()/to_bytes() (e.g. a mapped file).
  void add_tensor_ref(std::string name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  // Writes to `path` atomically (temporary file in the same folder + rename); Error naming the path on I/O failure.
  void write(const std::string& path) const;
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;     // owned copy (add_tensor), empty for add_tensor_ref
    const uint8_t* ref = nullptr;  // where the bytes are
    size_t nbytes = 0;
  };
  void check_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
                    size_t nbytes) const;
  template <typename Sink>
  void serialize(Sink& sink) const;
  std::vector<KeyValue> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tessera::gguf
