// GGUF v3 writer: validates its inputs like the reader does, lays tensors out aligned, writes atomically.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_internal.h"

namespace tessera::gguf {

using detail::printable;

namespace {

constexpr uint8_t kZeros[256] = {};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void check_key(const std::string& key) {
  if (key.empty()) fail("gguf writer: metadata key is empty");
  if (!detail::is_valid_utf8(key)) fail("gguf writer: metadata key '{}' is not valid UTF-8", printable(key));
}

// Checks that a Value is self-consistent (so serialization cannot read outside its storage) and nests at most
// kMaxArrayDepth arrays, the reader's limit.
void check_value(const std::string& key, const Value& v, int depth) {
  if (!detail::is_known_value_type(static_cast<uint32_t>(v.type)))
    fail("gguf writer: metadata key '{}' has unknown value type {}", printable(key), static_cast<uint32_t>(v.type));
  if (v.type == ValueType::BOOL && v.u > 1) fail("gguf writer: metadata key '{}' has a bool that is not 0 or 1", key);
  if (!v.is_array()) return;
  const int level = depth + 1;  // of this array; the reader rejects an array of arrays at the deepest level too
  if (level > kMaxArrayDepth || (v.elem_type == ValueType::ARRAY && level + 1 > kMaxArrayDepth))
    fail("gguf writer: metadata key '{}' nests arrays deeper than {} levels", printable(key), kMaxArrayDepth);
  if (!detail::is_known_value_type(static_cast<uint32_t>(v.elem_type)))
    fail("gguf writer: metadata key '{}' has an array of unknown element type", printable(key));
  if (v.elem_type == ValueType::STRING) {
    if (v.strs.size() != v.len)
      fail("gguf writer: metadata key '{}' has {} strings for length {}", printable(key), v.strs.size(), v.len);
  } else if (v.elem_type == ValueType::ARRAY) {
    if (v.items.size() != v.len)
      fail("gguf writer: metadata key '{}' has {} arrays for length {}", printable(key), v.items.size(), v.len);
    for (const Value& it : v.items) {
      if (!it.is_array()) fail("gguf writer: metadata key '{}' has a non-array inside an array of arrays", key);
      check_value(key, it, depth + 1);
    }
  } else if (v.len > 0 && v.raw == nullptr) {
    fail("gguf writer: metadata key '{}' has an array of {} elements without data", printable(key), v.len);
  }
}

template <typename Sink>
void put_u32(Sink& s, uint32_t v) {
  s.put(&v, 4);
}
template <typename Sink>
void put_u64(Sink& s, uint64_t v) {
  s.put(&v, 8);
}
template <typename Sink>
void put_string(Sink& s, std::string_view str) {
  put_u64(s, str.size());
  s.put(str.data(), str.size());
}

template <typename Sink>
void put_array_body(Sink& s, const Value& v) {
  put_u32(s, static_cast<uint32_t>(v.elem_type));
  put_u64(s, v.len);
  if (v.elem_type == ValueType::STRING) {
    for (std::string_view str : v.strs) put_string(s, str);
  } else if (v.elem_type == ValueType::ARRAY) {
    for (const Value& it : v.items) put_array_body(s, it);
  } else if (v.len > 0) {
    s.put(v.raw, v.len * value_type_size(v.elem_type));
  }
}

template <typename Sink>
void put_value(Sink& s, const Value& v) {
  put_u32(s, static_cast<uint32_t>(v.type));
  auto put_scalar = [&s](auto x) { s.put(&x, sizeof(x)); };
  switch (v.type) {
    case ValueType::UINT8:
      put_scalar(static_cast<uint8_t>(v.u));
      break;
    case ValueType::INT8:
      put_scalar(static_cast<int8_t>(v.i));
      break;
    case ValueType::UINT16:
      put_scalar(static_cast<uint16_t>(v.u));
      break;
    case ValueType::INT16:
      put_scalar(static_cast<int16_t>(v.i));
      break;
    case ValueType::UINT32:
      put_scalar(static_cast<uint32_t>(v.u));
      break;
    case ValueType::INT32:
      put_scalar(static_cast<int32_t>(v.i));
      break;
    case ValueType::UINT64:
      put_scalar(v.u);
      break;
    case ValueType::INT64:
      put_scalar(v.i);
      break;
    case ValueType::FLOAT32:
      put_scalar(static_cast<float>(v.f));
      break;
    case ValueType::FLOAT64:
      put_scalar(v.f);
      break;
    case ValueType::BOOL:
      put_scalar(static_cast<uint8_t>(v.u != 0));
      break;
    case ValueType::STRING:
      put_string(s, v.s);
      break;
    case ValueType::ARRAY:
      put_array_body(s, v);
      break;
  }
}

struct VectorSink {
  std::vector<uint8_t>& out;
  void put(const void* p, size_t n) {
    if (n == 0) return;
    size_t old = out.size();
    out.resize(old + n);
    std::memcpy(out.data() + old, p, n);
  }
};

struct FileSink {
  FILE* f;
  bool ok = true;
  void put(const void* p, size_t n) {
    if (ok && n > 0 && std::fwrite(p, 1, n, f) != n) ok = false;
  }
};

uint64_t alignment_of(const std::vector<KeyValue>& kv) {
  for (const KeyValue& e : kv)
    if (e.key == "general.alignment") return e.value.u;
  return kDefaultAlignment;
}

}  // namespace

void Writer::set(std::string key, Value v) {
  check_key(key);
  check_value(key, v, 0);
  if (key == "general.alignment") {
    if (v.type != ValueType::UINT32)
      fail("gguf writer: general.alignment has type {}, expected uint32", value_type_name(v.type));
    if (!detail::is_power_of_two(v.u)) fail("gguf writer: general.alignment {} is not a nonzero power of two", v.u);
  }
  for (KeyValue& e : kv_) {
    if (e.key == key) {
      e.value = std::move(v);
      return;
    }
  }
  kv_.push_back({std::move(key), std::move(v)});
}

void Writer::check_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
                          size_t nbytes) const {
  if (name.empty()) fail("gguf writer: tensor name is empty");
  if (!detail::is_valid_utf8(name)) fail("gguf writer: tensor name '{}' is not valid UTF-8", printable(name));
  for (const PendingTensor& t : tensors_)
    if (t.name == name) fail("gguf writer: duplicate tensor name '{}'", printable(name));
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(dtype));
  if (info == nullptr) fail("gguf writer: tensor '{}' has unknown dtype {}", name, static_cast<uint32_t>(dtype));
  if (shape.empty() || shape.size() > kMaxDims)
    fail("gguf writer: tensor '{}' has {} dimensions (1 to {} are supported)", name, shape.size(), kMaxDims);
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0) fail("gguf writer: tensor '{}' has a dimension {} <= 0", name, d);
    if (__builtin_mul_overflow(numel, d, &numel)) fail("gguf writer: tensor '{}' element count overflows", name);
  }
  std::optional<uint64_t> row = dtype_row_bytes(dtype, static_cast<uint64_t>(shape.back()));
  if (!row) {
    fail("gguf writer: tensor '{}' innermost dimension {} is not a multiple of the {} block size {}", name,
         shape.back(), info->name, info->block_size);
  }
  uint64_t expect = *row;
  for (size_t d = 0; d + 1 < shape.size(); ++d)
    if (__builtin_mul_overflow(expect, static_cast<uint64_t>(shape[d]), &expect))
      fail("gguf writer: tensor '{}' byte size overflows", name);
  if (expect != nbytes) fail("gguf writer: tensor '{}' needs {} bytes of {}, got {}", name, expect, info->name, nbytes);
  if (data == nullptr) fail("gguf writer: tensor '{}' has no data", name);
}

