// GGUF reader: one bounds-checked pass over the header, metadata and tensor infos; tensor data is never copied.
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_internal.h"
#include "quant/i2s.h"

namespace tessera::gguf {

using detail::printable;

// Smallest possible encodings, used to reject counts that cannot fit in the bytes left before allocating anything.
namespace {
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;                  // key length, 1 key byte, type, 1 value byte
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name length, 1 byte, n_dims, ne[0], type, offset
constexpr uint64_t kMinStringBytes = 8;                          // length only (empty string)
constexpr uint64_t kMinArrayBytes = 4 + 8;                       // element type + count (empty array)
}  // namespace

class Parser {
 public:
  Parser(File& f, const uint8_t* data, size_t size) : f_(f), p_(data), n_(size) {}

  void run() {
    read_header();
    read_metadata();
    read_alignment();
    read_tensor_infos();
    place_tensors();
    convert_i2s();
  }

 private:
  File& f_;
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  // What is being parsed, for error messages (composed only when an error is thrown).
  enum class Where { HEADER, KV, TENSOR } where_ = Where::HEADER;
  uint64_t index_ = 0;     // metadata entry or tensor info number
  std::string_view name_;  // its key or tensor name once read

  [[noreturn]] void error(const std::string& msg) const {
    std::string ctx;
    if (where_ == Where::KV) {
      ctx = name_.empty() ? fmt::format("metadata entry {}: ", index_)
                          : fmt::format("metadata key '{}': ", printable(name_));
    } else if (where_ == Where::TENSOR) {
      ctx = name_.empty() ? fmt::format("tensor info {}: ", index_) : fmt::format("tensor '{}': ", printable(name_));
    }
    fail("{}: {}{}", f_.name_, ctx, msg);
  }

  size_t remaining() const { return n_ - pos_; }

  void need(uint64_t bytes, const char* what) const {
    if (bytes > remaining())
      error(fmt::format("file truncated: {} at offset {} needs {} bytes but only {} remain", what, pos_, bytes,
                        remaining()));
  }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string_view read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    if (len > remaining())
      error(fmt::format("{} length {} at offset {} extends past the end of the file ({} bytes remain)", what, len,
                        pos_ - 8, remaining()));
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }

