// Chat templates: family detection from Jinja markers and a plain renderer per family (see include/tessera/chat.h).
#include "runtime/chat_template.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"
#include "tessera/chat.h"
#include "tessera/tokenizer.h"

namespace tessera {

namespace chat {

std::string_view trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string chatml_default_system(std::string_view src) {
  // The header appears with a real newline or with a Jinja string escape.
  for (const std::string_view header : {std::string_view("<|im_start|>system\n"), std::string_view("<|im_start|>system\\n")}) {
    size_t at = src.find(header);
    while (at != std::string_view::npos) {
      const size_t begin = at + header.size();
      const size_t end = src.find("<|im_end|>", begin);
      if (end == std::string_view::npos) break;
      const std::string_view body = src.substr(begin, end - begin);
      // A literal prompt holds no Jinja syntax or string delimiters; one built from variables is not a default.
      const bool literal = body.find_first_of("{}'\"+") == std::string_view::npos && !body.empty();
      if (literal) {
        std::string out;
        for (size_t i = 0; i < body.size(); ++i) {
          if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
            out.push_back('\n');
            ++i;
          } else {
            out.push_back(body[i]);
          }
        }
        return out;
      }
      at = src.find(header, end);
    }
  }
  return {};
}

}  // namespace chat

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = {
      "chatml", "llama3", "llama2", "mistral", "mistral-v3", "mistral-v3-tekken", "gemma", "phi3"};
  return names;
}

std::string detect_template(std::string_view src) {
  auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) return "chatml";
  if (has("<|start_header_id|>")) return "llama3";
  if (has("<start_of_turn>")) return "gemma";
  if (has("<|assistant|>") && has("<|end|>")) return "phi3";
  if (has("[INST]")) {
    // Mistral's own templates since v0.3 carry a tools block; Tekken's (Nemo) quote "[INST]" without its space.
    if (has("[AVAILABLE_TOOLS]")) return has("\"[INST]\"") ? "mistral-v3-tekken" : "mistral-v3";
    return has("<<SYS>>") ? "llama2" : "mistral";
  }
  return {};
}

ChatTemplate resolve_chat_template(std::string_view jinja_source, std::string_view override_name) {
  ChatTemplate t;
  const auto& names = chat_template_names();
  if (!override_name.empty()) {
    TESSERA_CHECK(std::find(names.begin(), names.end(), override_name) != names.end(),
                  "unknown chat template '{}'; known: {}", override_name, fmt::join(names, ", "));
    t.name = std::string(override_name);
  } else {
    TESSERA_CHECK(!jinja_source.empty(),
                  "the model has no chat template; pass --chat-template NAME (one of: {})", fmt::join(names, ", "));
    t.name = detect_template(jinja_source);
    TESSERA_CHECK(!t.name.empty(),
                  "the model's chat template is not one of the known families ({}); pass --chat-template NAME to "
                  "choose one",
                  fmt::join(names, ", "));
  }
  if (t.name == "chatml") t.default_system = chat::chatml_default_system(jinja_source);
  return t;
}

ChatTemplate chat_template_for(const Tokenizer& tokenizer, std::string_view override_name) {
  ChatTemplate t = resolve_chat_template(tokenizer.chat_template(), override_name);
  if (tokenizer.bos_id() >= 0) t.bos_text = tokenizer.token_text(tokenizer.bos_id());
  if (tokenizer.eos_id() >= 0) t.eos_text = tokenizer.token_text(tokenizer.eos_id());
  return t;
}

namespace {

// llama2 / mistral have no system turn: the system text goes in front of the first user message.
std::vector<ChatMessage> fold_system(const std::vector<ChatMessage>& messages, std::string_view sep) {
  if (messages.empty() || messages[0].role != "system") return messages;
  std::vector<ChatMessage> out(messages.begin() + 1, messages.end());
  for (auto& m : out) {
    if (m.role == "user") {
      std::string joined = messages[0].content;
      joined.append(sep);
      joined.append(m.content);
      m.content = std::move(joined);
      return out;
    }
  }
  out.insert(out.begin(), ChatMessage{"user", messages[0].content});
  return out;
}

}  // namespace

