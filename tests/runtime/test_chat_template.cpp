// Chat templates against the Jinja2 engine: python/make_chat_golden.py renders the published templates of each
// family (Qwen2, Qwen2.5 and Qwen3, Gemma 1 to 3, Phi-3 and 3.5, Mistral v0.1, v0.3 and Nemo, Llama 2 and 3, and
// SmolLM2's own, from the default model) for several conversations; detection must name the family and
// render_chat must produce the same text (BOS text at the start left to the tokenizer).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "runtime/chat_template.h"
#include "tessera/chat.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string read(const std::string& rel) {
  std::ifstream f(test::data_path(rel), std::ios::binary);
  EXPECT_TRUE(f.good()) << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ChatTemplate, MatchesJinjaRenderings) {
  const json g = json::parse(read("tokenizer/chat_golden.json"));
  const auto& convs = g.at("conversations");
  size_t checked = 0;
  for (const auto& c : g.at("cases")) {
    const std::string name = c.at("template").get<std::string>();
    SCOPED_TRACE(::testing::Message() << name << " conversation " << c.at("conversation").get<int>());
    const std::string src = read("tokenizer/chat_templates/" + name + ".jinja");
    ASSERT_EQ(detect_template(src), c.at("family").get<std::string>());
    if (c.contains("raises")) continue;  // the template rejects this conversation (e.g. a system turn for Gemma)
    ChatTemplate t = resolve_chat_template(src);
    t.bos_text = c.at("bos").get<std::string>();
    t.eos_text = c.at("eos").get<std::string>();
    std::vector<ChatMessage> messages;
    for (const auto& m : convs.at(c.at("conversation").get<size_t>())) {
      messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    }
    EXPECT_EQ(render_chat(t, messages, c.at("add_generation_prompt").get<bool>()),
              c.at("expected").get<std::string>());
    ++checked;
  }
  EXPECT_GE(checked, 200u);
}

TEST(ChatTemplate, DefaultSystemPromptComesFromTheTemplate) {
  const std::string src = read("tokenizer/chat_templates/smollm2.jinja");
  const std::string sys = chat::chatml_default_system(src);
  EXPECT_NE(sys.find("SmolLM"), std::string::npos) << sys;
  EXPECT_EQ(sys.find('\n'), std::string::npos);
  const std::string qwen = chat::chatml_default_system(read("tokenizer/chat_templates/qwen2.jinja"));
  EXPECT_FALSE(qwen.empty());
  EXPECT_NE(qwen, sys);
  EXPECT_EQ(chat::chatml_default_system("{{ '<|im_start|>system\\n' + message['content'] + '<|im_end|>' }}"), "");
}

TEST(ChatTemplate, DefaultModelTemplateTokenizes) {
  TESSERA_REQUIRE_DEFAULT_MODEL(model);
  const Tokenizer tok = Tokenizer::from_model(model);
  const ChatTemplate t = chat_template_for(tok);
  EXPECT_EQ(t.name, "chatml");
  const std::string prompt = render_chat(t, {{"user", "Hi!"}}, true);
  const auto ids = tok.encode(prompt, true, true);
  // <|im_start|> and <|im_end|> become single control tokens; the prompt ends with the assistant header.
  const auto count = [&](TokenId id) { return std::count(ids.begin(), ids.end(), id); };
  const TokenId im_start = tok.encode("<|im_start|>", false, true).at(0);
  EXPECT_TRUE(tok.is_control(im_start));
  EXPECT_EQ(count(im_start), 3);
  EXPECT_EQ(count(tok.eot_id()), 2);
  EXPECT_EQ(tok.decode(ids), prompt);
}

TEST(ChatTemplate, UnknownTemplateAndOverride) {
  const std::string odd = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
  EXPECT_EQ(detect_template(odd), "");
  try {
    resolve_chat_template(odd);
    FAIL() << "an unknown template must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_chat_template(odd, "llama3").name, "llama3");
  EXPECT_THROW(resolve_chat_template(odd, "jinja"), Error);
  EXPECT_THROW(resolve_chat_template("", ""), Error);
  for (const auto& name : chat_template_names()) {
    const std::string r = render_chat(name, {{"user", "ping"}}, true);
    EXPECT_NE(r.find("ping"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace tessera