  void read_header() {
    if (n_ < 4) fail("{}: not a GGUF file (only {} bytes)", f_.name_, n_);
    uint32_t magic = read<uint32_t>("magic");
    if (magic != detail::kMagic) {
      fail("{}: not a GGUF file (bad magic {:02x} {:02x} {:02x} {:02x}, expected 'GGUF')", f_.name_, p_[0], p_[1],
           p_[2], p_[3]);
    }
    uint32_t version = read<uint32_t>("version");
    if (version == 1) fail("{}: GGUF version 1 is not supported (only versions 2 and 3 are)", f_.name_);
    if (version != 2 && version != 3) {
      uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) fail("{}: big-endian GGUF files are not supported", f_.name_);
      fail("{}: unsupported GGUF version {} (only versions 2 and 3 are supported)", f_.name_, version);
    }
    f_.version_ = version;
    uint64_t tensor_count = read<uint64_t>("tensor count");
    uint64_t kv_count = read<uint64_t>("metadata count");
    // Both counts are bounded by the bytes left, so the allocations below are bounded by the file size.
    if (kv_count > remaining() / kMinKvBytes)
      error(fmt::format("metadata count {} cannot fit in the remaining {} bytes", kv_count, remaining()));
    if (tensor_count > (remaining() - kv_count * kMinKvBytes) / kMinTensorInfoBytes)
      error(fmt::format("tensor count {} cannot fit in the remaining {} bytes", tensor_count, remaining()));
    kv_count_ = kv_count;
    tensor_count_ = tensor_count;
  }

  void read_metadata() {
    where_ = Where::KV;
    f_.kv_.reserve(kv_count_);
    f_.kv_index_.reserve(kv_count_);
    for (index_ = 0; index_ < kv_count_; ++index_) {
      name_ = {};
      std::string_view key = read_string("key");
      if (key.empty()) error("empty key");
      if (!detail::is_valid_utf8(key)) {
        name_ = key;
        error("key is not valid UTF-8");
      }
      name_ = key;
      if (f_.kv_index_.count(key) != 0) error("duplicate metadata key");
      auto type = read<uint32_t>("value type");
      KeyValue kv{std::string(key), Value{}};
      read_value(kv.value, type, 0);
      f_.kv_index_.emplace(key, f_.kv_.size());
      f_.kv_.push_back(std::move(kv));
    }
    name_ = {};
  }

  // `depth`: how many arrays enclose this value.
  void read_value(Value& v, uint32_t type, int depth) {
    if (!detail::is_known_value_type(type)) error(fmt::format("unknown value type {} at offset {}", type, pos_ - 4));
    v.type = static_cast<ValueType>(type);
    switch (v.type) {
      case ValueType::UINT8:
        v = Value::from_u8(read<uint8_t>("uint8 value"));
        break;
      case ValueType::INT8:
        v = Value::from_i8(read<int8_t>("int8 value"));
        break;
      case ValueType::UINT16:
        v = Value::from_u16(read<uint16_t>("uint16 value"));
        break;
      case ValueType::INT16:
        v = Value::from_i16(read<int16_t>("int16 value"));
        break;
      case ValueType::UINT32:
        v = Value::from_u32(read<uint32_t>("uint32 value"));
        break;
      case ValueType::INT32:
        v = Value::from_i32(read<int32_t>("int32 value"));
        break;
      case ValueType::UINT64:
        v = Value::from_u64(read<uint64_t>("uint64 value"));
        break;
      case ValueType::INT64:
        v = Value::from_i64(read<int64_t>("int64 value"));
        break;
      case ValueType::FLOAT32:
        v = Value::from_f32(read<float>("float32 value"));
        break;
      case ValueType::FLOAT64:
        v = Value::from_f64(read<double>("float64 value"));
        break;
      case ValueType::BOOL: {
        uint8_t b = read<uint8_t>("bool value");
        if (b > 1) error(fmt::format("invalid bool value {} at offset {}", b, pos_ - 1));
        v = Value::from_bool(b != 0);
        break;
      }
      case ValueType::STRING:
        v.s = read_string("string");
        break;
      case ValueType::ARRAY:
        read_array(v, depth + 1);
        break;
    }
  }

  // `depth`: nesting level of this array (1 for a top-level array value).
  void read_array(Value& v, int depth) {
    v.type = ValueType::ARRAY;
    auto elem = read<uint32_t>("array element type");
    if (!detail::is_known_value_type(elem))
      error(fmt::format("unknown array element type {} at offset {}", elem, pos_ - 4));
    v.elem_type = static_cast<ValueType>(elem);
    if (v.elem_type == ValueType::ARRAY && depth + 1 > kMaxArrayDepth)
      error(fmt::format("arrays nested deeper than {} levels at offset {}", kMaxArrayDepth, pos_ - 4));
    uint64_t len = read<uint64_t>("array length");
    size_t elem_size = value_type_size(v.elem_type);
    uint64_t min_size = v.elem_type == ValueType::STRING  ? kMinStringBytes
                        : v.elem_type == ValueType::ARRAY ? kMinArrayBytes
                                                          : elem_size;
    if (len > remaining() / min_size)
      error(fmt::format("array of {} {} elements at offset {} cannot fit in the remaining {} bytes", len,
                        value_type_name(v.elem_type), pos_ - 12, remaining()));
    v.len = len;
    if (elem_size != 0) {
      v.raw = p_ + pos_;
      if (v.elem_type == ValueType::BOOL) {
        for (uint64_t k = 0; k < len; ++k)
          if (v.raw[k] > 1) error(fmt::format("invalid bool value {} at offset {}", v.raw[k], pos_ + k));
      }
      pos_ += len * elem_size;
    } else if (v.elem_type == ValueType::STRING) {
      v.strs.reserve(len);  // len <= remaining / 8: bounded by the file size
      for (uint64_t k = 0; k < len; ++k) v.strs.push_back(read_string("string"));
    } else {
      v.items.resize(len);  // len <= remaining / 12
      for (uint64_t k = 0; k < len; ++k) read_array(v.items[k], depth + 1);
    }
  }

  void read_alignment() {
    where_ = Where::HEADER;
    const Value* a = f_.find("general.alignment");
    if (a == nullptr) return;
    if (a->type != ValueType::UINT32)
      fail("{}: general.alignment has type {}, expected uint32", f_.name_, value_type_name(a->type));
    if (!detail::is_power_of_two(a->u)) fail("{}: general.alignment {} is not a nonzero power of two", f_.name_, a->u);
    f_.alignment_ = a->u;
  }

  void read_tensor_infos() {
    where_ = Where::TENSOR;
    f_.tensors_.reserve(tensor_count_);  // bounded by remaining / kMinTensorInfoBytes
    f_.tensor_index_.reserve(tensor_count_);
    for (index_ = 0; index_ < tensor_count_; ++index_) {
      name_ = {};
      std::string_view name = read_string("tensor name");
      if (name.empty()) error("empty tensor name");
      name_ = name;
      if (!detail::is_valid_utf8(name)) error("name is not valid UTF-8");
      if (f_.tensor_index_.count(name) != 0) error("duplicate tensor name");
      auto n_dims = read<uint32_t>("dimension count");
      if (n_dims == 0 || n_dims > kMaxDims)
        error(fmt::format("has {} dimensions (1 to {} are supported)", n_dims, kMaxDims));
      need(uint64_t{n_dims} * 8, "shape");
      uint64_t ne[kMaxDims];
      std::memcpy(ne, p_ + pos_, n_dims * 8);
      pos_ += n_dims * 8;
      int64_t numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        if (ne[d] == 0) error(fmt::format("dimension {} (innermost first) is 0", d));
        if (ne[d] > static_cast<uint64_t>(INT64_MAX))
          error(fmt::format("dimension {} (innermost first) is negative ({})", d, static_cast<int64_t>(ne[d])));
        if (__builtin_mul_overflow(numel, static_cast<int64_t>(ne[d]), &numel))
          error("element count of the shape overflows int64");
      }
      auto type_id = read<uint32_t>("ggml type");
      const bool i2s = type_id == kGgmlTypeI2S;
      const DTypeInfo* info = i2s ? &dtype_info(DType::F32) : dtype_info(type_id);  // I2_S: typed in convert_i2s()
      if (info == nullptr) error(fmt::format("unknown ggml type id {}", type_id));
      auto rel = read<uint64_t>("data offset");
      uint64_t nbytes = 0;
      if (i2s) {
        if (ne[0] % kI2SBlock != 0) error(fmt::format("i2_s rows of {} are not whole blocks of 128", ne[0]));
        nbytes = i2s_bytes(numel);
        i2s_.push_back(f_.tensors_.size());
      } else {
        std::optional<uint64_t> row = dtype_row_bytes(info->type, ne[0]);
        if (!row) {
          error(fmt::format("innermost dimension {} is not a multiple of the {} block size {}", ne[0], info->name,
                            info->block_size));
        }
        nbytes = *row;
        for (uint32_t d = 1; d < n_dims; ++d)
          if (__builtin_mul_overflow(nbytes, ne[d], &nbytes)) error("byte size of the shape overflows uint64");
      }
      if (rel % f_.alignment_ != 0)
        error(fmt::format("data offset {} is not a multiple of the alignment {}", rel, f_.alignment_));
      TensorView t;
      t.name = std::string(name);
      t.dtype = info->type;
      t.shape.assign(std::make_reverse_iterator(ne + n_dims), std::make_reverse_iterator(ne));
      t.offset = rel;  // made absolute in place_tensors() once the data section's start is known
      t.nbytes = nbytes;
      f_.tensor_index_.emplace(name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
    }
    name_ = {};
  }

  void place_tensors() {
    where_ = Where::TENSOR;
    uint64_t a = f_.alignment_;
    f_.data_offset_ = (pos_ + a - 1) / a * a;  // pos_ <= n_ < 2^63 and a <= 2^31: no overflow
    uint64_t avail = n_ >= f_.data_offset_ ? n_ - f_.data_offset_ : 0;
    for (size_t k = 0; k < f_.tensors_.size(); ++k) {
      TensorView& t = f_.tensors_[k];
      index_ = k;
      name_ = f_.tensors_[k].name;
      if (f_.data_offset_ > n_ || t.offset > avail || t.nbytes > avail - t.offset) {
        error(
            fmt::format("data ({} bytes at data offset {}) extends past the end of the file ({} bytes, data section "
                        "at {})",
                        t.nbytes, t.offset, n_, f_.data_offset_));
      }
      t.offset += f_.data_offset_;
      t.data = p_ + t.offset;
    }
    std::vector<size_t> order(f_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return f_.tensors_[x].offset < f_.tensors_[y].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
      const TensorView& prev = f_.tensors_[order[k - 1]];
      const TensorView& cur = f_.tensors_[order[k]];
      if (prev.offset + prev.nbytes > cur.offset) {
        name_ = cur.name;
        error(fmt::format("data overlaps tensor '{}'", printable(prev.name)));
      }
    }
    name_ = {};
  }

  // bitnet.cpp's I2_S tensors (quant/i2s.h) become TQ2_0 (or F32 where TQ2_0 cannot hold them exactly), in memory
  // the File owns, so the rest of Tessera sees only its own dtypes.
  void convert_i2s() {
    for (size_t k : i2s_) {
      TensorView& t = f_.tensors_[k];
      const int64_t cols = t.shape.back();
      auto buf = std::make_shared<std::vector<uint8_t>>();
      t.dtype = i2s_convert(t.data, t.numel() / cols, cols, *buf);
      t.data = buf->data();
      t.nbytes = buf->size();
      f_.converted_.push_back(std::move(buf));
    }
  }

  uint64_t kv_count_ = 0;
  uint64_t tensor_count_ = 0;
  std::vector<size_t> i2s_;  // indices of the I2_S tensors
};

