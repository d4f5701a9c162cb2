// libFuzzer entry for the safetensors header parser: any input must parse or throw tessera::Error, never crash,
// leak or read outside the buffer (ASan/UBSan are on in fuzz builds). Run with `make fuzz` (scripts/run_fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/safetensors.h"
#include "tessera/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so ASan sees any read past the end of the buffer.
  std::vector<uint8_t> buf(data, data + size);
  try {
    tessera::safetensors::Header h = tessera::safetensors::parse_header(buf.data(), buf.size(), "fuzz.safetensors");
    // Touch every tensor's first and last byte: the parser promised they lie inside the buffer.
    volatile uint8_t sink = 0;
    for (const tessera::TensorView& t : h.tensors) {
      if (t.nbytes == 0) continue;
      sink = sink ^ t.data[0] ^ t.data[t.nbytes - 1];
      if (t.offset + t.nbytes > buf.size()) __builtin_trap();
    }
    (void)sink;
  } catch (const tessera::Error&) {
  }
  return 0;
}