void Writer::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  check_tensor(name, dtype, shape, data, nbytes);
  const auto* b = static_cast<const uint8_t*>(data);
  tensors_.push_back({std::move(name), dtype, std::move(shape), std::vector<uint8_t>(b, b + nbytes), nullptr, nbytes});
}

void Writer::add_tensor_ref(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                            size_t nbytes) {
  check_tensor(name, dtype, shape, data, nbytes);
  tensors_.push_back({std::move(name), dtype, std::move(shape), {}, static_cast<const uint8_t*>(data), nbytes});
}

template <typename Sink>
void Writer::serialize(Sink& out) const {
  const uint64_t align = alignment_of(kv_);
  // Counts what passes through, so the padding before the data section needs no hand-tracked header size.
  struct Counted {
    Sink& sink;
    uint64_t n = 0;
    void put(const void* p, size_t k) {
      sink.put(p, k);
      n += k;
    }
  } s{out};
  put_u32(s, detail::kMagic);
  put_u32(s, 3);
  put_u64(s, tensors_.size());
  put_u64(s, kv_.size());
  for (const KeyValue& e : kv_) {
    put_string(s, e.key);
    put_value(s, e.value);
  }
  uint64_t offset = 0;  // relative to the data section
  for (const PendingTensor& t : tensors_) {
    put_string(s, t.name);
    put_u32(s, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put_u64(s, static_cast<uint64_t>(*it));
    put_u32(s, static_cast<uint32_t>(t.dtype));
    put_u64(s, offset);
    offset = align_up(offset + t.nbytes, align);
  }
  auto pad = [&s](uint64_t n) {
    while (n > 0) {
      uint64_t k = std::min<uint64_t>(n, sizeof(kZeros));
      s.put(kZeros, k);
      n -= k;
    }
  };
  pad(align_up(s.n, align) - s.n);
  for (const PendingTensor& t : tensors_) {
    s.put(t.data.empty() ? t.ref : t.data.data(), t.nbytes);
    pad(align_up(t.nbytes, align) - t.nbytes);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{out};
  serialize(sink);
  return out;
}

void Writer::write(const std::string& path) const {
  std::filesystem::path target(path);
  std::string tmpl = (target.parent_path().empty() ? std::string(".") : target.parent_path().string()) + "/." +
                     target.filename().string() + ".tmp-XXXXXX";
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) fail("{}: cannot create a temporary file next to it: {}", path, std::strerror(errno));
  FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    int e = errno;
    ::close(fd);
    ::unlink(tmpl.c_str());
    fail("{}: cannot write: {}", path, std::strerror(e));
  }
  FileSink sink{f};
  try {
    serialize(sink);
  } catch (...) {
    std::fclose(f);
    ::unlink(tmpl.c_str());
    throw;
  }
  int err = 0;
  if (!sink.ok) err = errno != 0 ? errno : EIO;
  if (std::fflush(f) != 0 && err == 0) err = errno;
  if (::fsync(::fileno(f)) != 0 && err == 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  // mkstemp creates 0600; a model file should get the usual permissions.
  if (err == 0) {
    mode_t mask = ::umask(0);
    ::umask(mask);
    if (::chmod(tmpl.c_str(), 0666 & ~mask) != 0) err = errno;
  }
  if (err == 0 && std::rename(tmpl.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmpl.c_str());
    fail("{}: cannot write: {}", path, std::strerror(err));
  }
}

}  // namespace tessera::gguf
