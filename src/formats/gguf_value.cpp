// GGUF metadata values: type names, element access, builders; UTF-8 helpers shared by the reader and the writer.
#include <cstring>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_internal.h"

namespace tessera::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
      return "uint8";
    case ValueType::INT8:
      return "int8";
    case ValueType::UINT16:
      return "uint16";
    case ValueType::INT16:
      return "int16";
    case ValueType::UINT32:
      return "uint32";
    case ValueType::INT32:
      return "int32";
    case ValueType::FLOAT32:
      return "float32";
    case ValueType::BOOL:
      return "bool";
    case ValueType::STRING:
      return "string";
    case ValueType::ARRAY:
      return "array";
    case ValueType::UINT64:
      return "uint64";
    case ValueType::INT64:
      return "int64";
    case ValueType::FLOAT64:
      return "float64";
  }
  return "unknown";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::BOOL:
      return 1;
    case ValueType::UINT16:
    case ValueType::INT16:
      return 2;
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::FLOAT32:
      return 4;
    case ValueType::UINT64:
    case ValueType::INT64:
    case ValueType::FLOAT64:
      return 8;
    case ValueType::STRING:
    case ValueType::ARRAY:
      return 0;
  }
  return 0;
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::UINT8:
    case ValueType::INT8:
    case ValueType::UINT16:
    case ValueType::INT16:
    case ValueType::UINT32:
    case ValueType::INT32:
    case ValueType::UINT64:
    case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

namespace {

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Element i of a scalar array, widened the way scalar Values are (u/i/f), with its type.
Value element(const Value& a, uint64_t i) {
  if (!a.is_array()) fail("metadata value of type {} is not an array", value_type_name(a.type));
  size_t size = value_type_size(a.elem_type);
  if (size == 0) fail("metadata array of {} has no numeric elements", value_type_name(a.elem_type));
  if (i >= a.len) fail("metadata array index {} is out of range (length {})", i, a.len);
  const uint8_t* p = a.raw + i * size;
  Value v;
  v.type = a.elem_type;
  switch (a.elem_type) {
    case ValueType::UINT8:
      v = Value::from_u8(load<uint8_t>(p));
      break;
    case ValueType::INT8:
      v = Value::from_i8(load<int8_t>(p));
      break;
    case ValueType::UINT16:
      v = Value::from_u16(load<uint16_t>(p));
      break;
    case ValueType::INT16:
      v = Value::from_i16(load<int16_t>(p));
      break;
    case ValueType::UINT32:
      v = Value::from_u32(load<uint32_t>(p));
      break;
    case ValueType::INT32:
      v = Value::from_i32(load<int32_t>(p));
      break;
    case ValueType::UINT64:
      v = Value::from_u64(load<uint64_t>(p));
      break;
    case ValueType::INT64:
      v = Value::from_i64(load<int64_t>(p));
      break;
    case ValueType::FLOAT32:
      v = Value::from_f32(load<float>(p));
      break;
    case ValueType::FLOAT64:
      v = Value::from_f64(load<double>(p));
      break;
    case ValueType::BOOL:
      v = Value::from_bool(load<uint8_t>(p) != 0);
      break;
    default:
      break;
  }
  return v;
}

Value unsigned_value(ValueType t, uint64_t x) {
  Value v;
  v.type = t;
  v.u = x;
  if (x <= static_cast<uint64_t>(INT64_MAX)) v.i = static_cast<int64_t>(x);
  v.f = static_cast<double>(x);
  return v;
}

Value signed_value(ValueType t, int64_t x) {
  Value v;
  v.type = t;
  v.i = x;
  if (x >= 0) v.u = static_cast<uint64_t>(x);
  v.f = static_cast<double>(x);
  return v;
}

Value float_value(ValueType t, double x) {
  Value v;
  v.type = t;
  v.f = x;
  return v;
}

}  // namespace

double Value::number_at(uint64_t idx) const { return element(*this, idx).f; }

