// docs/ENVIRONMENT.md lists every environment switch the sources read: each "TESSERA_..." string literal in src/ (the
// names getenv is called with) must appear there, and each name the document lists must still be read somewhere in
// src/ (a removed switch leaves no stale row).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::set<std::string> matches(const std::string& text, const std::regex& re, int group) {
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.insert((*it)[group].str());
  return out;
}

TEST(EnvDocs, EverySwitchTheSourcesReadIsDocumented) {
  const fs::path root = TESSERA_SOURCE_DIR;
  const std::string doc = read_all(root / "docs" / "ENVIRONMENT.md");
  ASSERT_FALSE(doc.empty()) << "docs/ENVIRONMENT.md is missing";
  const std::regex literal("\"(TESSERA_[A-Z0-9_]+)\"");
  std::set<std::string> read;
  for (const auto& e : fs::recursive_directory_iterator(root / "src")) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
    const std::set<std::string> found = matches(read_all(e.path()), literal, 1);
    read.insert(found.begin(), found.end());
  }
  // What a user sets: the model folder and the cuDNN library (docs/ENVIRONMENT.md); the engine's switches are options.
  ASSERT_GE(read.size(), 2u) << "the scan found too few variables: is TESSERA_SOURCE_DIR right?";
  for (const std::string& name : read) EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name;
  const std::set<std::string> listed = matches(doc, std::regex("\\| `(TESSERA_[A-Z0-9_]+)` \\|"), 1);
  for (const std::string& name : listed) EXPECT_TRUE(read.count(name)) << name << " is documented but never read";
}

}  // namespace
