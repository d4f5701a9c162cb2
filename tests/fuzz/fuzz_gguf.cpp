// libFuzzer entry for the GGUF reader: any input must parse or throw tessera::Error, never crash, hang, leak or read
// outside the buffer (ASan/UBSan are on in fuzz builds). Whatever parses is touched completely (every value, every
// tensor byte range's ends), and must survive a trip through our writer: the writer accepts everything the reader
// accepts and the result reads back the same. Run with `make fuzz` (scripts/run_fuzz.sh); corpus in
// tests/fuzz/fuzz_gguf/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "formats/gguf.h"
#include "tessera/error.h"

namespace {

using namespace tessera::gguf;

volatile uint64_t g_sink = 0;

void touch(const Value& v) {
  g_sink = g_sink + v.u + static_cast<uint64_t>(v.i) + static_cast<uint64_t>(v.f != 0) + v.s.size();
  for (char c : v.s) g_sink = g_sink + static_cast<uint8_t>(c);
  if (!v.is_array()) return;
  if (v.elem_type == ValueType::STRING) {
    for (std::string_view s : v.strs)
      if (!s.empty()) g_sink = g_sink + static_cast<uint8_t>(s.front()) + static_cast<uint8_t>(s.back());
  } else if (v.elem_type == ValueType::ARRAY) {
    for (const Value& it : v.items) touch(it);
  } else {
    for (uint64_t k = 0; k < v.len; ++k) g_sink = g_sink + static_cast<uint64_t>(v.number_at(k) != 0);
  }
}

// Calls every getter on `key`; type mismatches are expected to throw tessera::Error, nothing else.
template <typename Fn>
void try_get(Fn fn) {
  try {
    fn();
  } catch (const tessera::Error&) {
  }
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan sees any read past the end of the buffer.
  std::vector<uint8_t> buf(data, data + size);
  File f;
  try {
    f = File::parse(buf.data(), buf.size(), "fuzz.gguf");
  } catch (const tessera::Error&) {
    return 0;
  }
  for (const KeyValue& kv : f.metadata()) {
    touch(kv.value);
    check(f.find(kv.key) == &kv.value);
    try_get([&] { (void)f.get_uint(kv.key); });
    try_get([&] { (void)f.get_int(kv.key); });
    try_get([&] { (void)f.get_float(kv.key); });
    try_get([&] { (void)f.get_bool(kv.key); });
    try_get([&] { (void)f.get_string(kv.key); });
    try_get([&] { (void)f.get_string_array(kv.key); });
    try_get([&] { (void)f.get_number_array(kv.key); });
  }
  for (const tessera::TensorView& t : f.tensors()) {
    check(t.nbytes > 0 && t.offset + t.nbytes <= buf.size() && t.data == buf.data() + t.offset);
    check(t.offset % f.alignment() == 0 && t.numel() > 0);
    check(f.find_tensor(t.name) == &t);
    g_sink = g_sink + t.data[0] + t.data[t.nbytes - 1];
  }

  // Round trip through the writer.
  Writer w;
  for (const KeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const tessera::TensorView& t : f.tensors()) w.add_tensor_ref(t.name, t.dtype, t.shape, t.data, t.nbytes);
  std::vector<uint8_t> again = w.to_bytes();
  File g = File::parse(again.data(), again.size(), "fuzz-rewritten.gguf");
  check(g.metadata().size() == f.metadata().size() && g.tensors().size() == f.tensors().size());
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    check(g.metadata()[i].key == f.metadata()[i].key);
    check(g.metadata()[i].value.type == f.metadata()[i].value.type);
  }
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const tessera::TensorView& a = f.tensors()[i];
    const tessera::TensorView& b = g.tensors()[i];
    check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes);
  }
  // A second rewrite of the rewritten file is byte-identical (the writer's output is canonical).
  Writer w2;
  for (const KeyValue& kv : g.metadata()) w2.set(kv.key, kv.value);
  for (const tessera::TensorView& t : g.tensors()) w2.add_tensor_ref(t.name, t.dtype, t.shape, t.data, t.nbytes);
  check(w2.to_bytes() == again);
  return 0;
}