int64_t Value::int_at(uint64_t idx) const {
  Value v = element(*this, idx);
  if (v.is_float()) fail("metadata array of {} has no integer elements", value_type_name(elem_type));
  if (v.type == ValueType::UINT64 && v.u > static_cast<uint64_t>(INT64_MAX))
    fail("metadata array element {} ({}) does not fit in int64", idx, v.u);
  return v.type == ValueType::BOOL ? static_cast<int64_t>(v.u) : v.i;
}

Value Value::from_u8(uint8_t v) { return unsigned_value(ValueType::UINT8, v); }
Value Value::from_i8(int8_t v) { return signed_value(ValueType::INT8, v); }
Value Value::from_u16(uint16_t v) { return unsigned_value(ValueType::UINT16, v); }
Value Value::from_i16(int16_t v) { return signed_value(ValueType::INT16, v); }
Value Value::from_u32(uint32_t v) { return unsigned_value(ValueType::UINT32, v); }
Value Value::from_i32(int32_t v) { return signed_value(ValueType::INT32, v); }
Value Value::from_u64(uint64_t v) { return unsigned_value(ValueType::UINT64, v); }
Value Value::from_i64(int64_t v) { return signed_value(ValueType::INT64, v); }
Value Value::from_f32(float v) { return float_value(ValueType::FLOAT32, v); }
Value Value::from_f64(double v) { return float_value(ValueType::FLOAT64, v); }

Value Value::from_bool(bool b) {
  Value v;
  v.type = ValueType::BOOL;
  v.u = b ? 1 : 0;
  v.i = static_cast<int64_t>(v.u);
  v.f = static_cast<double>(v.u);
  return v;
}

Value Value::from_string(std::string s) {
  // The string lives on the heap behind `owned`, so `s` stays valid when the Value is copied or moved.
  auto store = std::make_shared<std::string>(std::move(s));
  Value v;
  v.type = ValueType::STRING;
  v.s = *store;
  v.owned = std::move(store);
  return v;
}

Value Value::from_strings(const std::vector<std::string>& strings) {
  auto store = std::make_shared<std::vector<std::string>>(strings);
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = ValueType::STRING;
  v.len = store->size();
  v.strs.assign(store->begin(), store->end());
  v.owned = std::move(store);
  return v;
}

Value Value::from_array(ValueType elem, const void* data, uint64_t n) {
  size_t size = value_type_size(elem);
  if (size == 0) fail("gguf writer: from_array needs a scalar element type, not {}", value_type_name(elem));
  if (n > SIZE_MAX / size) fail("gguf writer: array of {} {} elements is too large", n, value_type_name(elem));
  if (n > 0 && data == nullptr) fail("gguf writer: array of {} {} elements has no data", n, value_type_name(elem));
  auto store = std::make_shared<std::vector<uint8_t>>(n * size);
  if (n > 0) std::memcpy(store->data(), data, n * size);
  if (elem == ValueType::BOOL)
    for (uint8_t b : *store)
      if (b > 1) fail("gguf writer: bool array element {} is not 0 or 1", b);
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = elem;
  v.len = n;
  v.raw = store->data();
  v.owned = std::move(store);
  return v;
}

Value Value::from_f32s(const std::vector<float>& a) { return from_array(ValueType::FLOAT32, a.data(), a.size()); }
Value Value::from_i32s(const std::vector<int32_t>& a) { return from_array(ValueType::INT32, a.data(), a.size()); }

Value Value::array_of_arrays(std::vector<Value> items) {
  for (const Value& it : items)
    if (!it.is_array()) fail("gguf writer: an array of arrays cannot hold a {}", value_type_name(it.type));
  Value v;
  v.type = ValueType::ARRAY;
  v.elem_type = ValueType::ARRAY;
  v.len = items.size();
  v.items = std::move(items);
  return v;
}

namespace detail {

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string printable(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out;
  bool utf8 = is_valid_utf8(s);
  for (size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<uint8_t>(s[i]);
    bool continuation = utf8 && (c & 0xC0) == 0x80;
    if (out.size() >= kMax && !continuation) {  // cut only between code points
      out += "...";
      break;
    }
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !utf8)) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace detail
}  // namespace tessera::gguf
