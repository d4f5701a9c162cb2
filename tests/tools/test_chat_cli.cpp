// `tessera chat` from a pipe: replies on stdout, /reset starts over (the same greedy reply again), /quit ends the
// session (later lines are ignored).
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

namespace {

using tessera::test::cli_path;
using tessera::test::run_command;

std::string chat(const std::string& model, const std::string& input, const std::string& flags = "-n 12") {
  std::string out;
  const int rc = run_command(
      "{ printf '" + input + "' | " + cli_path() + " chat -m " + model + " " + flags + " --temp 0 -t 2 2>/dev/null; }",
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

// A full context never ends the conversation (issue 26: from a pipe it exited 1 at the first overflow): by default the
// oldest turns are dropped; --context-shift discards the oldest half of the tokens, in the middle of a reply too.
TEST(ChatCli, ChattingGoesOnPastAFullContext) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const std::string input = "Tell me about Paris.\\nAnd about Rome?\\nAnd Berlin?\\nAnd Madrid?\\n";
  const std::string dropped = chat(model, input, "-c 96 -n 30");
  EXPECT_EQ(std::count(dropped.begin(), dropped.end(), '\n'), 4) << dropped;
  // With shifting, 60-token replies in a 96-token context run past the context's end and still finish.
  const std::string shifted = chat(model, input, "-c 96 -n 60 --context-shift --ignore-eos");
  EXPECT_EQ(std::count(shifted.begin(), shifted.end(), '\n'), 4) << shifted;
  std::string out;
  EXPECT_EQ(run_command("{ printf '" + input + "' | " + cli_path() + " chat -m " + model +
                            " -c 96 -n 30 --temp 0 -t 2 >/dev/null; }",
                        &out),
            0);
  EXPECT_NE(out.find("dropped the oldest turn"), std::string::npos) << out;
}

// On a real terminal (tmux): arrow keys edit, history recalls, Ctrl-C stops a reply, a full context drops turns.
TEST(ChatCli, TerminalEditingHistoryAndCtrlC) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  std::string out;
  if (run_command("command -v tmux", &out) != 0) GTEST_SKIP() << "tmux is not installed";
  EXPECT_EQ(run_command(std::string(TESSERA_SOURCE_DIR) + "/tests/tools/chat_tmux_check.sh " + cli_path() + " " + model,
                        &out),
            0)
      << out;
}

}  // namespace
