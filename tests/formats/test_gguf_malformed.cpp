// Malformed GGUF files (tests/formats/test_gguf_cases.h): each must throw tessera::Error with a one-line message that
// names the file and the problem, and nothing may be read out of bounds (the fuzzer and the sanitizer builds
// check that part harder).
#include <gtest/gtest.h>

#include <memory>

#include "formats/gguf.h"
#include "formats/test_gguf_cases.h"

namespace {

using tessera::gguf::File;
namespace cases = tessera::test::gguf_cases;

// Parses a private heap copy of exactly `b.size()` bytes, so an out-of-bounds read lands outside the allocation
// (where AddressSanitizer sees it) instead of in spare vector capacity.
std::string parse_error(const cases::Bytes& b, const std::string& name) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[b.size() + (b.empty() ? 1 : 0)]);
  if (!b.empty()) std::memcpy(copy.get(), b.data(), b.size());
  try {
    File::parse(copy.get(), b.size(), name);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

TEST(GgufMalformed, BaseFileIsValid) {
  cases::Bytes b = cases::base_file();
  File f = File::parse(b.data(), b.size(), "base.gguf");
  cases::Layout l = cases::layout_of(b);
  ASSERT_EQ(f.metadata().size(), l.kvs.size());
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset(), l.data_offset);
  EXPECT_EQ(f.tensors().back().offset + f.tensors().back().nbytes, l.data_end);
  EXPECT_EQ(f.metadata()[2].key, "test.aaa");
  EXPECT_EQ(f.metadata()[7].key, "test.nest");
  EXPECT_EQ(l.kvs[7].array_elem_types.size(), static_cast<size_t>(tessera::gguf::kMaxArrayDepth));
}

TEST(GgufMalformed, NamedCasesFailWithTheirMessage) {
  auto all = cases::malformed_cases();
  EXPECT_GE(all.size(), 30u);
  for (const auto& c : all) {
    std::string name = c.name + ".gguf";
    std::string msg = parse_error(c.bytes, name);
    ASSERT_FALSE(msg.empty()) << c.name << ": parsed without error";
    EXPECT_EQ(msg.rfind(name + ": ", 0), 0u) << c.name << ": message does not start with the file name: " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": expected '" << c.expect << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.name << ": " << msg;
  }
}

// Every prefix of the file up to the end of the last tensor's data is invalid (the header, each metadata entry, each
// tensor info, the padding and the data are each cut at every byte).
TEST(GgufMalformed, EveryTruncationFails) {
  cases::Bytes b = cases::base_file();
  size_t end = cases::layout_of(b).data_end;
  ASSERT_LE(end, b.size());
  for (size_t n = 0; n < end; ++n) {
    std::string msg = parse_error(cases::Bytes(b.begin(), b.begin() + static_cast<long>(n)), "cut.gguf");
    ASSERT_FALSE(msg.empty()) << "truncated to " << n << " bytes parsed without error";
    EXPECT_EQ(msg.rfind("cut.gguf: ", 0), 0u) << msg;
  }
  // Trailing padding after the last tensor is not needed.
  EXPECT_EQ(parse_error(cases::Bytes(b.begin(), b.begin() + static_cast<long>(end)), "cut.gguf"), "");
}

// Names from the file are escaped in messages, so a hostile key cannot break the one-line error format.
TEST(GgufMalformed, HostileNamesAreEscapedInMessages) {
  cases::Bytes b = cases::base_file();
  cases::Layout l = cases::layout_of(b);
  b[l.kvs[3].key] = '\n';
  std::memcpy(b.data() + l.kvs[3].key + 1, "\x1b[2J", 4);
  b = cases::with_u32(b, l.kvs[3].type, 77);
  std::string msg = parse_error(b, "hostile.gguf");
  EXPECT_NE(msg.find("metadata key '\\x0a\\x1b[2Jbbb': unknown value type 77"), std::string::npos) << msg;
}

}  // namespace
