// `tessera chat` from a pipe: replies on stdout, /reset starts over (the same greedy reply again), /quit ends the
// session (later lines are ignored).
#include <gtest/gtest.h>

#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::run_command;

std::string chat(const std::string& model, const std::string& input) {
  std::string out;
  const int rc = run_command("{ printf '" + input + "' | " + cli_path() + " chat -m " + model +
                                 " -n 12 --temp 0 -t 2 2>/dev/null; }",
                             &out);
  EXPECT_EQ(rc, 0) << out;
  return out;
}

TEST(ChatCli, PipeResetAndQuit) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string one = chat(model, "Hello, who are you?\\n");
  ASSERT_GT(one.size(), 1u);
  EXPECT_EQ(one.back(), '\n');
  // After /reset the conversation starts over: greedy decoding gives the same reply again.
  EXPECT_EQ(chat(model, "Hello, who are you?\\n/reset\\nHello, who are you?\\n"), one + one);
  // /quit ends the session; blank lines are skipped.
  EXPECT_EQ(chat(model, "\\nHello, who are you?\\n/quit\\nWhat is 2+2?\\n"), one);
  // A second turn continues the conversation (its reply is produced and ends with a newline).
  const std::string two = chat(model, "Hello, who are you?\\nWhat is 2+2?\\n");
  EXPECT_EQ(two.rfind(one, 0), 0u);
  EXPECT_GT(two.size(), one.size() + 1);
}

}  // namespace