File File::parse(const uint8_t* data, size_t size, const std::string& name) {
  File f;
  f.name_ = name;
  f.size_ = size;
  Parser(f, data, size).run();
  return f;
}

File File::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  File f = parse(map->data(), map->size(), path);
  f.map_ = std::move(map);
  return f;
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorView* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void wrong_type(const File& f, std::string_view key, const Value& v, std::string_view expected) {
  std::string_view got = value_type_name(v.type);
  if (v.is_array()) {
    fail("{}: metadata key '{}' is an array of {}, expected {}", f.name(), printable(key), value_type_name(v.elem_type),
         expected);
  }
  fail("{}: metadata key '{}' has type {}, expected {}", f.name(), printable(key), got, expected);
}

}  // namespace

std::optional<uint64_t> File::get_uint(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_integer()) wrong_type(*this, key, *v, "an unsigned integer");
  bool is_signed = v->type == ValueType::INT8 || v->type == ValueType::INT16 || v->type == ValueType::INT32 ||
                   v->type == ValueType::INT64;
  if (is_signed && v->i < 0) fail("{}: metadata key '{}' is negative ({})", name_, printable(key), v->i);
  return v->u;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_integer()) wrong_type(*this, key, *v, "an integer");
  if (v->type == ValueType::UINT64 && v->u > static_cast<uint64_t>(INT64_MAX))
    fail("{}: metadata key '{}' ({}) does not fit in int64", name_, printable(key), v->u);
  return v->i;
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_float() && !v->is_integer()) wrong_type(*this, key, *v, "a number");
  return v->f;
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(*this, key, *v, "a bool");
  return v->u != 0;
}

std::optional<std::string_view> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(*this, key, *v, "a string");
  return v->s;
}

std::optional<std::vector<std::string_view>> File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array() || v->elem_type != ValueType::STRING) wrong_type(*this, key, *v, "an array of strings");
  return v->strs;
}

std::optional<std::vector<double>> File::get_number_array(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array() || value_type_size(v->elem_type) == 0) wrong_type(*this, key, *v, "an array of numbers");
  std::vector<double> out(v->len);  // len elements are inside the file: bounded by its size
  for (uint64_t k = 0; k < v->len; ++k) out[k] = v->number_at(k);
  return out;
}

}  // namespace tessera::gguf