std::string render_chat(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  // Appending views (not operator+ temporaries) also keeps GCC 12's -Wrestrict false positive away.
  auto put = [&out](std::initializer_list<std::string_view> parts) {
    for (const std::string_view p : parts) out.append(p);
  };
  if (t.name == "chatml") {
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i == 0 && messages[0].role != "system" && !t.default_system.empty()) {
        put({"<|im_start|>system\n", t.default_system, "<|im_end|>\n"});
      }
      put({"<|im_start|>", messages[i].role, "\n", messages[i].content, "<|im_end|>\n"});
    }
    if (add_generation_prompt) put({"<|im_start|>assistant\n"});
  } else if (t.name == "llama3") {
    for (const auto& m : messages) {
      put({"<|start_header_id|>", m.role, "<|end_header_id|>\n\n", chat::trim(m.content), "<|eot_id|>"});
    }
    if (add_generation_prompt) put({"<|start_header_id|>assistant<|end_header_id|>\n\n"});
  } else if (t.name == "llama2") {
    size_t first = 0;
    std::string_view system;
    if (!messages.empty() && messages[0].role == "system") {
      system = messages[0].content;
      first = 1;
    }
    for (size_t i = first; i < messages.size(); ++i) {
      std::string content;
      if (i == first && first == 1) {
        for (const std::string_view p : {std::string_view("<<SYS>>\n"), system, std::string_view("\n<</SYS>>\n\n")}) {
          content.append(p);
        }
      }
      content.append(messages[i].content);
      if (messages[i].role == "user") {
        // The first turn's BOS is the one the tokenizer adds; later turns carry its text.
        put({out.empty() ? std::string_view() : std::string_view(t.bos_text), "[INST] ", chat::trim(content), " [/INST]"});
      } else if (messages[i].role == "assistant") {
        put({" ", chat::trim(content), " ", t.eos_text});
      }
    }
  } else if (t.name == "mistral") {
    for (const auto& m : fold_system(messages, "\n\n")) {
      if (m.role == "user") {
        put({"[INST] ", m.content, " [/INST]"});
      } else if (m.role == "assistant") {
        put({m.content, t.eos_text});
      }
    }
  } else if (t.name == "mistral-v3" || t.name == "mistral-v3-tekken") {
    // The system text goes into the last message's turn when that is the user's (as the template's loop.last).
    const bool tekken = t.name == "mistral-v3-tekken";
    const bool has_system = !messages.empty() && messages[0].role == "system";
    const std::string_view open = tekken ? "[INST]" : "[INST] ";
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "user") {
        put({open});
        if (has_system && i + 1 == messages.size()) put({messages[0].content, "\n\n"});
        put({m.content, "[/INST]"});
      } else if (m.role == "assistant") {
        put({tekken ? std::string_view() : std::string_view(" "),
             tekken ? std::string_view(m.content) : chat::trim(m.content), t.eos_text});
      }
    }
  } else if (t.name == "gemma") {
    // Gemma 3: the system text, untrimmed, opens the first turn (Gemma 1 and 2 refuse a system turn).
    const bool has_system = !messages.empty() && messages[0].role == "system";
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      put({"<start_of_turn>", m.role == "assistant" ? std::string_view("model") : std::string_view(m.role), "\n"});
      if (has_system && i == 1) put({messages[0].content, "\n\n"});
      put({chat::trim(m.content), "<end_of_turn>\n"});
    }
    if (add_generation_prompt) put({"<start_of_turn>model\n"});
  } else if (t.name == "phi3") {
    for (const auto& m : messages) {
      if (m.role == "system" || m.role == "user" || m.role == "assistant") {
        put({"<|", m.role, "|>\n", m.content, "<|end|>\n"});
      }
    }
    put({add_generation_prompt ? std::string_view("<|assistant|>\n") : std::string_view(t.eos_text)});
  } else {
    tessera::fail("unknown chat template '{}'; known: {}", t.name, fmt::join(chat_template_names(), ", "));
  }
  return out;
}

std::string render_chat(std::string_view name, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  return render_chat(resolve_chat_template("", name), messages, add_generation_prompt);
}

}  // namespace tessera
