// `tessera inspect -m FILE` on malformed GGUF files (tests/formats/test_gguf_cases.h): a non-zero exit, one
// "tessera: error: ..." line naming the problem, and no crash (a signal would give an exit status >= 128).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "formats/test_gguf_cases.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
namespace cases = tessera::test::gguf_cases;

fs::path write_file(const fs::path& dir, const std::string& name, const cases::Bytes& b) {
  fs::path p = dir / name;
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return p;
}

void expect_clean_failure(const fs::path& file, const std::string& expect) {
  std::string out;
  int rc = tessera::test::run_command(tessera::test::cli_path() + " inspect -m '" + file.string() + "'", &out);
  SCOPED_TRACE(file.filename().string());
  EXPECT_GT(rc, 0) << out;
  EXPECT_LT(rc, 128) << "crashed: " << out;
  ASSERT_EQ(out.rfind("tessera: error: ", 0), 0u) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "expected exactly one line: " << out;
  EXPECT_NE(out.find(file.string() + ": "), std::string::npos) << "the message does not name the file: " << out;
  EXPECT_NE(out.find(expect), std::string::npos) << "expected '" << expect << "' in: " << out;
}

class InspectMalformed : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_inspect_malformed_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(InspectMalformed, NamedCases) {
  auto all = cases::malformed_cases();
  ASSERT_GE(all.size(), 30u);
  for (const auto& c : all) {
    // A file without the GGUF magic is no GGUF file whatever its name: every command says the same (issue 26).
    const bool no_magic = c.name == "empty_file" || c.name == "bad_magic";
    expect_clean_failure(write_file(dir_, c.name + ".gguf", c.bytes),
                         no_magic ? "not a GGUF or safetensors model" : c.expect);
  }
}

// A sample of truncation points, one inside each region of the file (the reader test cuts at every byte).
TEST_F(InspectMalformed, Truncations) {
  cases::Bytes b = cases::base_file();
  cases::Layout l = cases::layout_of(b);
  std::vector<size_t> cuts = {3,
                              17,
                              l.kvs[0].key + 3,
                              l.kvs[5].value + 6,
                              l.kvs[7].array_elem_types.back() + 2,
                              l.tensors[1].ne + 4,
                              l.tensors[2].offset + 1,
                              l.data_offset - 1,
                              l.data_end - 1};
  for (size_t n : cuts) {
    cases::Bytes cut(b.begin(), b.begin() + static_cast<long>(n));
    expect_clean_failure(write_file(dir_, "cut_" + std::to_string(n) + ".gguf", cut), "");
  }
}

}  // namespace
