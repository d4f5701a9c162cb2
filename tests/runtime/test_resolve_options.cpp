// resolve_options and the KV cache type per device: f16 (the default) or f32 on the CPU and, opt-in, on device 'cuda'
// (f32 models keep f32 precision on the GPU). Device 'cuda' itself needs a build with the CUDA backend and a GPU;
// without either, one clear error names the device whatever the cache type.
#include <gtest/gtest.h>

#include <string>

#include "runtime/session.h"
#include "tessera/error.h"

namespace tessera::runtime {
namespace {

TEST(ResolveOptions, KvCacheTypePerDevice) {
  ModelConfig c;
  c.n_ctx_train = 256;
  for (const std::string device : {"cpu", "cuda"}) {
    SCOPED_TRACE("device " + device);
    SessionOptions so;
    so.n_ctx = 64;
    so.device = device;
    bool usable = device == "cpu";
    if (device == "cuda")
      for (const std::string& n : backend::names())
        if (n == "cuda") {
          try {
            (void)backend::get("cuda");
            usable = true;
          } catch (const Error&) {
          }
        }
    if (!usable) {
      so.kv_dtype = "f32";
      try {
        resolve_options(so, c);
        ADD_FAILURE() << "device 'cuda' resolved without a CUDA build or GPU";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("device 'cuda' is not available"), std::string::npos) << e.what();
      }
      continue;
    }
    EXPECT_EQ(resolve_options(so, c).kv_dtype, DType::F16);  // the default
    EXPECT_EQ(resolve_options(so, c).device, device);
    so.kv_dtype = "f16";
    EXPECT_EQ(resolve_options(so, c).kv_dtype, DType::F16);
    so.kv_dtype = "f32";
    EXPECT_EQ(resolve_options(so, c).kv_dtype, DType::F32);
    so.kv_dtype = "bf16";
    EXPECT_THROW(resolve_options(so, c), Error);
    so.kv_dtype = "q8_0";
    EXPECT_THROW(resolve_options(so, c), Error);
  }
}

}  // namespace
}  // namespace tessera::runtime
